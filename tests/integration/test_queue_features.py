"""Issue 14's queue features with stock clients (pika, kombu, aio-pika):
priority queues, single active consumer, consumer priorities, the delivery
limit and overflow dead-lettering. Marked rabbitmq_ok: each also passes
against RabbitMQ 3.10 (MIRRORQ_TARGET), which is how the expected behaviour
was checked."""
from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from typing import Any

import aio_pika
import kombu
import pika
import pytest
from kombu.simple import SimpleQueue

from tests.broker_proc import Broker, uniq
from tests.support.kombu_client import connect as kombu_conn
from tests.support.pika_session import Amqp, events, pump_until

pytestmark = pytest.mark.rabbitmq_ok


def body(i: int) -> bytes:
    """A realistic body: its number, then random bytes of a mixed size."""
    return f"{i:06d}:".encode() + os.urandom(random.randint(16, 4096))


def num(b: bytes) -> int:
    return int(b.split(b":", 1)[0])


# -- priority queues --------------------------------------------------------------

def test_kombu_priority_publish_consume_as_kombus_suite_does(broker: Broker) -> None:
    # kombu's t/integration BasePriority.test_publish_consume, on a priority queue
    name = uniq("kprio")
    q = kombu.Queue(name, routing_key=name, exchange=kombu.Exchange(name), max_priority=10)
    with kombu_conn(broker) as conn:
        try:
            with conn.channel() as channel:
                producer = kombu.Producer(channel)
                for msg, prio in [({"msg": "first"}, 3), ({"msg": "second"}, 6),
                                  ({"msg": "third"}, 3)]:
                    producer.publish(msg, retry=True, exchange=q.exchange, routing_key=name,
                                     declare=[q], serializer="json", priority=prio)
            received: list[dict[str, Any]] = []

            def callback(b: dict[str, Any], message: kombu.Message) -> None:
                received.append(b)
                message.ack()

            with kombu.Consumer(conn, [q], accept=["json"], callbacks=[callback]):
                deadline = time.monotonic() + 10
                while len(received) < 3 and time.monotonic() < deadline:
                    conn.drain_events(timeout=5)
            assert received == [{"msg": "second"}, {"msg": "first"}, {"msg": "third"}]
        finally:
            q(conn.default_channel).delete()


def test_kombu_simple_queue_with_max_priority_orders_by_priority(broker: Broker) -> None:
    # kombu's BasePriority.test_simple_queue_publish_consume
    name = uniq("ksimple")
    with kombu_conn(broker) as conn:
        sq = SimpleQueue(conn, name, queue_opts={"max_priority": 10})
        try:
            for msg, prio in [("first", 3), ("second", 6), ("third", 3)]:
                sq.put(msg, priority=prio)
            got = []
            for _ in range(3):
                m = sq.get(timeout=10)
                got.append(m.payload)
                m.ack()
            assert got == ["second", "first", "third"]
        finally:
            sq.close()
            sq.queue(conn.default_channel).delete()


def test_priority_queue_order_fifo_within_priority_and_requeue_keeps_place(
        amqp: Amqp) -> None:
    ch = amqp.channel()
    ch.confirm_delivery()
    q = amqp.queue(ch, arguments={"x-max-priority": 5})
    rng = random.Random(14)
    prios = [rng.choice([None, 0, 1, 3, 5, 9]) for _ in range(60)]  # 9 counts as 5
    for i, p in enumerate(prios):
        ch.basic_publish("", q, body(i), pika.BasicProperties(priority=p))
    eff = [min(p or 0, 5) for p in prios]
    expect = sorted(range(60), key=lambda i: (-eff[i], i))
    # take the first ten, return them out of order: they go back to their places
    taken = [ch.basic_get(q) for _ in range(10)]
    assert [num(b) for _m, _p, b in taken] == expect[:10]
    for m, _p, _b in reversed(taken):
        ch.basic_nack(m.delivery_tag, requeue=True)
    got = []
    for _ in range(60):
        m, _p, b = ch.basic_get(q, auto_ack=True)
        assert m is not None
        got.append((num(b), m.redelivered))
    assert [n for n, _ in got] == expect
    assert [r for _, r in got] == [True] * 10 + [False] * 50


def test_x_max_priority_above_255_is_refused_with_406(amqp: Amqp) -> None:
    ch = amqp.channel()
    name = uniq("prio")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare(name, arguments={"x-max-priority": 256})
    assert exc.value.reply_code == 406
    assert "x-max-priority" in exc.value.reply_text


# -- single active consumer ----------------------------------------------------------

def sac_queue(amqp: Amqp) -> str:
    return amqp.queue(amqp.channel(), durable=True,
                      arguments={"x-single-active-consumer": True, "x-queue-type": "quorum"})


# the first consumer, in its own process so that it can die with kill -9 (a
# pika close would cancel the consumer first, which is a different path)
_SAC_CONSUMER = """
import sys, pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1] + "?heartbeat=0"))
ch = conn.channel()
ch.basic_qos(prefetch_count=20)
n = 0
def on(c, m, p, b):
    global n
    n += 1
    if n == 20:
        print("got20", flush=True)
ch.basic_consume(sys.argv[2], on, consumer_tag="a")
print("consuming", flush=True)
ch.start_consuming()
"""


def test_single_active_consumer_takes_over_with_unacked_redelivered_in_order(
        amqp: Amqp, broker: Broker) -> None:
    q = sac_queue(amqp)
    proc = subprocess.Popen([sys.executable, "-c", _SAC_CONSUMER, broker.url, q],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "consuming"  # a registered first: active
        got: list[tuple[int, bool]] = []
        conn = amqp.connect()
        ch = conn.channel()
        ch.basic_consume(q, lambda _c, m, _p, b: got.append((num(b), m.redelivered)),
                         consumer_tag="b")
        # a quorum queue counts its active consumer only (RabbitMQ 3.10)
        assert amqp.consumers(q) == 1
        amqp.publish(q, [body(i) for i in range(50)])
        assert proc.stdout.readline().strip() == "got20"
        events(conn, 0.3)  # a bounded look: the waiting consumer gets nothing
        assert got == []
        proc.kill()  # the active consumer dies with 20 unacked: b takes over
        proc.wait(10)
        pump_until(conn, lambda: len(got) >= 50)
        assert got == [(i, i < 20) for i in range(50)]
    finally:
        proc.kill()
        proc.wait(10)


def test_single_active_consumer_next_consumer_active_after_cancel(amqp: Amqp) -> None:
    q = sac_queue(amqp)
    conn = amqp.connect()
    ch = conn.channel()
    got: list[tuple[str, int]] = []
    for tag in ("first", "second"):
        ch.basic_consume(q, lambda c, m, _p, b: (got.append((m.consumer_tag, num(b))),
                                                 c.basic_ack(m.delivery_tag)),
                         consumer_tag=tag)
    amqp.publish(q, [body(0)])
    pump_until(conn, lambda: len(got) == 1)
    ch.basic_cancel("first")
    amqp.publish(q, [body(1), body(2)])
    pump_until(conn, lambda: len(got) == 3)
    assert got == [("first", 0), ("second", 1), ("second", 2)]


# -- consumer priorities ----------------------------------------------------------------

def test_consumer_priority_higher_consumers_first_lower_get_the_overflow(
        amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch)
    got: list[tuple[str, int]] = []
    ch.basic_qos(prefetch_count=2)
    for tag, prio in (("low", -5), ("high", 10), ("mid", None)):
        ch.basic_consume(q, lambda _c, m, _p, b: got.append((m.consumer_tag, num(b))),
                         consumer_tag=tag,
                         arguments=None if prio is None else {"x-priority": prio})
    amqp.publish(q, [body(i) for i in range(6)])
    pump_until(ch.connection, lambda: len(got) == 6)
    assert got == [("high", 0), ("high", 1), ("mid", 2), ("mid", 3), ("low", 4), ("low", 5)]


# -- delivery limit -------------------------------------------------------------------------

def test_delivery_limit_dead_letters_after_limit_with_delivery_count_header(
        amqp: Amqp) -> None:
    ch = amqp.channel()
    dlx = amqp.exchange(ch, uniq("dlx"), "fanout")
    dead = amqp.queue(ch)
    ch.queue_bind(dead, dlx)
    work = amqp.queue(ch, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": dlx})
    payload = body(7)
    amqp.publish(work, [payload], persistent=True)
    counts = []
    for _ in range(3):
        m, props, b = ch.basic_get(work)
        assert m is not None and b == payload
        counts.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_reject(m.delivery_tag, requeue=True)
    # basic.get from a quorum queue the first time: 0 in RabbitMQ 3.10 (and on
    # mirrorq before machine version 3), absent in 4.3 (S27)
    assert counts[0] in (0, None) and counts[1:] == [1, 2]
    amqp.wait_count(dead, 1)
    assert amqp.count(work) == 0
    m, props, b = ch.basic_get(dead, auto_ack=True)
    assert b == payload
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", work, 1)


def test_aio_pika_delivery_limit_poison_message_leaves_after_limit(broker: Broker) -> None:
    async def run() -> tuple[list[int], int]:
        conn = await aio_pika.connect(broker.url, timeout=10)
        async with conn:
            ch = await conn.channel()
            name = uniq("poison")
            q = await ch.declare_queue(name, durable=True, arguments={
                "x-queue-type": "quorum", "x-delivery-limit": 3})
            try:
                await ch.default_exchange.publish(aio_pika.Message(body(1)), routing_key=name)
                seen: list[int] = []
                async with q.iterator(no_ack=False) as it:
                    async for msg in it:
                        seen.append(int((msg.headers or {}).get("x-delivery-count", 0)))
                        # reject: a failed delivery in 3.10 and 4.3 alike; a
                        # basic.nack requeue no longer counts in 4.3 (S27)
                        await msg.reject(requeue=True)
                        if len(seen) == 4:
                            break
                left = await ch.declare_queue(name, passive=True)
                for _ in range(50):  # the last nack is settled asynchronously
                    if left.declaration_result.message_count == 0:
                        break
                    await asyncio.sleep(0.1)
                    left = await ch.declare_queue(name, passive=True)
                return seen, left.declaration_result.message_count
            finally:
                await q.delete(if_unused=False, if_empty=False)

    seen, left = asyncio.run(asyncio.wait_for(run(), 60))
    assert seen == [0, 1, 2, 3]
    assert left == 0  # dropped: no DLX


# -- overflow dead-lettering ----------------------------------------------------------------

def test_reject_publish_dlx_nacks_the_publish_and_dead_letters_it(amqp: Amqp) -> None:
    ch = amqp.channel()
    ch.confirm_delivery()
    dlx = amqp.exchange(ch, uniq("dlx"), "fanout")
    dead = amqp.queue(ch)
    ch.queue_bind(dead, dlx)
    q = amqp.queue(ch, arguments={"x-max-length": 2, "x-overflow": "reject-publish-dlx",
                                  "x-dead-letter-exchange": dlx})
    bodies = [body(i) for i in range(3)]
    ch.basic_publish("", q, bodies[0])
    ch.basic_publish("", q, bodies[1])
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, bodies[2])
    amqp.wait_count(dead, 1)
    m, props, b = ch.basic_get(dead, auto_ack=True)
    assert b == bodies[2] and props.headers["x-death"][0]["reason"] == "maxlen"
    assert amqp.count(q) == 2


def test_max_length_drop_head_dead_letters_heads_with_reason_maxlen(amqp: Amqp) -> None:
    ch = amqp.channel()
    dlx = amqp.exchange(ch, uniq("dlx"), "fanout")
    dead = amqp.queue(ch)
    ch.queue_bind(dead, dlx)
    q = amqp.queue(ch, arguments={"x-max-length": 3, "x-dead-letter-exchange": dlx})
    amqp.publish(q, [body(i) for i in range(8)])
    amqp.wait_count(dead, 5)
    heads = amqp.drain(dead)
    assert [num(b) for b, _ in heads] == [0, 1, 2, 3, 4]
    assert [num(b) for b, _ in amqp.drain(q)] == [5, 6, 7]
