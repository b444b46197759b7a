"""RaftView builders for folding the pure replication planners over ticks."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from node.broker.ids import NodeId
from node.replication.view import PeerView, RaftView

ME = NodeId("n1")
MEMBERS = (NodeId("n1"), NodeId("n2"), NodeId("n3"))


def peer(member: str, match: int = 0, reply: float = 0.0, connected: bool = True,
         lost: bool = False) -> PeerView:
    return PeerView(f"h:{member}", NodeId(member), match, reply, connected, lost)


def view(now: float = 0.0, *, leader: bool = True, commit: int = 0, applied: int | None = None,
         flushed: int | None = None, told: int = 0, members: tuple[str, ...] = MEMBERS,
         in_sync: tuple[str, ...] | None = None, draining: tuple[str, ...] = (),
         peers: dict[str, dict[str, Any]] | None = None, ready: bool = True, me: str = ME) -> RaftView:
    """`peers`: member -> PeerView fields (match, reply, connected, lost); every
    other member is a healthy peer that holds everything and answered now."""
    peers = peers or {}
    views = []
    for m in members:
        if m == me:
            continue
        fields = {"match": commit, "reply": now, **peers.get(m, {})}
        views.append(peer(m, **fields))
    return RaftView(now=now, me=NodeId(me), leader=leader, ready=ready, term=1, commit_index=commit,
                    last_applied=commit if applied is None else applied,
                    flushed_index=commit if flushed is None else flushed, told_mirrored=told,
                    members=tuple((NodeId(m), f"h:{m}") for m in members),
                    in_sync=tuple(NodeId(m) for m in (members if in_sync is None else in_sync)),
                    draining=tuple(NodeId(m) for m in draining), peers=tuple(views))


def at(v: RaftView, now: float) -> RaftView:
    return replace(v, now=now)
