"""A compact binary encoding for everything that crosses the Raft port and
everything the log holds: peer messages, Batches and their commands.

No pickle: decoding builds only the value types below and the registered
command tuples, so a peer (authenticated or not) cannot make a node construct
arbitrary objects. Message bodies are copied into the encoding once, as raw
bytes, never re-encoded per follower.

Value tags (one byte each):
  N None, T True, F False, i int64, I big int, d float64, s str, b bytes,
  l list, t tuple, m dict, D datetime, E Decimal,
  W a header value with its AMQP wire type (node/broker/fieldtypes.py): the
    type letter, then its big-endian wire bytes (for x a u32 BE length first),
  C record: class id (u8), its field count (u8), then its fields;
  Q BasicPublish (hot path): its field count (u8), then P's layout;
  R and P: the same without the count (what builds before counted records
    wrote; still read, and still written while the cluster's machine
    version is below COUNTED_RECORDS: see `write_counted`).
Lengths and counts are u32 little endian. Decoding checks every length
against the bytes left and raises CodecError on anything malformed.

Field counts: a reader takes a record with fewer fields than its class has
(an older build wrote it) and gives the missing ones their defaults; a field
without a default is refused, and so is a record with more fields than this
build knows (a newer build wrote it: never silently truncated). A new field
is therefore appended, with a default, never inserted. An R record has the
count its class had when records carried none (_LEGACY_ARITY, frozen). A C
record leaves out its trailing fields that hold their defaults: a field
appended later (BasicConsume.timeout) reaches a build that does not know it
only when set, which its proposer does once the cluster's machine version
says every member knows it.
BasicPublish's fields beyond the seven of P's layout would follow the body.
"""
from __future__ import annotations

import datetime
import decimal
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

from node.broker import fieldtypes
from node.broker.ids import ChanId, ConnId
from node.replication import command as cmd

MAX_DEPTH = 48


class CodecError(ValueError):
    """Bytes that are not a valid encoding (garbled, truncated, unknown tag)."""


# Registered record types; the id is the index: append only, never reorder
# (the journal on disk holds these ids).
RECORDS: tuple[type, ...] = (
    ChanId, ConnId, cmd.Batch,
    cmd.ChannelOpen, cmd.ChannelClose, cmd.ChannelFlow, cmd.ConnectionClose,
    cmd.ExchangeDeclare, cmd.ExchangeDelete, cmd.ExchangeBind, cmd.ExchangeUnbind,
    cmd.QueueDeclare, cmd.QueueBind, cmd.QueueUnbind, cmd.QueuePurge, cmd.QueueDelete,
    cmd.BasicQos, cmd.BasicConsume, cmd.BasicCancel, cmd.BasicCredit, cmd.BasicGet,
    cmd.BasicPublish, cmd.BasicAck, cmd.BasicNack, cmd.BasicRecover, cmd.TxCommit,
    cmd.Echo, cmd.Tick, cmd.NodeUp, cmd.NodeDown, cmd.MarkOutOfSync, cmd.MarkInSync,
    cmd.SetMember, cmd.SetDraining, cmd.UserPut, cmd.UserDelete, cmd.VhostPut,
    cmd.VhostDelete, cmd.PermissionSet, cmd.PermissionClear, cmd.DropMember,
    cmd.PolicySet, cmd.PolicyClear,
    cmd.SetMachineVersion,
    cmd.ConnectionOpen, cmd.LimitSet, cmd.LimitClear, cmd.TopicPermissionSet,
    cmd.TopicPermissionClear,
    cmd.GlobalParameterSet, cmd.GlobalParameterClear, cmd.VhostProtection,
)
_RECORD_ID: dict[type, int] = {t: i for i, t in enumerate(RECORDS)}
_N_RECORDS = len(RECORDS)
_RECORD_ARITY: tuple[int, ...] = tuple(len(t._fields) for t in RECORDS)  # type: ignore[attr-defined]
# fields a record must carry: those without a default (defaults are trailing)
_RECORD_MIN: tuple[int, ...] = tuple(len(t._fields) - len(t._field_defaults)  # type: ignore[attr-defined]
                                     for t in RECORDS)
# each record's defaults, in field order (the trailing fields that may be left out)
_TRAILING_DEFAULTS: tuple[tuple[Any, ...], ...] = tuple(
    tuple(t._field_defaults[f] for f in t._fields[len(t._fields) - len(t._field_defaults):])  # type: ignore[attr-defined]
    for t in RECORDS)
# The field count of each record id as R (count-less) records were written:
# frozen, never edited (a field added later is absent from older R records).
_LEGACY_ARITY: tuple[int, ...] = (3, 2, 5, 2, 2, 2, 1, 9, 4, 6, 6, 9, 6, 5, 3, 5, 3, 9, 3, 3, 3, 7, 3, 5,
                                  1, 2, 3, 0, 2, 1, 1, 1, 3, 2, 3, 1, 1, 1, 5, 2, 1, 7, 3)
_PUB_FIELDS = 7  # BasicPublish's fields in P's layout

# Counted (C, Q) or count-less (R, P) records: count-less while a member of the
# cluster may run a build that reads only those (node/replication/raft_node.py
# follows the replicated machine version). Read by every encode, set rarely.
_counted = True


def write_counted(on: bool) -> None:
    """Write records with their field count (True) or as builds before
    counted records read them (False). Record ids those builds do not know
    are always written counted."""
    global _counted
    _counted = on


def writes_counted() -> bool:
    return _counted

_Q = struct.Struct("<q")
_D = struct.Struct("<d")
_U = struct.Struct("<I")
# chan.conn, chan.serial, seq, mandatory, then the lengths of node, exchange,
# routing key and body
_PUB = struct.Struct("<qqqBIIII")


# ------------------------------------------------------------------ encode
def encode(value: Any) -> bytes:
    out: list[bytes] = []
    _enc(value, out)
    return b"".join(out)


def encode_into(value: Any, out: list[bytes]) -> None:
    """Append the encoding of `value` to `out` (for formats built of many values)."""
    _enc(value, out)


def _enc(v: Any, out: list[bytes]) -> None:
    fn = _ENCODERS.get(type(v))
    if fn is None:
        rid = _RECORD_ID.get(type(v))
        if rid is None:
            raise CodecError(f"cannot encode {type(v).__name__}")
        if _counted or rid >= len(_LEGACY_ARITY):
            n = len(v)
            defaults = _TRAILING_DEFAULTS[rid]
            if defaults:
                while n > _RECORD_MIN[rid] and v[n - 1] == defaults[n - 1 - _RECORD_MIN[rid]] \
                        and type(v[n - 1]) is type(defaults[n - 1 - _RECORD_MIN[rid]]):
                    n -= 1
                v = v[:n]
            out.append(b"C" + bytes((rid, n)))
        else:
            if len(v) != _LEGACY_ARITY[rid]:
                v = _legacy_fields(v, rid)
            out.append(b"R" + bytes((rid,)))
        for f in v:
            _enc(f, out)
        return
    fn(v, out)


def _legacy_fields(v: Any, rid: int) -> Any:
    """The fields an R record carries: a field added since must hold its default
    (readers of R records do not know it)."""
    n = _LEGACY_ARITY[rid]
    defaults = type(v)._field_defaults
    for name, value in zip(v._fields[n:], v[n:], strict=True):
        if value != defaults[name]:
            raise CodecError(f"{type(v).__name__}.{name}={value!r} cannot be written before "
                             "the cluster's machine version counts record fields")
    return v[:n]


def _enc_int(v: int, out: list[bytes]) -> None:
    if -(1 << 63) <= v < (1 << 63):
        out.append(b"i" + _Q.pack(v))
    else:
        raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
        out.append(b"I" + _U.pack(len(raw)) + raw)


def _enc_str(v: str, out: list[bytes]) -> None:
    raw = v.encode("utf-8", "surrogatepass")
    out.append(b"s" + _U.pack(len(raw)))
    out.append(raw)


def _enc_bytes(v: bytes | bytearray | memoryview, out: list[bytes]) -> None:
    out.append(b"b" + _U.pack(len(v)))
    out.append(bytes(v) if not isinstance(v, bytes) else v)


def _enc_seq(tag: bytes) -> Callable[[Any, list[bytes]], None]:
    def enc(v: Any, out: list[bytes]) -> None:
        out.append(tag + _U.pack(len(v)))
        for item in v:
            _enc(item, out)
    return enc


def _enc_dict(v: dict[Any, Any], out: list[bytes]) -> None:
    out.append(b"m" + _U.pack(len(v)))
    for k, item in v.items():
        _enc(k, out)
        _enc(item, out)


def _enc_publish(v: cmd.BasicPublish, out: list[bytes]) -> None:
    # the hot command: fixed fields and lengths in one struct, the body as is
    chan = v.chan
    node = chan.node.encode()
    ex = v.exchange.encode()
    rk = v.routing_key.encode()
    body = v.body
    out.append((b"Q\x07" if _counted else b"P")
               + _PUB.pack(chan.conn, chan.serial, v.seq, v.mandatory, len(node), len(ex), len(rk), len(body))
               + node + ex + rk)
    if v.props:
        _enc_dict(v.props, out)
    else:
        out.append(b"N")
    out.append(body)


_ENCODERS: dict[type, Callable[[Any, list[bytes]], None]] = {
    type(None): lambda v, out: out.append(b"N"),
    bool: lambda v, out: out.append(b"T" if v else b"F"),
    int: _enc_int,
    float: lambda v, out: out.append(b"d" + _D.pack(v)),
    str: _enc_str,
    bytes: _enc_bytes,
    bytearray: _enc_bytes,
    memoryview: _enc_bytes,
    list: _enc_seq(b"l"),
    tuple: _enc_seq(b"t"),
    dict: _enc_dict,
    datetime.datetime: lambda v, out: _enc_tagged_str(b"D", v.isoformat(), out),
    decimal.Decimal: lambda v, out: _enc_tagged_str(b"E", str(v), out),
    cmd.BasicPublish: _enc_publish,
}
for _wire_type in fieldtypes.WIRE_TYPES.values():
    _ENCODERS[_wire_type] = lambda v, out: out.append(b"W" + v.wire + fieldtypes.pack_scalar(v))


def _enc_tagged_str(tag: bytes, s: str, out: list[bytes]) -> None:
    raw = s.encode()
    out.append(tag + _U.pack(len(raw)) + raw)


# ------------------------------------------------------------------ decode
def decode(data: bytes, start: int = 0) -> Any:
    """Decode exactly one value that fills data[start:] (no copy of the rest)."""
    value, pos = decode_from(data, start)
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} trailing bytes")
    return value


def decode_from(data: bytes, pos: int) -> tuple[Any, int]:
    """Decode one value starting at `pos`; returns it and the position after it."""
    if not isinstance(data, bytes):
        raise CodecError("decode takes bytes")
    try:
        return _dec(data, pos, 0)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError, TypeError,
            decimal.InvalidOperation, OverflowError) as e:
        if isinstance(e, CodecError):
            raise
        raise CodecError(f"malformed encoding: {e}") from None


def _take(buf: bytes, pos: int, n: int) -> int:
    end = pos + n
    if n < 0 or end > len(buf):
        raise CodecError("truncated")
    return end


def _dec(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise CodecError("nested too deeply")
    if pos >= len(buf):
        raise CodecError("truncated")
    tag = buf[pos]
    pos += 1
    if tag == 0x62:  # b
        n = _U.unpack_from(buf, pos)[0]
        end = _take(buf, pos + 4, n)
        return buf[pos + 4:end], end
    if tag == 0x69:  # i
        return _Q.unpack_from(buf, pos)[0], pos + 8
    if tag == 0x73:  # s
        n = _U.unpack_from(buf, pos)[0]
        end = _take(buf, pos + 4, n)
        return buf[pos + 4:end].decode("utf-8", "surrogatepass"), end
    if tag == 0x4E:  # N
        return None, pos
    if tag == 0x54:  # T
        return True, pos
    if tag == 0x46:  # F
        return False, pos
    if tag == 0x51:  # Q
        if buf[pos] != _PUB_FIELDS:
            raise CodecError(f"a BasicPublish record with {buf[pos]} fields: this build reads {_PUB_FIELDS}"
                             + (" (written by a newer build)" if buf[pos] > _PUB_FIELDS else ""))
        return _dec_publish(buf, pos + 1, depth)
    if tag == 0x43:  # C
        rid = buf[pos]
        count = buf[pos + 1]
        if rid < _N_RECORDS and count == _RECORD_ARITY[rid]:  # as this build writes it (inline: hot)
            pos += 2
            fields = []
            for _ in range(count):
                f, pos = _dec(buf, pos, depth + 1)
                fields.append(f)
            return RECORDS[rid](*fields), pos
        if rid >= _N_RECORDS:
            raise CodecError(f"unknown record {rid} (written by a newer build?)")
        return _dec_record(buf, pos + 2, depth, rid, count)
    if tag == 0x50:  # P
        return _dec_publish(buf, pos, depth)
    if tag == 0x52:  # R
        rid = buf[pos]
        if rid >= len(_LEGACY_ARITY):
            raise CodecError(f"unknown record {rid}")
        return _dec_record(buf, pos + 1, depth, rid, _LEGACY_ARITY[rid])
    if tag in (0x6C, 0x74):  # l, t
        n = _U.unpack_from(buf, pos)[0]
        pos += 4
        if n > len(buf) - pos:  # every item takes at least one byte
            raise CodecError("truncated")
        items = []
        for _ in range(n):
            item, pos = _dec(buf, pos, depth + 1)
            items.append(item)
        return (items if tag == 0x6C else tuple(items)), pos
    if tag == 0x6D:  # m
        n = _U.unpack_from(buf, pos)[0]
        pos += 4
        if 2 * n > len(buf) - pos:
            raise CodecError("truncated")
        out: dict[Any, Any] = {}
        for _ in range(n):
            k, pos = _dec(buf, pos, depth + 1)
            v, pos = _dec(buf, pos, depth + 1)
            try:
                out[k] = v
            except TypeError:
                raise CodecError("unhashable key") from None
        return out, pos
    if tag == 0x64:  # d
        return _D.unpack_from(buf, pos)[0], pos + 8
    if tag == 0x49:  # I
        n = _U.unpack_from(buf, pos)[0]
        end = _take(buf, pos + 4, n)
        if n > 64:
            raise CodecError("integer too large")
        return int.from_bytes(buf[pos + 4:end], "little", signed=True), end
    if tag == 0x57:  # W
        letter = buf[pos:pos + 1]
        if letter == b"x":
            n = struct.unpack_from(">I", buf, pos + 1)[0]
            start = pos + 5
        else:
            wire_int = fieldtypes.INT_STRUCTS.get(letter)
            if wire_int is None and letter != b"f":
                raise CodecError(f"unknown wire type {letter!r}")
            n = wire_int.size if wire_int is not None else 4
            start = pos + 1
        end = _take(buf, start, n)
        return fieldtypes.unpack_scalar(letter, buf[start:end]), end
    if tag in (0x44, 0x45):  # D, E
        n = _U.unpack_from(buf, pos)[0]
        end = _take(buf, pos + 4, n)
        if n > 64:
            raise CodecError("value too long")
        text = buf[pos + 4:end].decode()
        if tag == 0x44:
            return datetime.datetime.fromisoformat(text), end
        return decimal.Decimal(text), end
    raise CodecError(f"unknown tag {tag:#x}")


def _dec_record(buf: bytes, pos: int, depth: int, rid: int, count: int) -> tuple[Any, int]:
    kind = RECORDS[rid]
    if count != _RECORD_ARITY[rid]:
        if count > _RECORD_ARITY[rid]:
            raise CodecError(f"a {kind.__name__} record with {count} fields: this build knows "
                             f"{_RECORD_ARITY[rid]} (written by a newer build)")
        if count < _RECORD_MIN[rid]:
            raise CodecError(f"a {kind.__name__} record with {count} fields lacks "
                             f"{kind._fields[count]!r}, which has no default")  # type: ignore[attr-defined]
    fields = []
    for _ in range(count):
        f, pos = _dec(buf, pos, depth + 1)
        fields.append(f)
    return kind(*fields), pos  # missing trailing fields take the class's defaults


def _dec_publish(buf: bytes, pos: int, depth: int) -> tuple[cmd.BasicPublish, int]:
    conn, serial, seq, mandatory, n_node, n_ex, n_rk, n_body = _PUB.unpack_from(buf, pos)
    a = pos + _PUB.size
    b = a + n_node
    c = b + n_ex
    d = _take(buf, c, n_rk)
    if mandatory > 1 or d >= len(buf):
        raise CodecError("bad publish")
    props_at = d
    if buf[d] == 0x4E:  # N: no properties
        props: Any = {}
        d += 1
    else:
        props, d = _dec(buf, d, depth + 1)
        if not isinstance(props, dict):
            raise CodecError("publish properties must be a table")
    end = _take(buf, d, n_body)
    # names recur across publishes: one str each (they are kept per queued message)
    p = cmd.BasicPublish(ChanId(buf[a:b].decode(), conn, serial), seq, sys.intern(buf[b:c].decode()),
                         sys.intern(buf[c:c + n_rk].decode()), mandatory == 1, props, buf[d:end])
    spans = _tls.__dict__.get("spans")
    if spans is not None:
        spans[id(p)] = (props_at, d - props_at)
    return p, end


# ----------------------------------------------------------------- batches
def encode_batch(batch: cmd.Batch) -> bytes:
    return encode(batch)


_tls = threading.local()  # decode_batch's `spans` (the raft thread applies while others decode)


def decode_batch(data: bytes, start: int = 0, spans: dict[int, tuple[int, int]] | None = None) -> cmd.Batch:
    """With `spans`: for each BasicPublish (nested in a TxCommit too), keyed by
    id() of the decoded command, (offset of its encoded properties in `data`,
    their length); its body follows them. The message store reads them back
    from the log at those offsets (node/replication/message_store.py)."""
    _tls.spans = spans
    try:
        value = decode(data, start)
    finally:
        _tls.spans = None
    if type(value) is not cmd.Batch:
        raise CodecError("not a batch")
    if not isinstance(value.commands, list) or not all(type(c) in _RECORD_ID for c in value.commands):
        raise CodecError("a batch holds commands only")
    return value
