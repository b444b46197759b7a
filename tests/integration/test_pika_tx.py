"""Transactions, S24."""
from __future__ import annotations

import pytest

from tests.support.pika_session import Amqp

pytestmark = pytest.mark.rabbitmq_ok


def test_s24_tx_publishes_invisible_until_commit(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch)
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", q, f"t{i}".encode())
    assert amqp.count(q) == 0, "uncommitted publishes must not be visible"
    ch.tx_commit()
    assert amqp.count(q) == 3


def test_s24_tx_rollback_discards_publishes(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch)
    ch.tx_select()
    ch.basic_publish("", q, b"gone")
    ch.tx_rollback()
    ch.basic_publish("", q, b"kept")
    ch.tx_commit()
    assert [b for b, _ in amqp.drain(q)] == [b"kept"]


def test_s24_tx_acks_take_effect_at_commit(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    q = amqp.queue(ch)
    amqp.publish(q, [b"a", b"b"])
    ch.tx_select()
    ma, _p, _b = ch.basic_get(q)
    mb, _p, _b = ch.basic_get(q)
    ch.basic_ack(ma.delivery_tag)
    ch.tx_rollback()                 # the ack of a is discarded: a stays unacked
    ch.basic_ack(mb.delivery_tag)
    ch.close()                       # uncommitted ack of b never happened
    got = amqp.drain(q)
    assert sorted(got) == [(b"a", True), (b"b", True)]
    amqp.publish(q, [b"c"])
    ch = conn.channel()
    ch.tx_select()
    m, _p, _b = ch.basic_get(q)
    ch.basic_ack(m.delivery_tag)
    ch.tx_commit()
    ch.close()                       # committed ack: nothing comes back
    assert amqp.count(q) == 0


def test_s24_tx_commit_publish_and_ack_atomically(amqp: Amqp) -> None:
    conn = amqp.connect()
    ch = conn.channel()
    src, dst = amqp.queue(ch), amqp.queue(ch)
    amqp.publish(src, [b"job"])
    ch.tx_select()
    m, _p, body = ch.basic_get(src)
    ch.basic_publish("", dst, body + b"-done")
    ch.basic_ack(m.delivery_tag)
    assert amqp.count(dst) == 0
    ch.tx_commit()
    assert amqp.count(dst) == 1
    ch.close()
    assert amqp.count(src) == 0
