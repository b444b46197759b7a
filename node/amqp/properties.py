"""Basic content-header properties and their field tables, with struct.

The headers table comes back to consumers as it was published, byte for byte
(RabbitMQ does): values decode to node.broker.fieldtypes' typed values where
Python's own type would lose the wire type (B, u, i, f, x, T, ...) and are
encoded from that type again. pamqp decoded a `B` as an int it re-encoded as
`b`, an `f` as a float it re-encoded as... `f` but a `d` as `f` too, an `x` as
bytes it re-encoded as `S`, and a timestamp into a datetime (failing past
year 9999, and dividing values over 2^32 by 1000). The timestamp property is
a plain int here: any 64-bit value is stored and returned.

Decoding walks the buffer by offset (linear in the table's size) and never
lets a value run past its table; errors are ValueError, struct.error,
UnicodeDecodeError, KeyError or RecursionError, which frame.decode_header
turns into 502.
"""
from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any

from node.broker.fieldtypes import (
    FLOAT32,
    INT_STRUCTS,
    INT_TYPES,
    ByteArray,
    Float32,
    WireInt,
)

# (pamqp's attribute name, kind) in flag order from bit 15 down
PROPERTIES: tuple[tuple[str, str], ...] = (
    ("content_type", "s"), ("content_encoding", "s"), ("headers", "F"),
    ("delivery_mode", "o"), ("priority", "o"), ("correlation_id", "s"), ("reply_to", "s"),
    ("expiration", "s"), ("message_id", "s"), ("timestamp", "T"), ("message_type", "s"),
    ("user_id", "s"), ("app_id", "s"), ("cluster_id", "s"),
)
_FLAG = {name: 1 << (15 - i) for i, (name, _) in enumerate(PROPERTIES)}
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_DOUBLE = struct.Struct(">d")
_DEC = struct.Struct(">BI")
_U64_MASK = (1 << 64) - 1
_SIZED = b"SxAF"


# ---------------------------------------------------------------- decoding

def decode_properties(buf: bytes, pos: int) -> dict[str, Any]:
    """The property flags at `pos` and the properties they announce."""
    (flags,) = _U16.unpack_from(buf, pos)
    pos += 2
    more = flags & 1
    while more:  # continuation words: basic has no properties past the first 14
        (extra,) = _U16.unpack_from(buf, pos)
        if extra & 0xFFFE:
            raise ValueError("unknown property flags")
        more = extra & 1
        pos += 2
    out: dict[str, Any] = {}
    for name, kind in PROPERTIES:
        if not flags & _FLAG[name]:
            continue
        if kind == "s":
            n = buf[pos]
            end = pos + 1 + n
            if end > len(buf):
                raise ValueError("short string overruns the header")
            out[name] = buf[pos + 1:end].decode("utf-8")
            pos = end
        elif kind == "o":
            out[name] = buf[pos]
            pos += 1
        elif kind == "T":
            out[name] = _U64.unpack_from(buf, pos)[0]
            pos += 8
        else:
            pos, out[name] = field_table(buf, pos, len(buf))
    if pos != len(buf):
        raise ValueError("trailing bytes after the properties")
    return out


def field_table(buf: bytes, pos: int, limit: int) -> tuple[int, dict[str, Any]]:
    """A length-prefixed table at `pos` (not past `limit`): (next offset, table)."""
    end = _sized_end(buf, pos, limit)
    pos += 4
    table: dict[str, Any] = {}
    while pos < end:
        n = buf[pos]
        key_end = pos + 1 + n
        if key_end > end:
            raise ValueError("field table key overruns its table")
        key = buf[pos + 1:key_end].decode("utf-8")
        pos, table[key] = _value(buf, key_end, end)
    return end, table


def _field_array(buf: bytes, pos: int, limit: int) -> tuple[int, list[Any]]:
    end = _sized_end(buf, pos, limit)
    pos += 4
    items: list[Any] = []
    while pos < end:
        pos, item = _value(buf, pos, end)
        items.append(item)
    return end, items


def _sized_end(buf: bytes, pos: int, limit: int) -> int:
    if pos + 4 > limit:
        raise ValueError("length overruns its table")
    end = pos + 4 + _U32.unpack_from(buf, pos)[0]
    if end > limit:
        raise ValueError("value overruns its table")
    return end


def _value(buf: bytes, pos: int, limit: int) -> tuple[int, Any]:
    letter = buf[pos:pos + 1]
    pos += 1
    fmt = INT_STRUCTS.get(letter)
    if fmt is not None:
        end = pos + fmt.size
        if end > limit:
            raise ValueError("value overruns its table")
        return end, INT_TYPES[letter](fmt.unpack_from(buf, pos)[0])
    if letter == b"S":
        end = _sized_end(buf, pos, limit)
        raw = buf[pos + 4:end]
        try:
            return end, raw.decode("utf-8")
        except UnicodeDecodeError:
            return end, raw  # plain bytes: a longstr that is not UTF-8, sent back as S
    if letter == b"t":
        _check(pos + 1, limit)
        return pos + 1, buf[pos] != 0
    if letter == b"d":
        _check(pos + 8, limit)
        return pos + 8, _DOUBLE.unpack_from(buf, pos)[0]
    if letter == b"f":
        _check(pos + 4, limit)
        return pos + 4, Float32(FLOAT32.unpack_from(buf, pos)[0])
    if letter == b"D":
        _check(pos + 5, limit)
        scale, raw_int = _DEC.unpack_from(buf, pos)
        # the digits and exponent as sent (Decimal keeps trailing zeros): same bytes back
        return pos + 5, decimal.Decimal((0, tuple(int(c) for c in str(raw_int)), -scale))
    if letter == b"F":
        return field_table(buf, pos, limit)
    if letter == b"A":
        return _field_array(buf, pos, limit)
    if letter == b"x":
        end = _sized_end(buf, pos, limit)
        return end, ByteArray(buf[pos + 4:end])
    if letter == b"V":
        return pos, None
    raise ValueError(f"unknown field type {letter!r}")


def _check(end: int, limit: int) -> None:
    if end > limit:
        raise ValueError("value overruns its table")


# ---------------------------------------------------------------- encoding

def encode_properties(props: dict[str, Any]) -> bytes:
    """Flags and property list. A value that cannot be encoded (a shortstr
    over 255 bytes, a priority of 300 from an old log entry) is left out: a
    delivery must never fail on its properties (that requeued the message and
    closed each consumer in turn, found by tests/fuzz)."""
    flags = 0
    parts: list[bytes] = []
    for name, kind in PROPERTIES:
        value = props.get(name)
        if value is None:
            continue
        try:
            if kind == "s":
                raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
                if len(raw) > 255:
                    continue
                part = bytes((len(raw),)) + raw
            elif kind == "o":
                part = bytes((int(value),))
            elif kind == "T":
                part = _U64.pack(_seconds(value) & _U64_MASK)
            else:
                if not isinstance(value, dict):
                    continue
                part = encode_table(value)
        except (TypeError, ValueError, OverflowError, struct.error):
            continue
        flags |= _FLAG[name]
        parts.append(part)
    return _U16.pack(flags) + b"".join(parts)


def encode_table(table: dict[str, Any]) -> bytes:
    body = bytearray()
    for key, value in table.items():
        raw = str(key).encode("utf-8")[:255]
        body += bytes((len(raw),)) + raw
        _encode_value(value, body)
    return _U32.pack(len(body)) + bytes(body)


def _encode_value(value: Any, out: bytearray) -> None:
    """One field value: its own wire type when it has one, else the default
    for its Python type (a long string as text for anything else)."""
    if isinstance(value, bool):
        out += b"t\x01" if value else b"t\x00"
    elif isinstance(value, WireInt):
        out += value.wire + INT_STRUCTS[value.wire].pack(value)
    elif isinstance(value, int):
        out += _plain_int(value)
    elif isinstance(value, Float32):
        out += b"f" + FLOAT32.pack(value)
    elif isinstance(value, float):
        out += b"d" + _DOUBLE.pack(value)  # a double: never overflows, loses nothing
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        out += b"S" + _U32.pack(len(raw)) + raw
    elif isinstance(value, ByteArray):
        out += b"x" + _U32.pack(len(value)) + value
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        out += b"S" + _U32.pack(len(raw)) + raw
    elif isinstance(value, dict):
        out += b"F" + encode_table(value)
    elif isinstance(value, list | tuple):
        items = bytearray()
        for v in value:
            _encode_value(v, items)
        out += b"A" + _U32.pack(len(items)) + items
    elif value is None:
        out += b"V"
    elif isinstance(value, datetime.datetime):
        out += b"T" + _U64.pack(_seconds(value) & _U64_MASK)
    elif isinstance(value, decimal.Decimal) and (dec := _decimal(value)) is not None:
        out += b"D" + dec
    else:
        raw = str(value).encode("utf-8")
        out += b"S" + _U32.pack(len(raw)) + raw


def _plain_int(value: int) -> bytes:
    """An int with no wire type of its own (the broker's, JSON's): the smallest
    signed type that holds it."""
    if -128 <= value <= 127:
        return b"b" + INT_STRUCTS[b"b"].pack(value)
    if -32768 <= value <= 32767:
        return b"s" + INT_STRUCTS[b"s"].pack(value)
    if -(1 << 31) <= value < (1 << 31):
        return b"I" + INT_STRUCTS[b"I"].pack(value)
    if -(1 << 63) <= value < (1 << 63):
        return b"l" + INT_STRUCTS[b"l"].pack(value)
    raw = str(value).encode()
    return b"S" + _U32.pack(len(raw)) + raw


def _decimal(value: decimal.Decimal) -> bytes | None:
    sign, digits, exponent = value.as_tuple()
    if sign or not isinstance(exponent, int) or exponent > 0 or -exponent > 255:
        return None
    raw = int("".join(map(str, digits)) or "0")
    if raw >= 1 << 32:
        return None
    return _DEC.pack(-exponent, raw)


def _seconds(value: Any) -> int:
    if isinstance(value, datetime.datetime):  # from log entries and snapshots of older builds
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return int(value.timestamp())
    return int(value)
