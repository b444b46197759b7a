"""Raw AMQP content for the field-type tests (issue 28): a headers table with
every field type of RabbitMQ's dialect at the top level, in an array and in a
nested table, and helpers that publish, get and consume it reading frames as
bytes (pamqp, the RawClient's decoder, cannot parse U)."""
from __future__ import annotations

import os
import struct
import time
from typing import Any

from pamqp import commands as spec

from harness.amqp import RawClient

SCALARS = (
    b"t\x01", b"b\xff", b"B\xff", b"s\x80\x00", b"u\xff\xff", b"U\x80\x01",
    b"I\x80\x00\x00\x00", b"i\xff\xff\xff\xff", b"l" + struct.pack(">q", -5),
    b"L" + struct.pack(">q", -1), b"f" + struct.pack(">f", 2.32), b"d" + struct.pack(">d", 2.32),
    b"D\x02" + struct.pack(">I", 120), b"S\x00\x00\x00\x03abc", b"S\x00\x00\x00\x02\xff\xfe",
    b"T" + struct.pack(">Q", 2**64 - 1), b"V", b"x\x00\x00\x00\x03\x00\x01\xff",
)
if os.environ.get("MIRRORQ_TARGET"):  # another broker (RabbitMQ): its dialect refuses U
    SCALARS = tuple(v for v in SCALARS if v[:1] not in (b"U", b"L"))  # and sends L back as l


def _items(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(bytes((len(k),)) + k + v for k, v in pairs)


_FLAT = _items([(b"k%d" % i, v) for i, v in enumerate(SCALARS)])
_ARRAY = b"".join(SCALARS)
# each entry's bytes (key and typed value), and the whole table body in this order
ENTRIES = [_items([(b"k%d" % i, v)]) for i, v in enumerate(SCALARS)] + [
    _items([(b"arr", b"A" + struct.pack(">I", len(_ARRAY)) + _ARRAY)]),
    _items([(b"tbl", b"F" + struct.pack(">I", len(_FLAT)) + _FLAT)])]
HEADER_ITEMS = b"".join(ENTRIES)
HEADERS = struct.pack(">I", len(HEADER_ITEMS)) + HEADER_ITEMS


def props_bytes(timestamp: int = 253402300800 + 86400, persistent: bool = True) -> bytes:
    """headers, delivery_mode and a timestamp property (default: year 10000)."""
    return (struct.pack(">H", 0x2000 | 0x1000 | 0x0040) + HEADERS
            + (b"\x02" if persistent else b"\x01") + struct.pack(">Q", timestamp))


def publish_raw(c: RawClient, queue: str, props: bytes, body: bytes = b"hello",
                exchange: str = "") -> None:
    header = struct.pack(">HHQ", 60, 0, len(body)) + props
    c.send(_frame(1, _publish_args(exchange, queue)) + _frame(2, header) + _frame(3, body))


def _publish_args(exchange: str, rk: str) -> bytes:
    def sstr(s: str) -> bytes:
        return bytes((len(s),)) + s.encode()
    return b"\x00\x3c\x00\x28\x00\x00" + sstr(exchange) + sstr(rk) + b"\x00"


def _frame(ftype: int, payload: bytes, chan: int = 1) -> bytes:
    return struct.pack(">BHI", ftype, chan, len(payload)) + payload + b"\xce"


def raw_frame(c: RawClient) -> tuple[int, bytes]:
    while True:
        ftype, _chan, size = struct.unpack(">BHI", c.read_raw(7))
        payload = c.read_raw(size + 1)[:-1]
        if ftype != 8:
            return ftype, payload


def get_raw(c: RawClient, queue: str) -> tuple[bytes, bytes]:
    """basic.get (no ack) of one message: (its property bytes, its body)."""
    c.send_frame(spec.Basic.Get(queue=queue, no_ack=True), 1)
    return content_after_method(c, 71)


def get_raw_eventually(c: RawClient, queue: str, timeout: float = 10.0) -> tuple[bytes, bytes]:
    """get_raw once the queue holds a message (RabbitMQ dead-letters after the
    reject's answer, so the target may still be empty right after it)."""
    deadline = time.monotonic() + timeout
    while True:
        c.send_frame(spec.Basic.Get(queue=queue, no_ack=True), 1)
        ftype, payload = raw_frame(c)
        if payload[:4] != b"\x00\x3c\x00\x48":  # not basic.get-empty
            break
        assert time.monotonic() < deadline, f"{queue} still empty after {timeout}s"
    assert ftype == 1 and payload[:4] == b"\x00\x3c\x00\x47", payload[:4]
    return _content(c)


def content_after_method(c: RawClient, method_id: int) -> tuple[bytes, bytes]:
    ftype, payload = raw_frame(c)
    assert ftype == 1 and struct.unpack_from(">HH", payload) == (60, method_id), payload[:4]
    return _content(c)


def _content(c: RawClient) -> tuple[bytes, bytes]:
    ftype, header = raw_frame(c)
    assert ftype == 2
    size = struct.unpack_from(">Q", header, 4)[0]
    body = b""
    while len(body) < size:
        ftype, part = raw_frame(c)
        assert ftype == 3
        body += part
    return header[12:], body


def confirm_select(c: RawClient) -> None:
    c.send_frame(spec.Confirm.Select(), 1)
    c.expect(spec.Confirm.SelectOk)


def declare(c: RawClient, queue: str, durable: bool = False,
            arguments: dict[str, Any] | None = None) -> None:
    c.send_frame(spec.Queue.Declare(queue=queue, durable=durable, arguments=arguments), 1)
    c.expect(spec.Queue.DeclareOk)


def publish_confirmed(c: RawClient, queue: str, props: bytes, body: bytes) -> None:
    publish_raw(c, queue, props, body)
    c.expect(spec.Basic.Ack)


def table(pairs: list[tuple[bytes, bytes]]) -> bytes:
    items = _items(pairs)
    return struct.pack(">I", len(items)) + items
