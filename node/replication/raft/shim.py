"""The pysyncobj shim: RaftShim, the SyncObj subclass (_BrokerLog) and its tick.

With its halves in this package it is the only code that touches SyncObj and
its private state: election.py (PreVote, fast election, term notice, startup
grace), snapshot/ (SnapshotMixin: the forked snapshot, sending, receiving and
loading it) and compaction.py (the snapshots it forces) are mixins of
RaftShim; replicator.py is the leader's sending side of _BrokerLog
(flow-controlled AppendEntries, the snapshot in chunks); log/ is the log on
disk; link/ is the network half (pysyncobj's TCPTransport over our links)
and broker_transport.py the shim's part of it; messages.py names our messages.
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
  that flush (broker_transport.py), so the leader's matchIndex only counts
  entries on disk;
- the term/vote meta file is written with fsync (FsyncMetaStorer).

Failure detection, for the in-sync planner and for elections: a peer link
that breaks (reset, EOF, connect refused) marks the peer `lost` until it
links again (broker_transport.py); a follower that loses its leader's link
campaigns at once (after a short delay ranked by address, so that two
survivors do not split the vote), and grants PreVotes, instead of waiting
for the election timeout.
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
from typing import Any, Protocol

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.monotonic import (
    monotonic as clock,  # pysyncobj's clock (MONOTONIC_RAW): compare like with like
)
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE

from node.broker.ids import NodeId
from node.replication.codec import CodecError, decode, decode_batch, encode, encode_batch
from node.replication.command import Batch
from node.replication.config import MAX_FRAME_BYTES, RaftConfig
from node.replication.machine.state import BrokerState
from node.replication.machine.version import MachineVersionError
from node.replication.message_store import BUCKET_SHIFT
from node.replication.raft.broker_transport import BrokerTransport
from node.replication.raft.compaction import CompactionMixin
from node.replication.raft.data_dir import make_private_dir, tighten
from node.replication.raft.election import ElectionMixin, quiet_timeouts
from node.replication.raft.link.security import PeerSecurity, tls_contexts
from node.replication.raft.log import EntryHandle, LogDamaged, SegmentLog
from node.replication.raft.log.upgrade import adopt, open_log
from node.replication.raft.messages import MIRRORED
from node.replication.raft.replicator import Replicator
from node.replication.raft.snapshot import (
    RaftMeta,
    SnapshotFormatError,
    SnapshotMixin,
    SnapshotReceiver,
)
from node.replication.raft.storage_fault import check_dir, open_dir
from node.replication.view import PeerView, RaftView

log = logging.getLogger(__name__)


def _security(config: RaftConfig) -> PeerSecurity:
    client = server = None
    if config.tls_cert or config.tls_key or config.tls_ca:
        if not (config.tls_cert and config.tls_key and config.tls_ca):
            raise ValueError("raft TLS needs tls_cert, tls_key and tls_ca together")
        client, server = tls_contexts(config.tls_cert, config.tls_key, config.tls_ca)
    password = config.password.encode() if config.password else None
    return PeerSecurity.from_password(password, client_tls=client, server_tls=server,  # the scrypt, once
                                      verify_names=config.tls_verify_names,
                                      max_frame=config.max_frame_bytes or MAX_FRAME_BYTES)


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


class _BrokerLog(Replicator):
    """SyncObj whose entries are codec-encoded Batches (no pickle in the log
    or on the wire) and whose AppendEntries go out flow-controlled (Replicator)."""

    def __init__(self, owner: RaftShim, self_addr: str, others: list[str], conf: SyncObjConf,
                 journal: SegmentLog) -> None:
        self._owner = owner
        self._flow = {}  # Replicator's state
        self._catch_up = {}
        self._blobs = {}
        self._send_term = -1
        super().__init__(self_addr, others, conf, transportClass=BrokerTransport)
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

    def _SyncObj__tryLogCompaction(self) -> None:  # noqa: N802
        owner = self._owner
        if owner._snap_pid is None and not owner.snapshot_may_start(clock()):
            return  # a failed snapshot is retried after a backoff, not at the next tick (issue 46)
        super()._SyncObj__tryLogCompaction()  # Replicator's: it holds compaction during a catch-up

    def _SyncObj__parseChangeClusterRequest(self, command: bytes) -> list[Any] | None:  # noqa: N802
        if command[0] != _COMMAND_TYPE.MEMBERSHIP:
            return None
        req = decode(command, 1)
        if not (isinstance(req, list) and len(req) == 2 and req[0] in ("add", "rem")
                and isinstance(req[1], str)):
            raise CodecError("malformed membership entry")
        return [req[0], req[1], TCPNode(req[1])]

    # pysyncobj keeps these private; we read them, never write them.
    def journal_flush(self) -> None:
        self._SyncObj__raftLog.flush()

    def last_log_index(self) -> int:
        log_: SegmentLog = self._SyncObj__raftLog  # any thread: no entry read
        return log_.last_index() if len(log_) else 0

    def wake(self) -> None:
        """Make the coming poll return at once."""
        self._SyncObj__pipeNotifier.notify()

    def transport(self) -> BrokerTransport:
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


_NEVER = float("inf")  # an election deadline pysyncobj's check never passes
CACHE_IDLE_CHECK = 10.0  # s: the log's cached entries older than this go (SegmentLog.age_cache)


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


class RaftShim(ElectionMixin, SnapshotMixin, CompactionMixin):
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
        self._dirs: list[tuple[str, int]] = []  # the data dir and the log's, an fd held on each
        self._last_dir_check = 0.0
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
        # (the chart's start.sh tells a fresh volume the same way)
        fresh = not any(os.path.exists(os.path.join(self.data_dir, name))
                        for name in ("log", "raft.journal", "raft.journal.meta",
                                     os.path.basename(self._dump_path)))
        quiet = quiet_timeouts(c, fresh)
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
        self._dirs = [(d, open_dir(d)) for d in (self.data_dir, journal.dir)]
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
                # (a failed fdatasync stopped the node: storage_fault.py) not on
                # disk: keep the acks held (the leader does not count these
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
        if clock() - self._last_dir_check >= 1.0:
            self._last_dir_check = clock()
            for path, fd in self._dirs:  # removed or unmounted: stop (open fds would keep working)
                check_dir(path, fd)
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

