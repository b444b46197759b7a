"""The confirm gate (pure): which held effects may leave this node now.

An effect of applying log entry i (a confirm, a reply, a delivery) is held
until i is *mirrored*: committed, applied here, and on the disk of every
member of the replicated in-sync set. The rules, each tested on its own in
tests/unit/replication/test_mirror.py and listed in docs/ARCHITECTURE.md:

M1 leader: mirrored = min(commit index, own flushed index, match index of
   every in-sync follower); a follower's acks are held until its flush, so
   its match index counts only entries on its disk.
M2 before the in-sync set exists (a new cluster), every follower counts.
M3 follower: mirrored = min(what the leader last announced, own last applied).
M4 the released index never goes back (a new leader's match indexes start
   at 0: what left stays left, what is held waits for the new leader).
M5 effects leave in log order: the held prefix whose index <= released.
M6 the leader announces its mirrored index when it changes, else at least
   every `reannounce` seconds (a follower that missed one learns it).
M7 a member leaves the set only through a committed MarkOutOfSync
   (in_sync.py), so the gate waits for it until that change is applied.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from node.replication.view import PeerView, RaftView

REANNOUNCE = 0.1  # seconds


@dataclass(frozen=True, slots=True)
class Gate:
    released: int = 0  # effects of entries up to here have left (or may leave) this node
    announced: int = -1  # leader: the mirrored index last sent to the followers
    announced_at: float = 0.0


@dataclass(frozen=True, slots=True)
class GateStep:
    gate: Gate
    announce: int | None  # leader: send this mirrored index to every follower now


def required(view: RaftView) -> tuple[PeerView, ...]:
    """The followers whose disks a confirm waits for (M1, M2, M7)."""
    if not view.in_sync:
        return view.peers
    in_sync = set(view.in_sync)
    return tuple(p for p in view.peers if p.member is not None and p.member in in_sync)


def mirrored_index(view: RaftView) -> int:
    if not view.leader:
        return min(view.told_mirrored, view.last_applied)  # M3
    upto = min(view.commit_index, view.flushed_index)
    for p in required(view):
        upto = min(upto, p.match_index)
    return upto


def step(gate: Gate, view: RaftView, reannounce: float = REANNOUNCE) -> GateStep:
    upto = mirrored_index(view)
    released = max(gate.released, upto)  # M4
    announce = None
    if view.leader and (upto != gate.announced or view.now - gate.announced_at >= reannounce):
        announce = upto  # M6
    if released == gate.released and announce is None:
        return GateStep(gate, None)
    if announce is None:
        return GateStep(Gate(released, gate.announced, gate.announced_at), None)
    return GateStep(Gate(released, announce, view.now), announce)


def release_count(held_indices: Iterable[int], released: int) -> int:
    """How many held entries (in log order) may leave (M5)."""
    n = 0
    for index in held_indices:
        if index > released:
            break
        n += 1
    return n
