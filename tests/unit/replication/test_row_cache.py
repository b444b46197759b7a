"""The shared snapshot of the management rows (issue 42 item 2): one build
for every reader waiting, none while nothing was applied, builds spaced so
they take at most their share of the raft thread."""
from __future__ import annotations

import asyncio

import pytest

from node.replication.row_cache import Built, RowCache, current, next_build_at


def test_next_build_at_keeps_builds_to_their_share() -> None:
    assert next_build_at(10.0, 0.030, 0.1, 0.2) == pytest.approx(10.12)  # 30 ms: 120 ms apart
    assert next_build_at(10.0, 0.001, 0.1, 0.2) == pytest.approx(10.1)  # the floor
    assert next_build_at(10.0, 0.5, 0.0, 1.0) == pytest.approx(10.0)  # share 1: back to back
    assert current(7, 7) and not current(7, 8) and not current(None, 0)


class Raft:
    """A raft thread that builds when asked: counts builds, 30 ms each."""

    def __init__(self) -> None:
        self.applied = 0
        self.builds = 0

    async def build(self) -> Built[int]:
        self.builds += 1
        await asyncio.sleep(0.001)
        return Built(self.builds, self.applied, 0.030)


def test_readers_share_one_build_and_nothing_applied_costs_nothing() -> None:
    async def run() -> None:
        raft = Raft()
        cache = RowCache(raft.build, lambda: raft.applied)
        got = await asyncio.gather(*(cache.get() for _ in range(48)))
        assert raft.builds == 1 and set(got) == {1}
        for _ in range(100):  # nothing applied since: the snapshot is the state
            assert await cache.get() == 1
        assert raft.builds == 1
        raft.applied += 1  # a write: the next read sees it (a new build)
        assert await cache.get() == 2 and raft.builds == 2
    asyncio.run(run())


def test_builds_are_spaced_whatever_the_readers() -> None:
    async def run() -> None:
        raft = Raft()
        cache = RowCache(raft.build, lambda: raft.applied, min_interval=0.05, max_share=0.2)
        loop = asyncio.get_running_loop()
        began = loop.time()
        while loop.time() - began < 0.6:
            raft.applied += 1  # a busy node: every read finds something applied
            await asyncio.gather(*(cache.get() for _ in range(10)))
        # 30 ms builds at a 0.2 share: one per ~120 ms, so about 5 in 0.6 s (not hundreds)
        assert 3 <= raft.builds <= 7, raft.builds
    asyncio.run(run())


def test_a_failed_build_reaches_its_readers_and_the_next_read_retries() -> None:
    async def run() -> None:
        calls = [0]

        async def build() -> Built[int]:
            calls[0] += 1
            if calls[0] == 1:
                raise TimeoutError("the raft thread did not answer")
            return Built(5, 0, 0.0)
        cache = RowCache(build, lambda: 0, min_interval=0.0)
        with pytest.raises(TimeoutError):
            await cache.get()
        assert await cache.get() == 5
    asyncio.run(run())
