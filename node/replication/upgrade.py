"""When the leader raises the cluster's machine version (pure; Ra's model).

Every member tells the leader the machine version its build runs, on each
AppendEntries answer (raft/broker_transport.py: "mq_machine"; a build before machine
versions sends none and counts as version 1; a member is unknown from a
broken link until its next answer). The leader appends SetMachineVersion(v),
v the lowest version any member of the Raft configuration runs (itself
included), once v is above the replicated one: so new apply behaviour starts
only when no member would apply the log the old way, and at one index on
every member (node/replication/machine/version.py).

U1 only the leader plans; U2 every other member must have answered since its
link came up (an unknown version holds the version where it is); U3 never
lower (apply ignores a lower one too); U4 the same proposal at most once a
second (it is in the log, or the leader changed, by then).
"""
from __future__ import annotations

from dataclasses import dataclass

from node.replication.command import SetMachineVersion
from node.replication.view import RaftView

REPEAT_AFTER = 1.0  # s between two identical proposals (U4)


@dataclass(frozen=True, slots=True)
class Planner:
    proposed: int = 0  # the version last proposed
    at: float = float("-inf")  # and when


def target(view: RaftView, current: int, runs: int) -> int | None:
    """The version the cluster can run now, if it is above `current`."""
    if not view.leader:
        return None  # U1
    lowest = runs
    for p in view.peers:
        if p.machine_version < 1:
            return None  # U2
        lowest = min(lowest, p.machine_version)
    return lowest if lowest > current else None  # U3


def plan(planner: Planner, view: RaftView, current: int,
         runs: int) -> tuple[Planner, SetMachineVersion | None]:
    """`current`: the replicated machine version as applied here; `runs`: this build's."""
    v = target(view, current, runs)
    if v is None:
        return planner, None
    if v == planner.proposed and view.now - planner.at < REPEAT_AFTER:
        return planner, None  # U4
    return Planner(v, view.now), SetMachineVersion(v)
