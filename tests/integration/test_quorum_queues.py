"""RabbitMQ 4.3's quorum-queue semantics with a real node and pika (issue 28;
docs/semantics.md, Quorum queues). The expected behaviour was read in
RabbitMQ's source (v4.3.x: rabbit_fifo return_one / incr_msg_headers,
rabbit_channel's settle ops for basic.reject / basic.nack,
rabbit_quorum_queue ?DEFAULT_DELIVERY_LIMIT, rabbit_fifo_client
add_delivery_count_header). Marked rabbitmq_ok: written to pass against
RabbitMQ 4.3 (MIRRORQ_TARGET) too:
all of them passed against RabbitMQ 4.3.6 (../shared/rabbitmq4, rmq4_single.sh)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from node.admin.client import call_status
from node.replication.machine.version import MACHINE_VERSION
from tests.broker_proc import Broker, NodeProcess, uniq, wait_for
from tests.support.pika_session import Amqp, pump_until

pytestmark = pytest.mark.rabbitmq_ok


@pytest.fixture
def qq(broker: Broker, amqp: Amqp) -> Iterator[Amqp]:
    """`amqp` once the node runs this build's machine version (a fresh node
    raises it shortly after its start; the 4.3 semantics start there)."""
    if isinstance(broker, NodeProcess):
        wait_for(lambda: call_status("127.0.0.1", broker.admin_port,
                                     token=broker.admin_token)["machine_version"]
                 == MACHINE_VERSION, 20, what="the node's machine version")
    yield amqp


def counts(props: pika.BasicProperties) -> tuple[Any, Any]:
    headers = props.headers or {}
    return headers.get("x-delivery-count"), headers.get("x-acquired-count")


def get(ch: Any, queue: str, timeout: float = 10.0) -> tuple[Any, Any, bytes]:
    """basic.get until a message comes: a return is asynchronous in RabbitMQ."""
    got: list[tuple[Any, Any, bytes]] = []

    def one() -> bool:
        m, p, b = ch.basic_get(queue)
        if m is not None:
            got.append((m, p, b))
        return bool(got)

    wait_for(one, timeout, what=f"a message in {queue}")
    return got[0]


def declare_with_dlx(amqp: Amqp, ch: Any, **args: Any) -> tuple[str, str]:
    """A quorum queue dead-lettering into a fanout bound to `dead`."""
    dlx = amqp.exchange(ch, uniq("qq-dlx"), "fanout")
    dead = amqp.queue(ch, prefix="qq-dead", durable=True)
    ch.queue_bind(dead, dlx)
    work = amqp.queue(ch, prefix="qq-work", durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": dlx, **args})
    ch.confirm_delivery()  # publishes below are in the queue once they return
    return work, dead


def test_quorum_queue_default_delivery_limit_20_dead_letters_the_21st_failure(qq: Amqp) -> None:
    ch = qq.channel()
    work, dead = declare_with_dlx(qq, ch)
    ch.basic_publish("", work, b"poison")
    seen = []
    for _ in range(21):
        m, p, body = get(ch, work)
        assert body == b"poison"
        seen.append(counts(p))
        ch.basic_reject(m.delivery_tag, requeue=True)
    assert seen == [(None, None)] + [(n, n) for n in range(1, 21)]
    qq.wait_count(dead, 1)
    m, p, body = ch.basic_get(dead, auto_ack=True)
    assert body == b"poison"
    assert p.headers["x-death"][0]["reason"] == "delivery_limit"
    assert qq.count(work) == 0


def test_nack_requeue_is_an_acquisition_not_a_failed_delivery(qq: Amqp) -> None:
    ch = qq.channel()
    work, dead = declare_with_dlx(qq, ch, **{"x-delivery-limit": 1})
    ch.basic_publish("", work, b"m")
    for _ in range(4):
        m, _p, _b = get(ch, work)
        ch.basic_nack(m.delivery_tag, requeue=True)
    m, p, _b = get(ch, work)
    assert counts(p) == (None, 4)  # the limit of 1 never bit
    ch.basic_reject(m.delivery_tag, requeue=True)
    m, p, _b = get(ch, work)
    assert counts(p) == (1, 5)
    ch.basic_reject(m.delivery_tag, requeue=True)  # 2 > 1
    qq.wait_count(dead, 1)


def test_x_delivery_limit_minus_1_disables_the_limit(qq: Amqp) -> None:
    ch = qq.channel()
    work, dead = declare_with_dlx(qq, ch, **{"x-delivery-limit": -1})
    ch.basic_publish("", work, b"m")
    for _ in range(25):
        m, _p, _b = get(ch, work)
        ch.basic_reject(m.delivery_tag, requeue=True)
    m, p, _b = get(ch, work)
    assert counts(p) == (25, 25)
    assert qq.count(dead) == 0


def test_a_consumers_closed_channel_counts_as_a_failed_delivery(qq: Amqp) -> None:
    ch = qq.channel()
    work, _dead = declare_with_dlx(qq, ch)
    ch.basic_publish("", work, b"m")
    conn = qq.connect()
    ch2 = conn.channel()
    got: list[Any] = []
    ch2.basic_consume(work, lambda _c, m, p, b: got.append((m, p, b)))
    pump_until(conn, lambda: bool(got))
    assert counts(got[0][1]) == (None, None) and not got[0][0].redelivered
    conn.close()  # the consumer's connection gone without an ack
    qq.wait_count(work, 1)
    m, p, _b = get(ch, work)
    assert m.redelivered and counts(p) == (1, 1)


# -- priorities (S28) ------------------------------------------------------------------

def test_quorum_queue_has_32_priority_levels_default_4_without_x_max_priority(qq: Amqp) -> None:
    ch = qq.channel()
    ch.confirm_delivery()
    q = qq.queue(ch, prefix="qq-prio", durable=True, arguments={"x-queue-type": "quorum"})
    for p in [None, 0, 1, 4, 5, 31, 40, 200, 3]:
        ch.basic_publish("", q, str(p).encode(), pika.BasicProperties(priority=p))
    got: list[bytes] = []
    ch.basic_consume(q, lambda _c, m, _p, b: got.append(b), auto_ack=True)
    pump_until(ch.connection, lambda: len(got) == 9)
    assert got == [b"31", b"40", b"200", b"5", b"None", b"4", b"3", b"1", b"0"]


def test_x_max_priority_is_refused_on_a_quorum_queue(qq: Amqp) -> None:
    ch = qq.channel()
    name = uniq("qq-maxprio")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(name, durable=True,
                         arguments={"x-queue-type": "quorum", "x-max-priority": 5})
    assert (err.value.reply_code, err.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{name}' in "
             "vhost '/' of queue type rabbit_quorum_queue")


def test_reject_publish_keeps_the_one_over_then_refuses_until_80_percent_s32(qq: Amqp) -> None:
    ch = qq.channel()
    ch.confirm_delivery()
    q = qq.queue(ch, prefix="qq-full", durable=True, arguments={
        "x-queue-type": "quorum", "x-overflow": "reject-publish", "x-max-length": 10})

    def publish() -> bool:
        try:
            ch.basic_publish("", q, b"m", pika.BasicProperties(delivery_mode=2))
            return True
        except pika.exceptions.NackError:
            return False

    assert [publish() for _ in range(12)] == [True] * 11 + [False]
    for _ in range(2):  # 9 ready: under the limit, above 80%
        m, _p, _b = get(ch, q)
        ch.basic_ack(m.delivery_tag)
    assert publish() is False
    m, _p, _b = get(ch, q)
    ch.basic_ack(m.delivery_tag)  # 8 ready: at 80%
    # RabbitMQ tells the publisher's queue client `go` asynchronously
    wait_for(publish, 10, what="a publish taken again")
    assert ch.queue_declare(q, passive=True).method.message_count == 9


def test_another_queue_types_argument_is_refused(qq: Amqp) -> None:
    ch = qq.channel()
    name = uniq("classic-dls")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(name, arguments={"x-queue-type": "classic", "x-delivery-limit": 5})
    assert (err.value.reply_code, err.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue '{name}' in "
             "vhost '/' of queue type rabbit_classic_queue")


# -- consumer timeout (S29) ------------------------------------------------------------
# a short x-consumer-timeout; mirrorq checks deadlines on its Tick (every
# second), RabbitMQ at the deadline: both well within the waits below

def test_a_timed_out_consumer_alone_gets_basic_cancel_and_its_messages_return(qq: Amqp) -> None:
    ch = qq.channel()
    ch.confirm_delivery()
    q = qq.queue(ch, prefix="qq-ct", durable=True, arguments={"x-queue-type": "quorum"})
    for i in range(2):
        ch.basic_publish("", q, b"m%d" % i)
    slow_conn = qq.connect()
    slow = slow_conn.channel()
    held: list[Any] = []
    cancelled: list[str] = []
    slow.add_on_cancel_callback(lambda m: cancelled.append(m.method.consumer_tag))
    slow.basic_consume(q, lambda _c, m, _p, b: held.append((m.delivery_tag, b)),
                       consumer_tag="slow", arguments={"x-consumer-timeout": 1000})
    pump_until(slow_conn, lambda: len(held) == 2)
    fast_conn = qq.connect()
    fast = fast_conn.channel()
    got: list[tuple[bytes, bool, Any]] = []

    def take(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append((b, m.redelivered, counts(p)))
        c.basic_ack(m.delivery_tag)
    fast.basic_consume(q, take, consumer_tag="fast")
    pump_until(slow_conn, lambda: bool(cancelled), timeout=15, what="basic.cancel")
    assert cancelled == ["slow"] and slow.is_open
    pump_until(fast_conn, lambda: len(got) == 2, timeout=10, what="the redeliveries")
    # returned, not failed: acquired once, no x-delivery-count
    assert sorted(got) == [(b"m0", True, (None, 1)), (b"m1", True, (None, 1))]
    slow.basic_ack(held[1][0], multiple=True)  # its old tags: no channel error
    slow_conn.process_data_events(time_limit=0.5)
    assert slow.is_open
    assert qq.count(q) == 0


def channel_close(c: Any, timeout: float = 15.0) -> Any:
    """The next channel.close the raw client gets (deliveries before it skipped)."""
    from pamqp import commands as spec
    deadline = time.monotonic() + timeout
    while True:
        _n, v = c.read_frame(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(v, spec.Channel.Close):
            return v


TIMED_OUT = ("PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout "
             "value used: -1 ms. This timeout value can be configured, see consumers doc guide "
             "to learn more")


def test_without_consumer_cancel_notify_a_timeout_closes_the_channel(qq: Amqp, raw: Any) -> None:
    from pamqp import commands as spec
    ch = qq.channel()
    ch.confirm_delivery()
    q = qq.queue(ch, prefix="qq-ct", durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_publish("", q, b"m")
    c = raw(handshake=False)
    c.handshake(cancel_notify=False)
    c.open_channel(1)
    c.call(spec.Basic.Consume(queue=q, consumer_tag="old",
                              arguments={"x-consumer-timeout": 1000}), spec.Basic.ConsumeOk)
    close = channel_close(c)
    assert (close.reply_code, close.reply_text) == (406, TIMED_OUT)
    qq.wait_count(q, 1)


def test_an_unacked_basic_get_times_out_and_closes_the_channel(qq: Amqp, raw: Any) -> None:
    from pamqp import commands as spec
    ch = qq.channel()
    ch.confirm_delivery()
    q = qq.queue(ch, prefix="qq-ct", durable=True,
                 arguments={"x-queue-type": "quorum", "x-consumer-timeout": 1000})
    ch.basic_publish("", q, b"m")
    c = raw()
    c.call(spec.Basic.Get(queue=q), spec.Basic.GetOk)
    close = channel_close(c)
    assert (close.reply_code, close.reply_text) == (406, TIMED_OUT)
    qq.wait_count(q, 1)


# -- single active consumer and consumer priorities (S30) ------------------------------

def test_single_active_consumer_hands_over_to_a_higher_priority_once_settled(qq: Amqp) -> None:
    ch = qq.channel()
    ch.confirm_delivery()
    q = qq.queue(ch, prefix="qq-sac", durable=True,
                 arguments={"x-queue-type": "quorum", "x-single-active-consumer": True})
    ch.basic_publish("", q, b"first")
    conn = qq.connect()
    low, high = conn.channel(), conn.channel()
    got: list[tuple[str, bytes, int]] = []

    def on(tag: str) -> Any:
        return lambda _c, m, _p, b: got.append((tag, b, m.delivery_tag))
    low.basic_consume(q, on("low"), consumer_tag="low", arguments={"x-priority": 0})
    pump_until(conn, lambda: len(got) == 1)
    high.basic_consume(q, on("high"), consumer_tag="high", arguments={"x-priority": 5})
    ch.basic_publish("", q, b"second")
    conn.process_data_events(time_limit=1.0)
    assert [(t, b) for t, b, _ in got] == [("low", b"first")]  # low quiesces, high waits
    low.basic_ack(got[0][2])
    pump_until(conn, lambda: len(got) == 2, what="the hand-over")
    assert (got[1][0], got[1][1]) == ("high", b"second")
