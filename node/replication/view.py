"""What the pure planners see of Raft: one immutable view per tick.

The shim (raft/shim.py) fills a RaftView once per Raft tick from pysyncobj's
state and the transport's links, and hands it to mirror.py and in_sync.py.
Time is in the view (pysyncobj's clock), so the planners never read one.
"""
from __future__ import annotations

from dataclasses import dataclass

from node.broker.ids import NodeId


@dataclass(frozen=True, slots=True)
class PeerView:
    """One other Raft member as the leader's (or a follower's) tick sees it."""

    address: str
    member: NodeId | None  # its member id in the replicated state, if recorded
    match_index: int  # leader: highest index it holds on disk (acks are held until its flush)
    last_reply: float  # leader: when it last answered (pysyncobj's clock)
    connected: bool  # a live, authenticated peer link
    lost: bool  # the link broke (reset, EOF, connect refused) and has not come back since
    # the machine version its build runs, as it last told us (on AppendEntries
    # answers; 0: not heard since its link came up)
    machine_version: int = 0


@dataclass(frozen=True, slots=True)
class RaftView:
    now: float
    me: NodeId
    leader: bool  # this node leads (the planners act only then)
    ready: bool  # the log is loaded and a leader is known
    term: int
    commit_index: int
    last_applied: int
    flushed_index: int  # highest log index on this node's disk
    told_mirrored: int  # follower: the mirrored index the leader last sent
    members: tuple[tuple[NodeId, str], ...]  # replicated members: (id, raft address), in order
    in_sync: tuple[NodeId, ...]  # the replicated in-sync set (as applied here)
    draining: tuple[NodeId, ...]
    peers: tuple[PeerView, ...]  # every other Raft node

    def peer(self, member: NodeId) -> PeerView | None:
        for p in self.peers:
            if p.member == member:
                return p
        return None
