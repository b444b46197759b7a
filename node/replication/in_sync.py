"""The in-sync planner (pure): which membership bookkeeping the leader proposes.

Folded once per Raft tick over a RaftView; returns the new planner state and
the commands to propose. The rules, each tested in tests/unit/replication/test_in_sync.py
and listed in docs/ARCHITECTURE.md:

I1 only the leader plans; a node that is not leading forgets its clocks, so a
   new leader starts every member's lag clock afresh.
I2 a new cluster (no members recorded yet): the leader proposes the
   bootstrap commands once (members, all in sync, and the seed users).
I3 an in-sync member whose Raft link broke (reset, EOF, connect refused: its
   process is gone or restarting) is marked out of sync at once, and the
   member is declared down at once (NodeDown, once until it links again), as
   RabbitMQ acts on a node's broken distribution link: its clients' exclusive
   queues go and its consumers' deliveries return without waiting for the
   bound (a Celery worker redeclaring its exclusive queue elsewhere got 405).
I4 an in-sync member silent for longer than the bound is marked out of
   sync; a member silent that long is also declared down (NodeDown, once per
   silence).
I5 an in-sync member that has not reached, within the bound, the commit
   index of the bound's start is marked out of sync (lagging).
I6 a draining member is marked out of sync.
I7 an out-of-sync member that is linked, answering, not draining and holds
   everything committed is marked in sync again.
I8 never below a majority: no MarkOutOfSync that would leave fewer in sync
   than a majority of the members (apply refuses it too).
I9 a command for the same member and kind is proposed again only after
   `repeat_after` seconds (the view shows the old set until it applies).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from node.broker.ids import NodeId
from node.replication.command import Command, MarkInSync, MarkOutOfSync, NodeDown
from node.replication.view import RaftView


@dataclass(frozen=True, slots=True)
class Lag:
    target: int  # the commit index the member must reach ...
    since: float  # ... counted from here


@dataclass(frozen=True, slots=True)
class Planner:
    lag: Mapping[NodeId, Lag] = field(default_factory=dict)
    proposed: Mapping[tuple[str, NodeId], float] = field(default_factory=dict)
    down: frozenset[NodeId] = frozenset()  # declared down, silent since
    bootstrapped: bool = False


def plan(planner: Planner, view: RaftView, bound: float, bootstrap: Sequence[Command] = (),
         repeat_after: float = 1.0) -> tuple[Planner, list[Command]]:
    if not view.leader:  # I1
        if planner.lag or planner.proposed or planner.down:
            return Planner(bootstrapped=planner.bootstrapped), []
        return planner, []
    now = view.now
    if not view.members:  # I2
        if planner.bootstrapped or not view.ready or not bootstrap:
            return planner, []
        return Planner(bootstrapped=True), list(bootstrap)
    in_sync = set(view.in_sync)
    draining = set(view.draining)
    majority = len(view.members) // 2 + 1
    remaining = len(in_sync)
    lag = dict(planner.lag)
    down = set(planner.down)
    wanted: list[MarkOutOfSync | MarkInSync | NodeDown] = []
    for member, _address in view.members:
        if member == view.me:
            continue
        p = view.peer(member)
        if p is None:
            continue
        m = lag.get(member)
        if m is None or p.match_index >= m.target:
            m = lag[member] = Lag(view.commit_index, now)
        silent = now - p.last_reply > bound
        lagging = now - m.since > bound
        if member in in_sync:
            if (p.lost or silent or lagging or member in draining) and remaining > majority:  # I3-I6, I8
                remaining -= 1
                wanted.append(MarkOutOfSync(member))
        elif p.connected and not p.lost and not silent and member not in draining \
                and p.match_index >= view.commit_index:  # I7
            wanted.append(MarkInSync(member))
        if (silent or p.lost) and member not in down:
            down.add(member)
            wanted.append(NodeDown(member))  # I3, I4
        elif not silent and not p.lost:
            down.discard(member)
    proposed = dict(planner.proposed)
    out: list[Command] = []
    for cmd in wanted:
        key = (type(cmd).__name__, NodeId(cmd.node))
        if now - proposed.get(key, float("-inf")) >= repeat_after or isinstance(cmd, NodeDown):  # I9
            proposed[key] = now
            out.append(cmd)
    return Planner(lag, proposed, frozenset(down), planner.bootstrapped), out
