"""The snapshot file: the whole replicated state (BrokerState) and the Raft
position it was taken at, in a versioned binary format of our own. No pickle:
decoding builds only the broker's own types (set field by field from checked
values), the codec's plain values and records, or raises SnapshotFormatError.

Layout (integers little endian):
  header  magic (8) | format version u16 | reserved u16 | body length u64 | CRC32 of the body u32
  body    log entries (version 3): u64 count, then that many u64 Raft indices,
          ascending: the entries the messages' bytes are in (see below)
          raft position: one codec value (RaftMeta)
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
A message is a fixed struct, its exchange and routing key, then (version 3)
where its bytes are in the Raft log (index, offset and length of its
properties inside that entry; the body follows them): the snapshot holds the
index only, never the bodies (issue 27 item 3), and the log's segments that
hold those entries are kept while a snapshot or the state needs them. A
message whose properties or body are held here instead (a test's state, a
dead-lettered message's new properties, versions 1 and 2) has them inline: a
codec table or a back reference (publishes routed to several queues share
one table and one body, and still do after a load), the body as raw bytes.
Queues, channels and consumers are referenced by index, so the object graph
(an unacked delivery's queue and consumer, a consumer's channel) comes back
with the same sharing, deleted queues that deliveries still name included.

The whole body is covered by the CRC: a damaged file is refused before any of
it is decoded. A new layout gets a new version number; this build reads
READ_VERSIONS. Version 2 (issue 28): message properties may hold the codec's
W values (header values with their AMQP wire type); version 1 files, which
cannot, are read as before. Version 3 (issue 27): the log-entries section,
messages by their place in the log, the priority in the message struct.
After the policies section, from machine version 2 on, the machine section
(node/replication/machine/version.py): absent, the machine version is 1.
Version 4 (issue 28, written from machine version 3 on, when every member
reads it): the message struct ends with the acquired count (x-acquired-count);
older files load with 0 there.
After it, from machine version 4 on, the access section (limits, topic
permissions, the connection table): absent, there are none.
Version 5 (issue 27, written from machine version 5 on): a queue's ready
messages are its packed index's columns (node/broker/fifo.py) as they are in
memory: u64 count, u64 how many are not persistent, the int64 x 4 records,
a u8 flag and the float64 expiries if any message has one, the (exchange,
routing key) table (one codec value), u32 per message indexing it
(0xFFFFFFFF: a message kept as an object, written after, in order, as any
message). A restart reads a backlog with a few large copies instead of a
struct per message; the log-entries check and the live counts run per
distinct entry (the records of a queue are in log order).
After that, from machine version 5 on, the dead-letter section: the
messages queues keep for at-least-once dead-lettering (state.dead_letters),
one codec value naming the stores and their entries' reasons and settled
targets, then the messages in the message format: absent, there are none.
After that, from machine version 6 on, the cluster section: the global
parameters (the cluster name among them) and the vhosts protected from
deletion: absent, there are none.
"""
from __future__ import annotations

import heapq
import struct
import sys
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from io import BytesIO
from typing import IO, Any, NamedTuple

from node.broker.channel import Channel, Consumer
from node.broker.dead_letter import DeadLetter, DeadLetterStore
from node.broker.exchange import Binding, Exchange, split_topic
from node.broker.fifo import CHUNK, PackedFifo
from node.broker.ids import ChanId, ConnId
from node.broker.parameter import json_error
from node.broker.policy import Policy
from node.broker.queue import Message, Queue, raw_priority, uses_levels
from node.replication.codec import CodecError, decode_from, encode_into
from node.replication.machine.limit import rebuild_counts
from node.replication.machine.policy import rebuild_policy_ae
from node.replication.machine.state import BrokerState, rebuild_deadlines
from node.replication.machine.version import (
    CLUSTER_METADATA,
    COUNTED_RECORDS,
    DEAD_LETTER_STORE,
    LIMITS,
    PACKED_SNAPSHOTS,
    QUORUM_SEMANTICS,
)
from node.replication.message_store import BUCKET_SHIFT, make_loc

MAGIC = b"\x89MQSNAP\n"  # not a pickle (0x80), not text
FORMAT_VERSION = 5  # written from machine version 5 on; 4 from 3 on; 3 below it
READ_VERSIONS = (1, 2, 3, 4, 5)
_HEADER = struct.Struct("<8sHHQI")
HEADER_SIZE = _HEADER.size
_U32 = struct.Struct("<I")
# seq, expires_at, delivery_count, flags, exchange length, routing key length,
# body length (or, with _BODY_REF, the index of a body written before)
_MSG = struct.Struct("<qdIBIII")  # versions 1 and 2
# version 3: flags u16, and the priority; body length is the size where the body is logged
_MSG3 = struct.Struct("<qdIHIIIB")
# version 4: and the acquired count and the deadline (0: none)
_MSG4 = struct.Struct("<qdIHIIIBId")
_LOC = struct.Struct("<QII")  # Raft index, properties' offset and length in the entry
_U64 = struct.Struct("<Q")
_PERSISTENT, _REDELIVERED, _EXPIRES, _PROPS_EMPTY, _PROPS_REF, _BODY_REF = 1, 2, 4, 8, 16, 32
_HAS_LOC, _BODY_LOGGED, _PROPS_LOGGED = 64, 128, 256  # version 3
_PLAIN = _HAS_LOC | _BODY_LOGGED | _PROPS_LOGGED  # all in the log (a packed ready message)
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
# written from version 4 on, after the fields above (S29)
CHANNEL_FIELDS_4 = ("released",)
CONSUMER_FIELDS_4 = ("timeout",)
# written from version 5 on, after the fields above (S32)
QUEUE_FIELDS_5 = ("rejecting",)
# BrokerState's slots written in the policies section (after everything else)
POLICY_FIELDS = ("policies", "operator_policies")
# and in the access section (after the machine section)
ACCESS_FIELDS = ("vhost_limits", "user_limits", "topic_permissions", "connections")
# and in the cluster section (after the dead-letter section)
CLUSTER_FIELDS = ("global_parameters", "protected_vhosts")
# slots not in the field lists: written another way (references, messages) or derived
DERIVED = {
    "BrokerState": ("exchanges", "queues", "channels", "live", "policy_ae",
                    "deadline_chans", "dead_letters",
                    "machine_version", "runs_version", *POLICY_FIELDS, *ACCESS_FIELDS,
                    *CLUSTER_FIELDS, "counts"),
    "Exchange": ("bindings", "_topic_cache"),
    "Queue": ("returned", "ready", "consumers", "exclusive_consumer", "levels", "bands",
              "band_order", "banded", *QUEUE_FIELDS_5),
    "Channel": ("unacked", "consumers", "next_deadline", *CHANNEL_FIELDS_4),
    "Consumer": ("channel", "queue", *CONSUMER_FIELDS_4),
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


def logged_entries(state: BrokerState) -> array[int]:
    """The Raft indices (ascending, each once) of the entries that hold bytes
    of the state's messages: what a snapshot of it needs from the log."""
    seen: set[int] = set()
    add = seen.add
    for q in state.queues.values():
        seen.update(q.ready.log_indices())  # packed: no message is made
        for _key, m in q.returned:
            if m.loc is not None:
                add(m.loc >> 64)
        if q.banded:
            seen.update(q.band_log_indices())
    for ch in state.channels.values():
        for _q, m, _by in ch.unacked.values():
            if m.loc is not None:
                add(m.loc >> 64)
    for store in state.dead_letters.values():
        for d in store:
            if d.message.loc is not None:
                add(d.message.loc >> 64)
    return array("Q", sorted(seen))


def iter_messages(state: BrokerState) -> Iterator[Message]:
    """Every message the state holds (ready, returned, unacked, a message
    unacked from a deleted queue too, kept dead letters); the ready ones are
    made from the packed index as they are read (tests, tools)."""
    for q in state.queues.values():
        yield from q.ready
        for _key, m in q.returned:
            yield m
        for _key, m in q.band_items():
            yield m
    for ch in state.channels.values():
        for _q, m, _by in ch.unacked.values():
            yield m
    for store in state.dead_letters.values():
        for d in store:
            yield d.message


def write_snapshot(sink: IO[bytes], state: BrokerState, raft: RaftMeta) -> int:
    """Write the snapshot to a seekable binary file; returns its size.
    Messages whose bytes are in the log are written as their place there."""
    start = sink.tell()
    sink.write(bytes(HEADER_SIZE))  # filled in once the body's length and CRC are known
    w = _Writer(sink)
    entries = logged_entries(state)
    w.out.append(_U64.pack(len(entries)))
    w.out.append(entries.tobytes() if sys.byteorder == "little" else _swapped(entries))
    w.value(tuple(raft))
    w.value(tuple(getattr(state, f) for f in STATE_FIELDS))
    _write_exchanges(w, state)
    queues, channels, consumers = _graph(state)
    msgs = _MessageWriter(w, state.machine_version)  # one for the whole file: back references span queues
    v4 = msgs.version >= 4
    channel_fields = CHANNEL_FIELDS + CHANNEL_FIELDS_4 if v4 else CHANNEL_FIELDS
    consumer_fields = CONSUMER_FIELDS + CONSUMER_FIELDS_4 if v4 else CONSUMER_FIELDS
    _write_queues(w, state, queues, msgs)
    q_index = {id(q): i for i, q in enumerate(queues)}
    c_index = {id(c): i for i, c in enumerate(channels)}
    k_index = {id(k): i for i, k in enumerate(consumers)}
    w.value([(key, c_index[id(ch)]) for key, ch in state.channels.items()])
    w.u32(len(channels))
    for ch in channels:
        w.value(tuple(getattr(ch, f) for f in channel_fields))
    w.u32(len(consumers))
    for k in consumers:
        w.value((c_index[id(k.channel)], q_index[id(k.queue)], *(getattr(k, f) for f in consumer_fields)))
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
    _write_machine(w, state)
    _write_access(w, state)
    _write_dead_letters(w, state, msgs)
    _write_cluster(w, state)
    w.flush()
    end = sink.tell()
    sink.seek(start)
    sink.write(_HEADER.pack(MAGIC, msgs.version, 0, w.length, w.crc))
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


def _heap_key(item: tuple[int, Message]) -> int:
    return item[0]


def _write_queues(w: _Writer, state: BrokerState, queues: list[Queue], msgs: _MessageWriter) -> None:
    q_index = {id(q): i for i, q in enumerate(queues)}
    w.value([(key, q_index[id(q)]) for key, q in state.queues.items()])
    w.u32(len(queues))
    fields = QUEUE_FIELDS + QUEUE_FIELDS_5 if msgs.version >= 5 else QUEUE_FIELDS
    for q in queues:
        w.value(tuple(getattr(q, f) for f in fields))
        # a priority queue's bands among the returned, the layout of every
        # version (read back into bands by Queue.unband_heap); in key order,
        # so the list is a heap to a build that takes it as one
        w.u32(len(q.returned) + q.banded)
        items = (heapq.merge(sorted(q.returned, key=_heap_key), q.band_items(), key=_heap_key)
                 if q.banded else q.returned)
        for key, m in items:
            w.value(key)
            msgs.write(m)
            w.maybe_flush()
        if msgs.version >= 5:
            _write_packed(w, q.ready, msgs)
        else:
            w.u32(len(q.ready))
            for m in q.ready:
                msgs.write(m)
                w.maybe_flush()
        w.maybe_flush()


_NO_PAIR = 0xFFFFFFFF  # version 5: a ready message written as an object
_POSITIVE_TOP = bytes(range(128))  # an int64's last byte (little-endian) when it is >= 0


def _little(a: array[Any]) -> bytes:
    if sys.byteorder == "little":
        return a.tobytes()
    copy = array(a.typecode, a)
    copy.byteswap()
    return copy.tobytes()


def _write_packed(w: _Writer, ready: PackedFifo, msgs: _MessageWriter) -> None:
    """PackedFifo.columns() as one piece each, written a chunk at a time."""
    table: list[tuple[str, str]] = []
    at: dict[int, int] = {}  # id of a shared pair -> its place in the table
    objects = []
    for _nums, _exp, refs in ready.column_chunks():  # the table first (it precedes the ids)
        for r in refs:
            if type(r) is tuple:
                if id(r) not in at:
                    at[id(r)] = len(table)
                    table.append(r)
            else:
                objects.append(r)
    w.out.append(_U64.pack(len(ready)))
    w.out.append(_U64.pack(ready.transient))
    for k, (nums, _exp, _refs) in enumerate(ready.column_chunks()):
        w.out.append(_little(nums))
        _flush_every(w, k)
    if not ready.has_expiry():
        w.out.append(b"\x00")
    else:
        w.out.append(b"\x01")
        for k, (_nums, exp, refs) in enumerate(ready.column_chunks()):
            w.out.append(bytes(8 * len(refs)) if exp is None else _little(exp))
            _flush_every(w, k)
    w.value(table)
    for k, (_nums, _exp, refs) in enumerate(ready.column_chunks()):
        w.out.append(_little(array("I", [at[id(r)] if type(r) is tuple else _NO_PAIR for r in refs])))
        _flush_every(w, k)
    for m in objects:
        msgs.write(m)
        w.maybe_flush()


def _flush_every(w: _Writer, k: int) -> None:
    if k & 63 == 63:  # 64 chunks: 4 MiB of records
        w.flush()


class _MessageWriter:
    """Messages, with property tables and inline bodies shared between queues
    written once; bytes in the log as their place there."""

    def __init__(self, w: _Writer, machine_version: int) -> None:
        self.w = w
        self.bodies: dict[int, int] = {}  # back references, by id()
        self.props: dict[int, int] = {}
        self.n_bodies = 0
        self.n_props = 0
        # a member of a build before machine version 3 reads up to version 3
        self.version = (FORMAT_VERSION if machine_version >= PACKED_SNAPSHOTS
                        else 4 if machine_version >= QUORUM_SEMANTICS else 3)

    def write(self, m: Message) -> None:
        out = self.w.out
        flags = (_PERSISTENT if m.persistent else 0) | (_REDELIVERED if m.redelivered else 0)
        expires = m.expires_at
        if expires is not None:
            flags |= _EXPIRES
        props, body, loc = m.props, m.body, m.loc
        pref = bref = -1
        if loc is not None:
            flags |= _HAS_LOC
        if props is None:
            if loc is None:
                raise SnapshotFormatError("a message without properties and without a place in the log")
            flags |= _PROPS_LOGGED
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
            if loc is None:
                raise SnapshotFormatError("a message without a body and without a place in the log")
            flags |= _BODY_LOGGED
        else:
            bref = self.bodies.get(id(body), -1)
            if bref >= 0:
                flags |= _BODY_REF
            else:
                self.bodies[id(body)] = self.n_bodies
                self.n_bodies += 1
        ex = m.exchange.encode()
        rk = m.routing_key.encode()
        n = m.size if body is None else (bref if bref >= 0 else len(body))
        if self.version >= 4:
            out.append(_MSG4.pack(m.seq, 0.0 if expires is None else expires, m.delivery_count,
                                  flags, len(ex), len(rk), n, min(m.priority, 255),
                                  m.acquired_count, m.deadline or 0.0))
        else:
            out.append(_MSG3.pack(m.seq, 0.0 if expires is None else expires, m.delivery_count,
                                  flags, len(ex), len(rk), n, min(m.priority, 255)))
        out.append(ex)
        out.append(rk)
        if loc is not None:
            out.append(_LOC.pack(loc >> 64, (loc >> 32) & 0xFFFFFFFF, loc & 0xFFFFFFFF))
        if flags & _PROPS_REF:
            out.append(_U32.pack(pref))
        elif props:
            encode_into(props, out)
        if body is not None and bref < 0:
            out.append(body)


def _swapped(entries: array[int]) -> bytes:
    copy = array("Q", entries)
    copy.byteswap()
    return copy.tobytes()


# ------------------------------------------------------------------- read
def check(data: bytes | memoryview) -> int:
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


def check_file(f: IO[bytes], size: int) -> None:
    """check() of the snapshot at the start of `f` (`size` bytes: snapshot_size),
    its CRC computed 4 MiB at a time (a leader checks what it is about to send)."""
    head = f.read(HEADER_SIZE)
    _magic, version, _reserved, length, crc = _HEADER.unpack_from(head, 0)
    if version not in READ_VERSIONS:
        raise SnapshotFormatError(f"snapshot format version {version}: this build reads "
                                  f"versions {', '.join(map(str, READ_VERSIONS))}")
    left, got = size - HEADER_SIZE, 0
    while left > 0:
        chunk = f.read(min(left, 4 << 20))
        if not chunk:
            raise SnapshotFormatError(f"body cut short: {size - HEADER_SIZE - left} of {length} bytes")
        got = zlib.crc32(chunk, got)
        left -= len(chunk)
    if got != crc:
        raise SnapshotFormatError("checksum mismatch: the snapshot is damaged")


def snapshot_size(head: bytes) -> int:
    """The whole snapshot's size in bytes, from its first HEADER_SIZE bytes
    (the snapshot a leader sends is followed by the log entries it needs)."""
    if len(head) < HEADER_SIZE or head[:len(MAGIC)] != MAGIC:
        raise SnapshotFormatError("not a mirrorq snapshot (no magic)")
    _magic, _version, _reserved, length, _crc = _HEADER.unpack_from(head, 0)
    return HEADER_SIZE + int(length)


def read_entries(f: IO[bytes]) -> array[int]:
    """The log-entries section of a snapshot file (its header checked, not
    its CRC: the file is this node's own, checked when written or received)."""
    head = f.read(HEADER_SIZE + 8)
    if len(head) < HEADER_SIZE or head[:len(MAGIC)] != MAGIC:
        raise SnapshotFormatError("not a mirrorq snapshot (no magic)")
    version = _HEADER.unpack_from(head, 0)[1]
    if version < 3:
        return array("Q")  # bodies inline: nothing needed from the log
    _expect(len(head) == HEADER_SIZE + 8, "log entries truncated")
    n = _U64.unpack_from(head, HEADER_SIZE)[0]
    raw = f.read(8 * n)
    _expect(len(raw) == 8 * n, "log entries truncated")
    entries = array("Q")
    entries.frombytes(raw)
    if sys.byteorder != "little":
        entries.byteswap()
    return entries


def read_meta(data: bytes) -> RaftMeta:
    """The Raft position alone (after check)."""
    r = _Reader(data, check(data))
    r.entries()
    return r.meta()


def read_snapshot(data: bytes) -> tuple[BrokerState, RaftMeta]:
    """The state and Raft position of a snapshot file's bytes."""
    r = _Reader(data, check(data))
    try:
        r.entries()
        meta = r.meta()
        state = r.state()
        if r.pos != len(data):  # files written before issue 28 end without it
            _read_policies(r.value(), state)
        rebuild_policy_ae(state)
        if r.pos < len(data):  # from machine version 2 on
            _read_machine(r.value(), state)
        quorum43 = state.machine_version >= QUORUM_SEMANTICS
        for q in state.queues.values():
            q.levels = uses_levels(q.arguments, quorum43)
            q.unband_heap()
        rebuild_deadlines(state)
        if r.pos < len(data):  # from machine version 4 on
            _read_access(r.value(), state)
        if r.pos < len(data):  # from machine version 5 on
            _read_dead_letters(r, state)
        if r.pos < len(data):  # from machine version 6 on
            _read_cluster(r.value(), state)
        rebuild_counts(state)
    except (CodecError, struct.error, UnicodeDecodeError, IndexError, TypeError, ValueError) as e:
        if isinstance(e, SnapshotFormatError):
            raise
        raise SnapshotFormatError(f"malformed snapshot at byte {r.pos}: {e}") from None
    if r.pos != len(data):
        raise SnapshotFormatError(f"{len(data) - r.pos} trailing bytes after the snapshot")
    return state, meta


# ---------------------------------------------------------- machine section
# ("machine", section version, the cluster's machine version), after the
# policies section, written from machine version 2 on only: below it a member
# may run a build before machine versions, which refuses trailing bytes.
_MACHINE_SECTION = "machine"
_MACHINE_SECTION_VERSION = 1


def _write_machine(w: _Writer, state: BrokerState) -> None:
    if state.machine_version >= COUNTED_RECORDS:
        w.value((_MACHINE_SECTION, _MACHINE_SECTION_VERSION, state.machine_version))


def _read_machine(v: Any, state: BrokerState) -> None:
    tag, version, machine = _tuple(v, 3, "machine section")
    _expect(tag == _MACHINE_SECTION, f"unknown section {tag!r}")
    _expect(version == _MACHINE_SECTION_VERSION, f"machine section version {version!r}")
    _expect(type(machine) is int and machine >= COUNTED_RECORDS, "machine_version")
    state.machine_version = machine


# ----------------------------------------------------------- access section
# ("access", section version, vhost limits, user limits, topic permissions,
# the connection table), after the machine section, written from machine
# version 3 on only (a version-2 build refuses trailing bytes); absent: none.
_ACCESS_SECTION = "access"
_ACCESS_SECTION_VERSION = 1


def _write_access(w: _Writer, state: BrokerState) -> None:
    if state.machine_version >= LIMITS:
        w.value((_ACCESS_SECTION, _ACCESS_SECTION_VERSION, state.vhost_limits,
                 state.user_limits, state.topic_permissions, state.connections))


def _limit_table(v: Any, what: str) -> dict[str, dict[str, int]]:
    table = _dict(v, what)
    for owner, limits in table.items():
        _expect(type(owner) is str and type(limits) is dict
                and all(type(k) is str and type(n) is int for k, n in limits.items()), what)
    return table


def _read_access(v: Any, state: BrokerState) -> None:
    tag, version, vhost_limits, user_limits, topic, conns = _tuple(v, 6, "access section")
    _expect(tag == _ACCESS_SECTION, f"unknown section {tag!r}")
    _expect(version == _ACCESS_SECTION_VERSION, f"access section version {version!r}")
    state.vhost_limits = _limit_table(vhost_limits, "vhost limits")
    state.user_limits = _limit_table(user_limits, "user limits")
    for key, perm in _dict(topic, "topic permissions").items():
        _expect(type(key) is tuple and len(key) == 3 and all(type(f) is str for f in key)
                and type(perm) is tuple and len(perm) == 2
                and all(type(f) is str for f in perm), "topic permission")
    state.topic_permissions = topic
    for conn, entry in _dict(conns, "connections").items():
        _expect(type(conn) is ConnId and type(entry) is tuple and len(entry) == 2
                and all(type(f) is str for f in entry), "connection")
    state.connections = conns


# ------------------------------------------------------ dead-letter section
# ("dead-letters", section version, [(queue key, [(reason, [settled target
# queue keys]), ...]), ...]), then each entry's message in that order (the
# message format, sharing properties and bodies with those written before).
# After the access section, written from machine version 5 on only (a
# version-4 build refuses trailing bytes); absent: no queue keeps any.
_DEAD_LETTER_SECTION = "dead-letters"
_DEAD_LETTER_SECTION_VERSION = 1


def _write_dead_letters(w: _Writer, state: BrokerState, msgs: _MessageWriter) -> None:
    if state.machine_version < DEAD_LETTER_STORE:
        return
    w.value((_DEAD_LETTER_SECTION, _DEAD_LETTER_SECTION_VERSION,
             [(key, [(d.reason, list(d.settled)) for d in store])
              for key, store in state.dead_letters.items()]))
    for store in state.dead_letters.values():
        for d in store:
            msgs.write(d.message)
            w.maybe_flush()


def _read_dead_letters(r: _Reader, state: BrokerState) -> None:
    tag, version, stores = _tuple(r.value(), 3, "dead-letter section")
    _expect(tag == _DEAD_LETTER_SECTION, f"unknown section {tag!r}")
    _expect(version == _DEAD_LETTER_SECTION_VERSION, f"dead-letter section version {version!r}")
    for key, entries in _pairs(stores, "dead-letter stores"):
        _expect(type(key) is str and key in state.queues, "dead-letter store's queue")
        store = DeadLetterStore()
        for item in _list(entries, "dead letters"):
            reason, settled = _tuple(item, 2, "dead letter")
            _expect(type(reason) is str and type(settled) is list
                    and all(type(t) is str for t in settled), "dead letter")
            m = r.message()
            _expect(m.props is not None, "a dead letter without its properties")
            store.add(DeadLetter(m, reason, dict.fromkeys(settled)))
        state.dead_letters[key] = store


# ---------------------------------------------------------- cluster section
# ("cluster", section version, {global parameter name: JSON value}, [protected
# vhost, ...]), after the dead-letter section, written from machine version 6
# on only (a version-5 build refuses trailing bytes); absent: none of either.
_CLUSTER_SECTION = "cluster"
_CLUSTER_SECTION_VERSION = 1


def _write_cluster(w: _Writer, state: BrokerState) -> None:
    if state.machine_version >= CLUSTER_METADATA:
        w.value((_CLUSTER_SECTION, _CLUSTER_SECTION_VERSION, state.global_parameters,
                 list(state.protected_vhosts)))


def _read_cluster(v: Any, state: BrokerState) -> None:
    tag, version, params, protected = _tuple(v, 4, "cluster section")
    _expect(tag == _CLUSTER_SECTION, f"unknown section {tag!r}")
    _expect(version == _CLUSTER_SECTION_VERSION, f"cluster section version {version!r}")
    for name, value in _dict(params, "global parameters").items():
        _expect(type(name) is str and json_error(value, 0) is None, "global parameter")
    _expect(type(protected) is list
            and all(type(n) is str and n in state.vhosts for n in protected),
            "protected vhosts")
    state.global_parameters = params
    state.protected_vhosts = dict.fromkeys(protected)


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
        self.version = _HEADER.unpack_from(data, 0)[1]
        self.logged: array[int] = array("Q")  # the log-entries section
        self.live: dict[int, int] = {}  # the state's per-bucket counts, rebuilt
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

    def entries(self) -> None:
        if self.version < 3:
            return
        n = _U64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        _expect(8 * n <= len(self.data) - self.pos, "log entries past the end")
        self.logged.frombytes(self.data[self.pos:self.pos + 8 * n])
        if sys.byteorder != "little":
            self.logged.byteswap()
        self.pos += 8 * n

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
        s.live = self.live
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
        fields = QUEUE_FIELDS + QUEUE_FIELDS_5 if self.version >= 5 else QUEUE_FIELDS
        v = _tuple(self.value(), len(fields), "queue")
        q = Queue.__new__(Queue)
        q.rejecting = False
        for name, field in zip(fields, v, strict=True):
            setattr(q, name, field)
        _expect(type(q.name) is str, "queue name")
        _dict(q.arguments, "queue arguments")
        _dict(q.incoming, "queue bindings")
        _expect(type(q.stats) is list, "queue stats")
        _expect(type(q.rejecting) is bool, "queue latch")
        returned = []
        for _ in range(self.count("returned messages")):
            key = self.value()
            _expect(type(key) is int, "heap key")
            returned.append((key, self.message()))
        q.returned = returned
        q.init_bands()
        if self.version >= 5:
            q.ready = self.packed()
            q.consumers = {}
            q.exclusive_consumer = None
            q.levels = False
            return q
        ready = PackedFifo()
        append = ready.append
        message = self.message
        plain = self.plain_ready if self.version >= 4 else None
        for _ in range(self.count("ready messages")):
            if plain is None or not plain(ready):
                append(message())
        q.ready = ready
        q.consumers = {}
        q.exclusive_consumer = None
        q.levels = False  # derived once the machine version is known (read_snapshot)
        return q

    def channel(self) -> Channel:
        fields = CHANNEL_FIELDS + CHANNEL_FIELDS_4 if self.version >= 4 else CHANNEL_FIELDS
        v = _tuple(self.value(), len(fields), "channel")
        ch = Channel.__new__(Channel)
        ch.released = {}
        for name, field in zip(fields, v, strict=True):
            setattr(ch, name, field)
        _dict(ch.released, "released tags")
        ch.next_deadline = None  # derived: read_snapshot
        _expect(type(ch.id) is ChanId, "channel id")
        ch.unacked = {}
        ch.consumers = {}
        return ch

    def consumer(self, channels: list[Channel], queues: list[Queue]) -> Consumer:
        fields = CONSUMER_FIELDS + CONSUMER_FIELDS_4 if self.version >= 4 else CONSUMER_FIELDS
        v = _tuple(self.value(), len(fields) + 2, "consumer")
        k = Consumer.__new__(Consumer)
        k.channel = _at(channels, v[0], "channel")
        k.queue = _at(queues, v[1], "queue")
        k.timeout = None
        for name, field in zip(fields, v[2:], strict=True):
            setattr(k, name, field)
        _expect(k.timeout is None or type(k.timeout) is int, "consumer timeout")
        return k

    def _column(self, typecode: str, n: int, what: str) -> array[Any]:
        a = array(typecode)
        size = a.itemsize * n
        _expect(size <= len(self.data) - self.pos, f"{what} past the end")
        a.frombytes(memoryview(self.data)[self.pos:self.pos + size])  # one copy, not two
        if sys.byteorder != "little":
            a.byteswap()
        self.pos += size
        return a

    def packed(self) -> PackedFifo:
        """Version 5: a queue's ready messages as columns."""
        n, transient = _U64.unpack_from(self.data, self.pos)[0], _U64.unpack_from(self.data, self.pos + 8)[0]
        self.pos += 16
        _expect(transient <= n, "ready messages: more transient than there are")
        # no field is negative: no int64's top byte has its sign bit set (C speed,
        # where min() made 40M Python ints at 10M messages)
        _expect(32 * n <= len(self.data) - self.pos, "ready records past the end")
        records = memoryview(self.data)[self.pos:self.pos + 32 * n]
        top = bytes(records[7::8])
        _expect(not top.translate(None, _POSITIVE_TOP), "ready records: a negative field")
        self.pos += 32 * n  # copied chunk by chunk below, once
        flag = self.data[self.pos]
        self.pos += 1
        _expect(flag in (0, 1), "ready expiries flag")
        exp = self._column("d", n, "ready expiries") if flag else None
        table = _list(self.value(), "ready routing table")
        pairs: dict[int, tuple[str, str] | None] = {}
        for i, t in enumerate(table):
            _expect(type(t) is tuple and len(t) == 2 and type(t[0]) is str and type(t[1]) is str,
                    "ready routing table entry")
            pairs[i] = t
        pairs[_NO_PAIR] = None
        ids = self._column("I", n, "ready references")
        parts: list[tuple[array[int], array[float] | None, list[Any]]] = []
        get = pairs.__getitem__
        swap = sys.byteorder != "little"
        for a in range(0, n, CHUNK):
            nums = array("q")
            nums.frombytes(records[32 * a:32 * min(a + CHUNK, n)])
            if swap:
                nums.byteswap()
            try:
                refs: list[Any] = list(map(get, ids[a:a + CHUNK]))
            except KeyError:
                raise SnapshotFormatError("ready message: routing table index out of range") from None
            parts.append((nums, None if exp is None else exp[a:a + CHUNK], refs))
        objects = ids.count(_NO_PAIR)
        k = -1
        for _ in range(objects):
            k = ids.index(_NO_PAIR, k + 1)
            parts[k // CHUNK][2][k % CHUNK] = self.message()
        col = array("q")  # the records' Raft indices: every fourth int64 from the second
        col.frombytes(records.cast("q")[1::4].tobytes())
        if swap:
            col.byteswap()
        if objects:
            col = array("q", (v for v, i in zip(col, ids, strict=True) if i != _NO_PAIR))
        self._count_packed(col)
        return PackedFifo.from_chunks(parts, transient, objects)

    def _name(self, raw: bytes) -> str:
        """One str per distinct exchange or routing key, not one per message
        (the same few recur)."""
        name = self.names.get(raw)
        if name is None:
            name = self.names[raw] = raw.decode()
        return name

    def _logged(self, idx: int, n: int) -> None:
        """`n` messages in the entry at `idx`: it must be in the log-entries
        section; they count in its bucket's live count."""
        logged = self.logged
        k = bisect_left(logged, idx)
        _expect(k < len(logged) and logged[k] == idx, f"message at log index {idx} not in the log-entries section")
        b = idx >> BUCKET_SHIFT
        self.live[b] = self.live.get(b, 0) + n

    def _count_packed(self, col: array[int]) -> None:
        """_logged for a queue's packed records (their Raft indices, `col`):
        once per distinct entry when in log order (they are: a queue takes
        them as they are applied)."""
        n = len(col)
        runs = []
        p = 0
        prev = -1
        while p < n:  # sorted iff every run is one value and the runs increase
            v = col[p]
            e = bisect_right(col, v, p)
            if v <= prev or col[p:e].count(v) != e - p:
                break
            runs.append((v, e - p))
            prev = v
            p = e
        else:
            for v, count in runs:
                self._logged(v, count)
            return
        for v in col:  # never written so; read anyway
            self._logged(v, 1)

    def plain_ready(self, ready: PackedFifo) -> bool:
        """The next message, if plain (in the log, never delivered: most of
        a backlog), straight into `ready` without a Message (restart time);
        False, and nothing read, for any other."""
        data, pos = self.data, self.pos
        (seq, expires, count, flags, n_ex, n_rk, n, priority, acquired,
         deadline) = _MSG4.unpack_from(data, pos)
        if (flags & ~(_PERSISTENT | _EXPIRES) != _PLAIN or count or acquired or deadline):
            return False
        pos += _MSG4.size
        end = pos + n_ex + n_rk
        _expect(end + _LOC.size <= len(data), "message truncated")
        idx, at, n_props = _LOC.unpack_from(data, end)
        if at >= 1 << 31:
            return False
        exchange, rk = self._name(data[pos:pos + n_ex]), self._name(data[pos + n_ex:end])
        self._logged(idx, 1)
        ready.append_plain(seq, exchange, rk, idx, (at << 32) | n_props, n, priority,
                           bool(flags & _PERSISTENT), expires if flags & _EXPIRES else None)
        self.pos = end + _LOC.size
        return True

    def message(self) -> Message:
        data = self.data
        pos = self.pos
        acquired, deadline = 0, 0.0
        if self.version >= 4:
            (seq, expires, count, flags, n_ex, n_rk, n, priority, acquired,
             deadline) = _MSG4.unpack_from(data, pos)
            pos += _MSG4.size
        elif self.version >= 3:
            seq, expires, count, flags, n_ex, n_rk, n, priority = _MSG3.unpack_from(data, pos)
            pos += _MSG3.size
        else:
            seq, expires, count, flags, n_ex, n_rk, n = _MSG.unpack_from(data, pos)
            pos += _MSG.size
            priority = -1
        end = pos + n_ex + n_rk
        _expect(end <= len(data), "message truncated")
        exchange, rk = self._name(data[pos:pos + n_ex]), self._name(data[pos + n_ex:end])
        pos = end
        loc: int | None = None
        if flags & _HAS_LOC:
            idx, at, n_props = _LOC.unpack_from(data, pos)
            pos += _LOC.size
            self._logged(idx, 1)
            loc = make_loc(idx, at, n_props)
        props: dict[str, Any] | None
        if flags & _PROPS_LOGGED:
            _expect(loc is not None, "properties in the log without a place there")
            props = None
        elif flags & _PROPS_EMPTY:
            props = {}
        elif flags & _PROPS_REF:
            props = _at(self.props, _U32.unpack_from(data, pos)[0], "properties")
            pos += 4
        else:
            props, pos = decode_from(data, pos)
            _expect(type(props) is dict, "message properties")
            self.props.append(props)
        body: bytes | None
        if flags & _BODY_LOGGED:
            _expect(loc is not None, "a body in the log without a place there")
            body = None
        elif flags & _BODY_REF:
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
        m.size = n if body is None else len(body)
        m.loc = loc
        m.priority = priority if priority >= 0 else raw_priority(props or {})
        m.persistent = bool(flags & _PERSISTENT)
        m.redelivered = bool(flags & _REDELIVERED)
        m.expires_at = expires if flags & _EXPIRES else None
        m.delivery_count = count
        m.acquired_count = acquired
        m.deadline = deadline or None
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
    yield Message, (("seq", "exchange", "routing_key", "props", "body", "persistent",
                     "expires_at", "redelivered", "delivery_count", "acquired_count", "deadline")
                    + DERIVED["Message"])
