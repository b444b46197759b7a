"""Queue records and message storage (pure model).

Ready messages are a FIFO of new messages (packed arrays, not objects:
node/broker/fifo.py) plus a heap of returned (requeued) ones keyed by their
enqueue sequence. Only the head is ever taken,
so every returned message has a lower sequence than anything still in the
deque: the heap always precedes the deque and a requeued message goes back
to its original position (S04).

A priority queue (x-max-priority) keeps one packed FIFO per priority (a
band: max - priority, 0 the highest), as RabbitMQ keeps one backing queue
per priority: `ready` holds priority 0 (most messages carry none), `bands`
the others. A requeued message goes to the heap keyed by (band, sequence):
its place among its priority. The head is the smallest key of the heap's
top and each FIFO's head (band << 64 | sequence).

A quorum queue from machine version 3 on (`levels`, RabbitMQ 4.3's
rabbit_fifo_pq) has 32 strict priority levels, 0-31 (a message without a
priority counts as 4, one above 31 as 31) and serves returned messages
before any other: band 32 - level, `ready` the default level 4's FIFO, and
returned messages in the heap keyed by their sequence alone (band 0).

Returned messages stay objects: they were delivered (unacked objects
already, bounded by the consumers' prefetch), and carry their counts.
"""
from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from node.broker.fifo import PackedFifo
from node.broker.message import Message, raw_priority
from node.broker.policy import QueueSettings, queue_settings
from node.broker.vhost import ResourceKey

if TYPE_CHECKING:
    from node.broker.channel import Consumer
    from node.broker.ids import ConnId


MAX_PRIORITY = 255  # RabbitMQ's limit for x-max-priority
QUORUM_LEVELS = 32  # rabbit_fifo_pq: priorities 0..31
QUORUM_DEFAULT_PRIORITY = 4  # rabbit_fifo ?DEFAULT_PRIORITY: a message without one


def quorum_priority(props: dict[str, Any]) -> int:
    """A message's level in a quorum queue (rabbit_fifo msg_priority): its
    priority clamped to 0..31, 4 without one."""
    p = props.get("priority")
    if isinstance(p, bool) or not isinstance(p, int):
        return QUORUM_DEFAULT_PRIORITY
    return max(0, min(p, QUORUM_LEVELS - 1))


def uses_levels(arguments: dict[str, Any], quorum_semantics: bool) -> bool:
    """Does a queue of these arguments have the 32 quorum priority levels
    (machine version 3 on)? A quorum queue declared with x-max-priority
    before it keeps that queue's priorities."""
    return (quorum_semantics and arguments.get("x-queue-type") == "quorum"
            and "x-max-priority" not in arguments)


def message_priority(props: dict[str, Any], max_priority: int) -> int:
    """A message's priority in a queue: absent or invalid counts as 0, above
    the queue's maximum as the maximum (RabbitMQ)."""
    return min(raw_priority(props), max_priority)


class Queue:
    __slots__ = ("name", "durable", "exclusive", "owner", "auto_delete", "arguments", "home",
                 "message_ttl", "expires", "max_length", "max_length_bytes", "overflow",
                 "dlx", "dlrk", "returned", "ready", "next_seq", "ready_bytes",
                 "consumers", "exclusive_consumer", "last_used", "deleted", "incoming",
                 "max_priority", "single_active", "delivery_limit", "counts_deliveries",
                 "prio_consumers", "stats", "levels", "rejecting", "bands", "band_order", "banded")

    def __init__(self, name: str, durable: bool, owner: ConnId | None, auto_delete: bool,
                 arguments: dict[str, Any], home: str, now: float) -> None:
        # the table key (vhost-qualified), which is what error texts must name
        self.name = ResourceKey(name)
        self.durable = durable
        self.exclusive = owner is not None
        self.owner = owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.home = home
        a = arguments
        self.message_ttl: int | None = None
        self.expires: int | None = None
        self.max_length: int | None = None
        self.max_length_bytes: int | None = None
        self.overflow: str = "drop-head"
        self.dlx: str | None = None
        self.dlrk: str | None = None
        self.delivery_limit: int | None = None
        self.counts_deliveries = False
        self.settle(queue_settings(a))
        self.max_priority: int | None = a.get("x-max-priority")
        self.single_active: bool = a.get("x-single-active-consumer") is True
        # the 32 quorum priority levels (derived: uses_levels; set by the machine)
        self.levels = False
        # consumers with a non-zero x-priority: pick() compares only when any
        self.prio_consumers = 0
        self.returned: list[tuple[int, Message]] = []
        self.ready = PackedFifo()
        self.init_bands()
        self.next_seq = 0
        self.ready_bytes = 0
        # (chan, consumer_tag) -> Consumer, in round-robin order (rotated on delivery)
        self.consumers: dict[tuple[Any, str], Consumer] = {}
        self.exclusive_consumer: Consumer | None = None
        self.last_used = now
        self.deleted = False
        # bindings that target this queue: (source exchange, bind key) -> None
        self.incoming: dict[tuple[str, Any], None] = {}
        # message counters since declare (replicated, so every node shows the
        # same totals; the HTTP API derives rates by sampling them):
        # [published, delivered + got, redelivered, acked]
        self.stats: list[int] = [0, 0, 0, 0]
        # a quorum queue's reject-publish latch (machine/overflow.py)
        self.rejecting = False

    def settle(self, st: QueueSettings) -> None:
        """Take the effective settings (x-arguments and policies:
        node/broker/policy.py's queue_settings) that enforcement reads."""
        (self.message_ttl, self.expires, self.max_length, self.max_length_bytes, self.overflow,
         self.dlx, self.dlrk, self.delivery_limit) = st
        # quorum queues (and any with a delivery limit) tell consumers how often
        # a message came back: the x-delivery-count header on redeliveries
        self.counts_deliveries = (self.arguments.get("x-queue-type") == "quorum"
                                  or self.delivery_limit is not None)

    def settings(self) -> QueueSettings:
        return QueueSettings(self.message_ttl, self.expires, self.max_length,
                             self.max_length_bytes, self.overflow, self.dlx, self.dlrk,
                             self.delivery_limit)

    def init_bands(self) -> None:
        # band -> its packed FIFO (priority queues: every priority but the default's)
        self.bands: dict[int, PackedFifo] = {}
        self.band_order: list[int] = []  # the bands holding messages, best first
        self.banded = 0  # messages in bands

    def _band(self, priority: int) -> int:
        """The band (0 the first served) of a new message of this priority."""
        if self.levels:
            return QUORUM_LEVELS - priority
        mp = self.max_priority
        return 0 if mp is None else mp - min(priority, mp)

    def _default_band(self) -> int:
        """The band `ready` holds."""
        if self.levels:
            return QUORUM_LEVELS - QUORUM_DEFAULT_PRIORITY
        mp = self.max_priority
        return 0 if mp is None else mp

    def _key(self, m: Message) -> int:
        """A returned message's heap key: its sequence (a plain queue; a quorum
        queue's returned ones come before every level), else (band, sequence)."""
        if self.levels or self.max_priority is None:
            return m.seq
        return (self._band(m.priority) << 64) | m.seq

    def ready_count(self) -> int:
        return len(self.returned) + len(self.ready) + self.banded

    def _source(self) -> int:
        """Where the head is: -2 nowhere, -1 the heap, else the band whose
        FIFO holds it (the default band's is `ready`)."""
        returned, ready = self.returned, self.ready
        if not self.banded:
            if returned:
                if not ready or not self.levels and self.max_priority is None:
                    return -1  # plain: returned ones precede every new one
                d = self._default_band()
                return -1 if returned[0][0] < (d << 64) | ready.head_seq() else d
            return self._default_band() if ready else -2
        best, where = -1, -2
        if returned:
            best, where = returned[0][0], -1
        if ready:
            d = self._default_band()
            k = (d << 64) | ready.head_seq()
            if where == -2 or k < best:
                best, where = k, d
        b = self.band_order[0]
        k = (b << 64) | self.bands[b].head_seq()
        if where == -2 or k < best:
            where = b
        return where

    def _fifo(self, band: int) -> PackedFifo:
        return self.ready if band == self._default_band() else self.bands[band]

    def peek(self) -> Message | None:
        if not self.returned and not self.banded:  # the common case: one FIFO
            return self.ready[0] if self.ready else None
        where = self._source()
        if where == -1:
            return self.returned[0][1]
        if where == -2:
            return None
        return self._fifo(where)[0]

    def pop(self) -> Message:
        if not self.returned and not self.banded:  # the common case: one FIFO
            m = self.ready.popleft()
            self.ready_bytes -= m.size
            return m
        where = self._source()
        if where == -1:
            m = heapq.heappop(self.returned)[1]
        elif where == -2:
            raise IndexError("pop from an empty queue")
        elif where == self._default_band():
            m = self.ready.popleft()
        else:
            f = self.bands[where]
            m = f.popleft()
            self.banded -= 1
            if not f:
                del self.bands[where]
                self.band_order.remove(where)
        self.ready_bytes -= m.size
        return m

    def push(self, m: Message) -> None:
        m.seq = self.next_seq
        self.next_seq += 1
        if self.levels or self.max_priority is not None:
            b = self._band(m.priority)
            if b == self._default_band():
                self.ready.append(m)
            else:
                self._band_fifo(b).append(m)
                self.banded += 1
        else:
            self.ready.append(m)
        self.ready_bytes += m.size

    def push_plain(self, exchange: str, routing_key: str, loc: int, size: int, priority: int,
                   persistent: bool, expires_at: float | None) -> bool:
        """push() of a never-delivered message in the log, from its fields,
        with no Message made (a backlog's publish); False when its record
        cannot be packed (then push() the object)."""
        pal = loc & 0xFFFFFFFFFFFFFFFF
        if pal >> 63 or not 0 <= priority < 256:
            return False
        if self.levels or self.max_priority is not None:
            b = self._band(priority)
            if b == self._default_band():
                f = self.ready
            else:
                f = self._band_fifo(b)
                self.banded += 1
        else:
            f = self.ready
        f.append_plain(self.next_seq, exchange, routing_key, loc >> 64, pal, size, priority,
                       persistent, expires_at)
        self.next_seq += 1
        self.ready_bytes += size
        return True

    def _band_fifo(self, b: int) -> PackedFifo:
        f = self.bands.get(b)
        if f is None:
            f = self.bands[b] = PackedFifo()
            bisect.insort(self.band_order, b)
        return f

    def requeue(self, m: Message) -> None:
        # levels: a returned message goes before every level (rabbit_fifo's
        # returns queue), at its original place among the returned (S04)
        heapq.heappush(self.returned, (self._key(m), m))
        self.ready_bytes += m.size

    def band_items(self) -> Iterator[tuple[int, Message]]:
        """The banded messages with their heap keys (a snapshot writes them
        among the returned ones, the layout every format version reads)."""
        for b in self.band_order:
            hi = b << 64
            for m in self.bands[b]:
                yield hi | m.seq, m

    def band_log_indices(self) -> set[int]:
        out: set[int] = set()
        for f in self.bands.values():
            out.update(f.log_indices())
        return out

    def unband_heap(self) -> None:
        """Move the heap's messages that belong in a band FIFO into it, in
        sequence order (after a snapshot's read, once `levels` is known: a
        snapshot holds a priority queue's messages among the returned ones).
        Only never-delivered ones (returned ones stay returned), and only
        into a FIFO still empty, so each stays in sequence order."""
        if not self.returned or not (self.levels or self.max_priority is not None):
            return
        d = self._default_band()
        stay: list[tuple[int, Message]] = []
        moving: dict[int, list[tuple[int, Message]]] = {}
        for k, m in self.returned:
            b = k >> 64
            if m.redelivered or b == 0 and self.levels or b == d and self.ready:
                stay.append((k, m))
            else:
                moving.setdefault(b, []).append((k, m))
        if not moving:
            return
        for b, items in moving.items():
            items.sort(key=lambda km: km[0])
            f = self.ready if b == d else self._band_fifo(b)
            for _k, m in items:
                f.append(m)
            if b != d:
                self.banded += len(items)
        heapq.heapify(stay)
        self.returned = stay

    def keep_only(self, keep: Callable[[Message], bool]) -> list[Message]:
        """Remove the ready messages `keep` refuses, every other one staying
        where it is; returns the removed ones."""
        gone = [m for _k, m in self.returned if not keep(m)]
        if gone:
            self.returned = [(k, m) for k, m in self.returned if keep(m)]
            heapq.heapify(self.returned)
        if self.ready:
            self.ready, more = self.ready.filtered(keep)
            gone.extend(more)
        for b in list(self.band_order):
            f, more = self.bands[b].filtered(keep)
            if more:
                gone.extend(more)
                self.banded -= len(more)
                if f:
                    self.bands[b] = f
                else:
                    del self.bands[b]
                    self.band_order.remove(b)
        self.ready_bytes -= sum(m.size for m in gone)
        return gone

    def keep_persistent(self) -> list[Message]:
        """keep_only(persistent), reading the packed flags: a backlog of
        persistent messages is neither made into objects nor copied."""
        if self.ready.all_persistent() and all(f.all_persistent() for f in self.bands.values()):
            gone = [m for _k, m in self.returned if not m.persistent]
            if gone:
                self.returned = [(k, m) for k, m in self.returned if m.persistent]
                heapq.heapify(self.returned)
                self.ready_bytes -= sum(m.size for m in gone)
            return gone
        return self.keep_only(lambda m: m.persistent)

    def take_all(self) -> list[Message]:
        """Remove and return every ready message, head first."""
        if self.banded:
            out = []
            while self.ready_count():
                out.append(self.pop())
        else:
            out = [heapq.heappop(self.returned)[1] for _ in range(len(self.returned))]
            out.extend(self.ready)
            self.ready.clear()
        self.ready_bytes = 0
        return out

    def over_limit(self) -> bool:
        """Over x-max-length / x-max-length-bytes (drop-head is applied after enqueue)."""
        return ((self.max_length is not None and self.ready_count() > self.max_length)
                or (self.max_length_bytes is not None
                    and self.ready_bytes > self.max_length_bytes))

    def full(self) -> bool:
        """At the limit: reject-publish refuses a new message."""
        return ((self.max_length is not None and self.ready_count() >= self.max_length)
                or (self.max_length_bytes is not None
                    and self.ready_bytes >= self.max_length_bytes))
