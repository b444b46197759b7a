"""AMQP 0-9-1 framing: the only module that imports pamqp.

Splitting the byte stream into frames and the hot methods (Basic.Publish,
Basic.Ack/Nack/Reject in, Basic.Deliver/Ack/Nack out) are done here with
struct directly; everything else goes through pamqp. Decoded methods are
pamqp objects (or a light stand-in with the same attribute names and a
`name` like "Basic.Publish"), typed Any for the callers so they never need
pamqp themselves.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Generator
from typing import Any

from pamqp import commands, decode, encode
from pamqp import exceptions as pamqp_exceptions

from node.amqp import properties

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))
FRAME_END = 0xCE
FRAME_END_BYTES = b"\xce"
FRAME_OVERHEAD = 8  # 7-byte header + end octet
# RabbitMQ's rabbit_reader takes a payload of up to frame_max bytes (its
# FRAME_SIZE_FUDGE of one frame overhead: AMQPStorm and rabbitpy cut bodies into
# frame_max-byte payloads); we take exactly that much and no more.
FRAME_SIZE_FUDGE = FRAME_OVERHEAD
FRAME_MIN_SIZE = 4096  # the largest frame a peer must accept before tune (AMQP frame-min-size)
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"

Method = Any  # a decoded method: has `.name` ("Queue.Declare") and its fields

_HDR = struct.Struct(">BHI")
_CM = struct.Struct(">HH")
_Q = struct.Struct(">Q")
_H = struct.Struct(">H")
_CONTENT_HDR = struct.Struct(">HHQ")

# What pamqp's unmarshal raises on bad input. RecursionError: pamqp decodes
# nested field tables/arrays recursively, so a few KB of tables nested some
# hundred deep (any table: arguments, headers, client properties) exhausted
# the stack and escaped as an internal error (found by tests/fuzz).
_DECODE_ERRORS = (struct.error, ValueError, TypeError, IndexError, KeyError,
                  UnicodeDecodeError, RecursionError, pamqp_exceptions.PAMQPException)


# ---------------------------------------------------------------- field tables
# pamqp decodes a table by handing each value the whole rest of the buffer
# (`value[offset:]`, a copy), so a 131 KB table of tiny entries costs ~0.5 s
# of the event loop (quadratic; found by tests/fuzz). These replacements walk
# the buffer by offset and give pamqp's own value decoders only the bytes of
# one value, so decoding is linear and the values are pamqp's. A value may
# not run past the end of its table (pamqp let it read on: malformed input
# is now a decode error instead of a misparse).

_FIXED = {b"t": 1, b"b": 1, b"B": 1, b"s": 2, b"u": 2, b"I": 4, b"i": 4, b"l": 8, b"L": 8,
          b"f": 4, b"d": 8, b"D": 5, b"T": 8, b"V": 0, b"\x00": 0}
_SIZED = (b"S", b"x", b"A", b"F")  # a 4-byte length, then that many bytes
_U32 = struct.Struct(">I")


def _value(buf: bytes, offset: int, end: int) -> tuple[int, Any]:
    """One typed value at `offset` (before `end`): (next offset, value)."""
    kind = buf[offset:offset + 1]
    start = offset + 1
    size = _FIXED.get(kind)
    if size is None:
        if kind not in _SIZED:
            raise ValueError(f"Unknown type: {kind!r}")
        if start + 4 > end:
            raise ValueError("field value length exceeds its table")
        size = 4 + _U32.unpack_from(buf, start)[0]
    stop = start + size
    if stop > end:
        raise ValueError("field value exceeds its table")
    decoder = decode.TABLE_MAPPING[kind]
    _, value = decoder(buf[start:stop])
    return stop, value


def _field_table(value: bytes) -> tuple[int, dict[str, Any]]:
    try:
        length = _U32.unpack_from(value, 0)[0]
    except struct.error as err:
        raise ValueError("Could not unpack data") from err
    end = 4 + length
    if end > len(value):
        raise ValueError("Field table length exceeds available data")
    data: dict[str, Any] = {}
    offset = 4
    while offset < end:
        key_length = value[offset]
        offset += 1
        if offset + key_length > end:
            raise ValueError("Field table key length exceeds data")
        key = value[offset:offset + key_length].decode("utf-8")
        offset, data[key] = _value(value, offset + key_length, end)
    return end, data


def _field_array(value: bytes) -> tuple[int, list[Any]]:
    try:
        length = _U32.unpack_from(value, 0)[0]
    except struct.error as err:
        raise ValueError("Could not unpack data") from err
    end = 4 + length
    if end > len(value):
        raise ValueError("Field array length exceeds available data")
    data: list[Any] = []
    offset = 4
    while offset < end:
        offset, item = _value(value, offset, end)
        data.append(item)
    return end, data


decode.field_table = _field_table
decode.field_array = _field_array
decode.METHODS["table"] = _field_table
decode.METHODS["array"] = _field_array
decode.TABLE_MAPPING[b"F"] = _field_table
decode.TABLE_MAPPING[b"A"] = _field_array


class FrameError(Exception):
    """The byte stream is broken (501): bad end octet, oversized frame."""


class UnknownMethod(Exception):
    def __init__(self, class_id: int, method_id: int) -> None:
        super().__init__(f"unknown method {class_id}.{method_id}")
        self.class_id = class_id
        self.method_id = method_id


class BadArguments(Exception):
    """A method's or content header's arguments could not be decoded (502)."""

    def __init__(self, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(text)
        self.class_id = class_id
        self.method_id = method_id


# ---------------------------------------------------------------- frame split

class FrameReader:
    """Splits a byte stream into (type, channel, payload) frames.

    The size check is made from the 7-byte header, so an oversized frame is
    rejected before its payload is buffered. Like RabbitMQ, a payload of
    frame_max bytes passes (FRAME_SIZE_FUDGE); the error names frame_max - 8.
    """

    __slots__ = ("buf", "frame_max", "held")

    def __init__(self, frame_max: int) -> None:
        self.buf = bytearray()
        self.frame_max = frame_max
        self.held = False  # the last frames() stopped at a frame `hold` kept

    def feed(self, data: bytes) -> None:
        self.buf += data

    def frames(self, hold: Callable[[int, int, bytes], bool] | None = None
               ) -> Generator[tuple[int, int, bytes], None, None]:
        """Yield complete frames; consumed bytes are dropped once at the end
        (or when the consumer stops iterating). `hold(type, channel, payload)`
        true: stop before that frame and keep it (back-pressure; see `held`)."""
        buf = self.buf
        pos = 0
        self.held = False
        try:
            n = len(buf)
            while n - pos >= 7:
                ftype, chan, size = _HDR.unpack_from(buf, pos)
                if size + FRAME_OVERHEAD > self.frame_max + FRAME_SIZE_FUDGE:
                    raise FrameError(
                        f"FRAME_ERROR - type {ftype}, frame_too_large {size} > {self.frame_max - FRAME_OVERHEAD}")
                end = pos + 7 + size
                if end >= n:
                    break
                if buf[end] != FRAME_END:
                    raise FrameError(f"FRAME_ERROR - type {ftype}, invalid_frame_end_marker {buf[end]}")
                payload = bytes(buf[pos + 7:end])
                if hold is not None and hold(ftype, chan, payload):
                    self.held = True
                    break
                pos = end + 1
                yield ftype, chan, payload
                n = len(buf)
        finally:
            if pos:
                del buf[:pos]

    def take_protocol_header(self) -> bytes | None:
        """The first 8 bytes of the stream, once they are all there."""
        if len(self.buf) < 8:
            return None
        head = bytes(self.buf[:8])
        del self.buf[:8]
        return head


# ---------------------------------------------------------------- decoding

class _Light:
    """Stand-in for a pamqp method on the hot path (no validation regex)."""

    __slots__: tuple[str, ...] = ()
    name = ""


class _Publish(_Light):
    __slots__ = ("exchange", "routing_key", "mandatory", "immediate")
    name = "Basic.Publish"

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate


class _AckLike(_Light):
    __slots__ = ("delivery_tag", "multiple", "requeue")

    def __init__(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.delivery_tag = delivery_tag
        self.multiple = multiple
        self.requeue = requeue


class _Ack(_AckLike):
    __slots__ = ()
    name = "Basic.Ack"


class _Nack(_AckLike):
    __slots__ = ()
    name = "Basic.Nack"


class _Reject(_AckLike):
    __slots__ = ()
    name = "Basic.Reject"


def _shortstr(data: bytes, pos: int) -> tuple[str, int]:
    ln = data[pos]
    end = pos + 1 + ln
    if end > len(data):
        raise ValueError("short string overruns frame")
    return data[pos + 1:end].decode("utf-8"), end


def _fast_method(cid: int, mid: int, data: bytes) -> Method | None:
    if cid != 60:
        return None
    if mid == 40:  # Basic.Publish: ticket, exchange, routing_key, bits
        exchange, pos = _shortstr(data, 6)
        rk, pos = _shortstr(data, pos)
        bits = data[pos]
        return _Publish(exchange, rk, bool(bits & 1), bool(bits & 2))
    if mid == 80:  # Basic.Ack
        (tag,) = _Q.unpack_from(data, 4)
        return _Ack(tag, bool(data[12] & 1), False)
    if mid == 120:  # Basic.Nack
        (tag,) = _Q.unpack_from(data, 4)
        return _Nack(tag, bool(data[12] & 1), bool(data[12] & 2))
    if mid == 90:  # Basic.Reject
        (tag,) = _Q.unpack_from(data, 4)
        return _Reject(tag, False, bool(data[12] & 1))
    return None


def method_ids(payload: bytes) -> tuple[int, int]:
    if len(payload) < 4:
        return 0, 0
    cid, mid = _CM.unpack_from(payload, 0)
    return cid, mid


def decode_method(payload: bytes) -> Method:
    """Decode a method frame payload.

    Raises UnknownMethod for an unknown class/method id and BadArguments when
    the arguments do not decode.
    """
    if len(payload) < 4:
        raise BadArguments("SYNTAX_ERROR - method frame too short")
    cid, mid = _CM.unpack_from(payload, 0)
    try:
        fast = _fast_method(cid, mid, payload)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as err:
        raise BadArguments(f"SYNTAX_ERROR - cannot decode {cid}.{mid}: {err}", cid, mid) from err
    if fast is not None:
        return fast
    cls = commands.INDEX_MAPPING.get((cid << 16) | mid)
    if cls is None:
        raise UnknownMethod(cid, mid)
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except _DECODE_ERRORS as err:
        raise BadArguments(f"SYNTAX_ERROR - cannot decode {method.name}", cid, mid) from err
    return method


_PROP_NAMES: list[str] = list(commands.Basic.Properties.__slots__)


def decode_header(payload: bytes) -> tuple[int, int, dict[str, Any]]:
    """Content header payload -> (class_id, body_size, properties dict).

    Properties by node/amqp/properties.py, not pamqp: header values keep
    their wire types and the timestamp is any 64-bit int (issue 28)."""
    try:
        cid, _weight, size = _CONTENT_HDR.unpack_from(payload, 0)
        if len(payload) == 14 and payload[12] == 0 and payload[13] == 0:
            return cid, size, {}  # no properties: the common cheap case
        return cid, size, properties.decode_properties(payload, 12)
    except _DECODE_ERRORS as err:
        raise BadArguments("SYNTAX_ERROR - cannot decode content header") from err


def decode_amqplain(response: str | bytes) -> dict[str, Any]:
    """AMQPLAIN response: a field table without its 4-byte length prefix."""
    raw = response.encode("utf-8") if isinstance(response, str) else bytes(response)
    try:
        _, table = decode.field_table(struct.pack(">I", len(raw)) + raw)
    except _DECODE_ERRORS:  # a bad table is a failed login, never an internal error
        return {}
    return table


# ---------------------------------------------------------------- encoding

def _frame(ftype: int, chan: int, payload: bytes) -> bytes:
    return b"".join((_HDR.pack(ftype, chan, len(payload)), payload, FRAME_END_BYTES))


_METHOD_CLASSES: dict[str, type] = {}


def method_class(path: str) -> type:
    """"Queue.DeclareOk" -> pamqp.commands.Queue.DeclareOk (cached)."""
    cls = _METHOD_CLASSES.get(path)
    if cls is None:
        owner, _, meth = path.partition(".")
        cls = getattr(getattr(commands, owner), meth)
        _METHOD_CLASSES[path] = cls
    return cls


_UNCHECKED: dict[type, type] = {}


def _no_validate(self: Any) -> None:
    pass


def encode_method(chan: int, path: str, fields: dict[str, Any] | None = None) -> bytes:
    """Method frame for the pamqp class `path` built from `fields`.

    Built from a subclass without pamqp's validate(): pamqp checks names
    against the spec's regex when it builds or marshals a method but not when
    it decodes one, so a queue name or consumer tag it accepted from a client
    (say "a b") could not be echoed in Queue.DeclareOk or Basic.ConsumeOk: an
    internal error 541 (found by tests/fuzz). Encoding still fails on what
    cannot be encoded at all (a shortstr over 255 bytes).
    """
    cls = method_class(path)
    unchecked = _UNCHECKED.get(cls)
    if unchecked is None:  # no __slots__ of its own: self.__slots__ stays the field list
        unchecked = _UNCHECKED[cls] = type(cls.__name__, (cls,), {"validate": _no_validate})
    method = unchecked()
    for name, value in (fields or {}).items():
        setattr(method, name, value)
    return _frame(FRAME_METHOD, chan, _CM.pack(int(method.index) >> 16, method.frame_id)
                  + method.marshal())


def encode_heartbeat() -> bytes:
    return HEARTBEAT


def _sstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    return bytes((len(raw),)) + raw


def encode_basic_ack(chan: int, delivery_tag: int, multiple: bool) -> bytes:
    return _frame(FRAME_METHOD, chan, b"\x00\x3c\x00\x50" + _Q.pack(delivery_tag)
                  + (b"\x01" if multiple else b"\x00"))


def encode_basic_nack(chan: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _frame(FRAME_METHOD, chan, b"\x00\x3c\x00\x78" + _Q.pack(delivery_tag) + bytes((bits,)))


_EMPTY_PROPS = b"\x00\x00"


def encode_properties(props: dict[str, Any]) -> bytes:
    """Properties dict (pamqp attribute names) -> flags + property list."""
    if not props:
        return _EMPTY_PROPS
    return properties.encode_properties(props)


def props_to_dict(props: Any) -> dict[str, Any]:
    """pamqp Basic.Properties -> dict of the properties that are set."""
    return {n: v for n in _PROP_NAMES if (v := getattr(props, n, None)) is not None and v != ""}


def dict_to_props(props: dict[str, Any]) -> Any:
    return commands.Basic.Properties(**props)


def content_frames(chan: int, props: dict[str, Any], body: bytes, frame_max: int) -> list[bytes]:
    """Content header + body frames of at most frame_max - 8 payload bytes.

    Returns pieces to be joined by the writer, so the body is copied once.
    """
    size = len(body)
    hdr_payload = b"\x00\x3c\x00\x00" + _Q.pack(size) + encode_properties(props)
    out = [_HDR.pack(FRAME_HEADER, chan, len(hdr_payload)), hdr_payload, FRAME_END_BYTES]
    chunk = frame_max - FRAME_OVERHEAD if frame_max > FRAME_OVERHEAD else size or 1
    if size <= chunk:
        if size:
            out += (_HDR.pack(FRAME_BODY, chan, size), body, FRAME_END_BYTES)
        return out
    view = memoryview(body)
    for start in range(0, size, chunk):
        part = view[start:start + chunk]
        out += (_HDR.pack(FRAME_BODY, chan, len(part)), bytes(part), FRAME_END_BYTES)
    return out


def encode_deliver(chan: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
                   exchange: str, routing_key: str, props: dict[str, Any], body: bytes,
                   frame_max: int) -> list[bytes]:
    args = b"".join((b"\x00\x3c\x00\x3c", _sstr(consumer_tag), _Q.pack(delivery_tag),
                     b"\x01" if redelivered else b"\x00", _sstr(exchange), _sstr(routing_key)))
    return [_frame(FRAME_METHOD, chan, args)] + content_frames(chan, props, body, frame_max)


def encode_get_ok(chan: int, delivery_tag: int, redelivered: bool, exchange: str,
                  routing_key: str, message_count: int, props: dict[str, Any], body: bytes,
                  frame_max: int) -> list[bytes]:
    args = b"".join((b"\x00\x3c\x00\x47", _Q.pack(delivery_tag),
                     b"\x01" if redelivered else b"\x00", _sstr(exchange), _sstr(routing_key),
                     struct.pack(">I", message_count)))
    return [_frame(FRAME_METHOD, chan, args)] + content_frames(chan, props, body, frame_max)


def encode_return(chan: int, reply_code: int, reply_text: str, exchange: str, routing_key: str,
                  props: dict[str, Any], body: bytes, frame_max: int) -> list[bytes]:
    args = b"".join((b"\x00\x3c\x00\x32", _H.pack(reply_code), _sstr(reply_text),
                     _sstr(exchange), _sstr(routing_key)))
    return [_frame(FRAME_METHOD, chan, args)] + content_frames(chan, props, body, frame_max)


def encode_publish(chan: int, exchange: str, routing_key: str, props: dict[str, Any], body: bytes,
                   frame_max: int = 131072, mandatory: bool = False,
                   immediate: bool = False) -> bytes:
    """Client-side publish (for tests and tools)."""
    bits = (1 if mandatory else 0) | (2 if immediate else 0)
    args = b"".join((b"\x00\x3c\x00\x28\x00\x00", _sstr(exchange), _sstr(routing_key),
                     bytes((bits,))))
    return b"".join([_frame(FRAME_METHOD, chan, args)]
                    + content_frames(chan, props, body, frame_max))


def encode_frame(ftype: int, chan: int, payload: bytes) -> bytes:
    return _frame(ftype, chan, payload)


def encode_table(table: dict[str, Any]) -> bytes:
    return encode.field_table(table)
