"""The pysyncobj shim: the only code that touches SyncObj and its private state.

(transport.py is its network half: pysyncobj's TCPTransport over our links.)
The shim runs the raft thread: it ticks SyncObj, flushes the journal once per
tick (group commit), releases the held AppendEntries acks after that flush,
gates elections (PreVote), and then fills one immutable RaftView that it
hands to its owner (raft_node.RaftNode), which folds it through the pure
planners (mirror.py, in_sync.py) and returns what to announce. Applying a
committed batch is the owner's too (`apply`).

Durability (pysyncobj writes its journal through mmap and never syncs):
- every node flushes (msync) its journal in an on-tick callback, which
  pysyncobj runs after the tick's appends and before the next tick's commit
  step; one flush covers every entry of the tick (group commit);
- a follower holds its AppendEntries acknowledgements (next_node_idx) until
  that flush, so the leader's matchIndex only counts entries on disk;
- the term/vote meta file is written with fsync (FsyncMetaStorer).

Failure detection, for the in-sync planner and for elections: a peer link
that breaks (reset, EOF, connect refused) marks the peer `lost` until it
links again; a follower that loses its leader's link campaigns at once
(after a short delay ranked by address, so that two survivors do not split
the vote), and grants PreVotes, instead of waiting for the election timeout.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import logging
import os
import pickle
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal, MetaStorer, ResizableFile
from pysyncobj.monotonic import (
    monotonic as clock,  # pysyncobj's clock (MONOTONIC_RAW): compare like with like
)
from pysyncobj.node import TCPNode
from pysyncobj.pickle import dumps as _pysyncobj_dumps
from pysyncobj.pickle import to_bytes as _to_bytes
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE
from pysyncobj.tcp_connection import CONNECTION_STATE

from node.broker.ids import NodeId
from node.replication.codec import CodecError, decode, decode_batch, encode, encode_batch
from node.replication.command import Batch
from node.replication.config import RaftConfig
from node.replication.transport import PeerSecurity, PeerTransport, tls_contexts
from node.replication.view import PeerView, RaftView

log = logging.getLogger(__name__)

SNAPSHOT_PROTOCOL = pickle.HIGHEST_PROTOCOL  # protocol 5: bodies as raw bytes
MIRRORED = "mq_mirrored"  # our transport message: leader -> followers
PREVOTE, PREVOTE_REPLY = "mq_prevote", "mq_prevote_reply"  # Raft thesis §9.6
LOST_REASONS = ("eof", "error", "refused")  # PeerLink.close_reason: the peer's end is gone
TERM_NOTICE = "mq_term"  # "your term is behind mine": a stale leader steps down
STARTUP_GRACE = 2.0  # seconds a restarted member listens before it may campaign


def _security(config: RaftConfig) -> PeerSecurity:
    client = server = None
    if config.tls_cert or config.tls_key or config.tls_ca:
        if not (config.tls_cert and config.tls_key and config.tls_ca):
            raise ValueError("raft TLS needs tls_cert, tls_key and tls_ca together")
        client, server = tls_contexts(config.tls_cert, config.tls_key, config.tls_ca)
    password = config.password.encode() if config.password else None
    return PeerSecurity(password=password, client_tls=client, server_tls=server)


class FsyncMetaStorer(MetaStorer):  # type: ignore[misc]
    """Term and vote must be durable before a vote is granted (Raft §5.2):
    a change of either is fsync'd (file and directory). pysyncobj also
    stores the commit index once a second; that needs no sync (a stale one
    is re-learned from the leader), and two fsyncs a second on the raft
    thread stalled it for hundreds of ms under write load."""

    _durable: tuple[Any, Any] | None = None

    def storeMeta(self, meta: dict[str, Any]) -> None:  # noqa: N802 - pysyncobj's name
        path = self.getPath()
        tmp = path + ".tmp"
        vote = (meta.get("currentTerm"), meta.get("votedForNodeId"))
        sync = vote != self._durable
        try:
            with open(tmp, "wb") as f:
                f.write(_pysyncobj_dumps(meta))
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if sync:
                raise  # a term/vote that is not durable must not be acted on
            # only the commit index (once a second from pysyncobj's tick): on a
            # full disk it was an exception that cut every such tick short;
            # skipping it is safe (a stale commit index is re-learned)
            log.warning("journal meta: commit index not stored: %s", exc)
            return
        os.replace(tmp, path)
        if sync:
            _fsync_dir(os.path.dirname(path) or ".")
            self._durable = vote


def _fallocate(fd: int, offset: int, length: int) -> None:
    """fallocate(2) mode 0. Not os.posix_fallocate: where the filesystem has no
    fallocate (FUSE, e.g. the chaos slow-disk mount) glibc emulates it by
    writing a byte into every block of the range, a FUSE round trip each;
    here that is EOPNOTSUPP and _PreallocFile stops preallocating."""
    if _libc_fallocate is None:
        os.posix_fallocate(fd, offset, length)
        return
    if _libc_fallocate(fd, 0, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


try:
    _libc_fallocate: Any = ctypes.CDLL(None, use_errno=True).fallocate64
    _libc_fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    _libc_fallocate.restype = ctypes.c_int
except (AttributeError, OSError):  # not glibc
    _libc_fallocate = None


class _PreallocFile(ResizableFile):  # type: ignore[misc]
    """The journal's mmap'd file with its growth preallocated.

    pysyncobj grows the file with ftruncate (sparse) and writes records
    through the mmap: on a full filesystem the kernel cannot back the first
    write into a hole with a block and the process dies of SIGBUS (a
    follower on a full tmpfs did exactly that, chaos experiment
    follower-disk-full). Here every write beyond the reserved end first
    reserves blocks with fallocate (in RESERVE steps), so a full disk
    is an OSError(ENOSPC) before anything is written, which _Journal.add
    turns into "entry not appended" (the ack for it is never sent). A
    filesystem without fallocate (EOPNOTSUPP) keeps the old behaviour."""

    RESERVE = 1 << 20  # a fallocate per MiB of journal
    _reserved = 0
    _no_fallocate = False

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        if end > self._reserved and not self._no_fallocate:
            f = self._ResizableFile__f
            start = self._reserved
            upto = max(end, start + self.RESERVE)
            try:
                _fallocate(f.fileno(), start, upto - start)  # may extend the file
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                self._no_fallocate = True
            else:
                self._reserved = upto
                mm = self._ResizableFile__mm
                size = os.fstat(f.fileno()).st_size
                if len(mm) < size:  # (mm.size() is the file's size, len(mm) the mapping's)
                    mm.resize(size)  # map what fallocate added (same size: no truncation)
        super().write(offset, values)


class _Journal(FileJournal):  # type: ignore[misc]
    """pysyncobj's FileJournal, whose compaction (deleteEntriesTo) rewrites
    the entries that remain one record at a time on the raft thread (a
    struct.pack, a mmap write and a header write each): after a snapshot
    under load that was 100k+ records and seconds without heartbeats. Here
    they are written as one block. Same file format.

    add() writes the record before it appends the entry to the in-memory
    list (pysyncobj does it the other way round): when the write fails (a
    full disk, see _PreallocFile) the entry is in neither, and the next add
    does not leave a hole in the file."""

    def add(self, command: Any, idx: int, term: int) -> None:
        data = struct.pack("<QQ", idx, term) + _to_bytes(command)
        size = struct.pack("<I", len(data))
        record = size + data + size
        offset: int = getattr(self, "_FileJournal__currentOffset")  # noqa: B009 - set below (mypy)
        self._FileJournal__journalFile.write(offset, record)  # OSError(ENOSPC): nothing changed
        self._FileJournal__journal.append((command, idx, term))
        self._FileJournal__currentOffset = offset + len(record)
        self._FileJournal__setLastRecordOffset(self._FileJournal__currentOffset)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 - pysyncobj's name
        keep: list[tuple[bytes, int, int]] = getattr(self, "_FileJournal__journal")[entryTo:]  # noqa: B009
        pack = struct.Struct("<IQQ").pack
        parts = []
        for command, idx, term in keep:
            data = command if isinstance(command, bytes) else bytes(command)
            size = 16 + len(data)
            tail = size.to_bytes(4, "little")
            parts.append(pack(size, idx, term))
            parts.append(data)
            parts.append(tail)
        blob = b"".join(parts)
        self._FileJournal__journal = keep
        self._FileJournal__journalFile.write(FIRST_RECORD_OFFSET, blob)
        self._FileJournal__currentOffset = FIRST_RECORD_OFFSET + len(blob)
        self._FileJournal__setLastRecordOffset(self._FileJournal__currentOffset)


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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Conf(SyncObjConf):  # type: ignore[misc]
    """Validated with the normal election timeouts, then (for a starting or
    joining node) switched to longer `quiet` ones until a leader is heard
    (pysyncobj asserts connectionTimeout >= raftMaxTimeout at validation)."""

    def __init__(self, quiet: tuple[float, float] | None, **kwargs: Any) -> None:
        self._quiet = quiet
        super().__init__(**kwargs)

    def validate(self) -> None:
        super().validate()
        if self._quiet is not None:
            self.raftMinTimeout, self.raftMaxTimeout = self._quiet


class _Transport(PeerTransport):
    """Holds AppendEntries acks until the journal is flushed; carries the
    leader's mirrored index, PreVote and term notices; drops RequestVote
    while a live leader is known (Raft thesis §4.2.3)."""

    def __init__(self, syncobj: _BrokerLog, self_node: Any, other_nodes: Any) -> None:
        self._held: list[tuple[Any, dict[str, Any]]] = []
        self._owner = syncobj._owner
        self._syncobj_ref = syncobj
        self.security = syncobj._owner.peer_security
        # node -> when its link broke (reset, EOF, refused), until it links again
        self.lost_at: dict[Any, float] = {}
        super().__init__(syncobj, self_node, other_nodes)

    def _onDisconnected(self, conn: Any) -> None:  # noqa: N802
        node = self._connToNode(conn)
        if node is not None and getattr(conn, "close_reason", "") in LOST_REASONS \
                and node not in self.lost_at:
            self.lost_at[node] = clock()
            self._owner._on_link_lost(node)
        super()._onDisconnected(conn)

    def _connectIfNecessarySingle(self, node: Any) -> bool:  # noqa: N802
        ok = bool(super()._connectIfNecessarySingle(node))
        conn = self._connections.get(node)
        if not ok and conn is not None and conn.state == CONNECTION_STATE.DISCONNECTED \
                and getattr(conn, "close_reason", "") == "refused" and node not in self.lost_at:
            self.lost_at[node] = clock()  # refused at once (no listener: the process is gone)
            self._owner._on_link_lost(node)
        return ok

    def _onNodeConnected(self, node: Any) -> None:  # noqa: N802
        self.lost_at.pop(node, None)
        super()._onNodeConnected(node)

    def send(self, node: Any, message: Any) -> bool:
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "next_node_idx":
            if message.get("reset") and not message.get("success"):
                # pysyncobj answers a mismatch with "my last index + 1" or "one
                # before yours"; under load, answers to older in-flight appends
                # keep resetting the leader's nextIndex up again and the walk
                # back never ends. Everything up to our commit index is in the
                # leader's log (Raft), so send it straight there.
                floor = self._syncobj_ref.raftCommitIndex + 1
                if message["next_node_idx"] > floor:
                    message = dict(message, next_node_idx=floor)
            self._held.append((node, message))  # all of them, to keep their order
            return True
        if kind == "request_vote" and self._owner._campaign_transfer:
            message = dict(message, transfer=True)  # asked for by the leader (TimeoutNow)
        return bool(super().send(node, message))

    def release_held(self) -> None:
        held, self._held = self._held, []
        for node, message in held:
            super().send(node, message)

    def send_raw(self, node: Any, message: dict[str, Any]) -> None:
        super().send(node, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        owner = self._owner
        kind = message.get("type")
        if kind == MIRRORED:
            owner._on_mirrored(int(message["index"]))
            return
        if kind == PREVOTE:
            owner._on_prevote(node, message)
            return
        if kind == PREVOTE_REPLY:
            owner._on_prevote_reply(node, message)
            return
        if kind == TERM_NOTICE:
            owner._on_term_notice(node, message)
            return
        if kind == "request_vote" and not message.get("transfer") and owner._leader_alive():
            owner.ignored_votes += 1
            return
        if kind == "append_entries":
            if "transmission" in message:
                return  # pysyncobj's pickled chunking: never sent by us, never unpickled
            if not owner._on_append_term(node, message):
                return
            if "serialized" in message and not owner._snapshot_moves_forward(node, message):
                return
            if message.get("entries") and "prevLogIdx" in message:
                message = owner._trim_append(node, message)
                if message is None:
                    return
            try:
                super()._onMessageReceived(node, message)
            except OSError as exc:
                # the journal could not take the entries (a full disk:
                # _PreallocFile): the ones before the failing one are in the
                # log, no ack is sent for this append, the leader resends and
                # its in-sync planner marks us lagging (I5) until space is back
                owner._on_journal_error("append", exc)
            return
        super()._onMessageReceived(node, message)


class _BrokerLog(SyncObj):  # type: ignore[misc]
    """SyncObj whose entries are codec-encoded Batches (no pickle in the log
    or on the wire) and whose AppendEntries go out flow-controlled."""

    def __init__(self, owner: RaftShim, self_addr: str, others: list[str], conf: SyncObjConf) -> None:
        self._owner = owner
        self._flow: dict[Any, _Flow] = {}
        self._blobs: dict[tuple[int, int, int], bytes] = {}
        super().__init__(self_addr, others, conf, transportClass=_Transport)
        journal = self._SyncObj__raftLog
        if isinstance(journal, FileJournal):
            journal.__class__ = _Journal  # created by pysyncobj; same state, faster compaction
            journal._FileJournal__journalFile.__class__ = _PreallocFile  # no SIGBUS on a full disk
            old = journal._FileJournal__metaStorer
            journal._FileJournal__metaStorer = FsyncMetaStorer(old.getPath())

    def propose(self, batch: Batch, callback: Callable[[Any, int], None]) -> None:
        self._applyCommand(encode_batch(batch), callback, _COMMAND_TYPE.REGULAR)

    def change_member(self, address: str, add: bool, callback: Callable[[Any, int], None]) -> None:
        self._applyCommand(encode(["add" if add else "rem", address]), callback, _COMMAND_TYPE.MEMBERSHIP)

    # ---- pysyncobj's private hooks, replaced (name-mangled on purpose)
    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:  # noqa: N802
        kind = command[0]
        if kind == _COMMAND_TYPE.REGULAR:
            # after the type byte, no copy; pysyncobj counts it applied after we return
            return self._owner.owner.apply(decode_batch(command, 1), self.raftLastApplied + 1)
        if kind == _COMMAND_TYPE.VERSION:
            log.error("ignoring a code-version entry (pysyncobj pickle; mirrorq never writes one)")
            return None
        return SyncObj._SyncObj__doApplyCommand(self, command)  # no-op and membership

    def _SyncObj__parseChangeClusterRequest(self, command: bytes) -> list[Any] | None:  # noqa: N802
        if command[0] != _COMMAND_TYPE.MEMBERSHIP:
            return None
        req = decode(command, 1)
        if not (isinstance(req, list) and len(req) == 2 and req[0] in ("add", "rem")
                and isinstance(req[1], str)):
            raise CodecError("malformed membership entry")
        return [req[0], req[1], TCPNode(req[1])]

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802
        self._replicate()

    def _replicate(self) -> None:
        """AppendEntries to every connected follower: entries in chunks of at
        most append_chunk_bytes while fewer than follower_window_bytes are
        unacknowledged (the next chunk after its reply), else a heartbeat.
        A range of entries is encoded once for all followers."""
        conf = self._SyncObj__conf
        cfg = self._owner.config
        now = clock()
        period = conf.appendEntriesPeriod
        self._SyncObj__newAppendEntriesTime = now + period
        journal = self._SyncObj__raftLog
        first, last = journal[0][1], journal[-1][1]
        term, commit = self._SyncObj__raftCurrentTerm, self._SyncObj__raftCommitIndex
        next_index, match = self._SyncObj__raftNextIndex, self._SyncObj__raftMatchIndex
        connected = self._SyncObj__connectedNodes
        transport: _Transport = self._SyncObj__transport
        window, chunk = cfg.follower_window_bytes, cfg.append_chunk_bytes
        for node in list(self._SyncObj__otherNodes):
            if node not in connected:
                self._SyncObj__serializer.cancelTransmisstion(node)
                self._flow.pop(node, None)
                continue
            flow = self._flow.get(node)
            if flow is None:
                flow = self._flow[node] = _Flow()
            nxt = next_index[node]
            flow.settle(match.get(node, 0), nxt)
            if nxt <= first:  # behind the snapshot: send it, in bounded chunks
                self._send_snapshot(node, flow, transport, term, commit, window, journal)
                flow.last_sent = now
                continue
            if flow.snapshot_index is not None:
                # the follower refused it (it has applied past it) or nextIndex moved on:
                # the next snapshot for it must start from its first chunk
                self._SyncObj__serializer.cancelTransmisstion(node)
                flow.snapshot_index = None
            sent = False
            while nxt <= last and flow.inflight < window:
                budget = min(chunk, window - flow.inflight)
                i = nxt - first
                entries = [journal[i]]
                size = len(entries[0][0])
                i += 1
                while i <= last - first and size + len(journal[i][0]) <= budget:
                    entries.append(journal[i])
                    size += len(journal[i][0])
                    i += 1
                prev = journal[nxt - 1 - first]
                header = {"type": "append_entries", "term": term, "commit_index": commit,
                          "prevLogIdx": prev[1], "prevLogTerm": prev[2]}
                if not transport.send_append(node, header, self._blob(entries)):
                    break
                flow.sent(entries[-1][1], size)
                nxt = next_index[node] = entries[-1][1] + 1
                sent = True
            # an empty AppendEntries: the heartbeat, and the news of a new
            # commit index at once (a follower's consumers wait on it)
            if not sent and (commit > flow.commit_sent or now - flow.last_sent >= period / 2):
                prev = journal[nxt - 1 - first]
                transport.send_append(node, {"type": "append_entries", "term": term, "commit_index": commit,
                                             "prevLogIdx": prev[1], "prevLogTerm": prev[2]}, _NO_ENTRIES)
                sent = True
            if sent:
                flow.last_sent = now
                flow.commit_sent = commit

    def _blob(self, entries: list[tuple[bytes, int, int]]) -> bytes:
        # (first index, last index, last term) names the range: Raft's log
        # matching makes entries up to an (index, term) identical everywhere
        key = (entries[0][1], entries[-1][1], entries[-1][2])
        blob = self._blobs.get(key)
        if blob is None:
            if len(self._blobs) >= 8:
                self._blobs.pop(next(iter(self._blobs)))
            blob = self._blobs[key] = encode(entries)
            self._owner.encoded_appends += 1
        return blob

    def _send_snapshot(self, node: Any, flow: _Flow, transport: _Transport, term: int, commit: int,
                       window: int, journal: Any) -> None:
        serializer = self._SyncObj__serializer
        while transport.unsent_bytes(node) < window:
            data = serializer.getTransmissionData(node)
            if data and data[1]:  # first chunk: the dump it reads is the one the journal starts at
                flow.snapshot_index = int(journal[1][1] if len(journal) > 1 else journal[0][1])
            # every chunk names the index, so that a follower that has applied past
            # it drops it instead of rewinding its state (_snapshot_moves_forward)
            transport.send(node, {"type": "append_entries", "term": term, "commit_index": commit,
                                  "serialized": None if not data else list(data),
                                  "snapshot_index": flow.snapshot_index})
            if not data:
                return
            if data[2]:  # last chunk
                if flow.snapshot_index is not None:
                    self._SyncObj__raftNextIndex[node] = flow.snapshot_index + 1
                flow.snapshot_index = None
                return

    # pysyncobj keeps these private; we read them, never write them.
    def journal_flush(self) -> None:
        self._SyncObj__raftLog.flush()

    def last_log_index(self) -> int:
        log_ = self._SyncObj__raftLog
        return int(log_[-1][1]) if len(log_) else 0

    def wake(self) -> None:
        """Make the coming poll return at once."""
        self._SyncObj__pipeNotifier.notify()

    def transport(self) -> _Transport:
        return self._SyncObj__transport  # type: ignore[no-any-return]

    def match_index(self) -> dict[Any, int]:
        return self._SyncObj__raftMatchIndex  # type: ignore[no-any-return]

    def last_response(self) -> dict[Any, float]:
        return self._SyncObj__lastResponseTime  # type: ignore[no-any-return]

    def advance_commit(self, upto: int, leader_commit: int) -> None:
        """What pysyncobj does with an AppendEntries' commit index, for one we
        answer ourselves: entries up to `upto` match the leader's."""
        self._SyncObj__leaderCommitIndex = leader_commit
        if upto > self.raftCommitIndex:
            self._SyncObj__raftCommitIndex = upto
            self._SyncObj__raftLog.setRaftCommitIndex(upto)


_NO_ENTRIES = encode([])


class _Flow:
    """Entry bytes sent to one follower and not yet acknowledged."""

    __slots__ = ("chunks", "inflight", "last_sent", "commit_sent", "snapshot_index")

    def __init__(self) -> None:
        self.chunks: deque[tuple[int, int]] = deque()  # (last index of a chunk, its bytes)
        self.inflight = 0
        self.last_sent = 0.0
        self.commit_sent = 0  # the commit index the follower was last told
        self.snapshot_index: int | None = None  # a snapshot transmission under way: its index

    def sent(self, last_index: int, size: int) -> None:
        self.chunks.append((last_index, size))
        self.inflight += size

    def settle(self, match: int, next_index: int) -> None:
        chunks = self.chunks
        while chunks and chunks[0][0] <= match:
            self.inflight -= chunks.popleft()[1]
        if chunks and chunks[-1][0] >= next_index:  # nextIndex went back: resent from there
            chunks.clear()
            self.inflight = 0


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


class Owner(Protocol):
    """What the shim calls back, on the raft thread."""

    def apply(self, batch: Batch, index: int) -> str: ...
    def on_tick(self, view: RaftView) -> int | None: ...  # returns a mirrored index to announce
    def on_result(self, seq: int, ok: bool, why: str) -> None: ...
    def membership(self) -> tuple[tuple[tuple[NodeId, str], ...], tuple[NodeId, ...], tuple[NodeId, ...]]: ...
    def snapshot_state(self) -> Any: ...
    def restore_state(self, state: Any, index: int) -> None: ...


Done = Callable[[bool, str], None]  # (succeeded, reason), on the raft thread


class RaftShim:
    def __init__(self, owner: Owner, node_id: NodeId, data_dir: str, config: RaftConfig) -> None:
        self.owner = owner
        self.node_id = node_id
        self.data_dir = data_dir
        self.config = config
        self.address = f"{config.host}:{config.port}"
        self.peer_security = _security(config)
        self._so: _BrokerLog | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tasks: deque[Callable[[], None]] = deque()  # run on the raft thread
        self._restore_timeouts: tuple[float, float] | None = None
        self._dump_path = os.path.join(data_dir, "raft.dump")
        self._snap_pid: int | None = None
        self._snap_started = 0.0
        self._flushed_index = 0
        self._mirrored = 0  # follower: as told by the leader
        self.leader_contact = 0.0  # last AppendEntries from the leader (raft thread writes)
        self._leader_lost = False  # the current leader's link broke: campaign soon
        self._contact_node: Any = None
        self._campaign_transfer = False  # this campaign was asked for (TimeoutNow)
        self._prevote_term = 0
        self._prevote_grants: set[Any] = set()
        self._prevote_won = False
        self._term_noticed: dict[Any, float] = {}
        self._last_forced_compaction = 0.0
        self._iteration_began = 0.0
        self._fail_names = {v: k.lower() for k, v in vars(FAIL_REASON).items()
                            if k.isupper() and k != "SUCCESS"}
        # statistics (Status)
        self.snapshots = 0
        self.last_snapshot_seconds = 0.0
        self.last_snapshot_bytes = 0
        self.flushes = 0
        self.deferred_elections = 0
        self.prevote_rounds = 0
        self.ignored_votes = 0
        self.encoded_appends = 0
        self.longest_stall = 0.0  # longest raft-thread loop iteration (s), idle poll included
        self.forced_compactions = 0
        self.longest_leader_gap = 0.0  # follower: longest silence between AppendEntries (s)
        self.fast_elections = 0  # campaigns started early because the leader's link broke
        self.longest_flush = 0.0  # longest journal flush (s)
        self.longest_owner_tick = 0.0  # longest on_tick of the owner (planners, hand-over)
        self.longest_fork = 0.0  # longest snapshot fork (s), on the raft thread
        self.journal_write_errors = 0  # appends the journal refused (OSError, e.g. ENOSPC)
        self.installed_snapshots = 0  # snapshots installed from the leader
        self.refused_snapshots = 0  # snapshot chunks dropped: we had applied past them
        self.journal_flush_errors = 0  # failed journal flushes (msync)
        self.last_journal_error = ""
        self._journal_error_logged = 0.0

    # ---------------------------------------------------------------- life
    def start(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        c = self.config
        # a node that campaigns before it has heard the leader deposes a healthy
        # one: a joining node stays quiet until a leader contacts it; a
        # (re)starting member waits a grace period first (a full-cluster
        # restart elects after it)
        quiet: tuple[float, float] | None = None
        if c.join:
            quiet = (3600.0, 3601.0)
        elif c.peers:
            quiet = (c.election_min + STARTUP_GRACE, c.election_max + STARTUP_GRACE)
        if quiet is not None:
            self._restore_timeouts = (c.election_min, c.election_max)
        conf = _Conf(
            quiet,
            autoTick=False,
            appendEntriesUseBatch=False,  # send at once and wake the poller: latency
            dynamicMembershipChange=True,
            journalFile=os.path.join(self.data_dir, "raft.journal"),
            fullDumpFile=self._dump_path,  # never a journal without a dump
            serializer=self._serialize,
            deserializer=self._deserialize,
            serializeChecker=self._check_snapshot,
            appendEntriesBatchSizeBytes=c.append_entries_batch_bytes,
            raftMinTimeout=c.election_min,
            raftMaxTimeout=c.election_max,
            appendEntriesPeriod=min(0.1, c.election_min / 4),
            leaderFallbackTimeout=c.leader_fallback,
            logCompactionMinEntries=c.compaction_min_entries,
            logCompactionMinTime=c.compaction_min_time,
            password=None,  # links are authenticated by our transport, not Fernet per message
            commandsQueueSize=0,
            # reconnect to a restarted peer well within its startup grace
            connectionRetryTime=0.5,
            # peers are dialled by name, and a name's address changes (a
            # Kubernetes pod gets a new IP on every restart): pysyncobj caches
            # a lookup 600 s (a failed one 30 s), so a restarted member stayed
            # unreachable for minutes (issue 13, found on a real StatefulSet)
            dnsCacheTime=c.dns_cache_seconds,
            dnsFailCacheTime=min(1.0, c.dns_cache_seconds),
            # where the Raft port listens (transport._createServer); None: every address
            bindAddress=f"{c.bind_host}:{c.port}" if c.bind_host else None,
        )
        self._so = _BrokerLog(self, self.address, list(c.peers.values()), conf)
        self._so.addOnTickCallback(self._on_tick)
        self._thread = threading.Thread(target=self._run, name=f"raft-{self.node_id}", daemon=True)
        self._thread.start()
        if os.environ.get("MIRRORQ_STALL_TRACE"):
            threading.Thread(target=self._trace_stalls, name="stall-trace", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._so is not None:
            self._so.destroy()  # flushes and closes the journal

    # ------------------------------------------- requests (any thread)
    def propose(self, batch: Batch, done: Done) -> None:
        so = self._so
        assert so is not None
        names = self._fail_names

        def callback(res: Any, err: int) -> None:
            if err == FAIL_REASON.SUCCESS:
                done(True, str(res))
            else:
                done(False, names.get(err, str(err)))

        so.propose(batch, callback)

    def change_member(self, address: str, add: bool, done: Done) -> None:
        so = self._so
        assert so is not None
        names = self._fail_names

        def callback(_res: Any, err: int) -> None:
            done(err == FAIL_REASON.SUCCESS, names.get(err, "success"))

        so.change_member(address, add, callback)

    def transfer(self, address: str | None, done: Done) -> None:
        """TimeoutNow to `address` (or the most caught-up follower); `done`
        says whether it was sent ("request_denied": the target is not caught up)."""
        so = self._so
        assert so is not None
        names = self._fail_names

        def callback(_res: Any, err: int) -> None:
            done(err == FAIL_REASON.SUCCESS, names.get(err, "success"))

        self._tasks.append(lambda: so.transferLeadership(address, callback=callback))

    # ------------------------------------------------ queries (any thread)
    def fail_reasons(self) -> list[str]:
        """The names a failed proposal reports (pysyncobj's FAIL_REASON, lower case)."""
        return list(self._fail_names.values())

    def ready(self) -> bool:
        so = self._so
        return so is not None and so.isReady() and so._getLeader() is not None

    def catch_up_progress(self) -> tuple[int, int]:
        """What grows while this node catches up with its leader: its last log
        index and the bytes of a snapshot being received (pysyncobj writes it
        to raft.dump.1.tmp). Any thread: two reads, no Raft state changed."""
        so = self._so
        received = 0
        with contextlib.suppress(OSError):
            received = os.path.getsize(os.path.join(self.data_dir, "raft.dump.1.tmp"))
        return (0 if so is None else so.last_log_index(), received)

    def is_leader(self) -> bool:
        so = self._so
        return so is not None and bool(so._isLeader())

    def leader_address(self) -> str | None:
        so = self._so
        leader = so._getLeader() if so is not None else None
        return None if leader is None else str(leader)

    def other_addresses(self) -> list[str]:
        so = self._so
        return [] if so is None else [n.address for n in list(so.otherNodes)]

    def answered_since(self, address: str, since: float) -> bool:
        """The leader heard from `address` after `since` (pysyncobj's clock), or
        it is no longer a Raft member."""
        so = self._so
        assert so is not None
        node = next((n for n in list(so.otherNodes) if n.address == address), None)
        return node is None or so.last_response().get(node, 0.0) > since

    def append_period(self) -> float:
        so = self._so
        assert so is not None
        return float(so._getConf().appendEntriesPeriod)

    def has_quorum(self) -> bool:
        so = self._so
        return so is not None and self._has_quorum(so)

    def peer_rejects(self) -> int:
        so = self._so
        return 0 if so is None else int(so.transport().peer_rejects)

    def raft_status(self) -> dict[str, Any]:
        so = self._so
        assert so is not None
        st = so.getStatus()
        return {"role": {0: "follower", 1: "candidate", 2: "leader"}.get(st.get("state"), str(st.get("state"))),
                "leader": None if st.get("leader") is None else str(st.get("leader")),
                "term": st.get("raft_term"), "commit_index": st.get("commit_idx"),
                "last_applied": st.get("last_applied"), "log_len": st.get("log_len")}

    def _trace_stalls(self) -> None:
        """Diagnostics (MIRRORQ_STALL_TRACE=1): log the raft thread's stack
        whenever one loop iteration has run for more than 200 ms."""
        import sys
        import traceback
        seen = 0.0
        while not self._stop.wait(0.05):
            began = self._iteration_began
            if began and clock() - began > 0.2 and began != seen and self._thread is not None:
                seen = began
                frame = sys._current_frames().get(self._thread.ident or 0)
                if frame is not None:
                    log.warning("raft thread busy %.0f ms in:\n%s", (clock() - began) * 1000,
                                "".join(traceback.format_stack(frame)[-12:]))

    def _run(self) -> None:
        so = self._so
        assert so is not None
        # pysyncobj checks a follower's election deadline at the start of a tick,
        # before it reads the socket: after this thread was held up (a long apply,
        # the GIL on 2 busy cores, a snapshot fork) it would campaign although
        # the leader's heartbeats sit unread in the buffer, and depose a healthy
        # leader. After such a gap the deadline moves past this tick's read.
        stall = max(self.config.election_min / 2, 4 * self.config.idle_tick)
        prev = clock()
        while not self._stop.is_set():
            now = clock()
            self._iteration_began = now
            gap = now - prev
            if gap > self.longest_stall:
                self.longest_stall = gap
            if gap > stall + self.config.idle_tick:
                self._defer_election(so, now)
            prev = now
            try:
                self._gate_election(so, now)
                so.doTick(self.config.idle_tick)
                self._campaign_transfer = False
            except Exception:  # noqa: BLE001 - a bad tick must not kill replication
                log.exception("raft tick failed")
                time.sleep(0.05)

    # ------------------------------------------------------ the tick (raft thread)
    def _on_tick(self) -> None:
        """pysyncobj's on-tick callback: after the tick's appends, before the
        next tick's commit step."""
        so = self._so
        assert so is not None
        while self._tasks:  # pysyncobj calls that touch Raft state directly
            self._tasks.popleft()()
        last = so.last_log_index()
        transport = so.transport()
        flushed = True
        if last != self._flushed_index:
            t0 = clock()
            try:
                so.journal_flush()  # group commit: one msync for the tick's entries
            except OSError as exc:
                # not on disk: keep the acks held (the leader does not count these
                # entries for us and its planner marks us lagging); retried next tick
                flushed = False
                self.journal_flush_errors += 1
                self._on_journal_error("flush", exc)
            else:
                self.longest_flush = max(self.longest_flush, clock() - t0)
                self._flushed_index = last
                self.flushes += 1
        if flushed:
            transport.release_held()  # acks only after the flush above
        if self._restore_timeouts is not None and so._getLeader() is not None:
            conf = so._getConf()
            conf.raftMinTimeout, conf.raftMaxTimeout = self._restore_timeouts
            self._restore_timeouts = None
        if not so.otherNodes and so.raftCommitIndex < last:
            so.wake()  # alone, nothing else would wake us to commit
        t0 = clock()
        announce = self.owner.on_tick(self._view(so))
        self.longest_owner_tick = max(self.longest_owner_tick, clock() - t0)
        if announce is not None:
            for node in list(so.otherNodes):
                transport.send_raw(node, {"type": MIRRORED, "index": announce})
        self._check_journal_bytes(so)

    def _view(self, so: _BrokerLog) -> RaftView:
        now = clock()
        members, in_sync, draining = self.owner.membership()
        by_addr = {a: m for m, a in members}
        match, replies = so.match_index(), so.last_response()
        lost = so.transport().lost_at
        connected = so._SyncObj__connectedNodes
        peers = tuple(PeerView(n.address, by_addr.get(n.address), match.get(n, 0), replies.get(n, now),
                               n in connected, n in lost)
                      for n in so.otherNodes)
        leader = bool(so._isLeader())
        return RaftView(now=now, me=self.node_id, leader=leader,
                        ready=bool(so.isReady()) and so._getLeader() is not None,
                        term=int(so.raftCurrentTerm), commit_index=int(so.raftCommitIndex),
                        last_applied=int(so.raftLastApplied), flushed_index=self._flushed_index,
                        told_mirrored=self._mirrored, members=members, in_sync=in_sync,
                        draining=draining, peers=peers)

    def _on_link_lost(self, node: Any) -> None:
        """A peer's link broke (raft thread). If it was our leader, campaign
        soon instead of after the election timeout: the survivors rank
        themselves by address (the first goes after ~20 ms, the next 150 ms
        later) so that they do not split the vote; PreVote still decides."""
        so = self._so
        if so is None or so._SyncObj__raftState != _RAFT_STATE.FOLLOWER or so._getLeader() != node:  # type: ignore[attr-defined]
            return
        self.leader_contact = 0.0
        self._contact_node = None
        self._leader_lost = True
        survivors = sorted([n.address for n in list(so.otherNodes) if n != node] + [self.address])
        rank = survivors.index(self.address)
        deadline = clock() + 0.02 + 0.15 * rank + random.uniform(0.0, 0.03)
        if so._SyncObj__raftElectionDeadline > deadline:  # type: ignore[attr-defined]
            so._SyncObj__raftElectionDeadline = deadline  # type: ignore[attr-defined]
            self.fast_elections += 1

    # ---------------------------------------------- elections (raft thread)
    def _gate_election(self, so: _BrokerLog, now: float) -> None:
        """PreVote (Raft thesis §9.6): before pysyncobj may start an election
        (bump its term and ask for votes), ask the others whether they would
        vote: only with a majority's yes does the election go ahead. A member
        that is behind, slow or cut off thus never raises its term and
        never disrupts a healthy leader."""
        if so._SyncObj__raftState == _RAFT_STATE.LEADER or not so.otherNodes:  # type: ignore[attr-defined]
            return
        if so._SyncObj__transferInProgress:  # type: ignore[attr-defined]
            self._campaign_transfer = True  # the leader asked: no pre-vote
            return
        if so._SyncObj__raftElectionDeadline > now + 2 * self.config.idle_tick:  # type: ignore[attr-defined]
            return
        if self._prevote_won:
            self._prevote_won = False
            so._SyncObj__raftElectionDeadline = 0  # type: ignore[attr-defined]
            return
        c = self.config
        # the next round: soon while the leader's link is known broken
        lo, hi = (0.15, 0.3) if self._leader_lost else (c.election_min, c.election_max)
        so._SyncObj__raftElectionDeadline = now + random.uniform(lo, hi)  # type: ignore[attr-defined]
        self._prevote_term = so.raftCurrentTerm + 1
        self._prevote_grants = set()
        self.prevote_rounds += 1
        last_index, last_term = self._log_tail(so)
        transport = so.transport()
        for node in list(so.otherNodes):
            transport.send_raw(node, {"type": PREVOTE, "term": self._prevote_term,
                                      "last_log_index": last_index, "last_log_term": last_term})

    @staticmethod
    def _log_tail(so: _BrokerLog) -> tuple[int, int]:
        journal = so._SyncObj__raftLog
        return (int(journal[-1][1]), int(journal[-1][2])) if len(journal) else (0, 0)

    def _leader_alive(self) -> bool:
        """A live leader is known: we lead and a majority answered within the
        minimum election timeout, or we follow one heard from within it."""
        so = self._so
        assert so is not None
        now = clock()
        bound = self.config.election_min
        if so._isLeader():
            fresh = sum(1 for t in list(so.last_response().values()) if now - t < bound)
            return fresh + 1 > (len(so.otherNodes) + 1) / 2
        return so._getLeader() is not None and now - self.leader_contact < bound

    def _on_prevote(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._so
        assert so is not None
        term = int(msg.get("term", 0))
        theirs = (int(msg.get("last_log_term", 0)), int(msg.get("last_log_index", 0)))
        mine_index, mine_term = self._log_tail(so)
        granted = term > so.raftCurrentTerm and theirs >= (mine_term, mine_index) and not self._leader_alive()
        so.transport().send_raw(node, {"type": PREVOTE_REPLY, "term": term, "granted": granted})

    def _on_prevote_reply(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._so
        assert so is not None
        if not msg.get("granted") or msg.get("term") != self._prevote_term \
                or so._SyncObj__raftState == _RAFT_STATE.LEADER:  # type: ignore[attr-defined]
            return
        self._prevote_grants.add(node)
        if len(self._prevote_grants) + 1 > (len(so.otherNodes) + 1) / 2:
            self._prevote_won = True
            so._SyncObj__raftElectionDeadline = 0  # type: ignore[attr-defined]

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

    def _on_append_term(self, node: Any, msg: dict[str, Any]) -> bool:
        """False: an AppendEntries from a stale term; tell its sender (at most
        once a second) so that a leader that missed an election steps down."""
        so = self._so
        assert so is not None
        term = int(msg.get("term", 0))
        now = clock()
        if term >= so.raftCurrentTerm:
            if node is self._contact_node and now - self.leader_contact > self.longest_leader_gap:
                self.longest_leader_gap = now - self.leader_contact  # heartbeats late or starved
            self._contact_node = node
            self.leader_contact = now
            self._leader_lost = False
            return True
        if now - self._term_noticed.get(node, 0.0) > 1.0:
            self._term_noticed[node] = now
            so.transport().send_raw(node, {"type": TERM_NOTICE, "term": so.raftCurrentTerm})
        return False

    def _on_term_notice(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._so
        assert so is not None
        term = int(msg.get("term", 0))
        if term > so.raftCurrentTerm and so._isLeader():
            log.warning("stepping down: a member is at term %d, above ours (%d)", term, so.raftCurrentTerm)
            so._SyncObj__setCurrentTerm(term, None)  # type: ignore[attr-defined]
            so._SyncObj__setState(_RAFT_STATE.FOLLOWER)  # type: ignore[attr-defined]
            so._SyncObj__raftLeader = None  # type: ignore[attr-defined]
            c = self.config
            so._SyncObj__raftElectionDeadline = clock() + random.uniform(c.election_min, c.election_max)  # type: ignore[attr-defined]

    def _defer_election(self, so: _BrokerLog, now: float) -> None:
        if so._SyncObj__raftState != _RAFT_STATE.FOLLOWER:  # type: ignore[attr-defined]
            return
        deadline = now + self.config.election_min
        if so._SyncObj__raftElectionDeadline < deadline:  # type: ignore[attr-defined]
            so._SyncObj__raftElectionDeadline = deadline  # type: ignore[attr-defined]
            self.deferred_elections += 1

    def _trim_append(self, node: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """Raft: append the entries not already in the log; truncate only on a
        conflict (same index, other term). pysyncobj truncates after
        prevLogIdx on every append, so a retransmission briefly shrinks the
        log below what this follower has acknowledged. Drop the entries we
        hold identically; if that is all of them, acknowledge without
        touching the log (the ack is held until the journal flush)."""
        so = self._so
        assert so is not None
        journal = so._SyncObj__raftLog
        if not len(journal):
            return message
        first, last = journal[0][1], journal[-1][1]
        entries = message["entries"]
        same = 0
        for entry in entries:
            idx = entry[1]
            if idx < first or idx > last or journal[idx - first][2] != entry[2]:
                break
            same += 1
        if same == 0:
            return message
        if same == len(entries):
            if message.get("term") != so.raftCurrentTerm or so._getLeader() != node:
                return message  # term or leader news: let pysyncobj handle it
            so.transport().send(node, {"type": "next_node_idx", "next_node_idx": entries[-1][1] + 1,
                                       "reset": False, "success": True})
            # the commit index it carries is news, though: dropping it left
            # this follower a heartbeat (100 ms) behind on what it may apply
            leader_commit = int(message.get("commit_index") or 0)
            so.advance_commit(min(leader_commit, entries[-1][1]), leader_commit)
            # and it is the leader's heartbeat: pysyncobj never sees it, so
            # push the election deadline as it would
            c = self.config
            so._SyncObj__raftElectionDeadline = clock() + random.uniform(c.election_min, c.election_max)  # type: ignore[attr-defined]
            return None
        prev = entries[same - 1]
        trimmed = dict(message)
        trimmed["prevLogIdx"], trimmed["prevLogTerm"] = prev[1], prev[2]
        trimmed["entries"] = entries[same:]
        return trimmed

    def _on_journal_error(self, what: str, exc: OSError) -> None:
        """A journal write or flush failed (raft thread): count it, log at most
        every 5 s (a full disk fails every append the leader resends)."""
        if what != "flush":
            self.journal_write_errors += 1
        self.last_journal_error = f"{what}: {exc}"
        now = clock()
        if now - self._journal_error_logged >= 5.0:
            self._journal_error_logged = now
            log.error("journal %s failed (%d writes, %d flushes failed so far): %s", what,
                      self.journal_write_errors, self.journal_flush_errors, exc)

    def _on_mirrored(self, index: int) -> None:
        if index > self._mirrored:
            self._mirrored = index

    def _check_journal_bytes(self, so: _BrokerLog) -> None:
        c = self.config
        now = clock()
        if now - self._last_forced_compaction < c.compaction_min_gap:
            return
        used = getattr(so._SyncObj__raftLog, "_FileJournal__currentOffset", 0)
        if used > c.compaction_max_bytes and self._snap_pid is None:
            self._last_forced_compaction = now
            self.forced_compactions += 1
            so.forceLogCompaction()

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
                with open(part, "wb") as f:
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

    def _has_quorum(self, so: _BrokerLog) -> bool:
        """Raft's view, not TCP's (a link cut by a firewall stays 'connected'
        for seconds, and pysyncobj starts no election while it is connected
        to nobody, so a cut-off follower keeps its old leader): a leader has
        heard from a majority within the fallback bound, a follower has heard
        from its leader within twice the election timeout."""
        now = clock()
        if so._isLeader():
            fresh = sum(1 for t in list(so.last_response().values())
                        if now - t < self.config.leader_fallback)
            return fresh + 1 > (len(so.otherNodes) + 1) / 2
        if not so.otherNodes:
            return True
        return so._getLeader() is not None and \
            now - self.leader_contact < 2 * self.config.election_max

