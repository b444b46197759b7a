"""Queue records and message storage (pure model).

Ready messages are a FIFO of new messages (packed arrays, not objects:
node/broker/fifo.py) plus a heap of returned (requeued) ones keyed by their
enqueue sequence. Only the head is ever taken,
so every returned message has a lower sequence than anything still in the
deque: the heap always precedes the deque and a requeued message goes back
to its original position (S04).

A priority queue (x-max-priority) keeps every ready message in the heap,
keyed by (max - priority, sequence): higher priority first, FIFO within a
priority, and a requeued message returns to its place among its priority.

A quorum queue from machine version 3 on (`levels`, RabbitMQ 4.3's
rabbit_fifo_pq) has 32 strict priority levels, 0-31 (a message without a
priority counts as 4, one above 31 as 31) and serves returned messages
before any other. The deque holds the messages of the default level 4
(the common case stays O(1)); the heap the returned ones, keyed by their
sequence (band 0), and those of the other levels, keyed by (32 - level,
sequence); the head is the smaller of the two heads.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from node.broker.fifo import PackedFifo
from node.broker.message import Message, raw_priority
from node.broker.policy import QueueSettings, queue_settings
from node.broker.vhost import ResourceKey

if TYPE_CHECKING:
    from node.broker.channel import Consumer
    from node.broker.ids import ConnId


def _level_key(priority: int, seq: int) -> int:
    """Heap key of a message of level `priority` (band 0: returned messages)."""
    return ((QUORUM_LEVELS - priority) << 64) | seq


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
                 "prio_consumers", "stats", "levels", "rejecting")

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

    def _key(self, m: Message) -> int:
        """Heap order: sequence, or (max - priority, sequence) in a priority queue."""
        mp = self.max_priority
        if mp is None:
            return m.seq
        return ((mp - min(m.priority, mp)) << 64) | m.seq

    def ready_count(self) -> int:
        return len(self.returned) + len(self.ready)

    def _heap_first(self) -> bool:
        """Is the head in the heap (else in the deque)?"""
        if not self.returned:
            return False
        if not self.levels or not self.ready:
            return True
        return self.returned[0][0] < _level_key(QUORUM_DEFAULT_PRIORITY, self.ready.head_seq())

    def peek(self) -> Message | None:
        if self._heap_first():
            return self.returned[0][1]
        if self.ready:
            return self.ready[0]
        return None

    def pop(self) -> Message:
        if self._heap_first():
            m = heapq.heappop(self.returned)[1]
        else:
            m = self.ready.popleft()
        self.ready_bytes -= m.size
        return m

    def push(self, m: Message) -> None:
        m.seq = self.next_seq
        self.next_seq += 1
        if self.levels:
            if m.priority == QUORUM_DEFAULT_PRIORITY:
                self.ready.append(m)
            else:
                heapq.heappush(self.returned, (_level_key(m.priority, m.seq), m))
        elif self.max_priority is None:
            self.ready.append(m)
        else:
            heapq.heappush(self.returned, (self._key(m), m))
        self.ready_bytes += m.size

    def requeue(self, m: Message) -> None:
        # levels: a returned message goes before every level (rabbit_fifo's
        # returns queue), at its original place among the returned (S04)
        heapq.heappush(self.returned, (m.seq if self.levels else self._key(m), m))
        self.ready_bytes += m.size

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
        self.ready_bytes -= sum(m.size for m in gone)
        return gone

    def keep_persistent(self) -> list[Message]:
        """keep_only(persistent), reading the packed flags: a backlog of
        persistent messages is neither made into objects nor copied."""
        if self.ready.all_persistent():
            gone = [m for _k, m in self.returned if not m.persistent]
            if gone:
                self.returned = [(k, m) for k, m in self.returned if m.persistent]
                heapq.heapify(self.returned)
                self.ready_bytes -= sum(m.size for m in gone)
            return gone
        return self.keep_only(lambda m: m.persistent)

    def take_all(self) -> list[Message]:
        """Remove and return every ready message (head first, but with
        `levels`: heap, then deque)."""
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
