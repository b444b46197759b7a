"""The Raft adapter: the only module that imports pysyncobj.

Threads: the asyncio loop proposes commands (batched here) and receives
effects; a dedicated raft thread ticks SyncObj, applies committed batches to
the pure state machine, flushes the journal and hands effects back to the
loop once per tick (call_soon_threadsafe).

Durability (pysyncobj writes its journal through mmap and never syncs):
- every node flushes (msync) its journal in an on-tick callback, which
  pysyncobj runs after the tick's appends and before the next tick's commit
  step; one flush covers every entry of the tick (group commit);
- a follower holds its AppendEntries acknowledgements (next_node_idx) until
  that flush, so the leader's matchIndex only counts entries on disk;
- the term/vote meta file is written with fsync (FsyncMetaStorer).

The confirm rule: effects of the entry at log index i (confirms, replies,
deliveries) leave a node only once i is "mirrored": committed, applied
there, and held (on disk) by every member of the replicated in-sync set. The
leader computes mirrored = min(commit index, its own flushed index,
matchIndex of every in-sync follower) and sends it to the followers in a
custom transport message. The leader also maintains the in-sync set: a
follower that lags or is unreachable for longer than `out_of_sync_after`
is marked out of sync (never below a majority) and, if unreachable,
declared down; it is marked in sync again once it has caught up.

Ordering and retries: batches of one node apply in seq order; the state
machine reports a batch that arrives after a gap, and a batch that fails
(discarded by a leader change, unknown outcome) is resent with everything
after it (go-back-N, same seqs: duplicates are dropped in apply). A publish
that cannot be made safe within `nack_after` is nacked (S16/S26); its late
confirm, if the batch applies after all, is dropped.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import pickle
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import MetaStorer
from pysyncobj.monotonic import (
    monotonic as clock,  # pysyncobj's clock (MONOTONIC_RAW): compare like with like
)
from pysyncobj.node import TCPNode
from pysyncobj.pickle import dumps as _pysyncobj_dumps
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE

from node.broker.password import hash_password
from node.broker.permission import check_patterns
from node.broker.vhost import DEFAULT_VHOST, vhost_name_error
from node.replication.codec import CodecError, decode, decode_batch, encode, encode_batch
from node.replication.command import (
    BasicAck,
    BasicPublish,
    Batch,
    Command,
    DropMember,
    MarkInSync,
    MarkOutOfSync,
    NodeDown,
    NodeUp,
    PermissionClear,
    PermissionSet,
    SetDraining,
    SetMember,
    Tick,
    UserDelete,
    UserPut,
    VhostDelete,
    VhostPut,
)
from node.replication.config import RaftConfig
from node.replication.effect import Confirm, Deliver, Effect, GetOk, Return, effect_node
from node.replication.metric import Histogram
from node.replication.port import EffectSink
from node.replication.state_machine import (
    BrokerState,
    apply_batch,
    batch_verdict,
    default_state,
)
from node.replication.transport import PeerSecurity, PeerTransport, tls_contexts

log = logging.getLogger(__name__)

SNAPSHOT_PROTOCOL = pickle.HIGHEST_PROTOCOL  # protocol 5: bodies as raw bytes
MIRRORED = "mq_mirrored"  # our transport message: leader -> followers
PREVOTE, PREVOTE_REPLY = "mq_prevote", "mq_prevote_reply"  # Raft thesis §9.6
TERM_NOTICE = "mq_term"  # "your term is behind mine": a stale leader steps down
APPLIED, DUPLICATE, GAP = "applied", "dup", "gap"
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
    """Term and vote must be durable before a vote is granted (Raft §5.2)."""

    def storeMeta(self, meta: dict[str, Any]) -> None:  # noqa: N802 - pysyncobj's name
        path = self.getPath()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_pysyncobj_dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(os.path.dirname(path) or ".")


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
        super().__init__(syncobj, self_node, other_nodes)

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
            if message.get("entries") and "prevLogIdx" in message:
                message = owner._trim_append(node, message)
                if message is None:
                    return
        super()._onMessageReceived(node, message)


class _BrokerLog(SyncObj):  # type: ignore[misc]
    """SyncObj whose entries are codec-encoded Batches (no pickle in the log
    or on the wire) and whose AppendEntries go out flow-controlled."""

    def __init__(self, owner: RaftNode, self_addr: str, others: list[str], conf: SyncObjConf) -> None:
        self._owner = owner
        self._flow: dict[Any, _Flow] = {}
        self._blobs: dict[tuple[int, int, int], bytes] = {}
        super().__init__(self_addr, others, conf, transportClass=_Transport)
        journal = self._SyncObj__raftLog
        if hasattr(journal, "_FileJournal__metaStorer"):
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
            return self._owner._apply(decode_batch(command, 1))  # after the type byte, no copy
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
                self._send_snapshot(node, transport, term, commit, window, journal)
                flow.last_sent = now
                continue
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

    def _send_snapshot(self, node: Any, transport: _Transport, term: int, commit: int, window: int,
                       journal: Any) -> None:
        serializer = self._SyncObj__serializer
        while transport.unsent_bytes(node) < window:
            data = serializer.getTransmissionData(node)
            transport.send(node, {"type": "append_entries", "term": term, "commit_index": commit,
                                  "serialized": None if not data else list(data)})
            if not data:
                return
            if data[2]:  # last chunk
                self._SyncObj__raftNextIndex[node] = (journal[1][1] if len(journal) > 1 else journal[0][1]) + 1
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

    __slots__ = ("chunks", "inflight", "last_sent", "commit_sent")

    def __init__(self) -> None:
        self.chunks: deque[tuple[int, int]] = deque()  # (last index of a chunk, its bytes)
        self.inflight = 0
        self.last_sent = 0.0
        self.commit_sent = 0  # the commit index the follower was last told

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
    _MODULES = ("node.broker.", "node.replication.state_machine", "node.broker.ids",
                "node.replication.command", "node.replication.effect")

    def find_class(self, module: str, name: str) -> Any:
        ours = module.startswith(self._MODULES) and not name.startswith("_")
        if (module, name) in self._ALLOWED or ours:
            obj = super().find_class(module, name)
            if ours and not isinstance(obj, type):
                raise pickle.UnpicklingError(f"snapshot refers to {module}.{name}, not a type")
            return obj
        raise pickle.UnpicklingError(f"snapshot refers to {module}.{name}: not allowed")


def load_snapshot(data: bytes) -> Any:
    return _SnapshotUnpickler(io.BytesIO(data)).load()


@dataclass
class _Pending:
    batch: Batch
    size: int
    sent_at: float
    resent_at: float = 0.0
    abandoned: bool = False  # its publishes were nacked after nack_after


@dataclass
class _Lag:
    target: int = 0
    since: float = 0.0


class RaftNode:
    """Implements node.replication.port.Proposer on top of pysyncobj."""

    def __init__(self, node_id: str, data_dir: str, loop: asyncio.AbstractEventLoop,
                 sink: EffectSink, config: RaftConfig) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.loop = loop
        self.sink = sink
        self.config = config
        self.address = f"{config.host}:{config.port}"
        self.incarnation = time.time_ns()
        self.state: BrokerState = default_state()
        self.on_removed: Callable[[str], None] | None = None
        self.seed_users: dict[str, str] = {}  # name -> password hash, for a new cluster
        # ---- loop-thread state
        self._batch: list[Command] = []
        self._batch_bytes = 0
        self._flush_scheduled = False
        self._seq = 0
        self._pending: dict[int, _Pending] = {}  # unresolved batches by seq (ordered)
        self._pending_bytes = 0
        self._resend_from: int | None = None
        self._resend_handle: asyncio.Handle | None = None
        self._abandoned: set[int] = set()  # seqs whose publishes were nacked
        self._early: set[tuple[Any, int]] = set()  # unsafe_early_confirm: already acked
        self._congested = False
        self._drain_listeners: list[Callable[[], None]] = []
        self._waiters: dict[int, asyncio.Future[None]] = {}
        # the pending handle of each recurring timer (replaced when it re-arms)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._no_leader_since: float | None = None  # since when without quorum
        # last time any batch outcome arrived: a full pipeline drains slowly
        # under flat-out load, so age alone does not mean the log is stuck
        self._last_progress = clock()
        self._leader_contact = 0.0  # last AppendEntries received (raft thread writes)
        self._blocked: str | None = None
        self._proposed_control: dict[tuple[str, str], float] = {}
        self._removed = False
        # ---- raft-thread state, handed over once per tick
        self._held: deque[tuple[int, tuple[str, int, int], list[Effect]]] = deque()
        self._out: list[tuple[tuple[str, int, int], list[Effect]]] = []
        self._out_done: list[tuple[int, str]] = []  # (seq, verdict or failure)
        self._flushed_index = 0
        self._mirrored = 0  # follower: as told by the leader
        self._released = 0
        self._sent_mirrored = (0, 0.0)
        self._lag: dict[str, _Lag] = {}
        self._bootstrapped = False
        self._was_member = False
        self._raft_tasks: deque[Callable[[], None]] = deque()  # run on the raft thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._syncobj: _BrokerLog | None = None
        self._restore_timeouts: tuple[float, float] | None = None
        self._dump_path = os.path.join(data_dir, "raft.dump")
        self._snap_pid: int | None = None
        self._snap_started = 0.0
        self.snapshots = 0
        self.last_snapshot_seconds = 0.0
        self.last_snapshot_bytes = 0
        self.flushes = 0
        self.applied_batches = 0
        self.resends = 0
        self.nacked_publishes = 0
        # failed pysyncobj outcomes per reason, for Status (issue 3: no DISCARDED under load)
        self._fail_names = {v: k.lower() for k, v in vars(FAIL_REASON).items()
                            if k.isupper() and k != "SUCCESS"}
        self.failed_batches = dict.fromkeys(self._fail_names.values(), 0)
        # Prometheus counters, updated on the loop thread (propose / _deliver)
        self.published = 0
        self.acked = 0
        self.confirmed = 0
        self.nacked = 0
        self.delivered = 0
        self.redelivered = 0
        self.leader_changes = 0
        self.deferred_elections = 0  # see _run
        self._last_leader: Any = None
        self.confirm_latency = Histogram()
        # ---- peer links and elections (raft thread)
        self.peer_security = _security(config)
        self._campaign_transfer = False  # this campaign was asked for (TimeoutNow)
        self._prevote_term = 0
        self._prevote_grants: set[Any] = set()
        self._prevote_won = False
        self._term_noticed: dict[Any, float] = {}
        self.prevote_rounds = 0
        self.ignored_votes = 0
        self.encoded_appends = 0
        self.longest_stall = 0.0  # longest raft-thread loop iteration (s), idle poll included
        self._last_forced_compaction = 0.0
        self.forced_compactions = 0
        self._contact_node: Any = None
        self.longest_leader_gap = 0.0  # follower: longest silence between AppendEntries (s)

    # ---------------------------------------------------------------- life
    def start(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        c = self.config
        # No pre-vote in pysyncobj: a node that campaigns before it has heard
        # the leader deposes a healthy one. A joining node stays quiet until a
        # leader contacts it; a (re)starting member waits a grace period first
        # (a full-cluster restart elects after it).
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
        )
        self._syncobj = _BrokerLog(self, self.address, list(c.peers.values()), conf)
        self._syncobj.addOnTickCallback(self._on_tick)
        self._thread = threading.Thread(target=self._run, name=f"raft-{self.node_id}", daemon=True)
        self._thread.start()
        self._timers["watch"] = self.loop.call_later(0.25, self._watch)

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Leader known, log applied, and our NodeUp applied."""
        deadline = clock() + timeout
        so = self._syncobj
        assert so is not None
        while not (so.isReady() and so._getLeader() is not None):
            if clock() > deadline:
                raise TimeoutError("raft did not become ready (no leader / quorum)")
            await asyncio.sleep(0.02)
        seq = self._send_now([NodeUp(self.node_id, self.incarnation)])
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiters[seq] = fut
        await asyncio.wait_for(fut, max(0.1, deadline - clock()))
        self._timers["tick"] = self.loop.call_later(self.config.tick_interval, self._propose_tick)

    def stop(self) -> None:
        for t in self._timers.values():
            t.cancel()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._syncobj is not None:
            self._syncobj.destroy()  # flushes and closes the journal

    def _run(self) -> None:
        so = self._syncobj
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
        so._SyncObj__raftElectionDeadline = now + random.uniform(c.election_min, c.election_max)  # type: ignore[attr-defined]
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
        so = self._syncobj
        assert so is not None
        now = clock()
        bound = self.config.election_min
        if so._isLeader():
            fresh = sum(1 for t in list(so.last_response().values()) if now - t < bound)
            return fresh + 1 > (len(so.otherNodes) + 1) / 2
        return so._getLeader() is not None and now - self._leader_contact < bound

    def _on_prevote(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._syncobj
        assert so is not None
        term = int(msg.get("term", 0))
        theirs = (int(msg.get("last_log_term", 0)), int(msg.get("last_log_index", 0)))
        mine_index, mine_term = self._log_tail(so)
        granted = term > so.raftCurrentTerm and theirs >= (mine_term, mine_index) and not self._leader_alive()
        so.transport().send_raw(node, {"type": PREVOTE_REPLY, "term": term, "granted": granted})

    def _on_prevote_reply(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._syncobj
        assert so is not None
        if not msg.get("granted") or msg.get("term") != self._prevote_term \
                or so._SyncObj__raftState == _RAFT_STATE.LEADER:  # type: ignore[attr-defined]
            return
        self._prevote_grants.add(node)
        if len(self._prevote_grants) + 1 > (len(so.otherNodes) + 1) / 2:
            self._prevote_won = True
            so._SyncObj__raftElectionDeadline = 0  # type: ignore[attr-defined]

    def _on_append_term(self, node: Any, msg: dict[str, Any]) -> bool:
        """False: an AppendEntries from a stale term; tell its sender (at most
        once a second) so that a leader that missed an election steps down."""
        so = self._syncobj
        assert so is not None
        term = int(msg.get("term", 0))
        now = clock()
        if term >= so.raftCurrentTerm:
            if node is self._contact_node and now - self._leader_contact > self.longest_leader_gap:
                self.longest_leader_gap = now - self._leader_contact  # heartbeats late or starved
            self._contact_node = node
            self._leader_contact = now
            return True
        if now - self._term_noticed.get(node, 0.0) > 1.0:
            self._term_noticed[node] = now
            so.transport().send_raw(node, {"type": TERM_NOTICE, "term": so.raftCurrentTerm})
        return False

    def _on_term_notice(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._syncobj
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

    # ------------------------------------------------------- raft thread
    def _apply(self, batch: Batch) -> str:
        so = self._syncobj
        assert so is not None
        verdict = batch_verdict(self.state, batch)
        if verdict != APPLIED:
            return verdict
        effects = apply_batch(self.state, batch)
        self.applied_batches += 1
        me = self.node_id
        mine = [e for e in effects if effect_node(e) == me]
        if mine:
            index = so.raftLastApplied + 1  # pysyncobj counts it applied after we return
            self._held.append((index, (batch.node, batch.incarnation, batch.seq), mine))
        return verdict

    def _on_result(self, seq: int, res: Any, err: int) -> None:
        if err != FAIL_REASON.SUCCESS:
            name = self._fail_names.get(err, str(err))
            self.failed_batches[name] = self.failed_batches.get(name, 0) + 1
        self._out_done.append((seq, str(res) if err == FAIL_REASON.SUCCESS else f"fail:{err}"))

    def _trim_append(self, node: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """Raft: append the entries not already in the log; truncate only on a
        conflict (same index, other term). pysyncobj truncates after
        prevLogIdx on every append, so a retransmission briefly shrinks the
        log below what this follower has acknowledged. Drop the entries we
        hold identically; if that is all of them, acknowledge without
        touching the log (the ack is held until the journal flush)."""
        so = self._syncobj
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

    def _on_mirrored(self, index: int) -> None:
        if index > self._mirrored:
            self._mirrored = index

    def _on_tick(self) -> None:
        so = self._syncobj
        assert so is not None
        while self._raft_tasks:  # pysyncobj calls that touch Raft state directly
            self._raft_tasks.popleft()()
        last = so.last_log_index()
        if last != self._flushed_index:
            so.journal_flush()
            self._flushed_index = last
            self.flushes += 1
        so.transport().release_held()  # acks only after the flush above
        if self._restore_timeouts is not None and so._getLeader() is not None:
            conf = so._getConf()
            conf.raftMinTimeout, conf.raftMaxTimeout = self._restore_timeouts
            self._restore_timeouts = None
        if so._isLeader():
            upto = self._leader_mirrored(so)
            self._leader_duties(so)
        else:
            upto = min(self._mirrored, so.raftLastApplied)
        if not so.otherNodes and so.raftCommitIndex < last:
            so.wake()  # alone, nothing else would wake us to commit
        if upto > self._released:
            self._released = upto
        held = self._held
        while held and held[0][0] <= self._released:
            _i, key, effects = held.popleft()
            self._out.append((key, effects))
        if self._out or self._out_done:
            out, done = self._out, self._out_done
            self._out, self._out_done = [], []
            self.loop.call_soon_threadsafe(self._deliver, out, done)
        self._check_membership()
        self._check_journal_bytes(so)

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

    def _in_sync_others(self, so: _BrokerLog) -> list[Any]:
        """Raft nodes of the in-sync followers (all of them before bootstrap)."""
        st = self.state
        if not st.in_sync:
            return list(so.otherNodes)
        addrs = {st.members[n] for n in st.in_sync if n != self.node_id and n in st.members}
        return [node for node in so.otherNodes if node.address in addrs]

    def _leader_mirrored(self, so: _BrokerLog) -> int:
        match = so.match_index()
        upto = min(so.raftCommitIndex, self._flushed_index)
        for node in self._in_sync_others(so):
            upto = min(upto, match.get(node, 0))
        sent, at = self._sent_mirrored
        now = clock()
        if upto != sent or now - at > 0.1:
            self._sent_mirrored = (upto, now)
            transport = so.transport()
            for node in so.otherNodes:
                transport.send_raw(node, {"type": MIRRORED, "index": upto})
        return upto

    def _leader_duties(self, so: _BrokerLog) -> None:
        st = self.state
        now = clock()
        if not st.members:
            if not self._bootstrapped and so.isReady():
                self._bootstrapped = True
                cmds: list[Command] = [SetMember(self.node_id, self.address, True)]
                cmds += [SetMember(n, a, True) for n, a in self.config.peers.items()]
                # a new cluster starts with the first leader's configured users,
                # each with full permissions on "/" (RabbitMQ's default_permissions)
                cmds += [UserPut(n, h, ()) for n, h in self.seed_users.items()]
                cmds += [PermissionSet(n, DEFAULT_VHOST, ".*", ".*", ".*") for n in self.seed_users]
                self._control(cmds)
            return
        match, last_resp = so.match_index(), so.last_response()
        by_addr = {node.address: node for node in so.otherNodes}
        bound = self.config.out_of_sync_after
        commit = so.raftCommitIndex
        for member, addr in list(st.members.items()):
            node = by_addr.get(addr)
            if member == self.node_id or node is None:
                continue
            lag = self._lag.setdefault(member, _Lag(commit, now))
            if match.get(node, 0) >= lag.target:
                lag.target, lag.since = commit, now
            silent = now - last_resp.get(node, now) > bound
            lagging = now - lag.since > bound
            if member in st.in_sync:
                if silent or lagging or member in st.draining:
                    self._control([MarkOutOfSync(member)])
                    if silent:
                        self._control([NodeDown(member)])
            elif not silent and match.get(node, 0) >= commit and member not in st.draining:
                self._control([MarkInSync(member)])

    def _control(self, cmds: list[Command]) -> None:
        """Propose leader bookkeeping from the raft thread, at most once a
        second per command kind and member."""
        now = clock()
        fresh = []
        for cmd in cmds:
            key = (type(cmd).__name__, getattr(cmd, "node", ""))
            if now - self._proposed_control.get(key, 0.0) >= 1.0:
                self._proposed_control[key] = now
                fresh.append(cmd)
        for cmd in fresh:
            self.loop.call_soon_threadsafe(self.propose, cmd, 0)

    def _check_membership(self) -> None:
        members = self.state.members
        if self.node_id in members:
            self._was_member = True
        elif self._was_member and members and not self._removed:
            self._removed = True
            self.loop.call_soon_threadsafe(self._on_removed)

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
        pid = os.fork()
        if pid == 0:  # child: no threads, no loop; write, sync, leave
            code = 1
            try:
                # every member compacts at about the same entry count: at full
                # priority three children starve the raft threads on a small
                # machine into missed heartbeats and an election
                os.nice(19)
                with open(part, "wb") as f:
                    pickle.dump((self.state, raft_data), f, protocol=SNAPSHOT_PROTOCOL)
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
        self.state = state
        return raft_data

    # --------------------------------------------------------- loop thread
    def propose(self, cmd: Command, size: int = 0) -> None:
        if self.config.unsafe_early_confirm and isinstance(cmd, BasicPublish) and cmd.seq:
            self._early.add((cmd.chan, cmd.seq))
            early: list[Effect] = [Confirm(cmd.chan, cmd.seq, True)]
            self.loop.call_soon(self.sink, early)
        self._batch.append(cmd)
        self._batch_bytes += size
        kind = type(cmd)
        if kind is BasicPublish:
            self.published += 1
        elif kind is BasicAck:
            self.acked += 1
        if len(self._batch) >= self.config.batch_max_commands or self._batch_bytes >= self.config.batch_max_bytes:
            self._flush_batch()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            # Nagle-like: alone on the wire, go now (latency); with batches
            # in flight, linger a moment so that moderate rates coalesce into
            # fewer Raft entries (per-entry cost dominates on small batches)
            if len(self._pending) < self.config.batch_linger_after:
                self.loop.call_soon(self._flush_batch)
            else:
                self.loop.call_later(self.config.batch_linger, self._flush_batch)

    def _flush_batch(self) -> None:
        self._flush_scheduled = False
        if not self._batch:
            return
        cmds, size = self._batch, self._batch_bytes
        self._batch, self._batch_bytes = [], 0
        self._send(cmds, size)

    def _send_now(self, cmds: list[Command]) -> int:
        self._flush_batch()  # keep FIFO order with what is already queued
        return self._send(cmds, 0)

    def _send(self, cmds: list[Command], size: int) -> int:
        self._seq += 1
        seq = self._seq
        batch = Batch(self.node_id, self.incarnation, seq, time.time(), cmds)
        self._pending[seq] = _Pending(batch, size, clock())
        self._pending_bytes += size
        if self._resend_from is None:  # while resending, keep order: it goes out with the rest
            self._submit(batch)
        if not self._congested and (len(self._pending) > self.config.max_inflight_batches
                                    or self._pending_bytes > self.config.max_inflight_bytes):
            self._congested = True
        return seq

    def _submit(self, batch: Batch) -> None:
        so = self._syncobj
        assert so is not None
        seq = batch.seq

        def done(res: Any, err: int) -> None:
            self._on_result(seq, res, err)

        so.propose(batch, done)

    def _deliver(self, out: list[tuple[tuple[str, int, int], list[Effect]]],
                 done: list[tuple[int, str]]) -> None:
        effects: list[Effect] = []
        me, inc = self.node_id, self.incarnation
        now = clock()
        for (node, incarnation, seq), group in out:
            if node == me and incarnation == inc and seq in self._abandoned:
                # already nacked: a late outcome must not confirm it too (S15)
                group = [e for e in group if not isinstance(e, Confirm | Return)]
            if self._early:
                group = self._drop_early_confirms(group)
            effects.extend(group)
            confirms = self._count(group)
            pending = self._pending.get(seq) if node == me and incarnation == inc else None
            if confirms and pending is not None:
                # from the batch leaving for the log to its confirms leaving the node
                self.confirm_latency.observe(now - pending.sent_at, confirms)
        if any(verdict in (APPLIED, DUPLICATE) for _, verdict in done):
            self._last_progress = now  # failed outcomes (no leader...) are no progress
        for seq, verdict in done:
            pending = self._pending.get(seq)
            if pending is None:
                continue
            if verdict in (APPLIED, DUPLICATE):
                del self._pending[seq]
                self._pending_bytes -= pending.size
                fut = self._waiters.pop(seq, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            else:
                # a gap before it, or not committed: resend it and all after it
                log.info("batch %d: %s, resending", seq, verdict)
                if self._resend_from is None or seq < self._resend_from:
                    self._resend_from = seq
                if self._resend_handle is None:
                    self._resend_handle = self.loop.call_later(0.05, self._resend)
        if effects:
            self.sink(effects)
        if self._congested and len(self._pending) <= self.config.max_inflight_batches // 2 \
                and self._pending_bytes <= self.config.max_inflight_bytes // 2:
            self._congested = False
            for cb in list(self._drain_listeners):
                cb()

    def _count(self, group: list[Effect]) -> int:
        """Tally a group's effects for the metrics; returns its positive confirms."""
        confirms = 0
        for e in group:
            kind = type(e)
            if kind is Deliver or kind is GetOk:
                self.delivered += 1
                if e.redelivered:  # type: ignore[union-attr]
                    self.redelivered += 1
            elif kind is Confirm:
                if e.ack:  # type: ignore[union-attr]
                    confirms += 1
                else:
                    self.nacked += 1
        self.confirmed += confirms
        return confirms

    def _drop_early_confirms(self, group: list[Effect]) -> list[Effect]:
        kept: list[Effect] = []
        for e in group:
            if isinstance(e, Confirm) and (e.chan, e.seq) in self._early:
                self._early.discard((e.chan, e.seq))  # acked on receipt already
                continue
            kept.append(e)
        return kept

    def _resend(self) -> None:
        self._resend_handle = None
        start, self._resend_from = self._resend_from, None
        if start is None:
            return
        now = clock()
        for seq, pending in self._pending.items():
            if seq >= start:
                self.resends += 1
                pending.resent_at = now
                self._submit(pending.batch)

    def _watch(self) -> None:
        """Every 250 ms: nack publishes that could not be made safe in time,
        and block publishers while this node cannot reach a majority."""
        self._timers["watch"] = self.loop.call_later(0.25, self._watch)
        now = clock()
        nacks: list[Effect] = []
        stuck = False
        for seq, pending in self._pending.items():
            age = now - pending.sent_at
            if age > self.config.block_after and now - self._last_progress > self.config.block_after:
                stuck = True
                # no outcome yet (a forward lost with its leader?): go back to
                # it; duplicates are dropped in apply
                if now - pending.resent_at > self.config.block_after and self._resend_handle is None:
                    self._resend_from = seq
                    self._resend_handle = self.loop.call_soon(self._resend)
            if age > self.config.nack_after and not pending.abandoned:
                pending.abandoned = True
                self._abandoned.add(seq)
                for cmd in pending.batch.commands:
                    if isinstance(cmd, BasicPublish) and cmd.seq:
                        nacks.append(Confirm(cmd.chan, cmd.seq, False))
        if nacks:
            self.nacked_publishes += len(nacks)
            self.nacked += len(nacks)
            log.warning("nacking %d publishes not made safe within %.0fs", len(nacks),
                        self.config.nack_after)
            self.sink(nacks)
        so = self._syncobj
        leader = so._getLeader() if so is not None else None
        if leader is not None and leader != self._last_leader:
            if self._last_leader is not None:
                self.leader_changes += 1
            self._last_leader = leader
        if so is None or not self._has_quorum(so):
            if self._no_leader_since is None:
                self._no_leader_since = now
        else:
            self._no_leader_since = None
        leaderless = self._no_leader_since is not None and now - self._no_leader_since > self.config.block_after
        self._blocked = "cluster unavailable: no quorum" if (stuck or leaderless) else None

    def _propose_tick(self) -> None:
        self.propose(Tick())
        self._timers["tick"] = self.loop.call_later(self.config.tick_interval, self._propose_tick)

    def _on_removed(self) -> None:
        if self.on_removed is not None:
            self.on_removed("node removed from the cluster")

    # ------------------------------------------------------- membership
    async def add_member(self, node_id: str, address: str, timeout: float = 30.0) -> None:
        """Record the member (out of sync), then change the Raft config.
        Callers serialize changes (pysyncobj's own guard does not)."""
        await self._commit([SetMember(node_id, address, False)], timeout)
        await self._change(address, add=True, timeout=timeout)

    async def remove_member(self, node_id: str, timeout: float = 30.0) -> None:
        """Replicate DropMember first, while the node still receives the log,
        so that it learns it was removed and stops serving; then change the
        Raft configuration (pysyncobj stops replicating to it at once)."""
        address = self.state.members.get(node_id) or self.config.peers.get(node_id)
        if address is None:
            raise KeyError(f"no member {node_id!r}")
        if node_id == self.node_id:
            raise RuntimeError("a node cannot remove itself; ask another member")
        await self._commit([DropMember(node_id)], timeout)
        so = self._syncobj
        assert so is not None
        # Every AppendEntries sent from now on carries a commit index covering
        # DropMember, and a follower answers only after the tick that applied
        # what it learned. So an answer well after now means the node has
        # applied its own removal. Best effort: a dead node never answers.
        since = clock() + 3 * so._getConf().appendEntriesPeriod
        deadline = clock() + min(timeout, 5.0)
        while clock() < deadline:
            node = next((n for n in so.otherNodes if n.address == address), None)
            if node is None or so.last_response().get(node, 0.0) > since:
                break
            await asyncio.sleep(0.05)
        await self._change(address, add=False, timeout=timeout)

    async def set_draining(self, node_id: str | None = None, draining: bool = True,
                           timeout: float = 30.0) -> None:
        """Maintenance mode on (drain) or off (revive) for a member, this node
        by default; returns once the command is applied here. The leader then
        keeps the member out of the in-sync set (while a majority remains)."""
        node = node_id or self.node_id
        if node not in self.state.members:
            raise KeyError(f"no member {node!r}")
        await self._commit([SetDraining(node, draining)], timeout)

    def draining(self) -> bool:
        return self.node_id in self.state.draining

    def users(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        return self.state.users

    async def put_user(self, name: str, password: str, tags: tuple[str, ...] = (),
                       timeout: float = 30.0) -> None:
        if not name:
            raise KeyError("a user needs a name")
        await self._commit([UserPut(name, hash_password(password), tags)], timeout)

    async def delete_user(self, name: str, timeout: float = 30.0) -> None:
        if name not in self.state.users:
            raise KeyError(f"no user {name!r}")
        await self._commit([UserDelete(name)], timeout)

    def vhosts(self) -> dict[str, None]:
        return self.state.vhosts

    def permissions(self) -> dict[tuple[str, str], tuple[str, str, str]]:
        return self.state.permissions

    async def put_vhost(self, name: str, timeout: float = 30.0) -> None:
        why = vhost_name_error(name)
        if why is not None:
            raise ValueError(why)
        await self._commit([VhostPut(name)], timeout)

    async def delete_vhost(self, name: str, timeout: float = 30.0) -> None:
        if name not in self.state.vhosts:
            raise KeyError(f"no vhost {name!r}")
        await self._commit([VhostDelete(name)], timeout)

    async def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str,
                              timeout: float = 30.0) -> None:
        why = check_patterns(configure, write, read)
        if why is not None:
            raise ValueError(why)
        if user not in self.state.users:
            raise KeyError(f"no user {user!r}")
        if vhost not in self.state.vhosts:
            raise KeyError(f"no vhost {vhost!r}")
        await self._commit([PermissionSet(user, vhost, configure, write, read)], timeout)

    async def clear_permissions(self, user: str, vhost: str, timeout: float = 30.0) -> None:
        if (user, vhost) not in self.state.permissions:
            raise KeyError(f"user {user!r} has no permissions on vhost {vhost!r}")
        await self._commit([PermissionClear(user, vhost)], timeout)

    async def _commit(self, cmds: list[Command], timeout: float) -> None:
        seq = self._send_now(cmds)
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiters[seq] = fut
        await asyncio.wait_for(fut, timeout)

    async def _change(self, address: str, add: bool, timeout: float) -> None:
        so = self._syncobj
        assert so is not None
        fut: asyncio.Future[int] = self.loop.create_future()

        def settle(err: int) -> None:
            if not fut.done():
                fut.set_result(err)

        def done(res: Any, err: int) -> None:
            self.loop.call_soon_threadsafe(settle, err)

        so.change_member(address, add, done)
        err = await asyncio.wait_for(fut, timeout)
        if err != FAIL_REASON.SUCCESS:
            raise RuntimeError(f"membership change refused (reason {err})")

    async def transfer_leadership(self, node_id: str | None = None, timeout: float = 10.0) -> str:
        """Hand leadership to `node_id` (or the most caught-up follower) with
        Raft's TimeoutNow, e.g. before this node is removed; returns the new
        leader's id. Must be asked of the leader."""
        so = self._syncobj
        assert so is not None
        address = None
        if node_id is not None:
            address = self.state.members.get(node_id) or self.config.peers.get(node_id)
            if address is None:
                raise KeyError(f"no member {node_id!r}")
        deadline = clock() + timeout
        err = FAIL_REASON.REQUEST_DENIED
        # pysyncobj sends TimeoutNow only when the target's matchIndex equals
        # the leader's last index: under load, retry until a moment it does
        while err == FAIL_REASON.REQUEST_DENIED and clock() < deadline:
            fut: asyncio.Future[int] = self.loop.create_future()

            def settle(result: int, fut: asyncio.Future[int] = fut) -> None:
                if not fut.done():
                    fut.set_result(result)

            def done(_res: Any, result: int, settle: Callable[[int], None] = settle) -> None:
                self.loop.call_soon_threadsafe(settle, result)

            def request(done: Callable[[Any, int], None] = done) -> None:
                so.transferLeadership(address, callback=done)

            self._raft_tasks.append(request)
            err = await asyncio.wait_for(fut, max(0.1, deadline - clock()))
            if err == FAIL_REASON.REQUEST_DENIED:
                await asyncio.sleep(0.02)
        if err != FAIL_REASON.SUCCESS:
            raise RuntimeError(f"leadership transfer refused (reason {err}): ask the leader, "
                               "and the target must be caught up")
        deadline = max(deadline, clock() + 5.0)
        while clock() < deadline:  # the request was sent; wait for the outcome
            leader = self.status()["leader"]
            if leader not in (None, self.node_id) and (node_id is None or leader == node_id):
                return str(leader)
            await asyncio.sleep(0.05)
        raise TimeoutError("no new leader after the transfer request")

    # ------------------------------------------------------------ queries
    def is_congested(self) -> bool:
        return self._congested

    def add_drain_listener(self, cb: Callable[[], None]) -> None:
        self._drain_listeners.append(cb)

    def message_bytes(self) -> int:
        return int(self.state.message_bytes)

    def blocked_reason(self) -> str | None:
        return self._blocked

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
            now - self._leader_contact < 2 * self.config.election_max

    def status(self) -> dict[str, Any]:
        so = self._syncobj
        assert so is not None
        st = so.getStatus()
        members = dict(self.state.members)
        by_addr = {a: n for n, a in members.items()}
        by_addr.update({a: n for n, a in self.config.peers.items()})
        by_addr[self.address] = self.node_id
        leader = st.get("leader")
        return {
            "node_id": self.node_id,
            "role": {0: "follower", 1: "candidate", 2: "leader"}.get(st.get("state"), str(st.get("state"))),
            "leader": by_addr.get(str(leader), str(leader)) if leader is not None else None,
            "term": st.get("raft_term"),
            "commit_index": st.get("commit_idx"),
            "last_applied": st.get("last_applied"),
            "log_len": st.get("log_len"),
            "members": list(members) or [self.node_id, *self.config.peers],
            "in_sync": list(self.state.in_sync),
            "draining": list(self.state.draining),
            "has_quorum": self._has_quorum(so),
            "mirrored_index": self._released,
            "blocked": self._blocked is not None,
            "pending_batches": len(self._pending),
            "resends": self.resends,
            "nacked_publishes": self.nacked_publishes,
            "failed_batches": dict(self.failed_batches),
            "queues": len(self.state.queues),
            "journal_flushes": self.flushes,
            "snapshots": self.snapshots,
            "last_snapshot_seconds": round(self.last_snapshot_seconds, 3),
            "last_snapshot_bytes": self.last_snapshot_bytes,
            "applied_batches": self.applied_batches,
            "message_bytes": self.message_bytes(),
            "published": self.published,
            "confirmed": self.confirmed,
            "nacked": self.nacked,
            "delivered": self.delivered,
            "redelivered": self.redelivered,
            "acked": self.acked,
            "leader_changes": self.leader_changes,
            "deferred_elections": self.deferred_elections,
            "prevote_rounds": self.prevote_rounds,
            "ignored_votes": self.ignored_votes,
            "peer_rejects": so.transport().peer_rejects,
            "peer_tls": self.peer_security.tls,
            "encoded_appends": self.encoded_appends,
            "longest_raft_stall_ms": round(self.longest_stall * 1000, 1),
            "forced_compactions": self.forced_compactions,
            "longest_leader_gap_ms": round(self.longest_leader_gap * 1000, 1),
            "in_sync_size": len(self.state.in_sync),
            "confirm_latency": self.confirm_latency.snapshot(),
        }
