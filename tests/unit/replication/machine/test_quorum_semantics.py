"""RabbitMQ 4.3's quorum-queue semantics, from machine version 3 on (issue 28;
docs/semantics.md, Quorum queues): the delivery limit defaults to 20,
x-delivery-count counts failed deliveries only, x-acquired-count every
return. Queues declared classic keep classic semantics, and the cluster
switches at the SetMachineVersion(3) entry.

Verified against RabbitMQ's source (v4.3.x): rabbit_quorum_queue
?DEFAULT_DELIVERY_LIMIT and get_delivery_limit (20, a negative limit is
none); rabbit_channel (basic.reject requeue=true is {modify, true, false}:
a failed delivery; basic.nack requeue=true and basic.recover are `requeue`,
i.e. rabbit_fifo_client:return: not failed); rabbit_fifo return_one /
incr_msg_headers (every return adds to acquired_count, a failed one to
delivery_count, dead-lettered with reason delivery_limit once
delivery_count > limit), maybe_return_all (a consumer's process down:
failed), consumer_disconnected_timeout (a disconnected node: not failed);
rabbit_fifo_client:add_delivery_count_header (the headers, present once
counted).
"""
from __future__ import annotations

from typing import Any

from node.broker.policy import DEFAULT_DELIVERY_LIMIT
from node.replication.command import (
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicGet,
    BasicRecover,
    ChannelClose,
    ChannelOpen,
    ExchangeDeclare,
    NodeDown,
    NodeUp,
    PolicySet,
    SetMachineVersion,
    Tick,
)
from node.replication.effect import ConsumerTimedOut, GetOk
from tests.support.machine import (
    Harness,
    chan,
    consume,
    delivers,
    errors,
    get,
    gets,
    nack,
    pub,
    qbind,
    qdecl,
    reject,
)
from tests.support.snapshot import snapshot_copy

QUORUM = {"x-queue-type": "quorum"}


def harness(version: int = 3) -> Harness:
    h = Harness()
    h.run(SetMachineVersion(version))
    return h


def counts(g: GetOk) -> tuple[Any, Any]:
    headers = (g.props or {}).get("headers") or {}
    return headers.get("x-delivery-count"), headers.get("x-acquired-count")


def with_dlx(h: Harness, **args: Any) -> Any:
    c = h.open(chan())
    h.run(ExchangeDeclare(c, "dlx", "fanout", False, False, False, False, {}, False))
    h.run(qdecl(c, "dead"), qbind(c, "dead", "dlx"))
    h.run(qdecl(c, "work", durable=True,
                arguments={**QUORUM, "x-dead-letter-exchange": "dlx", **args}))
    return c


def test_a_quorum_queue_delivery_limit_defaults_to_20_then_dead_letters() -> None:
    h = harness()
    c = with_dlx(h)
    assert h.state.queues["work"].delivery_limit == DEFAULT_DELIVERY_LIMIT == 20
    h.run(pub(c, "work", b"poison"))
    seen = []
    for _ in range(21):
        [g] = gets(h.run(get(c, "work")))
        seen.append(counts(g))
        h.run(reject(c, g.delivery_tag, requeue=True))
    # the first hand-out carries neither header; then both count each reject
    assert seen == [(None, None)] + [(n, n) for n in range(1, 21)]
    assert h.state.queues["work"].ready_count() == 0  # the 21st failure: 21 > 20
    [g] = gets(h.run(get(c, "dead", no_ack=True)))
    assert g.body == b"poison"
    assert g.props["headers"]["x-death"][0]["reason"] == "delivery_limit"


def test_x_delivery_limit_minus_1_means_no_limit_on_a_quorum_queue() -> None:
    h = harness()
    c = with_dlx(h, **{"x-delivery-limit": -1})
    assert errors(h.run(pub(c, "work", b"m"))) == []
    assert h.state.queues["work"].delivery_limit is None
    for _ in range(30):
        [g] = gets(h.run(get(c, "work")))
        h.run(reject(c, g.delivery_tag, requeue=True))
    [g] = gets(h.run(get(c, "work")))
    assert counts(g) == (30, 30)


def test_basic_nack_and_recover_requeue_count_acquisitions_not_failed_deliveries() -> None:
    h = harness()
    c = with_dlx(h, **{"x-delivery-limit": 1})
    h.run(pub(c, "work", b"m"))
    for _ in range(5):
        [g] = gets(h.run(get(c, "work")))
        h.run(nack(c, g.delivery_tag, requeue=True))
    [g] = gets(h.run(get(c, "work")))
    h.run(BasicRecover(c))
    [g] = gets(h.run(get(c, "work")))
    assert counts(g) == (None, 6)  # never failed: the limit of 1 never bites
    h.run(reject(c, g.delivery_tag, requeue=True))
    [g] = gets(h.run(get(c, "work")))
    assert counts(g) == (1, 7)
    h.run(reject(c, g.delivery_tag, requeue=True))  # the second failure: 2 > 1
    assert h.state.queues["work"].ready_count() == 0
    assert len(h.state.queues["dead"].ready) == 1


def test_a_closed_channel_is_a_failed_delivery_a_node_declared_down_is_not() -> None:
    h = harness()
    c = with_dlx(h)
    h.run(pub(c, "work", b"m"))
    c2 = h.open(chan(2))
    assert delivers(h.run(consume(c2, "work", "t")))
    h.run(ChannelClose(c2, True))  # the consumer's channel gone: counted
    c3 = chan(1, conn=1, node="n2")
    h.run(ChannelOpen(c3), node="n2")
    assert delivers(h.run(consume(c3, "work", "t3"), node="n2"))
    h.run(NodeDown("n2"))  # cut off by the cluster: returned, not counted
    [g] = gets(h.run(get(c, "work")))
    assert counts(g) == (1, 2)


def test_a_policy_sets_the_delivery_limit_of_an_existing_quorum_queue() -> None:
    h = harness()
    c = with_dlx(h)
    h.run(PolicySet(False, "/", "unlimited", "^work$", "quorum_queues", 0,
                    {"delivery-limit": -1}))
    assert h.state.queues["work"].delivery_limit is None
    h.run(PolicySet(False, "/", "unlimited", "^work$", "quorum_queues", 0,
                    {"delivery-limit": 2}))
    assert h.state.queues["work"].delivery_limit == 2
    h.run(pub(c, "work", b"m"))
    for _ in range(3):
        [g] = gets(h.run(get(c, "work")))
        h.run(reject(c, g.delivery_tag, requeue=True))
    assert len(h.state.queues["dead"].ready) == 1


def test_existing_quorum_queues_take_the_default_at_machine_version_3() -> None:
    h = harness(version=2)
    c = h.open(chan())
    h.run(qdecl(c, "qq", durable=True, arguments=QUORUM), qdecl(c, "classic", durable=True),
          qdecl(c, "own", durable=True, arguments={**QUORUM, "x-delivery-limit": 4}))
    h.run(pub(c, "qq", b"m"))
    for _ in range(3):  # returns before the switch: old semantics, every one counted
        [g] = gets(h.run(get(c, "qq")))
        h.run(nack(c, g.delivery_tag, requeue=True))
    limits = {n: h.state.queues[n].delivery_limit for n in ("qq", "classic", "own")}
    assert limits == {"qq": None, "classic": None, "own": 4}
    # x-delivery-limit -1 is refused before the switch, as builds of version 2 refuse it
    assert errors(h.run(qdecl(c, "neg", durable=True, arguments={**QUORUM, "x-delivery-limit": -1})))
    c = h.open(chan(3))
    h.run(SetMachineVersion(3))
    limits = {n: h.state.queues[n].delivery_limit for n in ("qq", "classic", "own")}
    assert limits == {"qq": 20, "classic": None, "own": 4}
    # a message returned before the switch: its returns were acquisitions
    [g] = gets(h.run(get(c, "qq")))
    assert counts(g) == (3, 3)
    h.run(nack(c, g.delivery_tag, requeue=True))
    h.state = snapshot_copy(h.state)  # the counts survive a snapshot
    [g] = gets(h.run(get(c, "qq")))
    assert counts(g) == (3, 4)


def test_classic_queues_keep_classic_semantics_at_machine_version_3() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "q", durable=True))
    assert h.state.queues["q"].delivery_limit is None
    h.run(pub(c, "q", b"m"))
    for _ in range(25):
        [g] = gets(h.run(get(c, "q")))
        h.run(reject(c, g.delivery_tag, requeue=True))
    [g] = gets(h.run(get(c, "q")))
    assert g.redelivered and "headers" not in g.props
    # a negative x-delivery-limit stays refused on a classic queue
    fx = h.run(qdecl(c, "neg", arguments={"x-delivery-limit": -1}))
    assert errors(fx)[0].reply_text.endswith("{value_negative,-1}")


# -- priorities (S28) ------------------------------------------------------------------
# Verified against RabbitMQ's source (v4.3.x rabbit_fifo_pq: 32 levels, 0-31;
# rabbit_fifo msg_priority: clamped, ?DEFAULT_PRIORITY 4 without one;
# take_next_msg: the returns queue first) and against RabbitMQ 4.3.6 itself
# (the order of the first test is what it gave for the same publishes).

def publish_priorities(h: Harness, c: Any, q: str, prios: list[int | None]) -> None:
    for p in prios:
        h.run(pub(c, q, str(p).encode(), props={} if p is None else {"priority": p}))


def drain(h: Harness, c: Any, q: str) -> list[str]:
    out = []
    while True:
        got = gets(h.run(get(c, q, no_ack=True)))
        if not got:
            return out
        out.append(got[0].body.decode())


def test_a_quorum_queue_has_32_strict_priority_levels_without_x_max_priority() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "qq", durable=True, arguments=QUORUM))
    publish_priorities(h, c, "qq", [None, 0, 1, 4, 5, 31, 40, 200, 3])
    # 40 and 200 count as 31, no priority as 4: FIFO within a level
    assert drain(h, c, "qq") == ["31", "40", "200", "5", "None", "4", "3", "1", "0"]


def test_returned_messages_go_before_every_level_in_their_original_order() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "qq", durable=True, arguments=QUORUM))
    publish_priorities(h, c, "qq", [0, 0])
    [a] = gets(h.run(get(c, "qq")))
    [b] = gets(h.run(get(c, "qq")))
    publish_priorities(h, c, "qq", [31, None])
    h.run(nack(c, b.delivery_tag), nack(c, a.delivery_tag))
    # RabbitMQ 4.3 serves returns in the order they came back (b, a);
    # mirrorq in their original order (S04)
    assert drain(h, c, "qq") == ["0", "0", "31", "None"]


def test_consumers_get_the_levels_in_order_and_dead_letters_keep_their_level() -> None:
    h = harness()
    c = h.open(chan())
    h.run(ExchangeDeclare(c, "dlx", "fanout", False, False, False, False, {}, False))
    h.run(qdecl(c, "dead", durable=True, arguments=QUORUM), qbind(c, "dead", "dlx"))
    h.run(qdecl(c, "src", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 0}))
    publish_priorities(h, c, "dead", [None, 2])
    publish_priorities(h, c, "src", [9, None])  # expire at once into `dead`
    h.run(pub(c, "dead", b"late"))  # the dead-lettered ones are in by now
    fx = h.run(consume(c, "dead", "t", no_ack=True))
    assert [d.body for d in delivers(fx)] == [b"9", b"None", b"None", b"late", b"2"]


def test_x_max_priority_is_refused_on_a_quorum_queue_from_machine_version_3() -> None:
    h = harness(version=2)
    c = h.open(chan())
    prio = {**QUORUM, "x-max-priority": 5}
    assert errors(h.run(qdecl(c, "old", durable=True, arguments=prio))) == []
    h.run(SetMachineVersion(3))
    c = h.open(chan(2))
    [e] = errors(h.run(qdecl(c, "new", durable=True, arguments=prio)))
    assert (e.reply_code, e.reply_text) == (
        406, "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'new' in vhost '/' "
             "of queue type rabbit_quorum_queue")  # as RabbitMQ 4.3.6 answered
    c = h.open(chan(3))
    # the one declared before keeps its priorities, redeclared alike
    assert errors(h.run(qdecl(c, "old", durable=True, arguments=prio))) == []
    old = h.state.queues["old"]
    assert (old.max_priority, old.levels) == (5, False)


def test_at_the_switch_queued_messages_count_as_the_default_level() -> None:
    h = harness(version=2)
    c = h.open(chan())
    h.run(qdecl(c, "qq", durable=True, arguments=QUORUM))
    publish_priorities(h, c, "qq", [9, None, 2])
    [g] = gets(h.run(get(c, "qq")))
    h.run(SetMachineVersion(3))
    publish_priorities(h, c, "qq", [3, 31, None])
    h.run(nack(c, g.delivery_tag))  # returned: before everything
    h.state = snapshot_copy(h.state)  # the levels survive a snapshot
    assert drain(h, c, "qq") == ["9", "31", "None", "2", "None", "3"]


def test_a_restarted_home_node_drops_transient_messages_and_keeps_the_levels() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "qq", durable=True, arguments=QUORUM))
    for p, mode in ((None, 2), (7, 1), (7, 2), (None, 1), (1, 2)):
        props: dict[str, Any] = {"delivery_mode": mode}
        if p is not None:
            props["priority"] = p
        h.run(pub(c, "qq", f"{p}/{mode}".encode(), props=props))
    h.run(NodeUp("n1", 2), node="n2")
    c2 = chan(1, conn=9, node="n2")
    h.run(ChannelOpen(c2), node="n2")
    out = []
    while got := gets(h.run(get(c2, "qq", no_ack=True), node="n2")):
        out.append(got[0].body.decode())
    assert out == ["7/2", "None/2", "1/2"]
    assert h.state.queues["qq"].ready_bytes == 0 and h.state.message_bytes == 0


# -- consumer timeout (S29) ------------------------------------------------------------
# Verified against RabbitMQ's source (v4.3.x): rabbit_queue_type:consume and
# get_consumer_timeout (consumer argument, else the smaller of the queue's
# argument and policy, else the node's consumer_timeout; a dequeue too),
# rabbit_fifo evaluate_consumer_timeout (timed-out messages return, not as
# failed deliveries), rabbit_channel's {released, ..., timeout} (basic.cancel
# with consumer_cancel_notify, else the channel closed), consumer_timeouts.md
# (classic queues: none).

def timed_consumer(h: Harness, c: Any, q: str, tag: str, timeout: int | None = None,
                   node_ms: int = -1) -> list[Any]:
    args = {} if timeout is None else {"x-consumer-timeout": timeout}
    return h.run(BasicConsume(c, q, tag, False, False, False, args, False, 1000, node_ms))


def test_a_consumer_past_its_timeout_alone_is_cancelled_and_its_deliveries_return() -> None:
    h = harness()
    c1, c2 = h.open(chan(1)), h.open(chan(2))
    h.run(qdecl(c1, "qq", durable=True, arguments=QUORUM))
    publish_priorities(h, c1, "qq", [None, None])
    got = delivers(timed_consumer(h, c1, "qq", "slow", timeout=1000))
    assert [d.body for d in got] == [b"None", b"None"]
    assert delivers(timed_consumer(h, c2, "qq", "other", node_ms=60000)) == []
    h.now += 0.5
    assert h.run(Tick()) == []  # not yet
    h.now += 0.6
    fx = h.run(Tick())
    assert [e for e in fx if isinstance(e, ConsumerTimedOut)] == [ConsumerTimedOut(c1, "slow")]
    again = delivers(fx)  # both returned, not as failed deliveries, to the other consumer
    assert [(d.chan, d.consumer_tag, d.redelivered) for d in again] == [(c2, "other", True)] * 2
    assert [counts_of(d) for d in again] == [(None, 1)] * 2
    assert "slow" not in h.state.channels[c1].consumers
    # the timed-out tags stay known: a late ack is no error and settles nothing
    assert errors(h.run(BasicAck(c1, got[0].delivery_tag, False))) == []
    assert errors(h.run(BasicAck(c1, got[1].delivery_tag, True))) == []
    assert errors(h.run(BasicAck(c1, got[1].delivery_tag, False)))  # now unknown
    assert len(h.state.channels[c2].unacked) == 2


def counts_of(d: Any) -> tuple[Any, Any]:
    headers = (d.props or {}).get("headers") or {}
    return headers.get("x-delivery-count"), headers.get("x-acquired-count")


def test_the_timeout_comes_from_the_consumer_else_the_queue_and_policy_else_the_node() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "a", durable=True, arguments={**QUORUM, "x-consumer-timeout": 5000}),
          qdecl(c, "b", durable=True, arguments=QUORUM), qdecl(c, "cl", durable=True))
    h.run(PolicySet(False, "/", "ct", "^(a|b|cl)$", "queues", 0, {"consumer-timeout": 3000}))
    timed_consumer(h, c, "a", "own", timeout=0, node_ms=9)
    timed_consumer(h, c, "a", "queue", node_ms=9)
    timed_consumer(h, c, "b", "policy", node_ms=9)
    h.run(PolicySet(False, "/", "ct", "^$", "queues", 0, {"consumer-timeout": 3000}))
    timed_consumer(h, c, "b", "node", node_ms=9)
    timed_consumer(h, c, "b", "none")
    timed_consumer(h, c, "cl", "classic", timeout=10, node_ms=9)  # classic: none (4.3)
    got = {t: k.timeout for t, k in h.state.channels[c].consumers.items()}
    assert got == {"own": 0, "queue": 3000, "policy": 3000, "node": 9, "none": None,
                   "classic": None}


def test_x_consumer_timeout_must_be_a_non_negative_integer_on_a_quorum_queue() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "qq", durable=True, arguments=QUORUM))
    [e] = errors(timed_consumer(h, c, "qq", "t", timeout=-1))
    assert e.reply_text == ("PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue "
                            "'qq' in vhost '/': {value_negative,-1}")
    c = h.open(chan(2))
    [e] = errors(h.run(qdecl(c, "q2", durable=True,
                             arguments={**QUORUM, "x-consumer-timeout": "soon"})))
    assert "invalid arg 'x-consumer-timeout'" in e.reply_text


def test_an_unacked_basic_get_times_out_and_closes_its_channel_via_the_wire() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "qq", durable=True, arguments={**QUORUM, "x-consumer-timeout": 1000}))
    publish_priorities(h, c, "qq", [None])
    assert gets(h.run(BasicGet(c, "qq", False, 60000)))
    h.state = snapshot_copy(h.state)  # the deadline survives a snapshot
    h.now += 1.5
    fx = h.run(Tick())
    assert [e for e in fx if isinstance(e, ConsumerTimedOut)] == [ConsumerTimedOut(c, "")]
    assert h.state.queues["qq"].ready_count() == 1


def test_a_consumer_that_acks_in_time_and_a_classic_queue_never_time_out() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "qq", durable=True, arguments=QUORUM), qdecl(c, "cl", durable=True))
    publish_priorities(h, c, "qq", [None])
    publish_priorities(h, c, "cl", [None])
    [d] = delivers(timed_consumer(h, c, "qq", "fast", timeout=1000))
    [d2] = delivers(timed_consumer(h, c, "cl", "classic", timeout=1000, node_ms=1000))
    h.run(BasicAck(c, d.delivery_tag, False))
    h.now += 10
    assert h.run(Tick()) == []
    assert list(h.state.channels[c].unacked) == [d2.delivery_tag]
    assert h.state.deadline_chans == {}


# -- single active consumer and consumer priorities (S30) ------------------------------
# Verified against RabbitMQ's source (v4.3.x rabbit_fifo activate_next_consumer:
# a higher-priority consumer takes over once the active one has nothing checked
# out, the active one quiescing until then; sort_waiting: highest priority
# first, then the earliest attached) and against RabbitMQ 4.3.6 (the pika test).

SAC = {**QUORUM, "x-single-active-consumer": True}


def prio_consumer(h: Harness, c: Any, q: str, tag: str, prio: int) -> list[Any]:
    return h.run(BasicConsume(c, q, tag, False, False, False, {"x-priority": prio}, False, 1000))


def test_a_higher_priority_consumer_takes_over_once_the_active_one_settled() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "sac", durable=True, arguments=SAC))
    publish_priorities(h, c, "sac", [None])
    [d] = delivers(prio_consumer(h, c, "sac", "low", 0))
    assert delivers(prio_consumer(h, c, "sac", "high", 5)) == []
    # the active one holds a delivery: it is quiescing, nobody gets the next
    assert delivers(h.run(pub(c, "sac", b"next"))) == []
    fx = h.run(BasicAck(c, d.delivery_tag, False))
    assert [(e.consumer_tag, e.body) for e in delivers(fx)] == [("high", b"next")]
    # and it stays active: a message later goes to it again
    assert [e.consumer_tag for e in delivers(h.run(pub(c, "sac", b"more")))] == ["high"]


def test_an_idle_active_consumer_hands_over_at_once_and_the_highest_waiting_follows() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "sac", durable=True, arguments=SAC))
    prio_consumer(h, c, "sac", "a", 0)
    prio_consumer(h, c, "sac", "b", 2)  # takes over at once: a holds nothing
    prio_consumer(h, c, "sac", "c", 1)
    prio_consumer(h, c, "sac", "d", 2)  # same priority as the active one: waits
    tags = []
    for name in ("b", "d", "c", "a"):
        fx = h.run(pub(c, "sac", name.encode()))
        [d] = delivers(fx)
        tags.append(d.consumer_tag)
        h.run(BasicAck(c, d.delivery_tag, False), BasicCancel(c, d.consumer_tag, True))
    assert tags == ["b", "d", "c", "a"]  # by priority, then the earliest attached


def test_classic_single_active_consumer_keeps_the_first_registered() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "sac", durable=True, arguments={"x-single-active-consumer": True}))
    prio_consumer(h, c, "sac", "low", 0)
    prio_consumer(h, c, "sac", "high", 5)
    for _ in range(2):
        [d] = delivers(h.run(pub(c, "sac", b"m")))
        assert d.consumer_tag == "low"
        h.run(BasicAck(c, d.delivery_tag, False))


# -- determinism -----------------------------------------------------------------------

def test_every_replica_applies_the_4_3_semantics_identically_across_a_snapshot() -> None:
    """Two members fold the same log, one through a snapshot in the middle:
    the same effects and the same state (snapshot bytes) at the end; the
    switch, levels, counts, deadlines and released tags included."""
    from node.replication.machine import apply_batch, default_state
    from node.replication.raft.snapshot import RaftMeta, encode_snapshot, read_snapshot
    meta = RaftMeta((b"", 5, 1), (b"", 4, 1), ("127.0.0.1:1",))
    h = harness(version=2)
    c1, c2 = h.open(chan(1)), h.open(chan(2))
    h.run(qdecl(c1, "qq", durable=True, arguments=QUORUM))
    publish_priorities(h, c1, "qq", [1, None, 9])
    h.run(SetMachineVersion(3))
    h.run(qdecl(c1, "sac", durable=True, arguments=SAC))
    publish_priorities(h, c1, "qq", [31, 0, None, 5])
    timed_consumer(h, c1, "qq", "slow", timeout=1500)
    prio_consumer(h, c2, "sac", "a", 0)
    publish_priorities(h, c1, "sac", [None, 3])
    prio_consumer(h, c2, "sac", "b", 4)
    half = len(h.batches)
    for _ in range(3):
        h.now += 1.0
        h.run(Tick())
        for g in gets(h.run(get(c2, "qq"))):
            h.run(reject(c2, g.delivery_tag, requeue=True))
    h.run(BasicAck(c2, 0, True))
    timed_consumer(h, c2, "qq", "fresh", node_ms=2000)
    h.now += 3.0
    h.run(Tick())
    a = default_state()
    fx_a = [e for batch in h.batches for e in apply_batch(a, batch)]
    b = default_state()
    fx_b = [e for batch in h.batches[:half] for e in apply_batch(b, batch)]
    b = read_snapshot(encode_snapshot(b, meta))[0]
    fx_b += [e for batch in h.batches[half:] for e in apply_batch(b, batch)]
    assert repr(fx_a) == repr(fx_b)
    assert encode_snapshot(a, meta) == encode_snapshot(b, meta) == encode_snapshot(h.state, meta)
    assert any(isinstance(e, ConsumerTimedOut) for e in fx_a)
