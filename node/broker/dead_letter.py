"""At-least-once dead-lettering (pure model): the dead-lettered messages a
quorum queue keeps until the queues its dead-letter exchange routes them to
have taken them (RabbitMQ's rabbit_fifo_dlx `discards`).

A queue has a store only while its effective strategy is at-least-once
(`at_least_once`); its messages count towards the queue's max-length and
max-length-bytes (rabbit_fifo is_over_limit) and are shown as messages_dlx
and message_bytes_dlx.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.broker.queue import Message, Queue

AT_LEAST_ONCE = "at-least-once"
STRATEGIES = ("at-most-once", AT_LEAST_ONCE)
# rabbit's dead_letter_worker_consumer_prefetch: how many dead letters one
# retry pass may fail on before it stops (the ones behind wait, as they wait
# behind the worker's 32 unsettled in RabbitMQ)
RETRY_WINDOW = 32


class DeadLetter:
    """One kept message: `message` carries the properties it is
    republished with (x-death recorded once, when it died), its body where it
    was (inline or in the log); `settled`: the target queues that have taken
    it so far (each target gets it once, as the worker's publisher confirms)."""

    __slots__ = ("message", "reason", "settled")

    def __init__(self, message: Message, reason: str,
                 settled: dict[str, None] | None = None) -> None:
        self.message = message
        self.reason = reason
        self.settled: dict[str, None] = settled if settled is not None else {}


class DeadLetterStore:
    """A queue's kept dead letters, oldest first, and their body bytes."""

    __slots__ = ("entries", "bytes")

    def __init__(self) -> None:
        self.entries: deque[DeadLetter] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[DeadLetter]:
        return iter(self.entries)

    def add(self, d: DeadLetter) -> None:
        self.entries.append(d)
        self.bytes += d.message.size

    def clear(self) -> list[DeadLetter]:
        out = list(self.entries)
        self.entries.clear()
        self.bytes = 0
        return out


def strategy(arguments: Mapping[str, Any], policy: Mapping[str, Any] | None) -> str | None:
    """The configured dead-letter strategy: the x-argument wins over the
    policy's key (rabbit_quorum_queue: queue_arg_has_precedence)."""
    v = arguments.get("x-dead-letter-strategy")
    if v is None:
        v = (policy or {}).get("dead-letter-strategy")
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None


def at_least_once(q: Queue, policy: Mapping[str, Any] | None) -> bool:
    """Does `q` dead-letter at least once (rabbit_quorum_queue:dlh)? A quorum
    queue with a dead-letter exchange, the strategy at-least-once and the
    overflow reject-publish; with drop-head it falls back to at-most-once."""
    return (q.arguments.get("x-queue-type") == "quorum" and q.dlx is not None
            and q.overflow == "reject-publish" and strategy(q.arguments, policy) == AT_LEAST_ONCE)


def full_with(q: Queue, store: DeadLetterStore) -> bool:
    """Queue.full counting the kept dead letters too (rabbit_fifo is_over_limit)."""
    return ((q.max_length is not None and q.ready_count() + len(store) >= q.max_length)
            or (q.max_length_bytes is not None
                and q.ready_bytes + store.bytes >= q.max_length_bytes))
