"""Snapshots: the whole replicated state in one file, written by a forked child.

pysyncobj compacts its journal through a serializer we give it: the state is
written in our own format (node/replication/snapshot_format.py: versioned,
checksummed, no pickle) by a child forked between two applies, so the raft
thread never stalls on a large state. pysyncobj's part (the last two entries
and the cluster's nodes) goes in as plain values and comes back as TCPNodes
here. A snapshot from the leader is received into a private file and read in
full before it replaces ours (SnapshotReceiver); a follower drops snapshot
chunks at or below what it has applied (_snapshot_moves_forward). Our own
snapshot is read before pysyncobj starts (load_own_snapshot): pysyncobj would
log a bad one and go on from the journal's tail with an empty state.
SnapshotMixin is the snapshot half of RaftShim (shim.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as clock
from pysyncobj.node import TCPNode
from pysyncobj.serializer import Serializer

from node.replication.machine.state import BrokerState
from node.replication.raft.data_dir import open_private
from node.replication.raft.journal import _fsync_dir
from node.replication.snapshot_format import (
    RaftMeta,
    SnapshotFormatError,
    read_snapshot,
    write_snapshot,
)

if TYPE_CHECKING:
    from node.replication.raft.shim import Owner, _BrokerLog

log = logging.getLogger(__name__)

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


def raft_meta(raft_data: Any) -> RaftMeta:
    """pysyncobj's part of a snapshot, (last entry, entry before it, cluster
    as a set of nodes), as plain values."""
    last, prev, cluster = raft_data
    members = sorted(str(getattr(n, "address", n)) for n in cluster)
    return RaftMeta(_entry(last), _entry(prev), tuple(members))


def _entry(e: Any) -> tuple[bytes, int, int]:
    return bytes(e[0]), int(e[1]), int(e[2])


def pysyncobj_raft_data(meta: RaftMeta) -> tuple[Any, Any, list[Any]]:
    """The tuple pysyncobj's loader takes, rebuilt from plain values."""
    return meta.last, meta.prev, [TCPNode(a) for a in meta.members]


class SnapshotReceiver(Serializer):  # type: ignore[misc]
    """pysyncobj's Serializer, swapped in by the shim, receiving a snapshot
    from the leader: the file is created 0600 (pysyncobj's open() gave 0644
    while it arrived), synced, and read in full (checksum, format) before it
    replaces our own snapshot; a bad one is deleted and refused (the leader
    sends it again from its first chunk)."""

    accept: Callable[[str, str], bool]  # (received file, dump path) -> install it?
    _incoming: IO[bytes] | None = None

    def setTransmissionData(self, data: Any) -> bool:  # noqa: N802 - pysyncobj's name
        if not (isinstance(data, list | tuple) and len(data) == 3 and isinstance(data[0], bytes)):
            return False
        chunk, first, last = data
        path: str = self._Serializer__fileName
        tmp = path + ".1.tmp"
        if first:
            self._drop_incoming(None)
            try:
                self._incoming = os.fdopen(open_private(tmp), "wb")
            except OSError as exc:
                log.error("cannot receive the leader's snapshot: %s", exc)
                return False
        f = self._incoming
        if f is None:
            return False  # a chunk after a failure or without the first one
        try:
            f.write(chunk)
            if not last:
                return False
            f.flush()
            os.fsync(f.fileno())
            f.close()
        except OSError as exc:
            log.error("cannot receive the leader's snapshot: %s", exc)
            self._drop_incoming(tmp)
            return False
        self._incoming = None
        if not self.accept(tmp, path):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        os.replace(tmp, path)
        _fsync_dir(os.path.dirname(path) or ".")
        return True

    def _drop_incoming(self, tmp: str | None) -> None:
        f, self._incoming = self._incoming, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


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
    damaged_snapshots: int
    # a snapshot read ahead (at start, or received whole): (path, state, position)
    _loaded: tuple[str, BrokerState, RaftMeta] | None

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
                journal = self._so._SyncObj__raftLog  # type: ignore[union-attr]
                with os.fdopen(open_private(part), "wb") as f:  # 0600: private data dir
                    # bodies in the log are read back (checked) and written inline:
                    # the snapshot stays self-contained for followers and restarts
                    write_snapshot(f, self.owner.snapshot_state(), raft_meta(raft_data),
                                   lambda idx: journal.handle(idx).payload())
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
        applied = int(so.raftLastApplied) if so is not None else 0
        if applied:  # from the leader, not our own dump at start
            self.installed_snapshots += 1
            log.warning("installing the leader's snapshot at index %d (applied here: %d)", index, applied)
        self.owner.restore_state(state, index)
        return pysyncobj_raft_data(meta)

    def _accept_snapshot(self, received: str, dump_path: str) -> bool:
        """A snapshot from the leader has arrived whole (SnapshotReceiver):
        install it only if it reads back in full."""
        try:
            with open(received, "rb") as f:
                state, meta = read_snapshot(f.read())
        except (OSError, SnapshotFormatError) as exc:
            self.damaged_snapshots += 1
            log.error("refusing the snapshot the leader sent (%s): nothing installed, the "
                      "leader sends it again", exc)
            return False
        self._loaded = (dump_path, state, meta)
        return True

    def load_own_snapshot(self, journal_first_index: int) -> None:
        """Read our snapshot file before pysyncobj does. A file this build
        cannot load (damaged, a pickle of an older build, another format
        version) is never loaded: when the journal still holds every entry
        from index 1 it is moved aside and the node starts from the journal;
        otherwise the node refuses to start, saying what to do."""
        path = self._dump_path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        try:
            state, meta = read_snapshot(data)
        except SnapshotFormatError as exc:
            aside = path + (".pickle" if data[:1] == b"\x80" else ".refused")
            if journal_first_index <= 1:
                os.replace(path, aside)
                log.warning("snapshot %s not loaded (%s); the journal holds every entry from "
                            "index 1, so the state is rebuilt from it (the file is kept as %s)",
                            path, exc, aside)
                return
            raise SnapshotFormatError(
                f"snapshot {path} not loaded ({exc}), and the journal starts at index "
                f"{journal_first_index}, after entries only the snapshot held: this node cannot "
                "rebuild its state. A member of a running cluster: stop it, move its data "
                "directory aside and start it again; it rejoins and installs the leader's "
                "snapshot. A single node: restore the data directory from a backup "
                "(docs/operations.md, Snapshots and restart).") from None
        self._loaded = (path, state, meta)
