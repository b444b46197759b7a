"""node.amqp.frame's linear field-table decoding against pamqp's own
(quadratic) decoder as the oracle: every table pamqp encodes decodes to the
same value both ways, nested tables and arrays included, in method arguments;
content headers come back byte for byte (node/amqp/properties.py); malformed tables fail with the decode errors the wire
turns into 502."""
from __future__ import annotations

import datetime
import decimal
import importlib.util
import struct
from types import ModuleType
from typing import Any

import pamqp.decode
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, encode
from pamqp import frame as pframe

from node.amqp import frame


def _pristine_pamqp_decode() -> ModuleType:
    """A second, unpatched copy of pamqp.decode (frame.py patches the shared one)."""
    spec = importlib.util.spec_from_file_location("pamqp_decode_oracle", pamqp.decode.__file__)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ORACLE = _pristine_pamqp_decode()
KEYS = st.text(min_size=1, max_size=20)
SCALARS = st.one_of(
    st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=40), st.none(),
    st.floats(width=32, allow_nan=False, allow_infinity=False), st.binary(max_size=20).map(bytearray),
    st.decimals(min_value=-10**6, max_value=10**6, places=2, allow_nan=False,
                allow_infinity=False),
    st.datetimes(min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2100, 1, 1))
    .map(lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(KEYS, inner, max_size=5)), max_leaves=15)
TABLES = st.dictionaries(KEYS, VALUES, max_size=10)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=150, deadline=None, derandomize=True)
@given(TABLES)
def test_tables_decode_as_pamqp_decodes_them(table: dict[str, Any]) -> None:
    raw = encode.field_table(table)
    ours = pamqp.decode.field_table(raw + b"trailing")
    theirs = ORACLE.field_table(raw + b"trailing")
    assert ours[0] == theirs[0] == len(raw)
    assert _same(ours[1], theirs[1]), (ours, theirs)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(TABLES, TABLES)
def test_method_arguments_and_headers_decode_through_the_wire(args: dict[str, Any],
                                                             headers: dict[str, Any]) -> None:
    payload = pframe.marshal(commands.Queue.Declare(queue="q", arguments=args), 1)[7:-1]
    m = frame.decode_method(payload)
    assert _same(m.arguments, ORACLE.field_table(encode.field_table(args))[1])
    # headers keep their wire types (issue 28): encoded again, the same bytes
    prop_bytes = commands.Basic.Properties(headers=headers, delivery_mode=2).marshal()
    _cid, _size, got = frame.decode_header(b"\x00\x3c\x00\x00" + struct.pack(">Q", 3) + prop_bytes)
    assert frame.encode_properties(got) == prop_bytes


def test_malformed_tables_are_decode_errors() -> None:
    bad = [
        struct.pack(">I", 10) + b"\x01k",  # table longer than the data
        struct.pack(">I", 3) + b"\x05k",  # key longer than the table
        struct.pack(">I", 3) + b"\x01kZ",  # unknown type
        struct.pack(">I", 4) + b"\x01kI\x00",  # value runs past the table's end
        struct.pack(">I", 7) + b"\x01kS" + struct.pack(">I", 99)[:3] + b"",  # truncated length
        struct.pack(">I", 8) + b"\x01kS" + struct.pack(">I", 50),  # string past the end
        b"\x00\x00",  # no length
    ]
    for raw in bad:
        try:
            pamqp.decode.field_table(raw)
        except (ValueError, struct.error, UnicodeDecodeError, IndexError):
            continue
        raise AssertionError(f"{raw!r} decoded")


def test_many_tiny_entries_decode_to_what_pamqp_gets() -> None:
    table = {f"k{i}": i for i in range(8_000)}  # ~70 KB: the case that was quadratic
    raw = encode.field_table(table)
    assert pamqp.decode.field_table(raw)[1] == table == ORACLE.field_table(raw)[1]
    assert decimal.Decimal  # (imported for the strategies above)
