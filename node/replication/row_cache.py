"""One shared snapshot of the management rows for every reader (issue 42
item 2).

Building the rows (read_model.management_rows) walks the whole state on the
raft thread: O(queues + exchanges + bindings + channels). Built once per
request, 48 keep-alive clients looping GET /api/overview on 3,000 queues kept
the raft thread busy and another vhost's confirms waited seconds. Here every
reader (each HTTP request, the rate sampler, each metrics scrape) awaits the
same snapshot:

- a snapshot is served as long as nothing was applied since it was built (it
  is exactly the state: a client reads its own writes, as before);
- otherwise one build is asked for all the readers waiting (never one each),
  and it starts no sooner than `next_build_at` after the previous one ended:
  at least `min_interval`, and long enough that the builds take at most
  `max_share` of the raft thread's time (a build of 30 ms with the default 0.1
  waits 270 ms), whatever the number of readers.

`next_build_at` and `current` are the pure decisions; RowCache is the
loop-side shell (one task at a time asks the raft thread).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, NamedTuple, TypeVar

_R = TypeVar("_R")

# defaults of [http] rows_min_interval and rows_max_share (node/app/config.py)
ROWS_MIN_INTERVAL = 0.05
ROWS_MAX_SHARE = 0.1


class Built(NamedTuple, Generic[_R]):
    """What one build on the raft thread returns."""

    rows: _R
    applied: int  # batches applied when it was built
    cost: float  # seconds the raft thread spent building it


def next_build_at(last_end: float, last_cost: float, min_interval: float,
                  max_share: float) -> float:
    """The earliest time the next build may start: builds of `last_cost`
    seconds spaced so that they take at most `max_share` of the raft
    thread, and never closer than `min_interval`."""
    share = min(max(max_share, 1e-3), 1.0)
    return last_end + max(min_interval, last_cost * (1.0 - share) / share)


def timed(build: Callable[[Any], _R], version: Callable[[], int]) -> Callable[[Any], Built[_R]]:
    """`build` as the raft thread runs it (ModelPublisher.compute): the rows,
    the state version they include, what they cost."""
    def run(state: Any) -> Built[_R]:
        began = time.perf_counter()
        rows = build(state)
        return Built(rows, version(), time.perf_counter() - began)
    return run


def current(built_applied: int | None, applied_now: int) -> bool:
    """Is a snapshot built at `built_applied` batches still the state?"""
    return built_applied is not None and built_applied == applied_now


class RowCache(Generic[_R]):
    """Loop side: `await get()` returns the shared snapshot, building it on
    the raft thread (through `build`) only when something was applied since,
    at most one build at a time, spaced by `next_build_at`."""

    def __init__(self, build: Callable[[], Awaitable[Built[_R]]], applied: Callable[[], int],
                 min_interval: float = ROWS_MIN_INTERVAL, max_share: float = ROWS_MAX_SHARE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._build = build
        self._applied = applied
        self.min_interval = min_interval
        self.max_share = max_share
        self._clock = clock
        self._last: Built[_R] | None = None
        self._last_end = float("-inf")
        self._pending: asyncio.Task[_R] | None = None
        self.builds = 0  # counted for tests and the metrics

    async def get(self) -> _R:
        last = self._last
        if last is not None and current(last.applied, self._applied()):
            return last.rows
        task = self._pending
        if task is None:
            task = self._pending = asyncio.ensure_future(self._refresh())
            task.add_done_callback(_retrieve)
        # shield: a reader that goes away does not cancel the others' build
        return await asyncio.shield(task)

    async def _refresh(self) -> _R:
        try:
            last = self._last
            if last is not None:
                wait = next_build_at(self._last_end, last.cost, self.min_interval,
                                     self.max_share) - self._clock()
                if wait > 0:
                    await asyncio.sleep(wait)
            built = await self._build()
            self.builds += 1
            self._last, self._last_end = built, self._clock()
            return built.rows
        finally:
            self._pending = None


def _retrieve(task: asyncio.Task[object]) -> None:
    """A failed build whose readers all left must not log 'never retrieved'."""
    if not task.cancelled():
        with contextlib.suppress(BaseException):
            task.exception()
