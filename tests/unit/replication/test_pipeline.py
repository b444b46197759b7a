"""The proposal pipeline (node/replication/pipeline.py): commands, outcomes
and watch ticks folded through it; one test per rule P1-P5."""
from __future__ import annotations

from node.broker.ids import ChanId, NodeId
from node.replication.command import BasicAck, BasicPublish, Tick
from node.replication.effect import Confirm
from node.replication.pipeline import Flush, Limits, Pipeline

CH = ChanId("n1", 1, 1)


def publish(seq: int) -> BasicPublish:
    return BasicPublish(CH, seq, "", "q", None, b"x", False)  # type: ignore[call-arg]


def make(**kw: float) -> Pipeline:
    return Pipeline(NodeId("n1"), 7, Limits(**kw))  # type: ignore[arg-type]


def test_p1_full_batches_cut_at_once_else_soon_else_linger() -> None:
    p = make(batch_max_commands=3, linger_after=1)
    assert p.add(Tick(), 0) is Flush.SOON  # nothing in flight: go now (latency)
    assert p.add(Tick(), 0) is Flush.NONE  # already due
    assert p.add(Tick(), 0) is Flush.NOW  # full
    batch = p.cut(0.0, 100.0)
    assert batch is not None and len(batch.commands) == 3 and batch.seq == 1 and batch.now == 100.0
    assert p.add(Tick(), 0) is Flush.LINGER  # one in flight: coalesce
    p2 = make(batch_max_bytes=10)
    assert p2.add(Tick(), 11) is Flush.NOW


def test_p2_a_failed_batch_is_resent_with_everything_after_it_in_order() -> None:
    p = make()
    seqs = []
    for i in range(3):
        p.add(BasicAck(CH, i + 1, False), 0)
        b = p.cut(0.0, 0.0)
        assert b is not None
        seqs.append(b.seq)
    assert p.outcome(1, True, 0.1) is False
    assert p.outcome(3, False, 0.1) is True  # resend due
    assert p.outcome(2, False, 0.1) is False  # already due; now from 2
    p.add(Tick(), 0)
    assert p.cut(0.1, 0.0) is None  # waits behind the resend (order)
    again = p.resend(0.2)
    assert [b.seq for b in again] == [2, 3, 4]
    assert p.resends == 3


def test_p3_no_outcome_and_no_progress_resends_and_reports_stuck() -> None:
    p = make(block_after=2.0)
    p.add(Tick(), 0)
    assert p.cut(0.0, 0.0) is not None
    w = p.watch(1.0)
    assert not w.stuck and not w.resend
    w = p.watch(2.5)
    assert w.stuck and w.resend
    assert [b.seq for b in p.resend(2.5)] == [1]
    w = p.watch(3.0)  # resent half a second ago: not again yet
    assert w.stuck and not w.resend
    assert p.outcome(1, True, 3.1) is False
    assert not p.watch(3.2).stuck


def test_p3_progress_elsewhere_is_not_stuck() -> None:
    p = make(block_after=2.0)
    for _ in range(2):
        p.add(Tick(), 0)
        p.cut(0.0, 0.0)
    p.outcome(2, True, 2.4)  # the log moves: a full pipeline drains slowly, no resend
    assert not p.watch(2.5).stuck


def test_p4_unsafe_publishes_are_nacked_once_and_stay_abandoned() -> None:
    p = make(nack_after=10.0)
    p.add(publish(1), 1)
    p.add(publish(0), 1)  # no confirm wanted: never nacked
    p.add(publish(2), 1)
    assert p.cut(0.0, 0.0) is not None
    assert p.watch(9.0).nacks == []
    assert p.watch(10.5).nacks == [Confirm(CH, 1, False), Confirm(CH, 2, False)]
    assert p.watch(11.0).nacks == []
    assert p.nacked_publishes == 2
    p.outcome(1, True, 12.0)  # the batch made it after all
    assert p.abandoned(1)  # its late confirms must be dropped (S15)


def test_p5_congestion_starts_over_the_bound_and_ends_below_half() -> None:
    p = make(max_inflight_batches=4)
    for _ in range(5):
        p.add(Tick(), 0)
        p.cut(0.0, 0.0)
    assert p.congested
    p.outcome(1, True, 0.1)
    p.outcome(2, True, 0.1)
    assert not p.relieved() and p.congested
    p.outcome(3, True, 0.1)
    assert p.relieved() and not p.congested
    assert not p.relieved()  # once
