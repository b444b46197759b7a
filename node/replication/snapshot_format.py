"""The snapshot file: the whole replicated state (BrokerState) and the Raft
position it was taken at, in a versioned binary format of our own. No pickle:
decoding builds only the broker's own types (set field by field from checked
values), the codec's plain values and records, or raises SnapshotFormatError.

Layout (integers little endian):
  header  magic (8) | format version u16 | reserved u16 | body length u64 | CRC32 of the body u32
  body    raft position: one codec value (RaftMeta)
          plain state: one codec value (the scalar fields and plain tables)
          exchanges    u32 count, each one codec tuple
          queues       u32 count, each: a codec tuple of its fields, then its
                       returned (heap) and ready messages
          channels     u32 count, each one codec tuple
          consumers    u32 count, each one codec tuple (channel and queue by index)
          links        per channel: its unacked deliveries and consumers;
                       per queue: its consumers and exclusive consumer
          policies     one codec value: the policies and operator policies
                       (issue 28; absent from older files: none then)
A message is a fixed struct, its exchange and routing key, its properties
(a codec table, or a back reference: publishes routed to several queues share
one table and one body, and still do after a load) and its body as raw bytes.
Queues, channels and consumers are referenced by index, so the object graph
(an unacked delivery's queue and consumer, a consumer's channel) comes back
with the same sharing, deleted queues that deliveries still name included.

The whole body is covered by the CRC: a damaged file is refused before any of
it is decoded. A new layout gets a new version number; this build reads
READ_VERSIONS. Version 2 (issue 28): message properties may hold the codec's
W values (header values with their AMQP wire type); version 1 files, which
cannot, are read as before.
"""
from __future__ import annotations

import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from io import BytesIO
from typing import IO, Any, NamedTuple

from node.broker.channel import Channel, Consumer
from node.broker.exchange import Binding, Exchange, split_topic
from node.broker.ids import ChanId
from node.broker.policy import Policy
from node.broker.queue import Message, Queue, raw_priority
from node.replication.codec import CodecError, decode_from, encode_into
from node.replication.machine.policy import rebuild_policy_ae
from node.replication.machine.state import BrokerState
from node.replication.message_store import PayloadCache, split_loc

MAGIC = b"\x89MQSNAP\n"  # not a pickle (0x80), not text
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
_HEADER = struct.Struct("<8sHHQI")
HEADER_SIZE = _HEADER.size
_U32 = struct.Struct("<I")
# seq, expires_at, delivery_count, flags, exchange length, routing key length,
# body length (or, with _BODY_REF, the index of a body written before)
_MSG = struct.Struct("<qdIBIII")
_PERSISTENT, _REDELIVERED, _EXPIRES, _PROPS_EMPTY, _PROPS_REF, _BODY_REF = 1, 2, 4, 8, 16, 32
_FLUSH_PIECES = 16384  # encoded pieces joined into one write


class SnapshotFormatError(ValueError):
    """Bytes that are not a snapshot this build can load (foreign, damaged,
    truncated, another format version)."""


class RaftMeta(NamedTuple):
    """Where the snapshot stands in the Raft log, as plain values: the last
    two entries it covers (command, index, term) and the cluster's addresses."""

    last: tuple[bytes, int, int]
    prev: tuple[bytes, int, int]
    members: tuple[str, ...]


# The fields each record is written with. tests/unit/replication/test_snapshot_format.py
# checks them against the classes' __slots__: a new slot must be added here.
STATE_FIELDS = ("now", "counter", "message_bytes", "config_version", "members", "in_sync",
                "draining", "users", "vhosts", "permissions", "dedup", "ttl_index",
                "expires_index", "conns", "exclusive")
EXCHANGE_FIELDS = ("name", "type", "durable", "auto_delete", "internal", "arguments", "home",
                   "direct", "fanout", "incoming")
QUEUE_FIELDS = ("name", "durable", "exclusive", "owner", "auto_delete", "arguments", "home",
                "message_ttl", "expires", "max_length", "max_length_bytes", "overflow", "dlx",
                "dlrk", "max_priority", "single_active", "delivery_limit", "counts_deliveries",
                "prio_consumers", "next_seq", "ready_bytes", "last_used", "deleted", "incoming",
                "stats")
CHANNEL_FIELDS = ("id", "vhost", "next_tag", "prefetch", "global_prefetch", "limited_unacked",
                  "flow")
CONSUMER_FIELDS = ("chan", "tag", "no_ack", "exclusive", "prefetch", "unacked", "credit",
                   "priority")
# BrokerState's slots written in the policies section (after everything else)
POLICY_FIELDS = ("policies", "operator_policies")
# slots not in the field lists: written another way (references, messages) or derived
DERIVED = {
    "BrokerState": ("exchanges", "queues", "channels", "live", "fetch_props", "policy_ae",
                    *POLICY_FIELDS),
    "Exchange": ("bindings", "_topic_cache"),
    "Queue": ("returned", "ready", "consumers", "exclusive_consumer"),
    "Channel": ("unacked", "consumers"),
    "Consumer": ("channel", "queue"),
    "Message": ("size", "loc", "priority"),
}


# ------------------------------------------------------------------ write
class _Writer:
    """Collects encoded pieces and hands them to `sink` in large writes,
    keeping the body's length and CRC."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.out: list[bytes] = []
        self.length = 0
        self.crc = 0

    def value(self, v: Any) -> None:
        encode_into(v, self.out)

    def u32(self, n: int) -> None:
        self.out.append(_U32.pack(n))

    def maybe_flush(self) -> None:
        if len(self.out) >= _FLUSH_PIECES:
            self.flush()

    def flush(self) -> None:
        data = b"".join(self.out)
        self.out = []
        self.crc = zlib.crc32(data, self.crc)
        self.length += len(data)
        self.sink.write(data)


def write_snapshot(sink: IO[bytes], state: BrokerState, raft: RaftMeta,
                   entry: Callable[[int], bytes] | None = None) -> int:
    """Write the snapshot to a seekable binary file; returns its size.
    `entry(index)`: a log entry's payload (checked), for the messages whose
    bytes are in the log (message_store): they are written inline."""
    start = sink.tell()
    sink.write(bytes(HEADER_SIZE))  # filled in once the body's length and CRC are known
    w = _Writer(sink)
    w.value(tuple(raft))
    w.value(tuple(getattr(state, f) for f in STATE_FIELDS))
    _write_exchanges(w, state)
    queues, channels, consumers = _graph(state)
    msgs = _MessageWriter(w, entry)  # one for the whole file: back references span queues
    _write_queues(w, state, queues, msgs)
    q_index = {id(q): i for i, q in enumerate(queues)}
    c_index = {id(c): i for i, c in enumerate(channels)}
    k_index = {id(k): i for i, k in enumerate(consumers)}
    w.value([(key, c_index[id(ch)]) for key, ch in state.channels.items()])
    w.u32(len(channels))
    for ch in channels:
        w.value(tuple(getattr(ch, f) for f in CHANNEL_FIELDS))
    w.u32(len(consumers))
    for k in consumers:
        w.value((c_index[id(k.channel)], q_index[id(k.queue)], *(getattr(k, f) for f in CONSUMER_FIELDS)))
    for ch in channels:
        w.u32(len(ch.unacked))
        for tag, (q, m, by) in ch.unacked.items():
            w.value((tag, q_index[id(q)], -1 if by is None else k_index[id(by)]))
            msgs.write(m)
        w.value([(tag, k_index[id(k)]) for tag, k in ch.consumers.items()])
        w.maybe_flush()
    for q in queues:
        ex = q.exclusive_consumer
        w.value(([(key, k_index[id(k)]) for key, k in q.consumers.items()],
                 -1 if ex is None else k_index[id(ex)]))
    _write_policies(w, state)
    w.flush()
    end = sink.tell()
    sink.seek(start)
    sink.write(_HEADER.pack(MAGIC, FORMAT_VERSION, 0, w.length, w.crc))
    sink.seek(end)
    return end - start


def encode_snapshot(state: BrokerState, raft: RaftMeta) -> bytes:
    buf = BytesIO()
    write_snapshot(buf, state, raft)
    return buf.getvalue()


def _write_exchanges(w: _Writer, state: BrokerState) -> None:
    w.u32(len(state.exchanges))
    for key, x in state.exchanges.items():
        bindings = [(bk, b.source, b.dest, b.routing_key, b.arguments) for bk, b in x.bindings.items()]
        w.value((key, *(getattr(x, f) for f in EXCHANGE_FIELDS), bindings))
        w.maybe_flush()


def _graph(state: BrokerState) -> tuple[list[Queue], list[Channel], list[Consumer]]:
    """Every queue, channel and consumer the state reaches, each once: the
    tables' own first, in table order; then the ones only references reach
    (e.g. a deleted queue that an unacked delivery came from)."""
    queues: dict[int, Queue] = {}
    channels: dict[int, Channel] = {}
    consumers: dict[int, Consumer] = {}
    todo_q: list[Queue] = []
    todo_c: list[Channel] = []

    def queue(q: Queue) -> None:
        if id(q) not in queues:
            queues[id(q)] = q
            todo_q.append(q)

    def channel(ch: Channel) -> None:
        if id(ch) not in channels:
            channels[id(ch)] = ch
            todo_c.append(ch)

    def consumer(k: Consumer) -> None:
        if id(k) not in consumers:
            consumers[id(k)] = k
            channel(k.channel)
            queue(k.queue)

    for q in state.queues.values():
        queue(q)
    for ch in state.channels.values():
        channel(ch)
    while todo_q or todo_c:
        while todo_c:
            ch = todo_c.pop()
            for k in ch.consumers.values():
                consumer(k)
            for q, _m, k2 in ch.unacked.values():
                queue(q)
                if k2 is not None:
                    consumer(k2)
        while todo_q:
            q = todo_q.pop()
            for k in q.consumers.values():
                consumer(k)
            if q.exclusive_consumer is not None:
                consumer(q.exclusive_consumer)
    return list(queues.values()), list(channels.values()), list(consumers.values())


def _write_queues(w: _Writer, state: BrokerState, queues: list[Queue], msgs: _MessageWriter) -> None:
    q_index = {id(q): i for i, q in enumerate(queues)}
    w.value([(key, q_index[id(q)]) for key, q in state.queues.items()])
    w.u32(len(queues))
    for q in queues:
        w.value(tuple(getattr(q, f) for f in QUEUE_FIELDS))
        w.u32(len(q.returned))
        for key, m in q.returned:
            w.value(key)
            msgs.write(m)
        w.u32(len(q.ready))
        for m in q.ready:
            msgs.write(m)
            w.maybe_flush()
        w.maybe_flush()


class _MessageWriter:
    """Messages, with bodies and property tables shared between queues written once."""

    def __init__(self, w: _Writer, entry: Callable[[int], bytes] | None) -> None:
        self.w = w
        # back references: inline bytes by id(), bytes in the log by their loc
        self.bodies: dict[int, int] = {}
        self.props: dict[int, int] = {}
        self.n_bodies = 0
        self.n_props = 0
        self.logged_bodies: dict[int, int] = {}
        self.logged_props: dict[int, int] = {}
        self.entry = entry
        self.cache = PayloadCache(32 << 20)

    def _payload(self, loc: int) -> tuple[bytes, int, int]:
        if self.entry is None:
            raise SnapshotFormatError("a message in the log, and no log to read it from")
        idx, at, n = split_loc(loc)
        entry = self.entry
        return self.cache.get(idx, lambda: entry(idx)), at, n

    def write(self, m: Message) -> None:
        out = self.w.out
        flags = (_PERSISTENT if m.persistent else 0) | (_REDELIVERED if m.redelivered else 0)
        expires = m.expires_at
        if expires is not None:
            flags |= _EXPIRES
        props, body = m.props, m.body
        raw_props: bytes | None = None
        pref = bref = -1
        if props is None:  # in the log, as encoded there (codec table, or N)
            assert m.loc is not None
            payload, at, n = self._payload(m.loc)
            if n == 1 and payload[at] == 0x4E:
                flags |= _PROPS_EMPTY
            else:
                pref = self.logged_props.get(m.loc, -1)
                if pref >= 0:
                    flags |= _PROPS_REF
                else:
                    self.logged_props[m.loc] = self.n_props
                    self.n_props += 1
                    raw_props = payload[at:at + n]
        elif not props:
            flags |= _PROPS_EMPTY
        else:
            pref = self.props.get(id(props), -1)
            if pref >= 0:
                flags |= _PROPS_REF
            else:
                self.props[id(props)] = self.n_props
                self.n_props += 1
        if body is None:
            assert m.loc is not None
            bref = self.logged_bodies.get(m.loc, -1)
            if bref < 0:
                self.logged_bodies[m.loc] = self.n_bodies
                self.n_bodies += 1
                payload, at, n = self._payload(m.loc)
                body = payload[at + n:at + n + m.size]
                if len(body) != m.size:
                    raise SnapshotFormatError(f"message at index {m.loc >> 64} past its entry's end")
        else:
            bref = self.bodies.get(id(body), -1)
            if bref < 0:
                self.bodies[id(body)] = self.n_bodies
                self.n_bodies += 1
        if bref >= 0:
            flags |= _BODY_REF
        ex = m.exchange.encode()
        rk = m.routing_key.encode()
        out.append(_MSG.pack(m.seq, 0.0 if expires is None else expires, m.delivery_count, flags,
                             len(ex), len(rk), bref if bref >= 0 else len(body or b"")))
        out.append(ex)
        out.append(rk)
        if flags & _PROPS_REF:
            out.append(_U32.pack(pref))
        elif raw_props is not None:
            out.append(raw_props)
        elif props:
            encode_into(props, out)
        if bref < 0:
            assert body is not None
            out.append(body)


# ------------------------------------------------------------------- read
def check(data: bytes) -> int:
    """Check the header and the body's CRC; returns where the body starts.
    Raises SnapshotFormatError naming what is wrong."""
    if data[:1] == b"\x80":  # pickle protocol 2+: what builds before issue 26 wrote
        raise SnapshotFormatError("a pickled snapshot of an older build, never loaded")
    if data[:len(MAGIC)] != MAGIC:
        raise SnapshotFormatError("not a mirrorq snapshot (no magic)")
    if len(data) < HEADER_SIZE:
        raise SnapshotFormatError(f"truncated: {len(data)} bytes, no whole snapshot header")
    _magic, version, _reserved, length, crc = _HEADER.unpack_from(data, 0)
    if version not in READ_VERSIONS:
        raise SnapshotFormatError(f"snapshot format version {version}: this build reads "
                                  f"versions {', '.join(map(str, READ_VERSIONS))}")
    if length != len(data) - HEADER_SIZE:
        raise SnapshotFormatError(f"body of {len(data) - HEADER_SIZE} bytes, the header says {length}: "
                                  "truncated or trailing bytes")
    if zlib.crc32(memoryview(data)[HEADER_SIZE:]) != crc:
        raise SnapshotFormatError("checksum mismatch: the snapshot is damaged")
    return HEADER_SIZE


def read_meta(data: bytes) -> RaftMeta:
    """The Raft position alone (after check)."""
    return _Reader(data, check(data)).meta()


def read_snapshot(data: bytes) -> tuple[BrokerState, RaftMeta]:
    """The state and Raft position of a snapshot file's bytes."""
    r = _Reader(data, check(data))
    try:
        meta = r.meta()
        state = r.state()
        if r.pos != len(data):  # files written before issue 28 end without it
            _read_policies(r.value(), state)
        rebuild_policy_ae(state)
    except (CodecError, struct.error, UnicodeDecodeError, IndexError, TypeError, ValueError) as e:
        if isinstance(e, SnapshotFormatError):
            raise
        raise SnapshotFormatError(f"malformed snapshot at byte {r.pos}: {e}") from None
    if r.pos != len(data):
        raise SnapshotFormatError(f"{len(data) - r.pos} trailing bytes after the snapshot")
    return state, meta


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise SnapshotFormatError(f"malformed snapshot: {what}")


def _tuple(v: Any, n: int, what: str) -> tuple[Any, ...]:
    _expect(type(v) is tuple and len(v) == n, f"{what}: expected {n} fields")
    return v  # type: ignore[no-any-return]


def _dict(v: Any, what: str) -> dict[Any, Any]:
    _expect(type(v) is dict, f"{what}: expected a table")
    return v  # type: ignore[no-any-return]


def _pairs(v: Any, what: str) -> list[tuple[Any, Any]]:
    _expect(type(v) is list and all(type(p) is tuple and len(p) == 2 for p in v),
            f"{what}: expected a list of pairs")
    return v  # type: ignore[no-any-return]


def _entry(v: Any) -> tuple[bytes, int, int]:
    _expect(type(v) is tuple and len(v) == 3 and type(v[0]) is bytes and type(v[1]) is int
            and type(v[2]) is int, "raft entry")
    return v  # type: ignore[no-any-return]


class _Reader:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos
        self.bodies: list[bytes] = []
        self.props: list[dict[str, Any]] = []
        self.names: dict[bytes, str] = {}

    def value(self) -> Any:
        v, self.pos = decode_from(self.data, self.pos)
        return v

    def u32(self) -> int:
        n: int = _U32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return n

    def count(self, what: str) -> int:
        n = self.u32()
        _expect(n <= len(self.data) - self.pos, f"{what}: count {n} past the end")
        return n

    def meta(self) -> RaftMeta:
        last, prev, members = _tuple(self.value(), 3, "raft position")
        _expect(type(members) is tuple and all(type(a) is str for a in members), "raft members")
        return RaftMeta(_entry(last), _entry(prev), members)

    def state(self) -> BrokerState:
        s = BrokerState()
        plain = _tuple(self.value(), len(STATE_FIELDS), "state")
        for name, v in zip(STATE_FIELDS, plain, strict=True):
            if name in ("now",):
                _expect(type(v) in (int, float), name)
            elif name in ("counter", "message_bytes", "config_version"):
                _expect(type(v) is int, name)
            else:
                _dict(v, name)
            setattr(s, name, v)
        for _ in range(self.count("exchanges")):
            key, x = self.exchange()
            s.exchanges[key] = x
        queue_keys = _pairs(self.value(), "queue table")
        queues = [self.queue() for _ in range(self.count("queues"))]
        s.queues = {key: _at(queues, i, "queue") for key, i in queue_keys}
        channel_keys = _pairs(self.value(), "channel table")
        channels = [self.channel() for _ in range(self.count("channels"))]
        s.channels = {key: _at(channels, i, "channel") for key, i in channel_keys}
        consumers = [self.consumer(channels, queues) for _ in range(self.count("consumers"))]
        for ch in channels:
            for _ in range(self.count("unacked")):
                tag, qi, ki = _tuple(self.value(), 3, "unacked delivery")
                m = self.message()
                ch.unacked[tag] = (_at(queues, qi, "queue"), m, None if ki == -1 else _at(consumers, ki, "consumer"))
            ch.consumers = {tag: _at(consumers, i, "consumer") for tag, i in _pairs(self.value(), "channel consumers")}
        for q in queues:
            keyed, ex = _tuple(self.value(), 2, "queue consumers")
            q.consumers = {key: _at(consumers, i, "consumer") for key, i in _pairs(keyed, "queue consumers")}
            q.exclusive_consumer = None if ex == -1 else _at(consumers, ex, "consumer")
        return s

    def exchange(self) -> tuple[str, Exchange]:
        v = _tuple(self.value(), len(EXCHANGE_FIELDS) + 2, "exchange")
        x = Exchange.__new__(Exchange)
        for name, field in zip(EXCHANGE_FIELDS, v[1:-1], strict=True):
            setattr(x, name, field)
        _expect(type(x.name) is str and type(x.type) is str, "exchange name")
        for name in ("arguments", "direct", "fanout", "incoming"):
            _dict(getattr(x, name), f"exchange {name}")
        x.bindings = {}
        for item in _list(v[-1], "bindings"):
            bk, source, dest, rk, args = _tuple(item, 5, "binding")
            _expect(type(rk) is str and type(dest) is tuple, "binding")
            b = Binding.__new__(Binding)
            b.source, b.dest, b.routing_key, b.arguments = source, dest, rk, _dict(args, "binding arguments")
            b.words = split_topic(rk)
            x.bindings[bk] = b
        x._topic_cache = {}
        return v[0], x

    def queue(self) -> Queue:
        v = _tuple(self.value(), len(QUEUE_FIELDS), "queue")
        q = Queue.__new__(Queue)
        for name, field in zip(QUEUE_FIELDS, v, strict=True):
            setattr(q, name, field)
        _expect(type(q.name) is str, "queue name")
        _dict(q.arguments, "queue arguments")
        _dict(q.incoming, "queue bindings")
        _expect(type(q.stats) is list, "queue stats")
        returned = []
        for _ in range(self.count("returned messages")):
            key = self.value()
            _expect(type(key) is int, "heap key")
            returned.append((key, self.message()))
        q.returned = returned
        ready: deque[Message] = deque()
        append = ready.append
        message = self.message
        for _ in range(self.count("ready messages")):
            append(message())
        q.ready = ready
        q.consumers = {}
        q.exclusive_consumer = None
        return q

    def channel(self) -> Channel:
        v = _tuple(self.value(), len(CHANNEL_FIELDS), "channel")
        ch = Channel.__new__(Channel)
        for name, field in zip(CHANNEL_FIELDS, v, strict=True):
            setattr(ch, name, field)
        _expect(type(ch.id) is ChanId, "channel id")
        ch.unacked = {}
        ch.consumers = {}
        return ch

    def consumer(self, channels: list[Channel], queues: list[Queue]) -> Consumer:
        v = _tuple(self.value(), len(CONSUMER_FIELDS) + 2, "consumer")
        k = Consumer.__new__(Consumer)
        k.channel = _at(channels, v[0], "channel")
        k.queue = _at(queues, v[1], "queue")
        for name, field in zip(CONSUMER_FIELDS, v[2:], strict=True):
            setattr(k, name, field)
        return k

    def message(self) -> Message:
        data = self.data
        pos = self.pos
        seq, expires, count, flags, n_ex, n_rk, n = _MSG.unpack_from(data, pos)
        pos += _MSG.size
        end = pos + n_ex + n_rk
        _expect(end <= len(data), "message truncated")
        # one str per distinct name, not one per message (the same few recur)
        names = self.names
        raw = data[pos:pos + n_ex]
        exchange = names.get(raw)
        if exchange is None:
            exchange = names[raw] = raw.decode()
        raw = data[pos + n_ex:end]
        rk = names.get(raw)
        if rk is None:
            rk = names[raw] = raw.decode()
        pos = end
        if flags & _PROPS_EMPTY:
            props: dict[str, Any] = {}
        elif flags & _PROPS_REF:
            props = _at(self.props, _U32.unpack_from(data, pos)[0], "properties")
            pos += 4
        else:
            props, pos = decode_from(data, pos)
            _expect(type(props) is dict, "message properties")
            self.props.append(props)
        if flags & _BODY_REF:
            body = _at(self.bodies, n, "body")
        else:
            end = pos + n
            _expect(end <= len(data), "message body truncated")
            body = data[pos:end]
            pos = end
            self.bodies.append(body)
        self.pos = pos
        m = Message.__new__(Message)
        m.seq, m.exchange, m.routing_key, m.props, m.body = seq, exchange, rk, props, body
        m.size = len(body)
        m.loc = None  # inline: a snapshot carries the bytes
        m.priority = raw_priority(props)
        m.persistent = bool(flags & _PERSISTENT)
        m.redelivered = bool(flags & _REDELIVERED)
        m.expires_at = expires if flags & _EXPIRES else None
        m.delivery_count = count
        return m


def _list(v: Any, what: str) -> list[Any]:
    _expect(type(v) is list, f"{what}: expected a list")
    return v  # type: ignore[no-any-return]


def _at(items: list[Any], i: Any, what: str) -> Any:
    _expect(type(i) is int and 0 <= i < len(items), f"{what} reference {i!r} out of range")
    return items[i]


# ---------------------------------------------------------- policies section
# ("policies", section version, policies, operator policies), each policy a
# plain tuple of Policy's fields. Written last: a reader of a file without it
# (an older build's) finds the body ends where the state does.
_POLICY_SECTION = "policies"
_POLICY_SECTION_VERSION = 1


def _write_policies(w: _Writer, state: BrokerState) -> None:
    w.value((_POLICY_SECTION, _POLICY_SECTION_VERSION,
             [tuple(p) for p in state.policies.values()],
             [tuple(p) for p in state.operator_policies.values()]))


def _read_policies(v: Any, state: BrokerState) -> None:
    tag, version, pols, ops = _tuple(v, 4, "policies section")
    _expect(tag == _POLICY_SECTION, f"unknown section {tag!r}")
    _expect(version == _POLICY_SECTION_VERSION, f"policies section version {version!r}")
    for items, table in ((pols, state.policies), (ops, state.operator_policies)):
        for t in _list(items, "policies"):
            vhost, name, pattern, apply_to, priority, definition = _tuple(t, 6, "policy")
            _expect(all(type(f) is str for f in (vhost, name, pattern, apply_to))
                    and type(priority) in (int, float), "policy fields")
            table[(vhost, name)] = Policy(vhost, name, pattern, apply_to, priority,
                                          _dict(definition, "policy definition"))


def iter_fields() -> Iterable[tuple[type, tuple[str, ...]]]:
    """Each record class with the fields written for it (and its derived ones)."""
    yield BrokerState, STATE_FIELDS + DERIVED["BrokerState"]
    yield Exchange, EXCHANGE_FIELDS + DERIVED["Exchange"]
    yield Queue, QUEUE_FIELDS + DERIVED["Queue"]
    yield Channel, CHANNEL_FIELDS + DERIVED["Channel"]
    yield Consumer, CONSUMER_FIELDS + DERIVED["Consumer"]
    yield Message, ("seq", "exchange", "routing_key", "props", "body", "persistent",
                    "expires_at", "redelivered", "delivery_count") + DERIVED["Message"]
