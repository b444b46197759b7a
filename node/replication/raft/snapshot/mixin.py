"""SnapshotMixin, the snapshot half of RaftShim (shim.py).

pysyncobj compacts its journal through a serializer we give it: the state is
written in our own format (this package: versioned, checksummed, no pickle)
by a child forked between two applies (child.py), so the raft thread never
stalls on a large state. pysyncobj's part (the last two entries and the
cluster's nodes) goes in as plain values and comes back as TCPNodes
(raft_data.py). A snapshot from the leader is received into a private file
(receiver.py) and read in full before it replaces ours (_accept_snapshot); a
follower drops snapshot chunks at or below what it has applied
(_snapshot_moves_forward). Our own snapshot is read before pysyncobj starts
(startup.py).

Snapshots hold messages' places in the log, not their bytes (issue 27 item
3): the log segments holding them are retained while the state or the latest
snapshot needs them (_retains); a leader sends them after the snapshot file
(transfer.py).

A writer that fails (issue 46): if its errno says the disk is broken, or a
probe of the data dir fails, the node stops (storage_fault.py); else the
next attempt waits (1 s, doubling to 5 min: snapshot_may_start, which
_BrokerLog asks before pysyncobj's compaction step) and one WARNING a minute
at most says so (`failed_snapshots` in the status).
"""
from __future__ import annotations

import contextlib
import logging
import os
import struct
from errno import errorcode
from io import BytesIO
from typing import TYPE_CHECKING, Any

from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as clock

from node.replication.message_store import BUCKET_SHIFT
from node.replication.raft.log import SegmentLog
from node.replication.raft.log.fs import _fsync_dir
from node.replication.raft.snapshot.child import write_in_child
from node.replication.raft.snapshot.envelope import SnapshotFormatError, snapshot_size
from node.replication.raft.snapshot.raft_data import pysyncobj_raft_data
from node.replication.raft.snapshot.reader import read_entries, read_snapshot
from node.replication.raft.snapshot.startup import OwnSnapshotMixin
from node.replication.raft.snapshot.transfer import _cut_synced, _received_entries, fits
from node.replication.raft.storage_fault import (
    child_errno,
    fail_stop,
    guarded,
    is_fatal,
    probe_dir,
    retry_delay,
    should_warn,
)

if TYPE_CHECKING:
    from node.replication.raft.shim import Owner, _BrokerLog

log = logging.getLogger("node.replication.raft.snapshot")  # the package's: log lines as before


class _NoDumpFailureLine(logging.Filter):
    """pysyncobj warns 'Failed to store full dump' at every failed snapshot; we
    say it ourselves, at most once a minute (_snapshot_failed)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Failed to store full dump"


logging.getLogger("pysyncobj.syncobj").addFilter(_NoDumpFailureLine())


class SnapshotMixin(OwnSnapshotMixin):
    """RaftShim's snapshot methods: pysyncobj's serializer, its checker and
    deserializer, and the follower's guard against an old snapshot."""

    owner: Owner
    _so: _BrokerLog | None
    _snap_pid: int | None
    _snap_started: float
    snapshots: int
    last_snapshot_seconds: float
    last_snapshot_bytes: int
    longest_fork: float
    installed_snapshots: int
    refused_snapshots: int
    damaged_snapshots: int
    data_dir: str
    failed_snapshots = 0  # writers that failed (status, metrics)
    _failures_in_row = 0
    _snapshot_retry_at = 0.0  # (pysyncobj's clock) no writer forked before
    _snapshot_warned: float | None = None
    _from_leader: bool  # _loaded is the leader's snapshot, accepted to be installed
    # log buckets of the snapshot being written (they replace snapshot_buckets
    # once it is in place)
    _pending_buckets: frozenset[int] = frozenset()
    snapshot_done_at: float = 0.0
    PIN_QUIET = 30.0  # seconds without a snapshot before one is forced to free pinned segments
    PIN_QUIET_SMALL = 3.0  # the same while the state holds few messages
    # (a state of this many snapshots in milliseconds; counted in log buckets,
    # 4,096 buckets of batched publishes were millions of messages: a
    # 10M drain forked a snapshot every 10 s from half-way on, 53k -> 37k msg/s)
    SMALL_STATE_MESSAGES = 50_000

    def _retains(self, first: int, last: int) -> bool:
        """Whether log entries first..last must stay: live messages of the state
        or of the latest snapshot are in them (the log asks, raft thread)."""
        if self.owner.retains(first, last):
            return True
        pinned = self.snapshot_buckets
        if not pinned:
            return False
        lo, hi = first >> BUCKET_SHIFT, last >> BUCKET_SHIFT
        if hi - lo > len(pinned):
            return any(lo <= b <= hi for b in pinned)
        return any(b in pinned for b in range(lo, hi + 1))

    def _snapshot_moves_forward(self, node: Any, msg: dict[str, Any]) -> bool:
        """False: a snapshot chunk at or below what we have applied (drop it
        and send the leader on from our commit index). Raft installs a
        snapshot only past the follower's state; pysyncobj installs whatever
        arrives, and a leader whose nextIndex a late reply had sent back
        resent the snapshot we had just installed: we rewound and applied the
        entries after it again, delivering their messages a second time
        (duplicates with redelivered=false, chaos follower-slow-disk and
        packet-loss, issue 16)."""
        index = msg.get("snapshot_index")
        so = self._so
        assert so is not None
        if index is None or int(index) > so.raftLastApplied:
            return True
        self.refused_snapshots += 1
        if self.refused_snapshots == 1 or self.refused_snapshots % 100 == 0:
            log.warning("dropping snapshot chunks at index %d: applied here up to %d (%d dropped)",
                        index, so.raftLastApplied, self.refused_snapshots)
        # everything up to our commit index is in the leader's log (Raft)
        so.transport().send(node, {"type": "next_node_idx", "next_node_idx": so.raftCommitIndex + 1,
                                   "reset": True, "success": False})
        return False

    def _serialize(self, tmp_path: str, raft_data: Any) -> None:
        """Start a snapshot in a forked child (copy-on-write view of the state
        between two applies), so the raft thread never stalls on a large
        state. pysyncobj renames `tmp_path` as soon as we return; we leave
        nothing there (its rename fails harmlessly) and install the child's
        file ourselves in _check_snapshot, which pysyncobj polls; only then
        does it drop the journal entries the snapshot covers."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path)
        part = self._dump_path + ".part"
        self._pending_buckets = frozenset(self.owner.snapshot_state().live)
        self._snap_started = clock()
        parent = os.getpid()
        pid = os.fork()
        if pid != 0:
            self.longest_fork = max(self.longest_fork, clock() - self._snap_started)
        if pid == 0:  # child: no threads, no loop; write, sync, leave
            write_in_child(parent, part, self.owner.snapshot_state, raft_data)
        self._snap_pid = pid

    def _check_snapshot(self) -> int:
        pid = self._snap_pid
        if pid is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        rpid, status = os.waitpid(pid, os.WNOHANG)
        if rpid == 0:
            return SERIALIZER_STATE.SERIALIZING
        self._snap_pid = None
        part = self._dump_path + ".part"
        if status != 0:
            err = child_errno(status)
            if err is not None and is_fatal(err, "write"):
                fail_stop(part, "snapshot write", OSError(err, os.strerror(err)))
            probe_dir(self.data_dir)  # stops the node if the directory itself is unusable
            # e.g. ENOSPC: that snapshot fails (pysyncobj keeps the journal);
            # its partial file must not keep the disk full
            with contextlib.suppress(OSError):
                os.unlink(part)
            self._snapshot_failed(f"errno {errorcode.get(err, err)}" if err is not None
                                  else f"wait status {status}")
            return SERIALIZER_STATE.FAILED
        with guarded(part, "rename"):
            os.replace(part, self._dump_path)
        _fsync_dir(self.data_dir)
        if self._failures_in_row:
            log.warning("snapshot written again after %d failed attempts", self._failures_in_row)
        self._failures_in_row = 0
        self._snapshot_retry_at = 0.0
        self.snapshot_buckets = self._pending_buckets  # (pysyncobj compacts the log after this)
        self.snapshot_done_at = clock()
        self.snapshots += 1
        self.last_snapshot_seconds = clock() - self._snap_started
        with guarded(self._dump_path, "stat"):
            self.last_snapshot_bytes = os.path.getsize(self._dump_path)
        return SERIALIZER_STATE.SUCCESS

    def _snapshot_failed(self, why: str) -> None:
        """A writer failed, not fatally: the next one waits (exponential
        backoff), and the warning is not repeated within a minute."""
        now = clock()
        self.failed_snapshots += 1
        self._failures_in_row += 1
        delay = retry_delay(self._failures_in_row)
        self._snapshot_retry_at = now + delay
        if should_warn(now, self._snapshot_warned):
            self._snapshot_warned = now
            log.warning("snapshot failed (%s): %d in a row, %d in all; next attempt in %.0f s", why,
                        self._failures_in_row, self.failed_snapshots, delay)

    def snapshot_may_start(self, now: float) -> bool:
        """Whether a snapshot writer may be forked now (not during a failure's backoff)."""
        return now >= self._snapshot_retry_at

    def _deserialize(self, filename: str) -> Any:
        """pysyncobj loads a snapshot: ours at start (read by load_own_snapshot)
        or the leader's just received (read by _accept_snapshot)."""
        loaded, self._loaded = self._loaded, None
        if loaded is not None and loaded[0] == filename:
            state, meta = loaded[1], loaded[2]
        else:  # not read ahead (not expected): read it now, refuse it loudly if bad
            with open(filename, "rb") as f:
                data = f.read()
            try:
                state, meta = read_snapshot(data)
            except SnapshotFormatError as exc:
                log.error("snapshot %s refused, not loaded: %s", filename, exc)
                raise
        so = self._so
        index = meta.prev[1]
        # the leader's (accepted just before), not our own at start: pysyncobj
        # starts raftLastApplied at 1, so that cannot tell them apart
        if self._from_leader:
            self._from_leader = False
            applied = int(so.raftLastApplied) if so is not None else 0
            self.installed_snapshots += 1
            log.warning("installing the leader's snapshot at index %d (applied here: %d)", index, applied)
        self.snapshot_buckets = frozenset(state.live)
        self.owner.restore_state(state, index)
        return pysyncobj_raft_data(meta)

    def _accept_snapshot(self, received: str, dump_path: str) -> bool:
        """A snapshot from the leader has arrived whole (SnapshotReceiver):
        install it only if it reads back in full and every log entry it needs
        came with it, checked; those are stored in the log first."""
        try:
            with open(received, "rb") as f:
                end = os.fstat(f.fileno()).st_size
                size = fits(snapshot_size(f.read(64)), end, "a snapshot")  # a u64 from the leader
                f.seek(0)
                data = f.read(size)
                state, meta = read_snapshot(data)
                entries = read_entries(BytesIO(data))
                if entries or f.read(1):  # (a section of 0 entries, or none from a leader before issue 27)
                    f.seek(size)
                    journal: SegmentLog = self._so._SyncObj__raftLog  # type: ignore[union-attr]
                    journal.import_records(_received_entries(f, entries, end))
            _cut_synced(received, size)  # what stays: the snapshot itself
        except (OSError, SnapshotFormatError, ValueError, struct.error, OverflowError, IndexError,
                MemoryError) as exc:
            # whatever a malformed file raises while decoded: refused, never the raft thread's end
            self.damaged_snapshots += 1
            log.error("refusing the snapshot the leader sent (%s): nothing installed, the "
                      "leader sends it again", exc)
            return False
        self._loaded = (dump_path, state, meta)
        self._from_leader = True
        return True
