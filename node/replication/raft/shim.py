"""The pysyncobj shim: RaftShim, the SyncObj subclass (_BrokerLog) and its tick.

With its halves in this package it is the only code that touches SyncObj and
its private state: election.py (PreVote, fast election, term notice, startup
grace) and snapshot.py (the forked snapshot and its loading) are mixins of
RaftShim; segment_log.py is the log on disk; link/ is the network half
(pysyncobj's TCPTransport over our links); messages.py names our messages.
The shim runs the raft thread: it ticks SyncObj, flushes the journal once per
tick (group commit), releases the held AppendEntries acks after that flush,
gates elections (PreVote), and then fills one immutable RaftView that it
hands to its owner (raft_node.RaftNode), which folds it through the pure
planners (mirror.py, in_sync.py) and returns what to announce. Applying a
committed batch is the owner's too (`apply`).

Durability: every node flushes (fdatasync) its log in an on-tick callback,
after the tick's appends and before the next tick's commit step; one flush
covers every entry of the tick (group commit);
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
import logging
import os
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.monotonic import (
    monotonic as clock,  # pysyncobj's clock (MONOTONIC_RAW): compare like with like
)
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

from node.broker.ids import NodeId
from node.replication.codec import CodecError, decode, decode_batch, encode, encode_batch
from node.replication.command import Batch
from node.replication.config import RaftConfig
from node.replication.machine.state import BrokerState
from node.replication.machine.version import FIRST_VERSION, MachineVersionError
from node.replication.message_store import BUCKET_SHIFT
from node.replication.raft.data_dir import make_private_dir, tighten
from node.replication.raft.election import ElectionMixin, quiet_timeouts
from node.replication.raft.link.connection import LOST_REASONS
from node.replication.raft.link.security import PeerSecurity, tls_contexts
from node.replication.raft.link.transport import PeerTransport
from node.replication.raft.log import EntryHandle, LogDamaged, SegmentLog
from node.replication.raft.log.upgrade import adopt, open_log
from node.replication.raft.messages import MIRRORED, PREVOTE, PREVOTE_REPLY, TERM_NOTICE
from node.replication.raft.snapshot import SnapshotMixin, SnapshotReceiver
from node.replication.snapshot_format import RaftMeta, SnapshotFormatError
from node.replication.view import PeerView, RaftView

log = logging.getLogger(__name__)


def _security(config: RaftConfig) -> PeerSecurity:
    client = server = None
    if config.tls_cert or config.tls_key or config.tls_ca:
        if not (config.tls_cert and config.tls_key and config.tls_ca):
            raise ValueError("raft TLS needs tls_cert, tls_key and tls_ca together")
        client, server = tls_contexts(config.tls_cert, config.tls_key, config.tls_ca)
    password = config.password.encode() if config.password else None
    return PeerSecurity.from_password(password, client_tls=client, server_tls=server)  # the scrypt, once


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
        if node is not None:
            self._owner.peer_versions.pop(node, None)  # unknown until it answers again (U2)
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
            # the machine version we run, for the leader's upgrade planner (a
            # key older builds ignore; absent from theirs: version 1)
            message["mq_machine"] = self._owner.config.machine_version
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
        if kind in ("request_vote", PREVOTE) and owner.repair_until:
            owner.ignored_votes += 1  # forgot a damaged log: may lack entries it acknowledged
            return
        if kind == "request_vote" and int(message.get("term", 0) or 0) <= owner.vote_floor:
            owner.ignored_votes += 1  # a term it may have voted in before its meta file was damaged
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
        if kind == "next_node_idx":
            version = message.get("mq_machine", FIRST_VERSION)
            if type(version) is int and version >= FIRST_VERSION:
                owner.peer_versions[node] = version
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
                # the log could not take the entries (a full disk: ENOSPC
                # before the write): the ones before the failing one are in the
                # log, no ack is sent for this append, the leader resends and
                # its in-sync planner marks us lagging (I5) until space is back
                owner._on_journal_error("append", exc)
            return
        super()._onMessageReceived(node, message)


class _BrokerLog(SyncObj):  # type: ignore[misc]
    """SyncObj whose entries are codec-encoded Batches (no pickle in the log
    or on the wire) and whose AppendEntries go out flow-controlled."""

    def __init__(self, owner: RaftShim, self_addr: str, others: list[str], conf: SyncObjConf,
                 journal: SegmentLog) -> None:
        self._owner = owner
        self._flow: dict[Any, _Flow] = {}
        # followers catching up from a snapshot we sent (kept across a broken
        # link: installing a large snapshot can outlast the link)
        self._catch_up: dict[Any, CatchUp] = {}
        self._blobs: dict[tuple[int, int, int], bytes] = {}
        self._send_term = -1  # the term _replicate last ran in: a new one starts fresh gaps
        super().__init__(self_addr, others, conf, transportClass=_Transport)
        adopt(self, journal)  # in place of the MemoryJournal pysyncobj made (no journalFile)
        receiver = self._SyncObj__serializer
        receiver.__class__ = SnapshotReceiver  # a leader's snapshot: private, checked before it is ours
        receiver.accept = owner._accept_snapshot
        receiver.own_damaged = owner._own_snapshot_damaged
        receiver.journal = journal

    def propose(self, batch: Batch, callback: Callable[[Any, int], None]) -> None:
        self._applyCommand(encode_batch(batch), callback, _COMMAND_TYPE.REGULAR)

    def change_member(self, address: str, add: bool, callback: Callable[[Any, int], None]) -> None:
        self._applyCommand(encode(["add" if add else "rem", address]), callback, _COMMAND_TYPE.MEMBERSHIP)

    # ---- pysyncobj's private hooks, replaced (name-mangled on purpose)
    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:  # noqa: N802
        kind = command[0]
        if kind == _COMMAND_TYPE.REGULAR:
            # after the type byte, no copy; pysyncobj counts it applied after we return
            spans: dict[int, tuple[int, int]] = {}  # where each publish's bytes sit (message store)
            index = self.raftLastApplied + 1
            try:
                batch = decode_batch(command, 1, spans)
            except CodecError as exc:
                # its CRC held, so not damage: a record this build cannot read (a
                # newer one). Retrying every tick would hang the node: it stops (exit 4)
                raise MachineVersionError(f"log entry {index} cannot be read by this build ({exc}): "
                                          "run the build that wrote it or a newer one") from None
            return self._owner.owner.apply(batch, index, spans)
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

    def _SyncObj__tryLogCompaction(self) -> None:  # noqa: N802
        if self._holds_compaction():
            return
        SyncObj._SyncObj__tryLogCompaction(self)

    def _holds_compaction(self) -> bool:
        """True: start no snapshot now, because a follower is catching up from
        the one we sent it. A snapshot taken meanwhile drops the log up to it,
        and the follower, done with the older one, is behind the new one:
        another transfer, overtaken again for as long as the load lasts (with
        a snapshot every second, chaos corruption experiments; and under the
        kubelet, a transfer of 49 s overtaken every 50 s by 10 MB/s of
        publishes, for as long as the load lasted). Bounded by the follower's
        progress (given up after CATCH_UP_STALL seconds in which it received
        no snapshot chunk and acknowledged no entry) and by the log's size
        (catch_up_hold_bytes: then one snapshot goes ahead and the next
        transfer holds again), not by the transfer's length: a large backlog
        under load takes minutes. A snapshot being written is always collected."""
        if not self._isLeader():
            self._catch_up.clear()
            return False
        if self._SyncObj__serializer._Serializer__pid != 0:
            return False
        now = clock()
        applied = self.raftLastApplied
        match = self._SyncObj__raftMatchIndex
        hold = False
        members = self._SyncObj__otherNodes
        for node, c in list(self._catch_up.items()):
            flow = self._flow.get(node)
            sending = flow is not None and flow.snapshot_index is not None
            progress = (match.get(node, 0), flow.snapshot_chunks if flow is not None else -1)
            progress_at = now if progress != c.progress else c.progress_at
            if node not in members:
                del self._catch_up[node]
            elif not sending and match.get(node, 0) >= c.mark:
                # it holds what we had applied at the last look (under load it never
                # quite reaches the applied index of the moment): caught up
                del self._catch_up[node]
                log.info("%s caught up from a snapshot in %.1f s (index %d): snapshots resume",
                         getattr(node, "address", node), now - c.since, applied)
            elif now - progress_at >= CATCH_UP_STALL:
                del self._catch_up[node]  # gone, or stuck: it must not stop our snapshots
                log.warning("%s made no progress catching up from a snapshot for %.0f s: "
                            "snapshots resume", getattr(node, "address", node), CATCH_UP_STALL)
            else:
                hold = True
                self._catch_up[node] = CatchUp(c.since, applied, progress, progress_at)
        if hold and self._SyncObj__raftLog.bytes_used() > self._owner.config.catch_up_hold_bytes:
            return False
        return hold

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
        if term != self._send_term:  # leader anew: gaps of an earlier leadership do not count
            self._send_term = term
            for f in self._flow.values():
                f.last_sent = 0.0
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
                self._sent_at(flow, now)
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
                self._sent_at(flow, now)
                flow.commit_sent = commit

    def _sent_at(self, flow: _Flow, now: float) -> None:
        # the leader's side of a heartbeat gap: a follower's own stalls (GIL
        # waits) lengthen the silence it measures, not this one
        if flow.last_sent and now - flow.last_sent > self._owner.longest_send_gap:
            self._owner.longest_send_gap = now - flow.last_sent
        flow.last_sent = now

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
                if node not in self._catch_up:
                    now = clock()
                    self._catch_up[node] = CatchUp(now, flow.snapshot_index, (-1, -1), now)
                    log.info("sending %s the snapshot at index %d: no snapshot here until it has "
                             "caught up (while it makes progress and the log is under %d MB)",
                             getattr(node, "address", node), flow.snapshot_index,
                             self._owner.config.catch_up_hold_bytes >> 20)
            # every chunk names the index, so that a follower that has applied past
            # it drops it instead of rewinding its state (_snapshot_moves_forward)
            transport.send(node, {"type": "append_entries", "term": term, "commit_index": commit,
                                  "serialized": None if not data else list(data),
                                  "snapshot_index": flow.snapshot_index})
            flow.snapshot_chunks += 1
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
        log_: SegmentLog = self._SyncObj__raftLog  # any thread: no entry read
        return log_.last_index() if len(log_) else 0

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
# a leader holds its snapshots for a follower catching up from one (_holds_compaction)
# while it made progress within this many seconds (a large state's install, after the
# last chunk and before its answer, shows none)
CATCH_UP_STALL = 60.0


class CatchUp(NamedTuple):
    """A follower catching up from a snapshot the leader sent it."""

    since: float  # when the transfer began
    mark: int  # the leader's applied index at the last look: what the follower must reach
    progress: tuple[int, int]  # (its match index, snapshot chunks sent to it) at the last look
    progress_at: float  # when that last changed
_NEVER = float("inf")  # an election deadline pysyncobj's check never passes
CACHE_IDLE_CHECK = 10.0  # s: the log's cached entries older than this go (SegmentLog.age_cache)


class _Flow:
    """Entry bytes sent to one follower and not yet acknowledged."""

    __slots__ = ("chunks", "inflight", "last_sent", "commit_sent", "snapshot_index", "snapshot_chunks")

    def __init__(self) -> None:
        self.chunks: deque[tuple[int, int]] = deque()  # (last index of a chunk, its bytes)
        self.inflight = 0
        self.last_sent = 0.0
        self.commit_sent = 0  # the commit index the follower was last told
        self.snapshot_index: int | None = None  # a snapshot transmission under way: its index
        self.snapshot_chunks = 0  # snapshot chunks handed to the transport (progress of a transfer)

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


class Owner(Protocol):
    """What the shim calls back, on the raft thread."""

    def apply(self, batch: Batch, index: int, spans: dict[int, tuple[int, int]] | None = None) -> str: ...
    def retains(self, first: int, last: int) -> bool: ...  # log entries that live messages need
    def live_messages(self) -> int: ...  # messages the state holds in the log (a snapshot's size)
    def on_tick(self, view: RaftView) -> int | None: ...  # returns a mirrored index to announce
    def on_result(self, seq: int, ok: bool, why: str) -> None: ...
    def membership(self) -> tuple[tuple[tuple[NodeId, str], ...], tuple[NodeId, ...], tuple[NodeId, ...]]: ...
    def snapshot_state(self) -> BrokerState: ...
    def restore_state(self, state: BrokerState, index: int) -> None: ...


Done = Callable[[bool, str], None]  # (succeeded, reason), on the raft thread


class RaftShim(ElectionMixin, SnapshotMixin):
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
        self._loaded: tuple[str, BrokerState, RaftMeta] | None = None
        self._from_leader = False
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
        # peer node -> the machine version it last told us it runs (raft thread)
        self.peer_versions: dict[Any, int] = {}
        self._last_forced_compaction = 0.0
        self._last_pin_check = 0.0
        self.snapshot_done_at = clock()  # the latest snapshot written or loaded
        self._last_release = 0.0
        self._last_cache_check = 0.0
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
        self.vote_floor = 0  # RequestVotes of terms up to this one are ignored (a lost meta file)
        self._meta_lost = False
        self.encoded_appends = 0
        self.longest_stall = 0.0  # longest raft-thread loop iteration (s), idle poll included
        self.forced_compactions = 0
        self.longest_leader_gap = 0.0  # follower: longest silence between AppendEntries (s)
        self.longest_send_gap = 0.0  # leader: longest time between AppendEntries to one follower (s)
        self.fast_elections = 0  # campaigns started early because the leader's link broke
        self.longest_flush = 0.0  # longest journal flush (s)
        self.longest_owner_tick = 0.0  # longest on_tick of the owner (planners, hand-over)
        self.longest_fork = 0.0  # longest snapshot fork (s), on the raft thread
        self.journal_write_errors = 0  # appends the journal refused (OSError, e.g. ENOSPC)
        self.installed_snapshots = 0  # snapshots installed from the leader
        self.refused_snapshots = 0  # snapshot chunks dropped: we had applied past them
        self.damaged_snapshots = 0  # leader's snapshots that did not read back (checksum, format)
        self.journal_flush_errors = 0  # failed log flushes (fdatasync)
        self.last_journal_error = ""
        self._journal_error_logged = 0.0

    # ---------------------------------------------------------------- life
    def start(self) -> None:
        make_private_dir(self.data_dir)  # 0700, files 0600 (tightened, with a log line)
        c = self.config
        quiet = quiet_timeouts(c)
        if quiet is not None:
            self._restore_timeouts = (c.election_min, c.election_max)
        conf = _Conf(
            quiet,
            autoTick=False,
            appendEntriesUseBatch=False,  # send at once and wake the poller: latency
            dynamicMembershipChange=True,
            journalFile=None,  # our SegmentLog replaces pysyncobj's journal (_BrokerLog)
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
        # retain: the state's and the snapshot's messages point into the log
        repairable = bool(c.peers) or c.join
        journal = open_log(self.data_dir, repairable=repairable, segment_bytes=c.segment_bytes,
                           retain=self._retains, granule=1 << BUCKET_SHIFT, verify_bytes=c.verify_at_open_bytes)
        journal.sync_appends = not c.unsafe_no_fsync
        try:  # before the first tick, where pysyncobj would load it
            self.load_own_snapshot(journal, repairable)
        except SnapshotFormatError as exc:
            log.critical("%s", exc)
            journal._destroy()
            raise
        if journal.meta_damaged and repairable and len(journal):
            # its vote is lost: granting one now could be a second vote in a term
            # it already voted in; none until a leader has brought it this far
            self.repair_until = max(self.repair_until, journal.last_index())
            self._meta_lost = True
            log.error("journal meta damaged: no votes from this member until it has applied index %d "
                      "from a leader", self.repair_until)
        self._so = _BrokerLog(self, self.address, list(c.peers.values()), conf, journal)
        if quiet is None:
            # no peers and not joining: a node alone elects itself at its first
            # tick instead of after an election timeout (~1.5 s of every
            # restart); members its snapshot brings back are not dialled yet
            # then, so pysyncobj starts no election, and PreVote gates the rest
            self._so._SyncObj__raftElectionDeadline = 0  # type: ignore[attr-defined]
        tighten(self.data_dir)  # the journal pysyncobj has just created with the default mode
        self._so.addOnTickCallback(self._on_tick)
        self._thread = threading.Thread(target=self._run, name=f"raft-{self.node_id}", daemon=True)
        self._thread.start()
        if journal.unverified:
            threading.Thread(target=journal.scrub, args=(self._stop, float(c.scrub_bytes_per_second),
                                                         self._on_scrub_damage),
                             name="log-scrub", daemon=True).start()
        if os.environ.get("MIRRORQ_STALL_TRACE"):
            threading.Thread(target=self._trace_stalls, name="stall-trace", daemon=True).start()

    # a clean stop with this much log since the last snapshot takes one first:
    # the restart then replays nothing (10M queued: 3.4 s of a 6.5 s restart)
    STOP_SNAPSHOT_BYTES = 32 << 20
    STOP_SNAPSHOT_SECONDS = 60.0

    def stop(self) -> None:
        self._snapshot_before_stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._so is not None:
            self._so.destroy()  # flushes and closes the journal

    def _on_scrub_damage(self, path: str) -> None:
        """A sealed segment the start took unchecked fails its CRC: restart this
        process (same pid, argv and environment) so the open walks it and
        handles the damage as at any start: dropped and re-fetched from the
        leader, or, alone, a refusal to start naming file and offset. Nothing
        of it was served: every read checks its record's CRC."""
        log.critical("raft log damaged: %s fails its checksum (a segment the start left to the background "
                     "check); restarting this process so its start finds and drops the damaged records", path)
        logging.shutdown()
        try:
            os.execv(sys.executable, sys.orig_argv)
        finally:
            os._exit(3)  # (exec failed: exit as on damage found by a read)

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
        if used < self.STOP_SNAPSHOT_BYTES:
            return
        before = self.snapshots
        began = clock()
        self._tasks.append(so.forceLogCompaction)
        so.wake()
        left = used
        while clock() - began < self.STOP_SNAPSHOT_SECONDS and self._thread.is_alive():
            time.sleep(0.02)
            left = self._log_since_snapshot()
            if 0 <= left < self.STOP_SNAPSHOT_BYTES and self.snapshots > before and self._snap_pid is None:
                break
        log.info("snapshot before stopping: %s in %.2f s (%d MB of log since the last one, %d MB left; "
                 "%d written)", "done" if 0 <= left < self.STOP_SNAPSHOT_BYTES else "not done",
                 clock() - began, used >> 20, max(left, 0) >> 20, self.snapshots - before)

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

    def add_member_refusal(self) -> str | None:
        """Why adding a member now would stall the cluster (leader; any thread),
        or None. etcd's strict reconfiguration check. Adding a member raises the quorum
        at once (pysyncobj applies a config entry when it is appended), and the
        new one counts only once it has caught up: with fewer members answering
        than the new quorum, nothing commits, the change included, until it has,
        or ever if it never starts (seen: one of three members down, AddMember
        stalled every confirm 34 s and timed out). A single member may grow."""
        so = self._so
        if so is None or not so._isLeader() or not so.otherNodes:
            return None
        now = clock()
        replies, lost = so.last_response(), so.transport().lost_at
        answering = 1 + sum(1 for n in list(so.otherNodes)
                            if n not in lost and now - replies.get(n, 0.0) < self.config.election_max)
        total = len(so.otherNodes) + 2
        quorum = total // 2 + 1
        if answering >= quorum:
            return None
        return (f"{answering} of the {total - 1} members answer, below the quorum of {quorum} that "
                f"{total} members need: bring the others back or remove the dead ones first")

    def transfer(self, address: str | None, done: Done) -> None:
        """TimeoutNow to `address` (or the most caught-up follower); `done`
        says whether it was sent ("request_denied": the target is not caught up)."""
        so = self._so
        assert so is not None
        names = self._fail_names

        def callback(_res: Any, err: int) -> None:
            done(err == FAIL_REASON.SUCCESS, names.get(err, "success"))

        self._tasks.append(lambda: so.transferLeadership(address, callback=callback))

    def entry_handle(self, idx: int) -> EntryHandle:
        """Raft thread only: a handle another thread reads entry `idx` by."""
        so = self._so
        assert so is not None
        journal: SegmentLog = so._SyncObj__raftLog
        return journal.handle(idx)

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

    def log_segments(self) -> int:
        so = self._so  # (any thread: counts a list, reads no entry)
        return 0 if so is None else len(so._SyncObj__raftLog.segment_files())

    def log_bounds(self) -> tuple[int, int]:
        """(first, last) index of the Raft log (any thread: reads two ints; the
        first is the last snapshot's index once one was taken, 1 before)."""
        so = self._so
        if so is None:
            return 0, 0
        journal: SegmentLog = so._SyncObj__raftLog
        return journal.first_index(), journal.last_index()

    def log_compactions(self) -> int:
        so = self._so
        return 0 if so is None else int(so._SyncObj__raftLog.compactions)

    def peer_rejects(self) -> int:
        so = self._so
        return 0 if so is None else int(so.transport().peer_rejects)

    def peer_mac_failures(self) -> int:
        so = self._so
        return 0 if so is None else int(so.transport().peer_mac_failures)

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
                self._tick(so, now)
            except LogDamaged as exc:  # found on a read: never applied nor sent; the restart repairs
                if exc.path and so._SyncObj__raftLog.unchecked(exc.path):
                    self._on_scrub_damage(exc.path)  # what the start would have found: start again
                log.critical("raft log damaged: %s; exiting (the restart drops it and re-fetches)", exc)
                logging.shutdown()
                os._exit(3)
            except MachineVersionError as exc:  # applying on would diverge from the other members
                log.critical("%s; exiting", exc)
                logging.shutdown()
                os._exit(4)
            except Exception:  # noqa: BLE001 - a bad tick must not kill replication
                log.exception("raft tick failed")
                time.sleep(0.05)

    def _tick(self, so: _BrokerLog, now: float) -> None:
        """One pysyncobj tick, campaigning only where the gate allows: else the
        election deadline is out of reach for the tick (pysyncobj checks it
        after steps that can run long) and comes back after it, unless the tick
        set a new one (a heartbeat, a granted vote, a lost link)."""
        if self._gate_election(so, now):
            so.doTick(self.config.idle_tick)
            self._campaign_transfer = False
            return
        deadline = so._SyncObj__raftElectionDeadline  # type: ignore[attr-defined]
        so._SyncObj__raftElectionDeadline = _NEVER  # type: ignore[attr-defined]
        try:
            so.doTick(self.config.idle_tick)
        finally:
            self._campaign_transfer = False
            if so._SyncObj__raftElectionDeadline == _NEVER:  # type: ignore[attr-defined]
                so._SyncObj__raftElectionDeadline = deadline  # type: ignore[attr-defined]

    # ------------------------------------------------------ the tick (raft thread)
    def _on_tick(self) -> None:
        """pysyncobj's on-tick callback: after the tick's appends, before the
        next tick's commit step."""
        so = self._so
        assert so is not None
        while self._tasks:  # pysyncobj calls that touch Raft state directly
            self._tasks.popleft()()
        if self.repair_until and so.raftLastApplied >= self.repair_until:
            self.repair_until = 0
            if self._meta_lost:
                # the vote it cast before the damage is unknown, also one in a term
                # past its log (a campaign the leader has not heard of): not in the
                # next term either (one more election round at most)
                self._meta_lost = False
                self.vote_floor = int(so.raftCurrentTerm) + 1
            log.warning("repaired from the leader up to index %d: voting again (in terms above %d)",
                        so.raftLastApplied, self.vote_floor)
        last = so.last_log_index()
        transport = so.transport()
        flushed = True
        if last != self._flushed_index:
            t0 = clock()
            try:
                so.journal_flush()  # group commit: one fdatasync for the tick's entries
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
        journal: SegmentLog = so._SyncObj__raftLog
        if journal.hidden and clock() - self._last_release >= 1.0:
            self._last_release = clock()
            journal.release()  # retained segments whose messages are all gone
        if clock() - self._last_cache_check >= CACHE_IDLE_CHECK:
            self._last_cache_check = clock()
            journal.age_cache()  # an idle or drained node holds no old entries in memory
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
        versions = self.peer_versions
        peers = tuple(PeerView(n.address, by_addr.get(n.address), match.get(n, 0), replies.get(n, now),
                               n in connected, n in lost, versions.get(n, 0))
                      for n in so.otherNodes)
        leader = bool(so._isLeader())
        return RaftView(now=now, me=self.node_id, leader=leader,
                        ready=bool(so.isReady()) and so._getLeader() is not None,
                        term=int(so.raftCurrentTerm), commit_index=int(so.raftCommitIndex),
                        last_applied=int(so.raftLastApplied), flushed_index=self._flushed_index,
                        told_mirrored=self._mirrored, members=members, in_sync=in_sync,
                        draining=draining, peers=peers)

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
            if idx < first or idx > last or journal.term_at(idx) != entry[2]:  # no read of the entry
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
        one alone keeps retained segments on disk (their messages settled
        since): a quiet queue after a drain takes no snapshot by entry count,
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
        return any(not retains(seg.first, seg.last) for seg in so._SyncObj__raftLog.hidden)

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

