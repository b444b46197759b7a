"""Issue 14: queue types as clients declare them (Celery, MassTransit, Spring AMQP
declare `x-queue-type: quorum`): quorum and classic are mirrorq's replicated
queue; RabbitMQ's quorum-queue rules (durable, not exclusive, not auto-delete)
give 406; a stream gets a clear 406."""
from __future__ import annotations

import os

import pika
import pytest

from tests.broker_proc import Broker, uniq


def connect(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url + "?heartbeat=0"))


@pytest.mark.rabbitmq_ok
def test_quorum_queue_declared_as_celery_does_round_trips(broker: Broker) -> None:
    name = uniq("quorum")
    with connect(broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            body = os.urandom(2048)
            ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
            method, _props, got = ch.basic_get(name, auto_ack=True)
            assert method is not None and got == body
            # redeclared the same way: fine; without the type: 406 inequivalent
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
                ch.queue_declare(name, durable=True)
            assert exc.value.reply_code == 406 and "x-queue-type" in exc.value.reply_text
        finally:
            conn.channel().queue_delete(name)


@pytest.mark.rabbitmq_ok
@pytest.mark.parametrize("kw,prop", [({"durable": False}, "non-durable"),
                                     ({"durable": True, "exclusive": True}, "exclusive-owner"),
                                     ({"durable": True, "auto_delete": True}, "auto-delete")])
def test_quorum_queue_property_rules_406(broker: Broker, kw: dict, prop: str) -> None:
    name = uniq("quorum-bad")
    with connect(broker) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch.queue_declare(name, arguments={"x-queue-type": "quorum"}, **kw)
        assert exc.value.reply_code == 406, exc.value
        assert f"invalid property '{prop}' for queue '{name}' in vhost '/'" in \
            exc.value.reply_text, exc.value
        assert conn.is_open  # a channel error: the connection keeps serving
        conn.channel().queue_declare(uniq("after"), auto_delete=True)


def test_stream_queue_is_refused_with_a_clear_406(broker: Broker) -> None:
    with connect(broker) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch.queue_declare(uniq("stream"), durable=True, arguments={"x-queue-type": "stream"})
        assert exc.value.reply_code == 406
        assert "streams are not supported" in exc.value.reply_text, exc.value
