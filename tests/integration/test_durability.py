"""S19: what survives kill -9 and restart of a node (own_node only)."""
from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.broker_proc import NodeProcess, uniq
from tests.support.pika_session import Amqp, pump_until

pytestmark = pytest.mark.own_node


def restart_hard(node: NodeProcess) -> None:
    node.kill9()
    node.start()


def exists(amqp: Amqp, queue: str) -> bool:
    try:
        amqp.count(queue)
        return True
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False


def test_s19_confirmed_persistent_messages_survive_kill9(own_node: NodeProcess) -> None:
    own_node.start()
    amqp = Amqp(own_node)
    try:
        ch = amqp.channel()
        q = uniq("dur")
        ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        n = 500
        for i in range(n):
            ch.basic_publish("", q, f"p{i}".encode(), pika.BasicProperties(delivery_mode=2))
        amqp.cleanup()
        restart_hard(own_node)
        amqp = Amqp(own_node)
        assert amqp.count(q) == n
        conn = amqp.connect()
        c = conn.channel()
        c.basic_qos(prefetch_count=100)
        got: list[bytes] = []

        def on_msg(chan: object, m: object, _p: object, b: bytes) -> None:
            got.append(b)
            c.basic_ack(m.delivery_tag)  # type: ignore[attr-defined]
        c.basic_consume(q, on_msg)
        pump_until(conn, lambda: len(got) >= n, timeout=30, what=f"{n} messages after restart")
        assert got == [f"p{i}".encode() for i in range(n)]
    finally:
        amqp.cleanup()


def test_s19_unacked_persistent_message_survives_and_is_redelivered(own_node: NodeProcess) -> None:
    own_node.start()
    amqp = Amqp(own_node)
    try:
        ch = amqp.channel()
        q = uniq("dur")
        ch.queue_declare(q, durable=True)
        amqp.publish(q, [b"a", b"b"], persistent=True)
        m, _p, _b = ch.basic_get(q)
        ch.basic_ack(m.delivery_tag)     # a acked (settled before the crash)
        ch.basic_get(q)                  # b unacked at the crash
        conn = amqp.conns[-1]
        conn.process_data_events(time_limit=0)
        c2 = amqp.channel()
        c2.queue_declare(q, passive=True)  # round trip: the ack has been processed
        amqp.cleanup()
        restart_hard(own_node)
        amqp = Amqp(own_node)
        got = amqp.drain(q)
        assert [b for b, _ in got] == [b"b"], "acked message came back or unacked one was lost"
    finally:
        amqp.cleanup()


def test_s19_transient_messages_and_non_durable_queues_do_not_survive(own_node: NodeProcess) -> None:
    own_node.start()
    amqp = Amqp(own_node)
    try:
        ch = amqp.channel()
        dq, tq = uniq("dur"), uniq("tmp")
        ch.queue_declare(dq, durable=True)
        ch.queue_declare(tq, durable=False)
        amqp.publish(dq, [b"persistent"], persistent=True)
        amqp.publish(dq, [b"transient"], persistent=False)
        amqp.publish(tq, [b"in-transient-queue"], persistent=True)
        amqp.cleanup()
        restart_hard(own_node)
        amqp = Amqp(own_node)
        assert not exists(amqp, tq), "non-durable queue survived a restart"
        assert [b for b, _ in amqp.drain(dq)] == [b"persistent"]
    finally:
        amqp.cleanup()


def test_s19_durable_exchange_and_binding_survive(own_node: NodeProcess) -> None:
    own_node.start()
    amqp = Amqp(own_node)
    try:
        ch = amqp.channel()
        x, tx_ = uniq("dx"), uniq("tx")
        q = uniq("dur")
        ch.exchange_declare(x, "topic", durable=True)
        ch.exchange_declare(tx_, "fanout", durable=False)
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, x, "a.#")
        amqp.cleanup()
        restart_hard(own_node)
        amqp = Amqp(own_node)
        ch = amqp.channel()
        ch.exchange_declare(x, "topic", passive=True)
        ch.confirm_delivery()
        ch.basic_publish(x, "a.b", b"routed", pika.BasicProperties(delivery_mode=2))
        assert [b for b, _ in amqp.drain(q)] == [b"routed"]
        ch = amqp.channel()
        with pytest.raises(ChannelClosedByBroker) as ei:
            ch.exchange_declare(tx_, "fanout", passive=True)
        assert ei.value.reply_code == 404
    finally:
        amqp.cleanup()


def test_s19_restart_is_repeatable_and_clean_stop_keeps_data(own_node: NodeProcess) -> None:
    own_node.start()
    amqp = Amqp(own_node)
    try:
        q = uniq("dur")
        amqp.channel().queue_declare(q, durable=True)
        amqp.publish(q, [b"1"], persistent=True)
        amqp.cleanup()
        own_node.restart()               # SIGTERM
        amqp = Amqp(own_node)
        amqp.publish(q, [b"2"], persistent=True)
        amqp.cleanup()
        restart_hard(own_node)
        amqp = Amqp(own_node)
        assert [b for b, _ in amqp.drain(q)] == [b"1", b"2"]
    finally:
        amqp.cleanup()
