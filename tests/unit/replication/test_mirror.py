"""The confirm gate (node/replication/mirror.py) folded over sequences of
RaftViews, one test per rule M1-M7 of its docstring and docs/ARCHITECTURE.md,
and the scenarios of issue 12: a follower that never flushes, a leader change
with held effects, an in-sync member that dies, a member that comes back."""
from __future__ import annotations

from collections.abc import Iterable

from node.replication import in_sync, mirror
from node.replication.command import MarkInSync, MarkOutOfSync, NodeDown
from node.replication.view import RaftView
from tests.support.view import view


def fold(views: Iterable[RaftView], held: list[int], gate: mirror.Gate | None = None
         ) -> tuple[mirror.Gate, list[list[int]], list[int | None]]:
    """Fold views through the gate; `held` are the log indices of held effects.
    Returns the final gate, what left at each tick, and each tick's announcement."""
    gate = gate or mirror.Gate()
    left: list[list[int]] = []
    announced: list[int | None] = []
    for v in views:
        step = mirror.step(gate, v)
        gate = step.gate
        n = mirror.release_count(held, gate.released)
        left.append(held[:n])
        del held[:n]
        announced.append(step.announce)
    return gate, left, announced


def test_m1_leader_waits_for_the_slowest_in_sync_follower() -> None:
    v = view(commit=10, peers={"n2": {"match": 10}, "n3": {"match": 7}})
    assert mirror.mirrored_index(v) == 7


def test_m1_leader_waits_for_its_own_flush() -> None:
    assert mirror.mirrored_index(view(commit=10, flushed=6)) == 6


def test_m1_a_follower_that_never_flushes_holds_every_confirm() -> None:
    """n3 acknowledges nothing (its acks wait for a flush that never comes):
    a majority commits, yet nothing leaves while n3 is in the in-sync set."""
    held = [1, 2, 3, 4, 5]
    views = [view(now=t * 0.02, commit=min(5, t), peers={"n3": {"match": 0, "reply": t * 0.02}})
             for t in range(1, 50)]
    gate, left, _ = fold(views, held)
    assert gate.released == 0 and not any(left) and held == [1, 2, 3, 4, 5]


def test_m1_an_out_of_sync_member_does_not_hold_confirms() -> None:
    v = view(commit=10, in_sync=("n1", "n2"), peers={"n3": {"match": 0}})
    assert mirror.mirrored_index(v) == 10


def test_m2_before_the_in_sync_set_exists_every_follower_counts() -> None:
    v = view(commit=10, in_sync=(), peers={"n3": {"match": 4}})
    assert mirror.mirrored_index(v) == 4


def test_m3_follower_releases_what_the_leader_announced_and_it_applied() -> None:
    assert mirror.mirrored_index(view(leader=False, commit=10, applied=8, told=9)) == 8
    assert mirror.mirrored_index(view(leader=False, commit=10, applied=10, told=9)) == 9
    _, left, announced = fold([view(leader=False, commit=10, applied=10, told=9)], [8, 9, 10])
    assert left == [[8, 9]] and announced == [None]  # followers announce nothing


def test_m4_a_leader_change_keeps_what_left_and_holds_the_rest() -> None:
    """Old leader: 10 mirrored. This node becomes leader; its match indexes
    start at 0: the effects of 11 and 12 wait until both followers hold them."""
    held = [9, 10, 11, 12]
    follower = view(now=0.0, leader=False, commit=10, told=10)
    new_leader_fresh = view(now=0.1, commit=12, peers={"n2": {"match": 0}, "n3": {"match": 0}})
    one_caught_up = view(now=0.2, commit=12, peers={"n2": {"match": 12}, "n3": {"match": 0}})
    both = view(now=0.3, commit=12)
    gate, left, _ = fold([follower, new_leader_fresh, one_caught_up, both], held)
    assert left == [[9, 10], [], [], [11, 12]]
    assert gate.released == 12


def test_m5_effects_leave_in_log_order() -> None:
    assert mirror.release_count([3, 5, 9], 6) == 2
    assert mirror.release_count([3, 5, 9], 2) == 0
    assert mirror.release_count([], 100) == 0


def test_m6_leader_announces_on_change_and_periodically() -> None:
    views = [view(now=0.00, commit=5), view(now=0.05, commit=5), view(now=0.12, commit=5),
             view(now=0.13, commit=6)]
    _, _, announced = fold(views, [])
    assert announced == [5, None, 5, 6]


def test_m7_an_in_sync_member_that_dies_holds_confirms_until_it_is_marked_out() -> None:
    """n3's link breaks: the planner proposes MarkOutOfSync at once; the gate
    waits for it until the change is applied (then n3 no longer counts)."""
    planner = in_sync.Planner()
    gate = mirror.Gate()
    held = [11]
    dead = {"n3": {"match": 10, "lost": True, "connected": False}}
    t0 = view(now=1.0, commit=11, peers=dead)
    planner, cmds = in_sync.plan(planner, t0, bound=5.0)
    assert [(type(c), c.node) for c in cmds] == [  # type: ignore[union-attr]
        (MarkOutOfSync, "n3"), (NodeDown, "n3")]
    gate, left, _ = fold([t0], held, gate)
    assert left == [[]]  # the change is not applied yet: still waiting for n3
    applied = view(now=1.02, commit=12, in_sync=("n1", "n2"), peers=dead)
    gate, left, _ = fold([applied], held, gate)
    assert left == [[11]]


def test_a_member_that_comes_back_counts_again_once_marked_in_sync() -> None:
    planner = in_sync.Planner()
    out_of_sync = ("n1", "n2")
    behind = view(now=1.0, commit=20, in_sync=out_of_sync, peers={"n3": {"match": 12}})
    planner, cmds = in_sync.plan(planner, behind, bound=5.0)
    assert cmds == []  # linked but behind: not yet
    caught_up = view(now=1.1, commit=20, in_sync=out_of_sync, peers={"n3": {"match": 20}})
    planner, cmds = in_sync.plan(planner, caught_up, bound=5.0)
    assert [(type(c), c.node) for c in cmds] == [(MarkInSync, "n3")]  # type: ignore[union-attr]
    # applied: the gate waits for n3 again
    after = view(now=1.2, commit=22, peers={"n3": {"match": 20}})
    assert mirror.mirrored_index(after) == 20
