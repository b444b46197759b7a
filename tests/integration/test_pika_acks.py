"""Consumer acknowledgements, S01-S12, with pika's BlockingConnection."""
from __future__ import annotations

import os
import time
from typing import Any

import pika
import pytest
from pamqp import commands as spec
from pika.exceptions import ChannelClosedByBroker

from tests.broker_proc import wait_for
from tests.support.pika_session import ON_RABBIT, Amqp, events, pump_until

pytestmark = pytest.mark.rabbitmq_ok


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(1, n + 1)]


def collect(ch: Any, queue: str, auto_ack: bool = False, **kw: Any) -> list[tuple[Any, bytes]]:
    got: list[tuple[Any, bytes]] = []
    ch.basic_consume(queue, lambda _c, m, _p, b: got.append((m, b)), auto_ack=auto_ack, **kw)
    return got


def assert_channel_error(ch: Any, code: int, text: str) -> None:
    """A synchronous round trip on `ch` surfaces the broker's channel.close."""
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_qos(prefetch_count=0)
        ch.basic_qos(prefetch_count=0)
    assert ei.value.reply_code == code, ei.value
    assert text in ei.value.reply_text, ei.value


# ---------------------------------------------------------------- S01

def test_s01_delivery_tags_start_at_1_per_channel_shared_with_get(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch1 = conn.channel()
    q = amqp.queue(ch1)
    amqp.publish(q, bodies(6))
    m, _p, b = ch1.basic_get(q)
    assert (m.delivery_tag, b) == (1, b"m1")
    ch1.basic_qos(prefetch_count=3)
    got = collect(ch1, q)
    pump_until(conn, lambda: len(got) >= 3, what="3 deliveries")
    assert [d.delivery_tag for d, _ in got] == [2, 3, 4], "basic.get and deliveries share the counter"
    m, _p, b = conn.channel().basic_get(q)  # another channel starts its own counter
    assert m.delivery_tag == 1
    m2, _p, _b = ch1.basic_get(q)
    assert m2.delivery_tag == 5
    for d, _ in got:
        assert isinstance(d.delivery_tag, int) and d.delivery_tag > 0


# ---------------------------------------------------------------- S02

def test_s02_no_ack_consume_settles_on_delivery(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(5))
    got = collect(ch, q, auto_ack=True)
    pump_until(conn, lambda: len(got) == 5, what="5 deliveries")
    ch.close()
    assert amqp.count(q) == 0, "no-ack deliveries must not be requeued on close"
    with pytest.raises(ChannelClosedByBroker) as ei:  # acking an auto-acked tag is unknown
        ch2 = conn.channel()
        got2 = collect(ch2, q, auto_ack=True)
        amqp.publish(q, [b"x"])
        pump_until(conn, lambda: len(got2) == 1)
        ch2.basic_ack(got2[0][0].delivery_tag)
        ch2.basic_qos(prefetch_count=0)
    assert ei.value.reply_code == 406


def test_s02_get_no_ack_and_manual(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(2))
    m, _p, b = ch.basic_get(q, auto_ack=True)
    assert b == b"m1"
    m, _p, b = ch.basic_get(q, auto_ack=False)
    assert b == b"m2"
    ch.close()
    got = amqp.drain(q)
    assert got == [(b"m2", True)], "only the manual-ack get is requeued"


# ---------------------------------------------------------------- S03

@pytest.mark.parametrize("how", ["ack", "reject", "nack"])
def test_s03_settle_removes(amqp: Amqp, how: str) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(2))
    m, _p, _b = ch.basic_get(q)
    if how == "ack":
        ch.basic_ack(m.delivery_tag)
    elif how == "reject":
        ch.basic_reject(m.delivery_tag, requeue=False)
    else:
        ch.basic_nack(m.delivery_tag, requeue=False)
    ch.close()
    assert amqp.drain(q) == [(b"m2", False)]


@pytest.mark.parametrize("how", ["reject", "nack"])
def test_s03_reject_dead_letters(amqp: Amqp, how: str) -> None:
    from tests.broker_proc import uniq
    conn = amqp.connect()
    ch = conn.channel()
    dlx = amqp.exchange(ch, uniq("dlx"), "fanout")
    dlq = amqp.queue(ch)
    ch.queue_bind(dlq, dlx)
    q = amqp.queue(ch, arguments={"x-dead-letter-exchange": dlx})
    amqp.publish(q, [b"doomed"])
    m, _p, _b = ch.basic_get(q)
    if how == "reject":
        ch.basic_reject(m.delivery_tag, requeue=False)
    else:
        ch.basic_nack(m.delivery_tag, multiple=False, requeue=False)
    wait_for(lambda: amqp.count(dlq) == 1, timeout=10, what="dead-lettered message")
    m, props, b = ch.basic_get(dlq, auto_ack=True)
    assert b == b"doomed"
    death = (props.headers or {}).get("x-death")
    assert death and death[0]["reason"] == "rejected" and death[0]["queue"] == q
    assert amqp.count(q) == 0


# ---------------------------------------------------------------- S04

def test_s04_requeue_keeps_original_position_and_sets_redelivered(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(5))
    tags = {}
    for _ in range(3):
        m, _p, b = ch.basic_get(q)
        tags[b] = m.delivery_tag
    ch.basic_ack(tags[b"m1"])
    ch.basic_reject(tags[b"m3"], requeue=True)
    ch.basic_nack(tags[b"m2"], requeue=True)
    got = []
    for _ in range(4):
        m, _p, b = ch.basic_get(q, auto_ack=True)
        got.append((b, m.redelivered))
    assert got == [(b"m2", True), (b"m3", True), (b"m4", False), (b"m5", False)]


# ---------------------------------------------------------------- S05

def test_s05_multiple_ack_covers_up_to_tag_on_that_channel_only(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch1, ch2 = conn.channel(), conn.channel()
    q = amqp.queue(ch1)
    amqp.publish(q, bodies(8))
    for _ in range(5):
        ch1.basic_get(q)
    for _ in range(3):
        ch2.basic_get(q)   # ch2 tags 1..3 hold m6..m8
    ch1.basic_ack(3, multiple=True)
    ch1.close()             # m4, m5 back
    assert sorted(b for b, _ in amqp.drain(q)) == [b"m4", b"m5"]
    ch2.close()             # ch2's three were not touched by ch1's multiple ack
    assert sorted(b for b, _ in amqp.drain(q)) == [b"m6", b"m7", b"m8"]


def test_s05_multiple_tag_zero_means_all_on_channel(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch1, ch2 = conn.channel(), conn.channel()
    q = amqp.queue(ch1)
    amqp.publish(q, bodies(6))
    for _ in range(4):
        ch1.basic_get(q)
    for _ in range(2):
        ch2.basic_get(q)
    ch1.basic_ack(0, multiple=True)
    ch1.close()
    assert amqp.count(q) == 0
    ch2.close()
    assert sorted(b for b, _ in amqp.drain(q)) == [b"m5", b"m6"]


def test_s05_multiple_nack(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(5))
    for _ in range(5):
        ch.basic_get(q)
    ch.basic_nack(2, multiple=True, requeue=False)     # m1, m2 dropped
    ch.basic_nack(4, multiple=True, requeue=True)      # m3, m4 back
    assert sorted(b for b, _ in amqp.drain(q)) == [b"m3", b"m4"]
    ch.basic_nack(0, multiple=True, requeue=True)      # m5 back
    assert amqp.drain(q) == [(b"m5", True)]


# ---------------------------------------------------------------- S06

@pytest.mark.parametrize("case", ["double", "unknown"])
def test_s06_bad_ack_closes_channel_406_and_requeues(amqp: Amqp, case: str) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(6))
    for _ in range(3):
        ch.basic_get(q)            # ch: tags 1..3 = m1..m3
    if case == "double":
        ch.basic_ack(2)
        ch.basic_ack(2)
        bad = 2
    else:
        bad = 99
        ch.basic_ack(bad)
    assert_channel_error(ch, 406, f"unknown delivery tag {bad}")
    expect = [b"m1", b"m3"] if case == "double" else [b"m1", b"m2", b"m3"]
    got = amqp.drain(q)
    assert sorted(b for b, r in got if r) == expect, "the closed channel's unacked come back redelivered"


def test_s06_tag_of_other_channel_with_own_unacked(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch1, ch2 = conn.channel(), conn.channel()
    q = amqp.queue(ch1)
    amqp.publish(q, bodies(4))
    for _ in range(3):
        ch1.basic_get(q)             # ch1 tags 1..3 = m1..m3
    ch2.basic_get(q)                 # ch2 tag 1 = m4
    ch2.basic_ack(3)                 # tag 3 exists only on ch1
    assert_channel_error(ch2, 406, "unknown delivery tag 3")
    assert amqp.drain(q) == [(b"m4", True)], "ch2's own unacked delivery is requeued"
    assert ch1.is_open
    ch1.basic_ack(3, multiple=True)  # ch1's tags are intact
    ch1.close()
    assert amqp.count(q) == 0


# ---------------------------------------------------------------- S07

def test_s07_redelivered_flags(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, [b"a"])
    m, _p, _b = ch.basic_get(q)
    assert m.redelivered is False
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, _p, _b = ch.basic_get(q)
    assert m.redelivered is True
    ch.close()                               # after channel close
    ch = conn.channel()
    m, _p, _b = ch.basic_get(q)
    assert m.redelivered is True
    conn.close()                             # after connection close: other consumer gets it
    conn2 = amqp.connect()
    ch2 = conn2.channel()
    got = collect(ch2, q)
    pump_until(conn2, lambda: got, what="redelivery after connection close")
    assert got[0][0].redelivered is True and got[0][1] == b"a"
    amqp.publish(q, [b"fresh"])
    pump_until(conn2, lambda: len(got) == 2, what="fresh delivery")
    assert got[1][0].redelivered is False


# ---------------------------------------------------------------- S08

@pytest.mark.parametrize("how", ["channel_close", "connection_close", "tcp_abort",
                                 "channel_error"])
def test_s08_close_requeues_unacked(amqp: Amqp, raw: Any, how: str) -> None:
    ch0 = amqp.channel()
    q = amqp.queue(ch0)
    amqp.publish(q, bodies(5))
    if how in ("tcp_abort",):
        c = raw()
        c.call(spec.Basic.Qos(prefetch_count=3), spec.Basic.QosOk)
        c.call(spec.Basic.Consume(queue=q, consumer_tag="raw"), spec.Basic.ConsumeOk)
        seen = 0
        while seen < 3:
            _ch, v = c.read_frame()
            seen += isinstance(v, spec.Basic.Deliver)
        wait_for(lambda: amqp.count(q) == 2, timeout=10, what="3 unacked")
        c.abort()
    else:
        conn = amqp.connect()
        ch = conn.channel()
        ch.basic_qos(prefetch_count=3)
        got = collect(ch, q)
        pump_until(conn, lambda: len(got) == 3, what="3 deliveries")
        assert amqp.count(q) == 2
        if how == "channel_close":
            ch.close()
        elif how == "connection_close":
            conn.close()
        else:
            with pytest.raises(ChannelClosedByBroker):
                ch.queue_declare(q + "-missing", passive=True)   # 404 channel error
    wait_for(lambda: amqp.count(q) == 5, timeout=15, what="unacked to be requeued")
    got2 = amqp.drain(q)
    assert sorted(b for b, r in got2 if r) == [b"m1", b"m2", b"m3"]
    assert [b for b, _ in got2] == bodies(5), "requeued at their original positions"


# ---------------------------------------------------------------- S09

def test_s09_prefetch_per_consumer(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    qa, qb = amqp.queue(ch), amqp.queue(ch)
    amqp.publish(qa, bodies(10))
    amqp.publish(qb, bodies(10))
    ch.basic_qos(prefetch_count=2, global_qos=False)
    ga, gb = collect(ch, qa), collect(ch, qb)
    pump_until(conn, lambda: len(ga) == 2 and len(gb) == 2, what="2 per consumer")
    events(conn, 0.3)
    assert (len(ga), len(gb)) == (2, 2)
    assert (amqp.count(qa), amqp.count(qb)) == (8, 8)
    ch.basic_ack(ga[1][0].delivery_tag, multiple=True)     # frees two for consumer a
    pump_until(conn, lambda: len(ga) == 4, what="two more for a")
    events(conn, 0.3)
    assert (len(ga), len(gb)) == (4, 2)


def test_s09_prefetch_global_shared_by_channel(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    qa, qb = amqp.queue(ch), amqp.queue(ch)
    amqp.publish(qa, bodies(10))
    amqp.publish(qb, bodies(10))
    ch.basic_qos(prefetch_count=3, global_qos=True)
    ga, gb = collect(ch, qa), collect(ch, qb)
    pump_until(conn, lambda: len(ga) + len(gb) == 3, what="3 across the channel")
    events(conn, 0.3)
    assert len(ga) + len(gb) == 3
    assert amqp.count(qa) + amqp.count(qb) == 17
    ch.basic_ack(0, multiple=True)
    pump_until(conn, lambda: len(ga) + len(gb) == 6, what="3 more after acking all")
    events(conn, 0.3)
    assert len(ga) + len(gb) == 6


def test_s09_prefetch_zero_unlimited(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(50))
    ch.basic_qos(prefetch_count=0)
    got = collect(ch, q)
    pump_until(conn, lambda: len(got) == 50, what="all 50 unacked")


# ---------------------------------------------------------------- S10

def test_s10_get_ignores_prefetch(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(4))
    ch.basic_qos(prefetch_count=1, global_qos=True)
    ch.basic_qos(prefetch_count=1)
    got = [ch.basic_get(q)[2] for _ in range(4)]
    assert got == bodies(4)


# ---------------------------------------------------------------- S11

def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_s11_auto_ack_consumer_that_stops_reading_is_back_pressured(amqp: Amqp, raw: Any,
                                                                    broker: Any) -> None:
    n, size = 1500, 64 * 1024
    ch0 = amqp.channel()
    q = amqp.queue(ch0)
    slow = raw(rcvbuf=16 * 1024)
    slow.call(spec.Basic.Consume(queue=q, consumer_tag="slow", no_ack=True), spec.Basic.ConsumeOk)
    proc = getattr(broker, "proc", None)
    rss0 = rss_kib(proc.pid) if proc is not None else 0
    pub = amqp.connect()
    pch = pub.channel()
    pch.confirm_delivery()   # every message confirmed = really in the queue or delivered
    body = os.urandom(size)
    t0 = time.monotonic()
    for _ in range(n):
        pch.basic_publish("", q, body)
    # publishing finished (each confirmed); now the broker must still hold most of it
    wait_for(lambda: amqp.count(q) >= n // 2, timeout=60,
             what=f"most of {n} messages to stay in the queue")
    t1 = time.monotonic()
    assert amqp.consumers(q) == 1
    ready = amqp.count(q)
    print(f"S11: {ready}/{n} still queued with a stalled auto-ack consumer ({t1 - t0:.1f}s)")
    if proc is not None:   # mirrorq only: memory stays within a sane multiple of the data
        grown = rss_kib(proc.pid) - rss0
        data_kib = n * size // 1024
        print(f"S11 (mirrorq): RSS grew {grown} KiB for {data_kib} KiB published")
        assert grown < 6 * data_kib, f"node grew by {grown} KiB for {data_kib} KiB published"
    # responsive: an unrelated round trip completes promptly
    t = time.monotonic()
    amqp.publish(amqp.queue(ch0), [b"ping"])
    assert time.monotonic() - t < 5
    slow.close()
    wait_for(lambda: amqp.consumers(q) == 0, timeout=15, what="stalled consumer to go away")


# ---------------------------------------------------------------- S12

def test_s12_recover_requeues_all_unacked_of_channel(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch, other = conn.channel(), conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(4))
    for _ in range(3):
        ch.basic_get(q)
    other.basic_get(q)
    ch.basic_recover(requeue=True)
    wait_for(lambda: amqp.count(q) == 3, timeout=10, what="recover to requeue 3")
    got = amqp.drain(q)
    assert got == [(b"m1", True), (b"m2", True), (b"m3", True)]
    other.basic_ack(1)                    # other channel unaffected
    other.close()
    assert amqp.count(q) == 0


def test_s12_recover_redelivers_to_consumer(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, bodies(2))
    got = collect(ch, q)
    pump_until(conn, lambda: len(got) == 2, what="2 deliveries")
    ch.basic_recover(requeue=True)
    pump_until(conn, lambda: len(got) == 4, what="2 redeliveries")
    assert [(m.redelivered, b) for m, b in got[2:]] == [(True, b"m1"), (True, b"m2")]
    assert [m.delivery_tag for m, _ in got] == [1, 2, 3, 4]


_ = (pika, ON_RABBIT)
