"""The snapshots the shim forces, beyond pysyncobj's own (entries, time).

A snapshot is forced (at most once per compaction_min_gap, never while one is
being written) when the log since the last one exceeds compaction_max_bytes,
when the latest snapshot alone pins retained segments whose messages have
settled (a quiet queue after a drain takes none by entry count), and when our
own snapshot file fails its check as it is about to be sent. A clean stop
with much log since the last snapshot takes one first, so that the restart
replays nothing. CompactionMixin is this part of RaftShim (shim.py).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from pysyncobj.monotonic import monotonic as clock

from node.replication.config import RaftConfig
from node.replication.message_store import BUCKET_SHIFT

if TYPE_CHECKING:
    from node.replication.raft.shim import Owner, _BrokerLog

log = logging.getLogger(__name__)


def stop_snapshot_skipped(used: int, failures_in_row: int, limit: int) -> str | None:
    """Why a clean stop takes no snapshot first ("": nothing worth saying), or
    None: take one. A disk on which snapshots fail (full: ENOSPC keeps the node
    running) would only make SIGTERM wait out the bound for another failure."""
    if used < limit:
        return ""
    if failures_in_row:
        return f"the last {failures_in_row} attempts failed"
    return None

class CompactionMixin:
    """RaftShim's forced snapshots (any thread for the stop, else the raft thread)."""

    owner: Owner
    config: RaftConfig
    _so: _BrokerLog | None
    _thread: threading.Thread | None
    _tasks: deque[Callable[[], None]]
    _snap_pid: int | None
    _dump_path: str
    snapshots: int
    forced_compactions: int
    _last_forced_compaction: float
    _last_pin_check: float
    snapshot_buckets: frozenset[int]  # SnapshotMixin's, as are the next four
    snapshot_done_at: float
    PIN_QUIET: float
    PIN_QUIET_SMALL: float
    SMALL_STATE_MESSAGES: int

    # a clean stop with this much log since the last snapshot takes one first:
    # the restart then replays nothing (10M queued: 3.4 s of a 6.5 s restart).
    # Bounded well inside a pod's grace period (the tests' 30 s, the operator's
    # default 120 s): the stop snapshot of 10M queued took 2.1 s, and a stop
    # without one only replays more at the restart
    STOP_SNAPSHOT_BYTES = 32 << 20
    STOP_SNAPSHOT_SECONDS = 20.0
    failed_snapshots: int  # SnapshotMixin's, as is the next
    _failures_in_row: int

    def _log_since_snapshot(self) -> int:
        so = self._so
        assert so is not None
        try:  # (read off the raft thread: it may move the log's start meanwhile)
            return int(so._SyncObj__raftLog.bytes_used())
        except (IndexError, ValueError):
            return -1

    def _snapshot_before_stop(self) -> None:
        """Until the log since the last snapshot is under STOP_SNAPSHOT_BYTES:
        one already being written may cover only part of it (pysyncobj keeps
        the forced request and starts another once it is done, if anything
        was applied after it)."""
        so = self._so
        if so is None or self._thread is None or not self._thread.is_alive():
            return
        used = self._log_since_snapshot()
        skip = stop_snapshot_skipped(used, self._failures_in_row, self.STOP_SNAPSHOT_BYTES)
        if skip is not None:
            if skip:
                log.info("no snapshot before stopping: %s", skip)
            return
        before, failed = self.snapshots, self.failed_snapshots
        began = clock()
        self._tasks.append(so.forceLogCompaction)
        so.wake()
        left = used
        while clock() - began < self.STOP_SNAPSHOT_SECONDS and self._thread.is_alive():
            time.sleep(0.02)
            left = self._log_since_snapshot()
            if 0 <= left < self.STOP_SNAPSHOT_BYTES and self.snapshots > before and self._snap_pid is None:
                break
            if self.failed_snapshots > failed:  # it failed: waiting longer cannot help
                break
        log.info("snapshot before stopping: %s in %.2f s (%d MB of log since the last one, %d MB left; "
                 "%d written)", "done" if 0 <= left < self.STOP_SNAPSHOT_BYTES else "not done",
                 clock() - began, used >> 20, max(left, 0) >> 20, self.snapshots - before)

    def _own_snapshot_damaged(self, why: str) -> None:
        """Our snapshot file failed its check when about to be sent (raft thread):
        write a new one (once per compaction_min_gap), which replaces it."""
        so = self._so
        now = clock()
        if so is None or self._snap_pid is not None or now - self._last_forced_compaction < self.config.compaction_min_gap:
            return
        self._last_forced_compaction = now
        self.forced_compactions += 1
        log.error("own snapshot %s damaged (%s): writing a new one", self._dump_path, why)
        self._tasks.append(so.forceLogCompaction)

    def _check_journal_bytes(self, so: _BrokerLog) -> None:
        c = self.config
        now = clock()
        if now - self._last_forced_compaction < c.compaction_min_gap:
            return
        used = so._SyncObj__raftLog.bytes_used()
        if self._snap_pid is None and (used > c.compaction_max_bytes or self._snapshot_pins_dead_segments()):
            self._last_forced_compaction = now
            self.forced_compactions += 1
            so.forceLogCompaction()

    def _snapshot_pins_dead_segments(self) -> bool:
        """Whether no snapshot was taken for PIN_QUIET seconds and the latest
        one alone keeps retained segments, or messages in them, on disk (they
        settled since): a quiet queue after a drain takes no snapshot by entry count,
        and those segments would stay until the next one. Under load
        snapshots come by entry count and this never fires."""
        now = clock()
        # a small state (the queues drained) snapshots in milliseconds: free
        # the disk within seconds, as RabbitMQ does; a large one waits longer
        quiet = self.PIN_QUIET if self.owner.live_messages() > self.SMALL_STATE_MESSAGES else self.PIN_QUIET_SMALL
        if not self.snapshot_buckets or now - self._last_pin_check < 1.0 \
                or now - self.snapshot_done_at < quiet:
            return False
        self._last_pin_check = now
        so = self._so
        assert so is not None
        retains = self.owner.retains
        hidden = so._SyncObj__raftLog.hidden
        if any(not retains(seg.first, seg.last) for seg in hidden):
            return True
        # every retained segment still holds a live message (a few never settled):
        # the snapshot pins settled ones beside them (its buckets all lie below
        # Raft's start), and only a new snapshot lets compaction rewrite those
        # segments. One pass over its buckets, as live_messages() above is.
        last = (1 << BUCKET_SHIFT) - 1
        return bool(hidden) and any(not retains(b << BUCKET_SHIFT, (b << BUCKET_SHIFT) + last)
                                    for b in self.snapshot_buckets)
