"""RaftNode.wait_ready gives up after `timeout` seconds without catch-up progress, not
after `timeout` in all: a member restarted under load (chaos kill-during-snapshot)
kept receiving its log for more than the old fixed 60 s and exited half way, each
time it was restarted."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from node.replication.config import RaftConfig
from node.replication.raft_node import RaftNode


class FakeShim:
    """ready() after `ready_after` s; catch_up_progress() grows every `step` s until
    `stall_after` s (then stays put)."""

    def __init__(self, ready_after: float, step: float, stall_after: float) -> None:
        self.t0 = time.monotonic()
        self.ready_after, self.step, self.stall_after = ready_after, step, stall_after

    def ready(self) -> bool:
        return time.monotonic() - self.t0 >= self.ready_after

    def catch_up_progress(self) -> tuple[int, int]:
        t = min(time.monotonic() - self.t0, self.stall_after)
        return (int(t / self.step), 0)

    def stop(self) -> None:
        pass


def _node(tmp_path: Path, shim: FakeShim) -> tuple[RaftNode, list[Any]]:
    loop = asyncio.get_running_loop()
    node = RaftNode("n1", str(tmp_path), loop, sink=None, config=RaftConfig())  # type: ignore[arg-type]
    node.shim = shim  # type: ignore[assignment]
    committed: list[Any] = []

    async def commit(cmds: list[Any], timeout: float = 30.0) -> None:
        committed.extend(cmds)

    node.commit = commit  # type: ignore[method-assign]
    return node, committed


def test_wait_ready_keeps_waiting_while_the_catch_up_progresses(tmp_path: Path) -> None:
    asyncio.run(_keeps_waiting(tmp_path))


async def _keeps_waiting(tmp_path: Path) -> None:
    # ready after 1.2 s, four times the timeout, progress every 0.1 s until then
    node, committed = _node(tmp_path, FakeShim(ready_after=1.2, step=0.1, stall_after=10))
    t0 = time.monotonic()
    await node.wait_ready(timeout=0.3)
    assert time.monotonic() - t0 >= 1.1
    assert [type(c).__name__ for c in committed] == ["NodeUp"]
    node.stop()


def test_wait_ready_gives_up_after_timeout_without_progress(tmp_path: Path) -> None:
    asyncio.run(_gives_up(tmp_path))


async def _gives_up(tmp_path: Path) -> None:
    # progress for 0.4 s, then none: gives up about 0.3 s after the last progress
    node, committed = _node(tmp_path, FakeShim(ready_after=100, step=0.1, stall_after=0.4))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no progress in"):
        await node.wait_ready(timeout=0.3)
    assert 0.6 <= time.monotonic() - t0 < 2.0
    assert committed == []
