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

Snapshots hold messages' places in the log, not their bytes (issue 27 item
3): the log segments holding them are retained while the state or the latest
snapshot needs them (_retains). A leader sends a follower the snapshot file
followed by those entries (an entries section: ENTRIES_MAGIC, version,
count, then the records as in a segment, each with its CRC); the follower
checks the snapshot and every record before it stores the records in a
segment of their own (SegmentLog.import_records) and installs the snapshot.
A member whose snapshot or retained entries are damaged or missing at start
forgets its log and state and is repaired by the leader; until it has
caught up again it grants no votes (it may have acknowledged entries it no
longer has). A node without peers refuses to start instead, saying why.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import stat
import struct
import time
from collections.abc import Callable, Iterator
from io import BytesIO
from typing import IO, TYPE_CHECKING, Any

from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as clock
from pysyncobj.node import TCPNode
from pysyncobj.serializer import Serializer

from node.replication.machine.state import BrokerState
from node.replication.message_store import BUCKET_SHIFT
from node.replication.raft.data_dir import open_private
from node.replication.raft.log import (
    REC_SIZE,
    RECORD,
    EntryHandle,
    LogDamaged,
    SegmentLog,
    record_crc,
)
from node.replication.raft.log.fs import _fsync_dir
from node.replication.snapshot_format import (
    RaftMeta,
    SnapshotFormatError,
    check_file,
    read_entries,
    read_snapshot,
    snapshot_size,
    write_snapshot,
)

if TYPE_CHECKING:
    from node.replication.raft.shim import Owner, _BrokerLog

log = logging.getLogger(__name__)

ENTRIES_MAGIC = b"MQSNPENT"
ENTRIES_VERSION = 1
_ENTRIES = struct.Struct("<8sHHQ")  # magic, version, reserved, count

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


def _close_sockets() -> None:
    """In a forked child: close every socket it inherited (listening AMQP,
    HTTP, admin and Raft ports, client links). A SIGKILLed node's child
    dies with it, but tearing down a copy of a large heap takes a while,
    and meanwhile the restarted node's bind failed ("Address already in use")
    or a connect reached the dying child's listener and was refused."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)


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
    own_damaged: Callable[[str], None]  # (why) our snapshot file fails its check: write a new one
    journal: SegmentLog  # where the entries a snapshot needs are read from
    _incoming: IO[bytes] | None = None
    _outgoing: dict[Any, _Outgoing]

    # ---- sending (leader): the snapshot file, then the log entries it needs
    def getTransmissionData(self, transmissionID: Any) -> Any:  # noqa: N802 - pysyncobj's name
        if self._Serializer__pid != 0:  # a snapshot being written
            return None
        outgoing = self.__dict__.setdefault("_outgoing", {})
        out = outgoing.get(transmissionID)
        first = out is None
        try:
            if out is None:
                out = outgoing[transmissionID] = _Outgoing(self._Serializer__fileName, self.journal)
            chunk = out.chunk(self._Serializer__transmissionBatchSize)
        except (OSError, IndexError, LogDamaged, SnapshotFormatError) as exc:
            outgoing.pop(transmissionID, None)
            if out is not None:
                out.close()
            log.error("cannot send the snapshot to %s: %s", transmissionID, exc)
            if isinstance(exc, SnapshotFormatError):
                # the follower would refuse every copy of this file, until the next
                # snapshot (minutes): write one now (chaos corruption, issue 29)
                self.own_damaged(str(exc))
            return None
        last = not chunk
        if last:
            outgoing.pop(transmissionID).close()
        return chunk, first, last

    def cancelTransmisstion(self, transmissionID: Any) -> None:  # noqa: N802 - pysyncobj's (misspelt) name
        out = self.__dict__.get("_outgoing", {}).pop(transmissionID, None)
        if out is not None:
            out.close()

    # ---- receiving (follower)

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


class _Outgoing:
    """One snapshot on its way to one follower: the file's bytes, then the
    entries section. The entries are pinned when the transmission starts (an
    EntryHandle keeps its segment readable if it is released meanwhile) and
    read, checked, one chunk at a time."""

    def __init__(self, path: str, journal: SegmentLog) -> None:
        self.f = open(path, "rb")  # noqa: SIM115 - closed by close()
        try:
            self.left = snapshot_size(self.f.read(64))
            self.f.seek(0)
            # checked before the first byte goes out: damage found by the
            # receiver only was sent again and again
            check_file(self.f, self.left)
            self.f.seek(0)
            entries = read_entries(self.f)
            self.f.seek(0)
            self.handles: list[EntryHandle | None] = [journal.handle(i) for i in entries]
        except BaseException:
            self.f.close()
            raise
        self.k = -1  # -1: the section's header is next

    def chunk(self, size: int) -> bytes:
        if self.left > 0:
            data = self.f.read(min(size, self.left))
            if not data:
                raise OSError("snapshot file cut short while being sent")
            self.left -= len(data)
            return data
        handles = self.handles
        if self.k >= len(handles):
            return b""
        parts = []
        n = 0
        if self.k < 0:
            parts.append(_ENTRIES.pack(ENTRIES_MAGIC, ENTRIES_VERSION, 0, len(handles)))
            self.k = 0
        while self.k < len(handles) and n < size:
            h = handles[self.k]
            assert h is not None
            raw = h.record()  # checked: damage is never sent
            handles[self.k] = None  # its segment may go once every pin on it has
            self.k += 1
            parts.append(raw)
            n += len(raw)
        return b"".join(parts)

    def close(self) -> None:
        self.f.close()
        self.handles = []


def _received_entries(f: IO[bytes], expect: Any) -> Iterator[bytes]:
    """The records of a received entries section, each checked (CRC, index)
    against the indices the snapshot names; SnapshotFormatError if not."""
    head = f.read(_ENTRIES.size)
    if len(head) != _ENTRIES.size:
        raise SnapshotFormatError("the log entries the snapshot needs are missing")
    magic, version, _r, count = _ENTRIES.unpack(head)
    if magic != ENTRIES_MAGIC or version != ENTRIES_VERSION or count != len(expect):
        raise SnapshotFormatError(f"entries section: {magic!r} version {version}, {count} entries "
                                  f"for {len(expect)} needed")
    for idx in expect:
        rec = f.read(REC_SIZE)
        if len(rec) != REC_SIZE:
            raise SnapshotFormatError(f"entries section cut short before entry {idx}")
        length, crc, ridx, term = RECORD.unpack(rec)
        payload = f.read(max(length - 16, 0))
        if ridx != idx or length < 16 or len(payload) != length - 16 \
                or record_crc(length, ridx, term, payload) != crc:
            raise SnapshotFormatError(f"entry {idx} of the snapshot is damaged (or out of order)")
        yield rec + payload
    if f.read(1):
        raise SnapshotFormatError("trailing bytes after the snapshot's entries")


def _cut_synced(path: str, size: int) -> None:
    """Cut `path` to `size` bytes and fsync that: the received file was synced
    with the log entries after the snapshot, so an unsynced cut could be undone
    by a power loss after the rename (which is synced) and leave raft.dump with
    trailing bytes: unreadable, the member's log reset (harness.lazyfs showed it)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


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
    _from_leader: bool  # _loaded is the leader's snapshot, accepted to be installed
    # log buckets the latest snapshot's messages are in (its segments are kept),
    # and those of the one being written (they replace them once it is in place)
    snapshot_buckets: frozenset[int] = frozenset()
    _pending_buckets: frozenset[int] = frozenset()
    # a member that forgot a damaged log at start: no votes until applied up to here
    repair_until: int = 0
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
            code = 1
            try:
                # die with the node: an orphan would keep the node's listening
                # sockets (inherited) while it writes, and the restarted node
                # could not bind its ports ("Address already in use": a SIGKILLed
                # node under load, its child writing a 1.3 GB snapshot, chaos
                # kill_during_snapshot / issue 16)
                _die_with_parent(parent)
                _close_sockets()
                # every member compacts at about the same entry count: at full
                # priority three children starve the raft threads on a small
                # machine into missed heartbeats and an election
                os.nice(19)
                with os.fdopen(open_private(part), "wb") as f:  # 0600: private data dir
                    # messages as their places in the log: no body is read or written
                    write_snapshot(f, self.owner.snapshot_state(), raft_meta(raft_data))
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
        self.snapshot_buckets = self._pending_buckets  # (pysyncobj compacts the log after this)
        self.snapshot_done_at = clock()
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
                size = snapshot_size(f.read(64))
                f.seek(0)
                data = f.read(size)
                state, meta = read_snapshot(data)
                entries = read_entries(BytesIO(data))
                if entries or f.read(1):  # (a section of 0 entries, or none from a leader before issue 27)
                    f.seek(size)
                    journal: SegmentLog = self._so._SyncObj__raftLog  # type: ignore[union-attr]
                    journal.import_records(_received_entries(f, entries))
            _cut_synced(received, size)  # what stays: the snapshot itself
        except (OSError, SnapshotFormatError) as exc:
            self.damaged_snapshots += 1
            log.error("refusing the snapshot the leader sent (%s): nothing installed, the "
                      "leader sends it again", exc)
            return False
        self._loaded = (dump_path, state, meta)
        self._from_leader = True
        return True

    def load_own_snapshot(self, journal: SegmentLog, repairable: bool) -> None:
        """Read our snapshot file before pysyncobj does, and check that the log
        holds every entry its messages are in. A file this build cannot load
        (damaged, a pickle of an older build, another format version) is never
        loaded: when the log still holds every entry from index 1 it is moved
        aside and the node starts from the log. Otherwise a member of a cluster
        forgets its log and state and is repaired by the leader (no votes
        until then); a node without peers refuses to start, saying what to do."""
        path = self._dump_path
        began = time.monotonic()
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        first = int(journal[0][1]) if len(journal) else 1
        try:
            state, meta = read_snapshot(data)
        except SnapshotFormatError as exc:
            aside = path + (".pickle" if data[:1] == b"\x80" else ".refused")
            if first <= 1:
                os.replace(path, aside)
                log.warning("snapshot %s not loaded (%s); the journal holds every entry from "
                            "index 1, so the state is rebuilt from it (the file is kept as %s)",
                            path, exc, aside)
                return
            self._forget(journal, repairable, f"snapshot {path} not loaded ({exc})", aside)
            return
        entries = read_entries(BytesIO(data))
        missing = journal.missing(entries)
        if missing:
            self._forget(journal, repairable, f"the log lacks {len(missing)} of the {len(entries)} entries "
                         f"the messages of snapshot {path} are in (from index {missing[0]}; damaged or "
                         "removed segments)", path + ".refused")
            return
        self.snapshot_buckets = frozenset(state.live)
        self._loaded = (path, state, meta)
        log.info("snapshot at index %d read in %.2f s: %d MB, %d log entries hold its messages",
                 meta.last[1], time.monotonic() - began, len(data) >> 20, len(entries))

    def _forget(self, journal: SegmentLog, repairable: bool, why: str, aside: str) -> None:
        """Our state cannot be rebuilt here. A member of a cluster starts over
        empty and is repaired by the leader; alone, refuse to start."""
        if not repairable:
            raise SnapshotFormatError(
                f"{why}, and the journal starts after entries only the snapshot held: this node "
                "cannot rebuild its state and has no peers to repair it from. Restore the data "
                "directory from a backup (docs/operations.md, Snapshots and restart).")
        os.replace(self._dump_path, aside)
        _fsync_dir(self.data_dir)
        applied = journal.getRaftCommitIndex()
        journal.reset()
        self.repair_until = max(applied, 1)
        log.error("%s: the snapshot is kept as %s, the log and state are forgotten and the "
                  "leader repairs this member (no votes from it until it has applied index %d "
                  "again)", why, aside, self.repair_until)
