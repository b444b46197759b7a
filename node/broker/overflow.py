"""A quorum queue's overflow, as rabbit_fifo's evaluate_limit has it (machine
version 5 on, S32).

reject-publish is a latch, not a per-message check as on a classic queue:
a publish is taken while the queue is not over its limit, so the one that
goes over is kept (ready + kept dead letters > x-max-length, or their bytes
> x-max-length-bytes); from then on publishes are refused until the queue
is back at or below 80% of the limit (rabbit_fifo ?LOW_LIMIT). RabbitMQ
tells each publisher's queue client `reject_publish` once the queue goes
over, and the client refuses further publishes itself until `go`; here the
replicated state holds the latch, so every member decides alike.
reject-publish-dlx is not a quorum queue's strategy: RabbitMQ logs a warning
and uses drop-head.
"""
from __future__ import annotations

from node.broker.dead_letter import DeadLetterStore
from node.broker.queue import Queue

LOW_LIMIT = 0.8  # rabbit_fifo.hrl ?LOW_LIMIT


def _load(q: Queue, kept: DeadLetterStore | None) -> tuple[int, int]:
    if kept is None:
        return q.ready_count(), q.ready_bytes
    return q.ready_count() + len(kept), q.ready_bytes + kept.bytes


def _over(q: Queue, n: int, b: int) -> bool:
    return ((q.max_length is not None and n > q.max_length)
            or (q.max_length_bytes is not None and b > q.max_length_bytes))


def _below_soft(q: Queue, n: int, b: int) -> bool:
    return ((q.max_length is None or n <= int(q.max_length * LOW_LIMIT))
            and (q.max_length_bytes is None or b <= int(q.max_length_bytes * LOW_LIMIT)))


def admits(q: Queue, kept: DeadLetterStore | None) -> bool:
    """Whether a quorum reject-publish queue takes a publish now; opens the
    latch once the queue is back below the soft limit, closes it when the
    queue is over the limit already (returned messages, a lowered limit)."""
    if q.max_length is None and q.max_length_bytes is None:
        q.rejecting = False
        return True
    n, b = _load(q, kept)
    if q.rejecting:
        if not _below_soft(q, n, b):
            return False
        q.rejecting = False
    elif _over(q, n, b):
        q.rejecting = True
        return False
    return True


def latch(q: Queue, kept: DeadLetterStore | None) -> None:
    """After a publish was taken: over the limit now, so refuse the next ones."""
    if _over(q, *_load(q, kept)):
        q.rejecting = True
