"""Reading a snapshot: the envelope checked (envelope.py), then the state's
records and the trailing sections (section.py) decoded into the broker's own
types, set field by field from checked values; anything else raises
SnapshotFormatError naming what is malformed and where.

Queues, channels and consumers are referenced by index, so the object graph
(an unacked delivery's queue and consumer, a consumer's channel) comes back
with the same sharing, deleted queues that deliveries still name included.
"""
from __future__ import annotations

import struct
import sys
from array import array
from typing import IO

from node.broker.channel import Channel, Consumer
from node.broker.exchange import Binding, Exchange, split_topic
from node.broker.fifo import PackedFifo
from node.broker.ids import ChanId
from node.broker.queue import Queue
from node.replication.codec import CodecError
from node.replication.machine.limit import rebuild_counts
from node.replication.machine.state import BrokerState, rebuild_binding_counts
from node.replication.raft.snapshot.envelope import (
    _HEADER,
    _U64,
    HEADER_SIZE,
    MAGIC,
    RaftMeta,
    SnapshotFormatError,
    _at,
    _dict,
    _entry,
    _expect,
    _list,
    _pairs,
    _tuple,
    check,
)
from node.replication.raft.snapshot.fields import (
    EXCHANGE_FIELDS,
    STATE_FIELDS,
    channel_fields,
    consumer_fields,
    queue_fields,
)
from node.replication.raft.snapshot.packed import _PackedReader
from node.replication.raft.snapshot.sections import SECTIONS


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
        for section in SECTIONS:  # files of an older cluster end before some
            if r.pos < len(data):
                section.read(r, state)
            section.derive(state)
        rebuild_counts(state)
        rebuild_binding_counts(state)
    except (CodecError, struct.error, UnicodeDecodeError, IndexError, TypeError, ValueError) as e:
        if isinstance(e, SnapshotFormatError):
            raise
        raise SnapshotFormatError(f"malformed snapshot at byte {r.pos}: {e}") from None
    if r.pos != len(data):
        raise SnapshotFormatError(f"{len(data) - r.pos} trailing bytes after the snapshot")
    return state, meta


class _Reader(_PackedReader):
    """The snapshot body's reader: the log-entries section, the Raft position,
    the state's records."""

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
        x.rebuild_topic()
        return v[0], x

    def queue(self) -> Queue:
        fields = queue_fields(self.version)
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
        fields = channel_fields(self.version)
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
        fields = consumer_fields(self.version)
        v = _tuple(self.value(), len(fields) + 2, "consumer")
        k = Consumer.__new__(Consumer)
        k.channel = _at(channels, v[0], "channel")
        k.queue = _at(queues, v[1], "queue")
        k.timeout = None
        for name, field in zip(fields, v[2:], strict=True):
            setattr(k, name, field)
        _expect(k.timeout is None or type(k.timeout) is int, "consumer timeout")
        return k
