"""Issue 14's queue features, folded through apply_batch: priority queues,
single active consumer, consumer priorities and the delivery limit.

Each is replicated state: the tests also fold the same batches into a second
replica and compare, and take a snapshot (written and read back) midway where order matters.
"""
from __future__ import annotations

from typing import Any

from node.broker.ids import ChanId
from node.replication.command import (
    BasicCancel,
    BasicConsume,
    BasicQos,
    ChannelClose,
    ChannelOpen,
    ExchangeDeclare,
    NodeDown,
)
from node.replication.effect import ChannelError, Effect
from node.replication.machine import apply_batch, default_state
from tests.support.machine import (
    Harness,
    ack,
    chan,
    consume,
    delivers,
    get,
    gets,
    nack,
    pub,
    qbind,
    qdecl,
    reject,
)
from tests.support.snapshot import snapshot_copy


def consume_args(c: ChanId, q: str, tag: str, arguments: dict[str, Any],
                 no_ack: bool = False) -> BasicConsume:
    return BasicConsume(c, q, tag, False, no_ack, False, arguments, False, 1000)


def errors(fx: list[Effect]) -> list[ChannelError]:
    return [e for e in fx if isinstance(e, ChannelError)]


def prio(p: int | None) -> dict[str, Any]:
    return {} if p is None else {"priority": p}


def replay(h: Harness) -> list[Effect]:
    """Fold every batch `h` applied into a fresh replica; return its effects."""
    s = default_state()
    out: list[Effect] = []
    for b in h.batches:
        out.extend(apply_batch(s, b))
    return out


# -- priority queues ------------------------------------------------------------

def test_priority_queue_delivers_higher_priority_first_fifo_within_a_priority() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "pq", arguments={"x-max-priority": 10}))
    order = [(b"a", 1), (b"b", 5), (b"c", None), (b"d", 5), (b"e", 10), (b"f", 1)]
    h.run(*[pub(c, "pq", body, props=prio(p)) for body, p in order])
    fx = h.run(*[get(c, "pq", no_ack=True) for _ in order])
    assert [g.body for g in gets(fx)] == [b"e", b"b", b"d", b"a", b"f", b"c"]


def test_priority_above_the_maximum_counts_as_the_maximum() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "pq", arguments={"x-max-priority": 3}))
    # 200 > 3 counts as 3, so FIFO with the 3 published before it
    h.run(pub(c, "pq", b"low", props=prio(0)), pub(c, "pq", b"three", props=prio(3)),
          pub(c, "pq", b"huge", props=prio(200)), pub(c, "pq", b"two", props=prio(2)))
    fx = h.run(*[get(c, "pq", no_ack=True) for _ in range(4)])
    assert [g.body for g in gets(fx)] == [b"three", b"huge", b"two", b"low"]


def test_priority_is_ignored_without_x_max_priority() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "q"))
    h.run(pub(c, "q", b"1", props=prio(1)), pub(c, "q", b"2", props=prio(9)))
    fx = h.run(get(c, "q", no_ack=True), get(c, "q", no_ack=True))
    assert [g.body for g in gets(fx)] == [b"1", b"2"]


def test_requeue_keeps_priority_and_position_across_a_snapshot() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "pq", arguments={"x-max-priority": 5}))
    h.run(*[pub(c, "pq", f"{p}-{i}".encode(), props=prio(p)) for i in range(3) for p in (1, 5)])
    # take three (5-0, 5-1, 5-2), then the queue holds 1-0 1-1 1-2
    fx = h.run(*[get(c, "pq") for _ in range(3)])
    assert [g.body for g in gets(fx)] == [b"5-0", b"5-1", b"5-2"]
    tags = [g.delivery_tag for g in gets(fx)]
    h.run(nack(c, tags[1]), nack(c, tags[0]))  # out of order on purpose
    # a snapshot taken now restores the same order
    h.state = snapshot_copy(h.state)
    h.run(pub(c, "pq", b"5-late", props=prio(5)))
    fx = h.run(*[get(c, "pq", no_ack=True) for _ in range(5)])
    got = gets(fx)
    assert [g.body for g in got] == [b"5-0", b"5-1", b"5-late", b"1-0", b"1-1"]
    assert [g.redelivered for g in got] == [True, True, False, False, False]


def test_priority_queue_order_with_a_waiting_consumer_and_prefetch() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "pq", arguments={"x-max-priority": 9}), BasicQos(c, 1, False))
    h.run(consume(c, "pq", tag="t"))
    # the first goes straight to the consumer; the rest wait for its ack
    fx = h.run(*[pub(c, "pq", str(p).encode(), props=prio(p)) for p in (1, 2, 9, 4)])
    first = delivers(fx)
    assert [d.body for d in first] == [b"1"]
    seen = []
    tag = first[0].delivery_tag
    for _ in range(3):
        d = delivers(h.run(ack(c, tag)))
        assert len(d) == 1
        seen.append(d[0].body)
        tag = d[0].delivery_tag
    assert seen == [b"9", b"4", b"2"]


def test_x_max_priority_is_validated_like_rabbitmq() -> None:
    h = Harness()
    c = h.open(chan())
    fx = h.run(qdecl(c, "pq", arguments={"x-max-priority": 256}))
    assert [(e.reply_code, e.reply_text) for e in errors(fx)] == [
        (406, "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'pq' in vhost "
              "'/': {max_value_exceeded,256}")]
    c2 = h.open(chan(2))
    fx = h.run(qdecl(c2, "pq", arguments={"x-max-priority": -1}))
    assert errors(fx)[0].reply_code == 406
    c3 = h.open(chan(3))
    h.run(qdecl(c3, "pq", arguments={"x-max-priority": 255}))
    fx = h.run(qdecl(c3, "pq", arguments={"x-max-priority": 10}))
    assert "inequivalent arg 'x-max-priority'" in errors(fx)[0].reply_text


# -- single active consumer -------------------------------------------------------

def sac_setup(h: Harness, *chans: ChanId, prefetch: int = 0) -> None:
    for c in chans:
        h.open(c)
        if prefetch:
            h.run(BasicQos(c, prefetch, False))
    h.run(qdecl(chans[0], "sac", durable=True,
                arguments={"x-single-active-consumer": True, "x-queue-type": "quorum"}))


def test_single_active_consumer_only_the_first_registered_consumer_receives() -> None:
    h = Harness()
    c1, c2 = chan(1, conn=1), chan(1, conn=2)
    sac_setup(h, c1, c2, prefetch=2)
    h.run(consume(c1, "sac", "a"), consume(c2, "sac", "b"))
    fx = h.run(*[pub(c1, "sac", str(i).encode()) for i in range(5)])
    # prefetch 2 blocks the active consumer; the waiting one still gets nothing
    assert [(d.consumer_tag, d.body) for d in delivers(fx)] == [("a", b"0"), ("a", b"1")]
    assert h.state.queues["sac"].ready_count() == 3


def test_single_active_consumer_next_takes_over_on_cancel_unacked_stay_with_the_channel() -> None:
    h = Harness()
    c1, c2 = chan(1, conn=1), chan(1, conn=2)
    sac_setup(h, c1, c2)
    h.run(consume(c1, "sac", "a"), consume(c2, "sac", "b"))
    fx = h.run(pub(c1, "sac", b"0"))
    [d0] = delivers(fx)
    assert d0.consumer_tag == "a"
    fx = h.run(BasicCancel(c1, "a", False))
    fx += h.run(pub(c1, "sac", b"1"))
    assert [(d.consumer_tag, d.body) for d in delivers(fx)] == [("b", b"1")]
    # as in RabbitMQ, a cancelled consumer's deliveries are still the channel's to ack
    assert errors(h.run(ack(c1, d0.delivery_tag))) == []


def test_single_active_consumer_takeover_on_channel_close_redelivers_in_order() -> None:
    h = Harness()
    c1, c2 = chan(1, conn=1), chan(1, conn=2)
    sac_setup(h, c1, c2, prefetch=3)
    h.run(consume(c1, "sac", "a"), consume(c2, "sac", "b"))
    h.run(*[pub(c1, "sac", str(i).encode()) for i in range(6)])
    fx = h.run(ChannelClose(c1, True))
    got = delivers(fx)
    assert [(d.consumer_tag, d.body, d.redelivered) for d in got] == [
        ("b", b"0", True), ("b", b"1", True), ("b", b"2", True)]
    assert got[0].props["headers"]["x-delivery-count"] == 1  # a quorum queue counts


def test_single_active_consumer_takeover_when_the_active_consumers_node_dies() -> None:
    h = Harness()
    c1, c2 = chan(1, conn=1, node="n2"), chan(1, conn=2, node="n3")
    for c in (c1, c2):
        h.run(ChannelOpen(c), node=c.node)
        h.run(BasicQos(c, 2, False), node=c.node)
    h.run(qdecl(c1, "sac", durable=True, arguments={"x-single-active-consumer": True}),
          node="n2")
    h.run(consume(c1, "sac", "a"), node="n2")
    h.run(consume(c2, "sac", "b"), node="n3")
    fx = h.run(*[pub(c2, "sac", str(i).encode()) for i in range(4)], node="n3")
    assert [d.consumer_tag for d in delivers(fx)] == ["a", "a"]
    fx = h.run(NodeDown("n2"), node="n1")
    got = delivers(fx)
    assert [(d.consumer_tag, d.body, d.redelivered) for d in got] == [
        ("b", b"0", True), ("b", b"1", True)]
    # a replica that folds the same batches makes the same decisions
    assert delivers(replay(h))[-2:] == got


def declare_ok_consumers(h: Harness, c: ChanId, q: str) -> int:
    fx = h.run(qdecl(c, q, passive=True))
    return int([e for e in fx if getattr(e, "method", "") == "Queue.DeclareOk"][0]
               .fields["consumer_count"])


def test_single_active_consumer_declare_ok_counts_as_rabbitmq_does() -> None:
    # RabbitMQ 3.10: a quorum queue reports the active consumer only, a classic one all
    h = Harness()
    c1, c2 = chan(1, conn=1), chan(1, conn=2)
    sac_setup(h, c1, c2)
    h.run(qdecl(c1, "csac", durable=True, arguments={"x-single-active-consumer": True}))
    h.run(consume(c1, "sac", "a"), consume(c2, "sac", "b"))
    h.run(consume(c1, "csac", "ca"), consume(c2, "csac", "cb"))
    assert declare_ok_consumers(h, c1, "sac") == 1
    assert declare_ok_consumers(h, c1, "csac") == 2


def test_x_single_active_consumer_must_be_a_bool() -> None:
    h = Harness()
    c = h.open(chan())
    fx = h.run(qdecl(c, "s", arguments={"x-single-active-consumer": "yes"}))
    assert [(e.reply_code, e.reply_text) for e in errors(fx)] == [
        (406, "PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue 's' in "
              "vhost '/': {unacceptable_type,longstr}")]


# -- consumer priorities ------------------------------------------------------------

def test_consumer_priority_serves_the_highest_that_can_take_round_robin_within() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "q"), BasicQos(c, 2, False))
    h.run(consume_args(c, "q", "low", {"x-priority": -1}), consume(c, "q", "mid"),
          consume_args(c, "q", "hi1", {"x-priority": 10}),
          consume_args(c, "q", "hi2", {"x-priority": 10}))
    fx = h.run(*[pub(c, "q", str(i).encode()) for i in range(8)])
    tags = [d.consumer_tag for d in delivers(fx)]
    # both priority-10 consumers alternate until full, then mid, then low
    assert tags == ["hi1", "hi2", "hi1", "hi2", "mid", "mid", "low", "low"]


def test_consumer_priority_must_be_an_integer() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "q"))
    fx = h.run(consume_args(c, "q", "t", {"x-priority": "high"}))
    assert [(e.reply_code, e.reply_text) for e in errors(fx)] == [
        (406, "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'q' in vhost '/': "
              '"expected integer, got longstr"')]


# -- delivery limit ------------------------------------------------------------------

def test_delivery_limit_counts_every_return_then_dead_letters_with_reason() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(ExchangeDeclare(c, "dlx", "fanout", False, False, False, False, {}, False))
    h.run(qdecl(c, "dead"), qbind(c, "dead", "dlx"))
    h.run(qdecl(c, "work", durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": "dlx"}))
    h.run(pub(c, "work", b"poison", props={"headers": {"k": "v"}}))
    counts = []
    for _ in range(3):
        [g] = gets(h.run(get(c, "work")))
        counts.append((g.props.get("headers") or {}).get("x-delivery-count"))
        h.run(reject(c, g.delivery_tag, requeue=True))
    assert counts == [0, 1, 2]  # basic.get from a quorum queue always carries it
    assert h.state.queues["work"].ready_count() == 0
    [g] = gets(h.run(get(c, "dead", no_ack=True)))
    assert g.body == b"poison"
    death = g.props["headers"]["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", "work", 1)
    assert g.props["headers"]["k"] == "v"
    assert h.state.message_bytes == 0


def test_delivery_limit_without_dlx_drops_and_channel_close_counts_too() -> None:
    h = Harness()
    c1 = h.open(chan(1))
    h.run(qdecl(c1, "w", durable=True, arguments={"x-delivery-limit": 0}))
    h.run(pub(c1, "w", b"once"))
    h.run(consume(c1, "w", "t"))
    h.run(ChannelClose(c1, True))  # returned once: 1 > 0, dropped
    assert h.state.queues["w"].ready_count() == 0
    assert h.state.message_bytes == 0


def test_delivery_count_survives_failover_and_matches_on_every_replica() -> None:
    h = Harness()
    c2, c3 = chan(1, conn=1, node="n2"), chan(1, conn=2, node="n3")
    h.run(ChannelOpen(c2), node="n2")
    h.run(ChannelOpen(c3), node="n3")
    h.run(qdecl(c2, "w", durable=True, arguments={"x-queue-type": "quorum",
                                                 "x-delivery-limit": 5}), node="n2")
    h.run(pub(c2, "w", b"m"), node="n2")
    h.run(consume(c2, "w", "t2"), node="n2")  # delivered on n2, never acked
    h.run(NodeDown("n2"), node="n1")
    h.state = snapshot_copy(h.state)  # a snapshot in between
    fx = h.run(consume(c3, "w", "t3"), node="n3")
    [d] = delivers(fx)
    assert (d.redelivered, d.props["headers"]["x-delivery-count"]) == (True, 1)
    assert delivers(replay(h))[-1] == d


def test_classic_queue_redeliveries_carry_no_delivery_count_header() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "q"), pub(c, "q", b"m"))
    [g] = gets(h.run(get(c, "q")))
    h.run(nack(c, g.delivery_tag))
    [g] = gets(h.run(get(c, "q")))
    assert g.redelivered and "headers" not in g.props


def test_x_delivery_limit_must_be_a_non_negative_integer() -> None:
    h = Harness()
    c = h.open(chan())
    fx = h.run(qdecl(c, "w", arguments={"x-delivery-limit": -3}))
    assert errors(fx)[0].reply_text.endswith("{value_negative,-3}")


# -- overflow dead-lettering -----------------------------------------------------------

def test_max_length_drop_head_dead_letters_with_reason_maxlen() -> None:
    h = Harness()
    c = h.open(chan())
    h.run(ExchangeDeclare(c, "dlx", "fanout", False, False, False, False, {}, False))
    h.run(qdecl(c, "dead"), qbind(c, "dead", "dlx"))
    h.run(qdecl(c, "short", arguments={"x-max-length": 2, "x-dead-letter-exchange": "dlx"}))
    h.run(*[pub(c, "short", str(i).encode()) for i in range(4)])
    fx = h.run(*[get(c, "dead", no_ack=True) for _ in range(2)])
    got = gets(fx)
    assert [g.body for g in got] == [b"0", b"1"]
    assert {g.props["headers"]["x-death"][0]["reason"] for g in got} == {"maxlen"}
