"""Writing a snapshot: the state's records in order, then the trailing
sections (section.py), into the envelope (envelope.py).

  body    log entries (version 3): u64 count, then that many u64 Raft indices,
          ascending: the entries the messages' bytes are in
          raft position: one codec value (RaftMeta)
          plain state: one codec value (the scalar fields and plain tables)
          exchanges, queues, channels, consumers, links (package docstring)
          the trailing sections, each from its machine version on

Queues, channels and consumers are written by index (_graph reaches each
once: the tables' own first, then the ones only references reach).
"""
from __future__ import annotations

import heapq
import sys
from array import array
from collections.abc import Iterator
from io import BytesIO
from typing import IO

from node.broker.channel import Channel, Consumer
from node.broker.queue import Message, Queue
from node.replication.machine.state import BrokerState
from node.replication.raft.snapshot.envelope import (
    _HEADER,
    _U64,
    HEADER_SIZE,
    MAGIC,
    RaftMeta,
    _Writer,
)
from node.replication.raft.snapshot.fields import (
    EXCHANGE_FIELDS,
    STATE_FIELDS,
    channel_fields,
    consumer_fields,
    queue_fields,
)
from node.replication.raft.snapshot.message import _MessageWriter
from node.replication.raft.snapshot.packed import _write_packed
from node.replication.raft.snapshot.sections import SECTIONS


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
    ch_fields = channel_fields(msgs.version)
    k_fields = consumer_fields(msgs.version)
    _write_queues(w, state, queues, msgs)
    q_index = {id(q): i for i, q in enumerate(queues)}
    c_index = {id(c): i for i, c in enumerate(channels)}
    k_index = {id(k): i for i, k in enumerate(consumers)}
    w.value([(key, c_index[id(ch)]) for key, ch in state.channels.items()])
    w.u32(len(channels))
    for ch in channels:
        w.value(tuple(getattr(ch, f) for f in ch_fields))
    w.u32(len(consumers))
    for k in consumers:
        w.value((c_index[id(k.channel)], q_index[id(k.queue)], *(getattr(k, f) for f in k_fields)))
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
    for section in SECTIONS:  # the trailing sections, each from its machine version on
        if state.machine_version >= section.since:
            section.write(w, state, msgs)
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
    fields = queue_fields(msgs.version)
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


def _swapped(entries: array[int]) -> bytes:
    copy = array("Q", entries)
    copy.byteswap()
    return copy.tobytes()
