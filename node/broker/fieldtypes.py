"""Field-table values that remember their AMQP wire type.

A header table is handed back to consumers exactly as it was published
(RabbitMQ does): an unsigned byte stays `B`, a float32 stays `f`, a byte
array stays `x`. Python has one int, one float and one bytes type, so the
values decoded from a message's headers are subclasses carrying their type
letter in `wire`; they compare, hash and compute as the plain value (a
headers exchange matches `B` 5 against `l` 5), and arithmetic on them gives
plain values again. Plain values (built by the broker or from JSON) are
encoded by the default rules of node/amqp/properties.py.

Here and not in node/amqp: the replicated command codec and the snapshot
format carry these values too, and they may not import the wire layer.
"""
from __future__ import annotations

import struct
from typing import ClassVar


class WireInt(int):
    """An integer field of a given wire type (see INT_TYPES)."""

    __slots__ = ()
    wire: ClassVar[bytes] = b"l"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


def _int_type(name: str, letter: bytes) -> type[WireInt]:
    return type(name, (WireInt,), {"__slots__": (), "wire": letter})


# RabbitMQ's dialect (rabbit_binary_parser): s is a signed 16-bit, l and L are
# both signed 64-bit (RabbitMQ re-encodes L as l; we keep the letter). U, the
# 0-9-1 spec's signed 16-bit that RabbitMQ does not parse, is kept the same way.
Int8 = _int_type("Int8", b"b")
UInt8 = _int_type("UInt8", b"B")
Int16 = _int_type("Int16", b"s")
UInt16 = _int_type("UInt16", b"u")
Int16U = _int_type("Int16U", b"U")
Int32 = _int_type("Int32", b"I")
UInt32 = _int_type("UInt32", b"i")
Int64 = _int_type("Int64", b"l")
Int64L = _int_type("Int64L", b"L")
Timestamp = _int_type("Timestamp", b"T")  # seconds, unsigned 64-bit, any value (no datetime)

INT_STRUCTS: dict[bytes, struct.Struct] = {
    b"b": struct.Struct(">b"), b"B": struct.Struct(">B"), b"s": struct.Struct(">h"),
    b"u": struct.Struct(">H"), b"U": struct.Struct(">h"), b"I": struct.Struct(">i"),
    b"i": struct.Struct(">I"), b"l": struct.Struct(">q"), b"L": struct.Struct(">q"),
    b"T": struct.Struct(">Q"),
}
INT_TYPES: dict[bytes, type[WireInt]] = {
    t.wire: t for t in (Int8, UInt8, Int16, UInt16, Int16U, Int32, UInt32, Int64, Int64L,
                        Timestamp)
}


class Float32(float):
    """A `f` field: the double nearest the float32 sent, packed back to the same 4 bytes."""

    __slots__ = ()
    wire: ClassVar[bytes] = b"f"

    def __repr__(self) -> str:
        return f"Float32({float(self)!r})"


class ByteArray(bytes):
    """An `x` field (RabbitMQ's binary); plain bytes are a non-UTF-8 `S`."""

    __slots__ = ()
    wire: ClassVar[bytes] = b"x"


FLOAT32 = struct.Struct(">f")

WIRE_TYPES: dict[bytes, type] = {**INT_TYPES, b"f": Float32, b"x": ByteArray}


def pack_scalar(value: WireInt | Float32 | ByteArray) -> bytes:
    """The value's wire bytes after its type letter (a u32 length first for `x`)."""
    if isinstance(value, WireInt):
        return INT_STRUCTS[value.wire].pack(value)
    if isinstance(value, Float32):
        return FLOAT32.pack(value)
    return struct.pack(">I", len(value)) + bytes(value)


def unpack_scalar(letter: bytes, raw: bytes) -> WireInt | Float32 | ByteArray:
    """The typed value of one scalar's wire bytes (for `x`: without the length);
    struct.error or KeyError when they do not fit the type."""
    if letter == b"f":
        return Float32(FLOAT32.unpack(raw)[0])
    if letter == b"x":
        return ByteArray(raw)
    return INT_TYPES[letter](INT_STRUCTS[letter].unpack(raw)[0])
