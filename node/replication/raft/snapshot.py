"""Snapshots: the whole replicated state in one file, written by a forked child.

pysyncobj compacts its journal through a serializer we give it: the state is
pickled (SNAPSHOT_PROTOCOL) by a child forked between two applies, so the raft
thread never stalls on a large state; a snapshot that arrives from the leader
is read by an unpickler that builds only the broker's own types. A follower
drops snapshot chunks at or below what it has applied (_snapshot_moves_forward).
SnapshotMixin is the snapshot half of RaftShim (shim.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
import pickle
from typing import TYPE_CHECKING, Any

from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as clock

from node.replication.raft.data_dir import PRIVATE_FILE, open_private
from node.replication.raft.journal import _fsync_dir

if TYPE_CHECKING:
    from node.replication.raft.shim import Owner, _BrokerLog

log = logging.getLogger(__name__)

SNAPSHOT_PROTOCOL = pickle.HIGHEST_PROTOCOL  # protocol 5: bodies as raw bytes


_PR_SET_PDEATHSIG = 1
try:  # resolved here: no dlopen in a child forked from a threaded process
    _libc_prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (AttributeError, OSError):  # not Linux / glibc
    _libc_prctl = None


def _die_with_parent(parent: int) -> None:
    """In a forked child: be SIGKILLed when the thread that forked it (the raft
    thread, alive as long as the node) ends; exit at once if the node is
    already gone. Linux only, a no-op elsewhere."""
    if _libc_prctl is None:
        return
    _libc_prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL
    if os.getppid() != parent:
        os._exit(1)


class _SnapshotUnpickler(pickle.Unpickler):
    """A snapshot may arrive from the leader: build only the broker's own
    types and plain containers, never an arbitrary callable."""

    _ALLOWED = {
        ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
        ("collections", "deque"), ("collections", "OrderedDict"), ("collections", "defaultdict"),
        ("datetime", "datetime"), ("datetime", "date"), ("datetime", "timedelta"),
        ("datetime", "timezone"), ("decimal", "Decimal"),
        ("pysyncobj.node", "TCPNode"), ("pysyncobj.node", "Node"),
    }

    # the state's own modules: the pure model and the replicated state (no I/O in any of them)
    _MODULES = ("node.broker.", "node.replication.machine.state", "node.broker.ids",
                "node.replication.command", "node.replication.effect")
    # where a snapshot written by an older build names a type that has moved since
    _MOVED = {"node.replication.state_machine": "node.replication.machine.state"}

    def find_class(self, module: str, name: str) -> Any:
        module = self._MOVED.get(module, module)
        ours = module.startswith(self._MODULES) and not name.startswith("_")
        if (module, name) in self._ALLOWED or ours:
            obj = super().find_class(module, name)
            if ours and not isinstance(obj, type):
                raise pickle.UnpicklingError(f"snapshot refers to {module}.{name}, not a type")
            return obj
        raise pickle.UnpicklingError(f"snapshot refers to {module}.{name}: not allowed")


def load_snapshot(data: bytes) -> Any:
    return _SnapshotUnpickler(io.BytesIO(data)).load()


class SnapshotMixin:
    """RaftShim's snapshot methods: pysyncobj's serializer, its checker and
    deserializer, and the follower's guard against an old snapshot."""

    owner: Owner
    data_dir: str
    _so: _BrokerLog | None
    _dump_path: str
    _snap_pid: int | None
    _snap_started: float
    snapshots: int
    last_snapshot_seconds: float
    last_snapshot_bytes: int
    longest_fork: float
    installed_snapshots: int
    refused_snapshots: int

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
        self._snap_started = clock()
        parent = os.getpid()
        pid = os.fork()
        if pid != 0:
            self.longest_fork = max(self.longest_fork, clock() - self._snap_started)
        if pid == 0:  # child: no threads, no loop; write, sync, leave
            code = 1
            try:
                # die with the node: an orphan would keep the node's listening
                # sockets (inherited) while it writes, and the restarted node
                # could not bind its ports ("Address already in use": a SIGKILLed
                # node under load, its child writing a 1.3 GB snapshot, chaos
                # kill_during_snapshot / issue 16)
                _die_with_parent(parent)
                # every member compacts at about the same entry count: at full
                # priority three children starve the raft threads on a small
                # machine into missed heartbeats and an election
                os.nice(19)
                with os.fdopen(open_private(part), "wb") as f:  # 0600: private data dir
                    pickle.dump((self.owner.snapshot_state(), raft_data), f, protocol=SNAPSHOT_PROTOCOL)
                    f.flush()
                    os.fsync(f.fileno())
                code = 0
            finally:
                os._exit(code)
        self._snap_pid = pid

    def _check_snapshot(self) -> int:
        pid = self._snap_pid
        if pid is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        rpid, status = os.waitpid(pid, os.WNOHANG)
        if rpid == 0:
            return SERIALIZER_STATE.SERIALIZING
        self._snap_pid = None
        if status != 0:
            log.error("snapshot child failed with status %d", status)
            # e.g. ENOSPC: that snapshot fails (pysyncobj keeps the journal and
            # tries again later); its partial file must not keep the disk full
            with contextlib.suppress(OSError):
                os.unlink(self._dump_path + ".part")
            return SERIALIZER_STATE.FAILED
        os.replace(self._dump_path + ".part", self._dump_path)
        _fsync_dir(self.data_dir)
        self.snapshots += 1
        self.last_snapshot_seconds = clock() - self._snap_started
        self.last_snapshot_bytes = os.path.getsize(self._dump_path)
        return SERIALIZER_STATE.SUCCESS

    def _deserialize(self, filename: str) -> Any:
        # a snapshot from the leader: pysyncobj wrote it with the default mode
        with contextlib.suppress(OSError):
            os.chmod(filename, PRIVATE_FILE)
        with open(filename, "rb") as f:
            state, raft_data = load_snapshot(f.read())
        so = self._so
        index = int(raft_data[1][1])
        applied = int(so.raftLastApplied) if so is not None else 0
        if applied:  # from the leader, not our own dump at start
            self.installed_snapshots += 1
            log.warning("installing the leader's snapshot at index %d (applied here: %d)", index, applied)
        self.owner.restore_state(state, index)
        return raft_data

