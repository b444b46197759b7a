"""upgrade.plan (U1-U4): the leader raises the cluster's machine version to
the lowest one any member runs, once every member has told it, never lower,
and repeats a proposal at most once a second."""
from __future__ import annotations

from dataclasses import replace

from node.replication.command import SetMachineVersion
from node.replication.upgrade import Planner, plan
from node.replication.view import RaftView
from tests.support.view import view


def versions(v: RaftView, **runs: int) -> RaftView:
    """Each other member's reported machine version (absent: not heard: 0)."""
    return replace(v, peers=tuple(replace(p, machine_version=runs.get(str(p.member), 0))
                                  for p in v.peers))


def test_u1_only_the_leader_plans() -> None:
    _, cmd = plan(Planner(), versions(view(leader=False), n2=2, n3=2), current=1, runs=2)
    assert cmd is None


def test_every_member_at_the_new_version_raises_it() -> None:
    _, cmd = plan(Planner(), versions(view(), n2=2, n3=2), current=1, runs=2)
    assert cmd == SetMachineVersion(2)


def test_u2_one_member_older_or_unheard_holds_the_version() -> None:
    assert plan(Planner(), versions(view(), n2=2, n3=1), current=1, runs=2)[1] is None
    assert plan(Planner(), versions(view(), n2=2), current=1, runs=2)[1] is None
    # the leader itself counts: a leader of the older build holds it too
    assert plan(Planner(), versions(view(), n2=2, n3=2), current=1, runs=1)[1] is None


def test_the_lowest_version_any_member_runs_is_proposed() -> None:
    _, cmd = plan(Planner(), versions(view(), n2=3, n3=2), current=1, runs=3)
    assert cmd == SetMachineVersion(2)


def test_u3_never_lower_nor_the_same() -> None:
    assert plan(Planner(), versions(view(), n2=2, n3=2), current=2, runs=2)[1] is None
    assert plan(Planner(), versions(view(), n2=1, n3=1), current=2, runs=2)[1] is None


def test_u4_the_same_proposal_at_most_once_a_second() -> None:
    p, cmd = plan(Planner(), versions(view(0.0), n2=2, n3=2), current=1, runs=2)
    assert cmd is not None
    p2, cmd = plan(p, versions(view(0.5), n2=2, n3=2), current=1, runs=2)
    assert cmd is None and p2 == p
    _, cmd = plan(p, versions(view(1.0), n2=2, n3=2), current=1, runs=2)
    assert cmd == SetMachineVersion(2)  # not applied yet (lost with a leader change?): again


def test_a_single_node_raises_its_own_version() -> None:
    _, cmd = plan(Planner(), view(members=("n1",)), current=1, runs=2)
    assert cmd == SetMachineVersion(2)
