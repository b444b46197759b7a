"""Queue declaration, arguments, exclusivity, consumer tags and cancel notify."""
from __future__ import annotations

from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.broker_proc import uniq, wait_for
from tests.support.pika_session import Amqp, events, pump_until

pytestmark = pytest.mark.rabbitmq_ok


def test_message_ttl_queue_arg(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch, arguments={"x-message-ttl": 200})
    amqp.publish(q, [b"short-lived"])
    wait_for(lambda: amqp.count(q) == 0, timeout=10, what="message to expire")


def test_per_message_expiration(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"expires", pika.BasicProperties(expiration="200"))
    ch.basic_publish("", q, b"stays")
    wait_for(lambda: amqp.count(q) == 1, timeout=10, what="the expired message to go")
    assert [b for b, _ in amqp.drain(q)] == [b"stays"]


def test_expired_message_dead_lettered_with_routing_key(amqp: Amqp) -> None:
    ch = amqp.channel()
    dlx = amqp.exchange(ch, uniq("dlx"), "direct")
    dlq = amqp.queue(ch)
    ch.queue_bind(dlq, dlx, "dead")
    q = amqp.queue(ch, arguments={"x-message-ttl": 100, "x-dead-letter-exchange": dlx,
                                  "x-dead-letter-routing-key": "dead"})
    amqp.publish(q, [b"ttl"])
    wait_for(lambda: amqp.count(dlq) == 1, timeout=10, what="expired message dead-lettered")
    _m, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"ttl" and props.headers["x-death"][0]["reason"] == "expired"


def test_queue_expires_when_unused(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = uniq("exp")
    ch.queue_declare(q, arguments={"x-expires": 300})

    def gone() -> bool:
        try:
            amqp.count(q)
            return False
        except ChannelClosedByBroker as e:
            return e.reply_code == 404
    # poll slower than x-expires: a passive declare may count as use
    wait_for(gone, timeout=15, interval=1.0, what="x-expires queue to be deleted")


def test_max_length_drop_head(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch, arguments={"x-max-length": 3})
    amqp.publish(q, [f"m{i}".encode() for i in range(1, 6)])
    assert [b for b, _ in amqp.drain(q)] == [b"m3", b"m4", b"m5"]


def test_max_length_bytes(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch, arguments={"x-max-length-bytes": 25})
    amqp.publish(q, [b"0123456789", b"abcdefghij", b"ABCDEFGHIJ"])
    assert [b for b, _ in amqp.drain(q)] == [b"abcdefghij", b"ABCDEFGHIJ"]


def test_max_length_drop_head_dead_letters(amqp: Amqp) -> None:
    ch = amqp.channel()
    dlx = amqp.exchange(ch, uniq("dlx"), "fanout")
    dlq = amqp.queue(ch)
    ch.queue_bind(dlq, dlx)
    q = amqp.queue(ch, arguments={"x-max-length": 1, "x-dead-letter-exchange": dlx})
    amqp.publish(q, [b"first", b"second"])
    wait_for(lambda: amqp.count(dlq) == 1, timeout=10, what="dropped head dead-lettered")
    assert [b for b, _ in amqp.drain(dlq)] == [b"first"]
    assert [b for b, _ in amqp.drain(q)] == [b"second"]


def test_exclusive_queue_locked_405_for_other_connection(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch, exclusive=True)
    other = amqp.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        other.basic_consume(q, lambda *a: None)
    assert ei.value.reply_code == 405
    other = amqp.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        other.queue_declare(q)
    assert ei.value.reply_code == 405


def test_exclusive_queue_deleted_with_connection(amqp: Amqp) -> None:
    conn = amqp.connect()
    q = conn.channel().queue_declare("", exclusive=True).method.queue
    conn.close()

    def gone() -> bool:
        try:
            amqp.count(q)
            return False
        except ChannelClosedByBroker as e:
            return e.reply_code == 404
    wait_for(gone, timeout=10, what="exclusive queue deleted with its connection")


def test_passive_declare_missing_is_404(amqp: Amqp) -> None:
    ch = amqp.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(uniq("missing"), passive=True)
    assert ei.value.reply_code == 404
    assert "NOT_FOUND" in ei.value.reply_text


def test_redeclare_with_different_args_is_406(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch, durable=False)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(q, durable=True)
    assert ei.value.reply_code == 406


def test_server_named_queue(amqp: Amqp) -> None:
    ch = amqp.channel()
    res = ch.queue_declare("", exclusive=True)
    assert res.method.queue.startswith("amq.gen-")
    assert (res.method.message_count, res.method.consumer_count) == (0, 0)
    ch.confirm_delivery()
    ch.basic_publish("", res.method.queue, b"x")
    assert ch.basic_get(res.method.queue, auto_ack=True)[2] == b"x"


def test_queue_purge_and_delete_counts(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch)
    amqp.publish(q, [b"1", b"2", b"3"])
    assert ch.queue_purge(q).method.message_count == 3
    amqp.publish(q, [b"4"])
    assert ch.queue_delete(q).method.message_count == 1


def test_queue_delete_if_empty_and_if_unused(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, [b"1"])
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_delete(q, if_empty=True)
    assert ei.value.reply_code == 406
    ch = conn.channel()
    ch.basic_consume(q, lambda *a: None)
    ch2 = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.queue_delete(q, if_unused=True)
    assert ei.value.reply_code == 406


def test_consumer_cancel_notify_on_queue_delete(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    tag = ch.basic_consume(q, lambda *a: None)
    amqp.channel().queue_delete(q)
    pump_until(conn, lambda: cancelled, what="basic.cancel from the broker")
    assert cancelled[0].method.consumer_tag == tag
    assert ch.is_open


def test_consumer_tags_client_and_server_chosen(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    got: list[str] = []
    mine = ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag),
                            auto_ack=True, consumer_tag="my-tag")
    assert mine == "my-tag"
    amqp.publish(q, [b"x"])
    pump_until(conn, lambda: got, what="delivery with consumer tag")
    assert got == ["my-tag"]
    ch.basic_cancel("my-tag")
    # server-generated tag via the raw protocol (pika always picks its own)
    from pamqp import commands as spec

    from harness.amqp import RawClient
    c = RawClient(amqp.broker)
    try:
        c.handshake()
        c.open_channel(1)
        ok = c.call(spec.Basic.Consume(queue=q, consumer_tag=""), spec.Basic.ConsumeOk)
        assert ok.consumer_tag.startswith("amq.ctag-"), ok.consumer_tag
        c.call(spec.Basic.Cancel(consumer_tag=ok.consumer_tag), spec.Basic.CancelOk)
        c.call(spec.Basic.Consume(queue=q, consumer_tag="dup"), spec.Basic.ConsumeOk)
        c.send_frame(spec.Basic.Consume(queue=q, consumer_tag="dup"), 1)
        frames = c.read_until_closed(timeout=10)
        closes = [v for _ch, v in frames if isinstance(v, spec.Connection.Close)]
        assert closes and closes[0].reply_code == 530, f"duplicate consumer tag: {frames!r}"
    finally:
        c.close()


def test_basic_cancel_stops_deliveries(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    got: list[bytes] = []
    tag = ch.basic_consume(q, lambda _c, _m, _p, b: got.append(b), auto_ack=True)
    amqp.publish(q, [b"1"])
    pump_until(conn, lambda: got, what="first delivery")
    ch.basic_cancel(tag)
    amqp.publish(q, [b"2"])
    events(conn, 0.2)
    assert got == [b"1"] and amqp.count(q) == 1
