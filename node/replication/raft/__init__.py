"""Raft for the broker over pysyncobj: the only package that imports pysyncobj.

shim.py       RaftShim (what raft_node.RaftNode drives), the SyncObj subclass, the tick
election.py   PreVote, fast election, term notice, startup grace (a mixin of RaftShim)
log/          the Raft log on disk: checksummed segments, recovery, the term/vote meta file
data_dir.py   the data dir is private: directories 0700, files 0600
snapshot/     snapshots: the file format (no pickle), the forked writer, sending,
              receiving and loading them (SnapshotMixin, a mixin of RaftShim)
compaction.py the snapshots the shim forces: log size, pinned segments, stop (a mixin of RaftShim)
replicator.py the leader's flow-controlled AppendEntries and snapshot sending (base of the SyncObj)
messages.py   our own Raft messages (mirrored index, PreVote, term notice)
link/         authenticated peer links under pysyncobj's TCPTransport
broker_transport.py  the shim's part of the transport: held acks, our messages, lost links
"""
from __future__ import annotations

from node.replication.raft.link.security import PeerSecurity, tls_contexts
from node.replication.raft.shim import RaftShim, clock

__all__ = ["PeerSecurity", "RaftShim", "clock", "tls_contexts"]
