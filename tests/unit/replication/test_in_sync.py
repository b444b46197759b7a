"""The in-sync planner (node/replication/in_sync.py) folded over RaftViews:
one test per rule I1-I9 of its docstring and docs/ARCHITECTURE.md."""
from __future__ import annotations

from collections.abc import Iterable

from node.replication import in_sync
from node.replication.command import Command, SetMember
from node.replication.view import RaftView
from tests.support.view import view

BOUND = 5.0


def fold(views: Iterable[RaftView], planner: in_sync.Planner | None = None,
         bootstrap: tuple[Command, ...] = ()) -> tuple[in_sync.Planner, list[list[str]]]:
    """Each tick's commands as "Kind(node)" strings (NamedTuples of equal
    fields compare equal across kinds: MarkOutOfSync("n2") == NodeDown("n2"))."""
    planner = planner or in_sync.Planner()
    out = []
    for v in views:
        planner, cmds = in_sync.plan(planner, v, BOUND, bootstrap)
        out.append([show(c) for c in cmds])
    return planner, out


def show(cmd: Command) -> str:
    return f"{type(cmd).__name__}({cmd[0]})"


OUT2, OUT3, IN3, DOWN3 = "MarkOutOfSync(n2)", "MarkOutOfSync(n3)", "MarkInSync(n3)", "NodeDown(n3)"


def test_i1_a_follower_plans_nothing_and_forgets_its_clocks() -> None:
    lagging = {"n3": {"match": 0}}
    planner, out = fold([view(now=0.0, commit=10, peers=lagging)])
    assert planner.lag  # the leader's clock for n3 started
    planner, out = fold([view(now=9.0, leader=False, commit=10, peers=lagging)], planner)
    assert out == [[]] and not planner.lag
    # leading again: the lag clock starts afresh, not from t=0
    _, out = fold([view(now=10.0, commit=10, peers=lagging)], planner)
    assert out == [[]]


def test_i2_bootstrap_once_by_the_first_leader() -> None:
    boot = (SetMember("n1", "h:n1", True),)
    _, out = fold([view(members=(), ready=False), view(members=()), view(members=())], bootstrap=boot)
    assert out == [[], [show(boot[0])], []]


def test_i3_a_broken_link_marks_out_of_sync_and_declares_down_at_once() -> None:
    lost = {"n2": {"lost": True, "connected": False}}
    _, out = fold([view(now=t, commit=3, peers=lost) for t in (0.0, 0.5)]
                  + [view(now=1.0, commit=3), view(now=2.0, commit=3, peers=lost)])
    # down once while lost; again after it linked and broke again
    assert out == [[OUT2, "NodeDown(n2)"], [], [], [OUT2, "NodeDown(n2)"]]


def test_i3_a_connected_member_is_not_lost() -> None:
    _, out = fold([view(now=t, commit=3) for t in (0.0, 1.0, 6.0)])
    assert out == [[], [], []]


def test_i4_silence_past_the_bound_marks_out_and_declares_down_once() -> None:
    silent = {"n3": {"reply": 0.0}}
    views = [view(now=t, commit=0, peers=silent) for t in (1.0, 4.9, 5.1, 6.5, 9.0)]
    _, out = fold(views)
    assert out[:2] == [[], []]
    assert out[2] == [OUT3, DOWN3]
    assert DOWN3 not in out[3] + out[4]  # once per silence
    # it answers again, then falls silent again: declared down again
    _, out = fold([view(now=10.0, commit=0, peers={"n3": {"reply": 10.0}}),
                   view(now=16.0, commit=0, peers={"n3": {"reply": 10.0}})])
    assert DOWN3 in out[1]


def test_i5_a_member_that_does_not_catch_up_within_the_bound_is_marked_out() -> None:
    # it answers, but never reaches the commit index of t=0
    views = [view(now=t, commit=int(10 * t) + 1, peers={"n2": {"match": 0}}) for t in (0.0, 2.0, 4.0, 5.5)]
    _, out = fold(views)
    assert out == [[], [], [], [OUT2]]


def test_i5_a_member_that_keeps_up_under_load_stays_in() -> None:
    # always a little behind the commit index, but it reaches each target
    views = [view(now=t / 10, commit=t * 100, peers={"n2": {"match": t * 100 - 50}}) for t in range(100)]
    _, out = fold(views)
    assert not any(out)


def test_i6_a_draining_member_is_marked_out() -> None:
    _, out = fold([view(commit=1, draining=("n2",))])
    assert out == [[OUT2]]


def test_i7_an_out_of_sync_member_that_caught_up_is_marked_in() -> None:
    base = {"members": ("n1", "n2", "n3"), "in_sync": ("n1", "n2")}
    _, out = fold([view(now=0.0, commit=9, peers={"n3": {"match": 8}}, **base),  # behind
                   view(now=0.1, commit=9, peers={"n3": {"match": 9, "lost": True}}, **base),
                   view(now=0.2, commit=9, draining=("n3",), **base),
                   view(now=0.3, commit=9, **base)])
    assert out == [[], [DOWN3], [], [IN3]]  # the broken link: declared down (I3)


def test_i8_never_below_a_majority() -> None:
    both_dead = {"n2": {"lost": True}, "n3": {"lost": True}}
    _, out = fold([view(now=0.0, commit=1, peers=both_dead)])
    assert out == [[OUT2, "NodeDown(n2)", DOWN3]]  # n1 + n3 remain: a majority of 3
    _, out = fold([view(now=0.0, commit=1, in_sync=("n1", "n3"), peers=both_dead)])
    assert out == [["NodeDown(n2)", DOWN3]]


def test_i9_repeated_at_most_once_per_second_until_applied() -> None:
    lost = {"n2": {"lost": True}}
    _, out = fold([view(now=t, commit=1, peers=lost) for t in (0.0, 0.5, 0.99, 1.0, 1.5, 2.1)])
    # MarkOutOfSync again each second; NodeDown once (with the first)
    assert [len(c) for c in out] == [2, 0, 0, 1, 0, 1]
