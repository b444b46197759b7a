"""node.amqp.frame: framing round trips, body splitting, size checks."""
from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

from node.amqp import frame


def _frames(data: bytes, frame_max: int = 131072) -> list[tuple[int, int, bytes]]:
    r = frame.FrameReader(frame_max)
    r.feed(data)
    return list(r.frames())


def test_method_round_trip_via_pamqp() -> None:
    raw = pframe.marshal(commands.Queue.Declare(queue="q1", durable=True,
                                                arguments={"x-max-length": 5}), 3)
    [(ftype, chan, payload)] = _frames(raw)
    assert (ftype, chan) == (frame.FRAME_METHOD, 3)
    m = frame.decode_method(payload)
    assert m.name == "Queue.Declare" and m.queue == "q1" and m.durable
    assert m.arguments == {"x-max-length": 5}


def test_encode_method_decodes_with_pamqp() -> None:
    raw = frame.encode_method(2, "Queue.DeclareOk",
                              {"queue": "q", "message_count": 7, "consumer_count": 1})
    n, chan, m = pframe.unmarshal(raw)
    assert n == len(raw) and chan == 2
    assert isinstance(m, commands.Queue.DeclareOk) and m.message_count == 7


@pytest.mark.parametrize("mandatory,immediate", [(False, False), (True, False), (True, True)])
def test_fast_publish_decode(mandatory: bool, immediate: bool) -> None:
    raw = pframe.marshal(commands.Basic.Publish(exchange="ex", routing_key="rk.é",
                                                mandatory=mandatory, immediate=immediate), 1)
    [(_, _, payload)] = _frames(raw)
    m = frame.decode_method(payload)
    assert (m.name, m.exchange, m.routing_key, m.mandatory, m.immediate) == (
        "Basic.Publish", "ex", "rk.é", mandatory, immediate)


def test_fast_ack_nack_reject_decode() -> None:
    for obj, name in [(commands.Basic.Ack(7, True), "Basic.Ack"),
                      (commands.Basic.Nack(8, False, True), "Basic.Nack"),
                      (commands.Basic.Reject(9, False), "Basic.Reject")]:
        [(_, _, payload)] = _frames(pframe.marshal(obj, 1))
        m = frame.decode_method(payload)
        assert m.name == name and m.delivery_tag == obj.delivery_tag


def test_header_round_trip_properties() -> None:
    props = {"content_type": "text/plain", "delivery_mode": 2, "headers": {"a": 1, "b": "x"},
             "correlation_id": "c1", "priority": 3}
    pieces = frame.content_frames(1, props, b"hello", 131072)
    frames = _frames(b"".join(pieces))
    assert [f[0] for f in frames] == [frame.FRAME_HEADER, frame.FRAME_BODY]
    cid, size, got = frame.decode_header(frames[0][2])
    assert (cid, size, got) == (60, 5, props)
    assert frames[1][2] == b"hello"
    # and pamqp agrees on the header
    _, _, hdr = pframe.unmarshal(b"".join(pieces[:3]))
    assert isinstance(hdr, pheader.ContentHeader) and hdr.properties.content_type == "text/plain"


def test_header_empty_properties() -> None:
    raw = pframe.marshal(pheader.ContentHeader(0, 0, commands.Basic.Properties()), 1)
    [(_, _, payload)] = _frames(raw)
    assert frame.decode_header(payload) == (60, 0, {})


def test_heartbeat_round_trip() -> None:
    assert frame.HEARTBEAT == pframe.marshal(pheartbeat.Heartbeat(), 0)
    assert _frames(frame.HEARTBEAT) == [(frame.FRAME_HEARTBEAT, 0, b"")]


def test_body_split_at_frame_max() -> None:
    body = bytes(range(256)) * 100  # 25600 bytes
    fmax = 4096
    frames = _frames(b"".join(frame.content_frames(1, {}, body, fmax)), fmax)
    bodies = [p for t, _, p in frames if t == frame.FRAME_BODY]
    assert all(len(p) <= fmax - 8 for p in bodies)
    assert len(bodies[0]) == fmax - 8
    assert b"".join(bodies) == body


def test_body_exactly_one_frame_and_empty_body() -> None:
    fmax = 4096
    frames = _frames(b"".join(frame.content_frames(1, {}, b"x" * (fmax - 8), fmax)), fmax)
    assert [t for t, _, _ in frames] == [frame.FRAME_HEADER, frame.FRAME_BODY]
    frames = _frames(b"".join(frame.content_frames(1, {}, b"", fmax)), fmax)
    assert [t for t, _, _ in frames] == [frame.FRAME_HEADER]


def test_deliver_encoding_decodes_with_pamqp() -> None:
    raw = b"".join(frame.encode_deliver(1, "ctag", 42, True, "ex", "rk", {"delivery_mode": 2},
                                        b"body", 131072))
    n, chan, m = pframe.unmarshal(raw)
    assert isinstance(m, commands.Basic.Deliver)
    assert (m.consumer_tag, m.delivery_tag, m.redelivered, m.exchange, m.routing_key) == (
        "ctag", 42, True, "ex", "rk")
    n2, _, hdr = pframe.unmarshal(raw[n:])
    assert hdr.body_size == 4 and hdr.properties.delivery_mode == 2
    _, _, body = pframe.unmarshal(raw[n + n2:])
    assert body.value == b"body"


def test_ack_nack_encoding() -> None:
    _, _, m = pframe.unmarshal(frame.encode_basic_ack(1, 5, True))
    assert isinstance(m, commands.Basic.Ack) and m.delivery_tag == 5 and m.multiple
    _, _, m = pframe.unmarshal(frame.encode_basic_nack(1, 6, False))
    assert isinstance(m, commands.Basic.Nack) and m.delivery_tag == 6 and not m.multiple


def test_oversized_frame_rejected_from_header_alone() -> None:
    r = frame.FrameReader(4096)
    r.feed(struct.pack(">BHI", 1, 1, 1_000_000))  # only the 7-byte header
    with pytest.raises(frame.FrameError):
        list(r.frames())


def test_frame_exactly_frame_max_accepted() -> None:
    r = frame.FrameReader(4096)
    r.feed(struct.pack(">BHI", 3, 1, 4096 - 8) + b"x" * (4096 - 8) + b"\xce")
    assert len(list(r.frames())) == 1


def test_bad_frame_end() -> None:
    with pytest.raises(frame.FrameError):
        _frames(struct.pack(">BHI", 1, 0, 4) + b"abcd\x00")


def test_partial_frames_are_buffered() -> None:
    raw = pframe.marshal(commands.Basic.Ack(1), 1) * 2
    r = frame.FrameReader(131072)
    got = []
    for i in range(len(raw)):
        r.feed(raw[i:i + 1])
        got += list(r.frames())
    assert len(got) == 2 and not r.buf


def test_unknown_method_and_bad_arguments() -> None:
    with pytest.raises(frame.UnknownMethod):
        frame.decode_method(struct.pack(">HH", 60, 99))
    with pytest.raises(frame.BadArguments):
        frame.decode_method(struct.pack(">HH", 50, 10) + b"\x00")
    with pytest.raises(frame.BadArguments):
        frame.decode_method(struct.pack(">HH", 60, 40) + b"\x00\x00\x05ab")


def test_amqplain_table() -> None:
    table = frame.encode_table({"LOGIN": "guest", "PASSWORD": "pw"})[4:]
    assert frame.decode_amqplain(table) == {"LOGIN": "guest", "PASSWORD": "pw"}
