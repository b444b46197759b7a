"""pysyncobj's part of a snapshot (its raft_data: the last two entries and the
cluster's nodes) as the plain values a snapshot holds (RaftMeta), and back
as the TCPNodes pysyncobj's loader takes."""
from __future__ import annotations

from typing import Any

from pysyncobj.node import TCPNode

from node.replication.raft.snapshot.envelope import RaftMeta


def raft_meta(raft_data: Any) -> RaftMeta:
    """pysyncobj's part of a snapshot, (last entry, entry before it, cluster
    as a set of nodes), as plain values."""
    last, prev, cluster = raft_data
    members = sorted(str(getattr(n, "address", n)) for n in cluster)
    return RaftMeta(_entry(last), _entry(prev), tuple(members))


def _entry(e: Any) -> tuple[bytes, int, int]:
    return bytes(e[0]), int(e[1]), int(e[2])


def pysyncobj_raft_data(meta: RaftMeta) -> tuple[Any, Any, list[Any]]:
    """The tuple pysyncobj's loader takes, rebuilt from plain values."""
    return meta.last, meta.prev, [TCPNode(a) for a in meta.members]
