"""Wire details third-party clients rely on (issue 28 items 1 and 5), each
against the shared real node with a real client or raw frames where no client
can send what is tested: bodies cut into frame_max-byte payloads (AMQPStorm,
rabbitpy), channel.flow(active=false). Field types and timestamps (items 2
and 3): test_field_types.py."""
from __future__ import annotations

import hashlib
import os
import struct
from typing import Any

import amqpstorm
import rabbitpy
from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import frame as pframe

from tests.broker_proc import Broker, uniq

MIB = 1 << 20


def _body() -> tuple[bytes, str]:
    body = os.urandom(MIB)
    return body, hashlib.sha256(body).hexdigest()


def test_amqpstorm_1mib_body_round_trips(broker: Broker) -> None:
    """AMQPStorm cuts bodies into payloads of exactly frame_max bytes (8 over
    the limit counted as whole frames); RabbitMQ takes them, so do we."""
    body, digest = _body()
    q = uniq("storm")
    with amqpstorm.Connection(broker.host, broker.user, broker.password,
                              port=broker.amqp_port, timeout=30) as conn:
        assert conn.max_frame_size == 131072
        with conn.channel() as ch:
            ch.queue.declare(q)
            ch.basic.publish(body, q)
            msg = None
            for _ in range(100):
                msg = ch.basic.get(q, no_ack=True, to_dict=False)
                if msg is not None:
                    break
            assert msg is not None
            assert hashlib.sha256(bytes(msg.body)).hexdigest() == digest
            ch.queue.delete(q)


def test_rabbitpy_1mib_body_round_trips(broker: Broker) -> None:
    body, digest = _body()
    q = uniq("rabbitpy")
    with rabbitpy.Connection(broker.url) as conn:
        with conn.channel() as ch:
            queue = rabbitpy.Queue(ch, q)
            queue.declare()
            rabbitpy.Message(ch, body, opinionated=False).publish("", q)
            got = queue.get(acknowledge=False)
            assert got is not None
            assert hashlib.sha256(bytes(got.body)).hexdigest() == digest
            queue.delete()


def test_payload_of_frame_max_taken_one_more_refused(raw: Any, broker: Broker) -> None:
    """The exact boundary, RabbitMQ's: a body frame payload of frame_max bytes
    is taken, frame_max + 1 closes the connection with 501 frame_too_large."""
    q = uniq("edge")
    c = raw(handshake=False)
    c.handshake(frame_max=4096)
    c.open_channel(1)
    c.send_frame(spec.Queue.Declare(queue=q), 1)
    c.expect(spec.Queue.DeclareOk)
    for size, ok in ((4096, True), (4097, False)):
        c.send(pframe.marshal(spec.Basic.Publish(exchange="", routing_key=q), 1)
               + _header(1, size) + pframe.marshal(pbody.ContentBody(b"z" * size), 1))
        if ok:
            c.send_frame(spec.Basic.Get(queue=q, no_ack=True), 1)
            c.expect(spec.Basic.GetOk)
        else:
            closes = [v for _, v in c.read_until_closed() if isinstance(v, spec.Connection.Close)]
            assert closes and closes[0].reply_code == 501, closes
            text = closes[0].reply_text  # RabbitMQ words it {frame_too_large,4097,4088}
            assert "frame_too_large" in text and "4097" in text and "4088" in text, text


def _header(chan: int, size: int, props: bytes = b"\x00\x00") -> bytes:
    payload = struct.pack(">HHQ", 60, 0, size) + props
    return struct.pack(">BHI", 2, chan, len(payload)) + payload + b"\xce"


def test_channel_flow_active_false_is_540_as_in_rabbitmq(raw: Any, broker: Broker) -> None:
    """RabbitMQ closes the connection with 540 NOT_IMPLEMENTED for
    channel.flow(active=false) (rabbit_channel); active=true is answered."""
    c = raw()
    c.send_frame(spec.Channel.Flow(active=True), 1)
    _, ok = c.expect(spec.Channel.FlowOk)
    assert ok.active is True
    c.send_frame(spec.Channel.Flow(active=False), 1)
    closes = [v for _, v in c.read_until_closed() if isinstance(v, spec.Connection.Close)]
    assert closes and (closes[0].reply_code, closes[0].reply_text) == (540, "NOT_IMPLEMENTED - active=false")
    assert (closes[0].class_id, closes[0].method_id) == (20, 20)
