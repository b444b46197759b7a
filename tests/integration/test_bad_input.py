"""Malformed input on raw sockets: the broker answers with RabbitMQ's reply code
(or closes), and a second connection keeps working afterwards."""
from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from harness.amqp import Closed, RawClient
from tests.broker_proc import Broker, uniq
from tests.support.pika_session import Amqp, round_trip_ok

pytestmark = pytest.mark.rabbitmq_ok


def close_codes(frames: list[tuple[int, Any]]) -> list[tuple[str, int]]:
    return [(type(v).__name__, v.reply_code) for _ch, v in frames
            if isinstance(v, spec.Connection.Close | spec.Channel.Close)]


def method_frame(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + args
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


def test_garbage_after_protocol_header_before_open(raw: Any, broker: Broker) -> None:
    c = raw(handshake=False)
    c.send(pframe.marshal(pheader.ProtocolHeader(), 0))
    c.expect(spec.Connection.Start)
    c.send(b"garbage garbage garbage garbage")
    frames = c.read_until_closed()
    assert all(code == 501 for _k, code in close_codes(frames)), frames
    round_trip_ok(broker)


def test_garbage_after_open_is_501_frame_error(raw: Any, broker: Broker) -> None:
    c = raw(channel=False)
    c.send(b"garbage garbage garbage garbage")
    assert close_codes(c.read_until_closed()) == [("Close", 501)]
    round_trip_ok(broker)


@pytest.mark.parametrize("hdr", [b"AMQP\x00\x00\x08\x00", b"AMQP\x01\x01\x00\x0a",
                                 b"GET / HTTP/1.1\r\n\r\n"])
def test_wrong_protocol_header_gets_amqp0091_header_and_close(raw: Any, broker: Broker,
                                                             hdr: bytes) -> None:
    c = raw(handshake=False)
    c.send(hdr)
    assert c.read_raw(8) == b"AMQP\x00\x00\x09\x01"
    with pytest.raises((Closed, ConnectionResetError)):
        c.read_raw(1, timeout=10)
    round_trip_ok(broker)


def test_truncated_frame_then_close(raw: Any, broker: Broker) -> None:
    c = raw()
    c.send(pframe.marshal(spec.Basic.Qos(prefetch_count=1), 1)[:9])
    c.sock.shutdown(1)   # half-close: the broker sees EOF mid-frame
    frames = c.read_until_closed()
    assert not [f for f in frames if isinstance(f[1], spec.Basic.QosOk)]
    round_trip_ok(broker)


def test_frame_over_frame_max_is_501(raw: Any, broker: Broker) -> None:
    c = RawClient(broker)
    try:
        c.handshake(frame_max=4096)
        c.open_channel(1)
        c.send(pframe.marshal(spec.Basic.Publish(exchange="", routing_key=uniq("nowhere")), 1)
               + pframe.marshal(pheader.ContentHeader(0, 10000, spec.Basic.Properties()), 1)
               + pframe.marshal(pbody.ContentBody(b"z" * 10000), 1))
        assert close_codes(c.read_until_closed()) == [("Close", 501)]
    finally:
        c.close()
    round_trip_ok(broker)


def test_bad_frame_end_octet_is_501(raw: Any, broker: Broker) -> None:
    c = raw()
    f = bytearray(pframe.marshal(spec.Basic.Qos(prefetch_count=1), 1))
    f[-1] = 0
    c.send(bytes(f))
    assert close_codes(c.read_until_closed()) == [("Close", 501)]
    round_trip_ok(broker)


@pytest.mark.parametrize("class_id,method_id", [(99, 99), (60, 99)])
def test_unknown_class_or_method(raw: Any, broker: Broker, class_id: int, method_id: int) -> None:
    """RabbitMQ 3.10 drops the TCP connection without a close frame here; a broker
    may instead send connection.close 503 COMMAND_INVALID / 540 NOT_IMPLEMENTED."""
    c = raw()
    c.send(method_frame(1, class_id, method_id))
    frames = c.read_until_closed()
    assert all(code in (503, 540) for _k, code in close_codes(frames)), frames
    assert not [f for f in frames if not isinstance(f[1], spec.Connection.Close)], frames
    round_trip_ok(broker)


def test_body_longer_than_header_said(raw: Any, amqp: Amqp, broker: Broker) -> None:
    """RabbitMQ keeps waiting for the body to 'complete' (it never does) and sends
    nothing; closing 501/505 is also acceptable. The oversized message must never be
    enqueued, whole or cut."""
    q = amqp.queue()
    c = raw()
    c.send(pframe.marshal(spec.Basic.Publish(exchange="", routing_key=q), 1)
           + pframe.marshal(pheader.ContentHeader(0, 5, spec.Basic.Properties()), 1)
           + pframe.marshal(pbody.ContentBody(b"0123456789"), 1))
    c.send_frame(spec.Basic.Qos(prefetch_count=0), 1)   # a reply would prove nothing broke
    frames: list[tuple[int, Any]] = []
    try:
        frames.append(c.read_frame(timeout=2))
        if isinstance(frames[-1][1], spec.Connection.Close):
            c.send_frame(spec.Connection.CloseOk(), 0)
    except (TimeoutError, Closed, ConnectionResetError):
        pass
    assert all(code in (501, 505) for _k, code in close_codes(frames)), frames
    assert amqp.count(q) == 0, "a message whose body disagrees with its header was enqueued"
    round_trip_ok(broker)


def test_ack_of_unknown_tag_is_406_channel_close(raw: Any, broker: Broker) -> None:
    c = raw()
    c.send_frame(spec.Basic.Ack(delivery_tag=7), 1)
    ch, v = c.read_frame()
    assert ch == 1 and isinstance(v, spec.Channel.Close), v
    assert v.reply_code == 406 and "unknown delivery tag 7" in v.reply_text
    c.send_frame(spec.Channel.CloseOk(), 1)
    c.open_channel(2)                       # the connection itself survives
    c.call(spec.Basic.Qos(prefetch_count=1), spec.Basic.QosOk, 2)
    round_trip_ok(broker)


def test_method_on_unopened_channel_is_504(raw: Any, broker: Broker) -> None:
    c = raw(channel=False)
    c.send_frame(spec.Basic.Qos(prefetch_count=1), 3)
    assert close_codes(c.read_until_closed()) == [("Close", 504)]
    round_trip_ok(broker)


@pytest.mark.parametrize("what", ["header", "body"])
def test_content_without_method_is_505(raw: Any, broker: Broker, what: str) -> None:
    c = raw()
    if what == "header":
        c.send(pframe.marshal(pheader.ContentHeader(0, 5, spec.Basic.Properties()), 1))
    else:
        c.send(pframe.marshal(pbody.ContentBody(b"abc"), 1))
    assert close_codes(c.read_until_closed()) == [("Close", 505)]
    round_trip_ok(broker)


def test_channel_reopen_same_number_is_error(raw: Any, broker: Broker) -> None:
    c = raw()
    c.send_frame(spec.Channel.Open(), 1)
    codes = close_codes(c.read_until_closed())
    assert codes == [("Close", 504)], codes
    round_trip_ok(broker)
