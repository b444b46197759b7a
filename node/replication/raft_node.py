"""The raft node: the broker's state machine on a Raft log, and the confirm rule.

Two threads. The asyncio loop proposes commands (batched by pipeline.py) and
carries out effects. The raft thread (owned by the shim, raft/shim.py) ticks
pysyncobj, applies committed batches to the pure state machine here
(`apply`), and once per tick hands an immutable RaftView to `on_tick`, which
folds it through the pure planners:

  view -> mirror.step   -> the released index (held effects leave) and the
                           mirrored index the leader announces (shim sends it)
       -> in_sync.plan  -> MarkInSync / MarkOutOfSync / NodeDown / bootstrap
                           (proposed on the loop, like any command)

and hands the released effects and batch outcomes to the loop in one
call_soon_threadsafe. This module imports no pysyncobj.

The confirm rule (see mirror.py and docs/ARCHITECTURE.md): effects of the
entry at log index i (confirms, replies, deliveries) leave a node only once
i is mirrored: committed, applied there, and held on disk by every member of
the replicated in-sync set.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from node.broker.ids import NodeId
from node.broker.vhost import DEFAULT_VHOST
from node.replication import codec, in_sync, mirror, upgrade
from node.replication.command import (
    APPLIED,
    DUPLICATE,
    BasicAck,
    BasicPublish,
    Batch,
    Command,
    NodeUp,
    PermissionSet,
    SetMember,
    Tick,
    UserPut,
)
from node.replication.config import RaftConfig
from node.replication.effect import (
    Confirm,
    Deliver,
    Effect,
    GetOk,
    Return,
    effect_node,
    effect_serial,
)
from node.replication.machine import (
    BrokerState,
    apply_batch,
    batch_verdict,
    default_state,
    skipped_effects,
)
from node.replication.machine.version import COUNTED_RECORDS, too_old
from node.replication.message_store import BUCKET_SHIFT, LogReader
from node.replication.metric import Histogram
from node.replication.pipeline import Flush, Limits, Pipeline
from node.replication.port import EffectSink
from node.replication.raft import RaftShim, clock
from node.replication.read_model import Management, ModelPublisher, ReadModel, management_rows
from node.replication.row_cache import RowCache, timed
from node.replication.status import NodeStatus, peer_rows
from node.replication.view import RaftView

log = logging.getLogger(__name__)

BatchKey = tuple[str, int, int]  # (node, incarnation, seq)


def _limits(c: RaftConfig) -> Limits:
    return Limits(batch_max_commands=c.batch_max_commands, batch_max_bytes=c.batch_max_bytes,
                  max_inflight_batches=c.max_inflight_batches, max_inflight_bytes=c.max_inflight_bytes,
                  linger_after=c.batch_linger_after, block_after=c.block_after, nack_after=c.nack_after)


class RaftNode:
    """Implements node.replication.port.Proposer; the shim's Owner."""

    def __init__(self, node_id: str, data_dir: str, loop: asyncio.AbstractEventLoop,
                 sink: EffectSink, config: RaftConfig, first_serial: int = 0) -> None:
        self.node_id = NodeId(node_id)
        # connections of this node's earlier lives have serials below this one
        # (node/amqp/connection.py): their effects have nobody to reach
        self.first_serial = first_serial
        self.data_dir = data_dir
        self.loop = loop
        self.sink = sink
        self.config = config
        self.address = f"{config.host}:{config.port}"
        self.incarnation = time.time_ns()
        self.state: BrokerState = default_state()
        self.state.runs_version = config.machine_version
        self.state.binding_limits = config.binding_limits
        self.machine_version = 0  # the cluster's, as applied here (raft thread writes)
        self._machine_changed()
        self.on_removed: Callable[[str], None] | None = None
        self.seed_users: dict[str, str] = {}  # name -> password hash, for a new cluster
        self.shim = RaftShim(self, self.node_id, data_dir, config)
        # the log's messages as apply (read only) and deliveries read them (raft thread)
        self.log_reader = LogReader(self.shim.entry_handle)
        # the loop thread reads the state only through this (immutable, per tick)
        self.model_publisher = ModelPublisher(loop, self.state)
        # the management rows every reader shares (HTTP requests, the rate sampler,
        # metrics scrapes): built again only when something was applied, spaced
        built = timed(management_rows, self._state_version)
        self.row_cache: RowCache[Management] = RowCache(
            lambda: self.model_publisher.compute(built), self._state_version)
        self.peer_security = self.shim.peer_security
        # ---- loop thread
        self.pipeline = Pipeline(self.node_id, self.incarnation, _limits(config))
        self._resend_handle: asyncio.Handle | None = None
        self._early: set[tuple[Any, int]] = set()  # unsafe_early_confirm: already acked
        self._drain_listeners: list[Callable[[], None]] = []
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}  # each recurring timer's pending handle
        self._no_quorum_since: float | None = None
        self._blocked: str | None = None
        self._stuck = False
        # our NodeUp is applied: the log is caught up with the leader's this run, so the
        # model's in_sync is no longer the view this node had when it went down
        self._up = False
        self._last_leader: str | None = None
        # ---- raft thread, handed over once per tick
        self._held: deque[tuple[int, BatchKey, list[Effect]]] = deque()
        self._out: list[tuple[BatchKey, list[Effect]]] = []
        self._out_done: list[tuple[int, str]] = []  # (seq, verdict or "fail:<reason>")
        self._gate = mirror.Gate()
        self._view: RaftView | None = None
        self._planner = in_sync.Planner()
        self._upgrade = upgrade.Planner()
        self._was_member = False
        self._removed = False
        # ---- statistics
        self.applied_batches = 0
        self.restores = 0  # states replaced (snapshots installed): the rows changed too
        self.failed_batches = dict.fromkeys(self.shim.fail_reasons(), 0)
        self.published = self.acked = self.confirmed = self.nacked = 0
        self.delivered = self.redelivered = 0
        self.leader_changes = 0
        self.skipped_closes = 0  # connections closed after a snapshot skipped their effects
        self.confirm_latency = Histogram()

    # ---------------------------------------------------------------- life
    def start(self) -> None:
        self.shim.start()
        self.pipeline.last_progress = clock()
        self._timers["watch"] = self.loop.call_later(0.25, self._watch)

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Leader known, log applied, and our NodeUp applied. Gives up after
        `timeout` seconds without progress, not after `timeout` in all: a
        member restarted under heavy load may need minutes to receive the
        log or a snapshot of gigabytes, and exiting half way (as it did, chaos
        experiment kill-during-snapshot) left the cluster a member short for
        as long as the load lasted, however often it was restarted."""
        began = clock()
        deadline = began + timeout
        progress = self.shim.catch_up_progress()
        first = self.applied_batches
        while not self.shim.ready():
            now_progress = self.shim.catch_up_progress()
            if now_progress != progress:
                progress, deadline = now_progress, clock() + timeout
            if clock() > deadline:
                raise TimeoutError(f"raft did not become ready (no leader / quorum; no progress in {timeout:.0f} s)")
            await asyncio.sleep(0.02)
        log.info("raft ready in %.2f s: %d batches applied from the log", clock() - began,
                 self.applied_batches - first)
        await self.commit([NodeUp(self.node_id, self.incarnation)], max(timeout, 0.1))
        log.info("NodeUp applied")
        self._up = True
        self._timers["tick"] = self.loop.call_later(self.config.tick_interval, self._propose_tick)

    def stop(self) -> None:
        for t in self._timers.values():
            t.cancel()
        self.shim.stop()

    # ---------------------------------------------- the shim's Owner (raft thread)
    def apply(self, batch: Batch, index: int, spans: dict[int, tuple[int, int]] | None = None) -> str:
        verdict = batch_verdict(self.state, batch)
        if verdict != APPLIED:
            return verdict
        effects = apply_batch(self.state, batch, index, spans, self.log_reader)
        self.applied_batches += 1
        if self.state.machine_version != self.machine_version:
            self._machine_changed(index)
        me, first = self.node_id, self.first_serial
        # not the effects for connections of an earlier life: replaying the log
        # at start would hold one per publish until the first tick
        mine = [e for e in effects if effect_node(e) == me and effect_serial(e) >= first]
        if mine:
            if spans is not None:
                mine = self.log_reader.resolve(mine)
            self._held.append((index, (batch.node, batch.incarnation, batch.seq), mine))
        return verdict

    def retains(self, first: int, last: int) -> bool:
        """Whether log entries first..last hold bytes of messages the state
        still has (raft thread: the log asks when it would delete a segment)."""
        live = self.state.live
        if not live:
            return False
        lo, hi = first >> BUCKET_SHIFT, last >> BUCKET_SHIFT
        if hi - lo > len(live):
            return any(lo <= b <= hi for b in live)
        return any(b in live for b in range(lo, hi + 1))

    def live_messages(self) -> int:
        return sum(self.state.live.values())

    def membership(self) -> tuple[tuple[tuple[NodeId, str], ...], tuple[NodeId, ...], tuple[NodeId, ...]]:
        st = self.state
        return (tuple((NodeId(n), a) for n, a in st.members.items()),
                tuple(NodeId(n) for n in st.in_sync), tuple(NodeId(n) for n in st.draining))

    def on_tick(self, view: RaftView) -> int | None:
        step = mirror.step(self._gate, view)
        self._gate = step.gate
        self._view = view  # the last view (immutable): per-peer figures for status()
        boot = self._bootstrap() if not view.members else ()
        self._planner, control = in_sync.plan(self._planner, view, self.config.out_of_sync_after, boot)
        self._upgrade, raise_to = upgrade.plan(self._upgrade, view, self.state.machine_version,
                                               self.config.machine_version)
        if raise_to is not None:
            control = [*control, raise_to]
        if control:
            self.loop.call_soon_threadsafe(self._propose_all, control)
        # the model first: a commit() that returns has its change in the model
        self.model_publisher.tick(self.state)
        held = self._held
        n = mirror.release_count((h[0] for h in held), self._gate.released)
        for _ in range(n):
            _i, key, effects = held.popleft()
            self._out.append((key, effects))
        if self._out or self._out_done:
            out, done = self._out, self._out_done
            self._out, self._out_done = [], []
            self.loop.call_soon_threadsafe(self._deliver, out, done)
        self._check_membership()
        return step.announce

    def on_result(self, seq: int, ok: bool, why: str) -> None:
        if not ok:
            self.failed_batches[why] = self.failed_batches.get(why, 0) + 1
        self._out_done.append((seq, why if ok else f"fail:{why}"))

    def snapshot_state(self) -> BrokerState:
        return self.state

    def _machine_changed(self, index: int | None = None) -> None:
        """The cluster's machine version moved (raft thread): what this node
        writes follows it (counted records once no member reads only R/P)."""
        version = self.state.machine_version
        if index is not None and version != self.machine_version:
            log.info("machine version %d from log index %d on", version, index)
        self.machine_version = version
        codec.write_counted(version >= COUNTED_RECORDS)

    def restore_state(self, state: BrokerState, index: int) -> None:
        runs = self.config.machine_version
        if state.machine_version > runs:
            raise too_old(state.machine_version, runs)  # the shim exits (never applied)
        state.runs_version = runs
        state.binding_limits = self.config.binding_limits
        old, self.state = self.state, state
        self.restores += 1
        self._machine_changed(index)
        self.log_reader.clear()
        if not old.members:
            return  # our own dump at start: no client has seen anything yet
        owed = skipped_effects(old, state, self.node_id, self.incarnation)
        if owed:
            log.warning("snapshot at %d skipped changes of %d local connection(s): closing them",
                        index, len(owed))
            self.skipped_closes += len(owed)
            # in log order with the held effects; no batch of ours is behind it
            self._held.append((index, (NodeId(""), 0, 0), owed))

    def _bootstrap(self) -> list[Command]:
        """A new cluster: every configured member in sync, and the first
        leader's configured users with full permissions on "/" (RabbitMQ's
        default_permissions) and the administrator tag (default_user_tags)."""
        cmds: list[Command] = [SetMember(self.node_id, self.address, True)]
        cmds += [SetMember(n, a, True) for n, a in self.config.peers.items()]
        cmds += [UserPut(n, h, ("administrator",)) for n, h in self.seed_users.items()]
        cmds += [PermissionSet(n, DEFAULT_VHOST, ".*", ".*", ".*") for n in self.seed_users]
        return cmds

    def _check_membership(self) -> None:
        members = self.state.members
        if self.node_id in members:
            self._was_member = True
        elif self._was_member and members and not self._removed:
            self._removed = True
            self.loop.call_soon_threadsafe(self._on_removed)

    # --------------------------------------------------------- loop thread
    def propose(self, cmd: Command, size: int = 0) -> None:
        if self.config.unsafe_early_confirm and isinstance(cmd, BasicPublish) and cmd.seq:
            self._early.add((cmd.chan, cmd.seq))
            early: list[Effect] = [Confirm(cmd.chan, cmd.seq, True)]
            self.loop.call_soon(self.sink, early)
        kind = type(cmd)
        if kind is BasicPublish:
            self.published += 1
        elif kind is BasicAck:
            self.acked += 1
        flush = self.pipeline.add(cmd, size)
        if flush is Flush.NOW:
            self._flush()
        elif flush is Flush.SOON:
            self.loop.call_soon(self._flush)
        elif flush is Flush.LINGER:
            self.loop.call_later(self.config.batch_linger, self._flush)

    def _propose_all(self, cmds: list[Command]) -> None:
        for cmd in cmds:
            self.propose(cmd, 0)

    def _flush(self) -> None:
        batch = self.pipeline.cut(clock(), time.time())
        if batch is not None:
            self._submit(batch)

    def _submit(self, batch: Batch) -> None:
        seq = batch.seq

        def done(ok: bool, why: str) -> None:
            self.on_result(seq, ok, why)

        self.shim.propose(batch, done)

    async def commit(self, cmds: list[Command], timeout: float = 30.0) -> None:
        """Propose `cmds` now (after what is queued) and wait until applied here."""
        seq, batches = self.pipeline.send_now(cmds, clock(), time.time())
        for batch in batches:
            self._submit(batch)
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiters[seq] = fut
        await asyncio.wait_for(fut, timeout)

    def _deliver(self, out: list[tuple[BatchKey, list[Effect]]], done: list[tuple[int, str]]) -> None:
        effects: list[Effect] = []
        me, inc = self.node_id, self.incarnation
        pipeline = self.pipeline
        now = clock()
        for (node, incarnation, seq), group in out:
            ours = node == me and incarnation == inc
            if ours and pipeline.abandoned(seq):
                # already nacked: a late outcome must not confirm it too (S15)
                group = [e for e in group if not isinstance(e, Confirm | Return)]
            if self._early:
                group = self._drop_early_confirms(group)
            effects.extend(group)
            confirms = self._count(group)
            sent_at = pipeline.sent_at(seq) if ours else None
            if confirms and sent_at is not None:
                # from the batch leaving for the log to its confirms leaving the node
                self.confirm_latency.observe(now - sent_at, confirms)
        for seq, verdict in done:
            ok = verdict in (APPLIED, DUPLICATE)
            if pipeline.outcome(seq, ok, now) and self._resend_handle is None:
                log.info("batch %d: %s, resending", seq, verdict)
                self._resend_handle = self.loop.call_later(0.05, self._resend)
            if ok:
                fut = self._waiters.pop(seq, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
        if effects:
            self.sink(effects)
        if pipeline.relieved():
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
        for batch in self.pipeline.resend(clock()):
            self._submit(batch)

    def _watch(self) -> None:
        """Every 250 ms: nack publishes that could not be made safe in time,
        resend what has no outcome, and block publishers while this node
        cannot reach a majority."""
        self._timers["watch"] = self.loop.call_later(0.25, self._watch)
        now = clock()
        w = self.pipeline.watch(now)
        if w.resend and self._resend_handle is None:
            self._resend_handle = self.loop.call_soon(self._resend)
        if w.nacks:
            self.nacked += len(w.nacks)
            log.warning("nacking %d publishes not made safe within %.0fs", len(w.nacks),
                        self.config.nack_after)
            self.sink(list(w.nacks))
        leader = self.shim.leader_address()
        if leader is not None and leader != self._last_leader:
            if self._last_leader is not None:
                self.leader_changes += 1
            self._last_leader = leader
        if not self.shim.has_quorum():
            if self._no_quorum_since is None:
                self._no_quorum_since = now
        else:
            self._no_quorum_since = None
        leaderless = self._no_quorum_since is not None and now - self._no_quorum_since > self.config.block_after
        # the reason clients see (connection.blocked): no majority reachable, or
        # one is but nothing committed for block_after (a slow or stalled member)
        self._blocked = "cluster unavailable: no quorum" if leaderless else \
            f"replication stalled: nothing committed for {self.config.block_after:g} s" if w.stuck else None
        self._stuck = w.stuck

    def _propose_tick(self) -> None:
        self.propose(Tick())
        self._timers["tick"] = self.loop.call_later(self.config.tick_interval, self._propose_tick)

    def _on_removed(self) -> None:
        if self.on_removed is not None:
            self.on_removed("node removed from the cluster")

    # ------------------------------------------------ Raft-level primitives
    async def change_member(self, address: str, add: bool, timeout: float = 30.0) -> None:
        """Add or remove a Raft member (pysyncobj's config change); the
        replicated bookkeeping (SetMember/DropMember) is the caller's."""
        ok, why = await self._ask_raft(lambda done: self.shim.change_member(address, add, done), timeout)
        if not ok:
            raise RuntimeError(f"membership change refused ({why})")

    async def request_transfer(self, address: str | None, timeout: float) -> tuple[bool, str]:
        """Ask pysyncobj to send TimeoutNow (see Administrator.transfer_leadership)."""
        return await self._ask_raft(lambda done: self.shim.transfer(address, done), timeout)

    async def _ask_raft(self, request: Callable[[Callable[[bool, str], None]], None],
                        timeout: float) -> tuple[bool, str]:
        """Make a shim request whose (ok, reason) callback runs on the raft thread."""
        fut: asyncio.Future[tuple[bool, str]] = self.loop.create_future()

        def settle(result: tuple[bool, str]) -> None:
            if not fut.done():
                fut.set_result(result)

        def done(ok: bool, why: str) -> None:
            self.loop.call_soon_threadsafe(settle, (ok, why))

        request(done)
        return await asyncio.wait_for(fut, timeout)

    def add_member_refusal(self) -> str | None:
        return self.shim.add_member_refusal()

    def peer_address(self, node_id: str) -> str | None:
        return self.read_model().members.get(node_id) or self.config.peers.get(node_id)

    async def wait_heard_from(self, address: str, timeout: float) -> None:
        """Until the leader hears from `address` after a few heartbeats from
        now: every AppendEntries sent from now on carries the current commit
        index, and a follower answers only after the tick that applied what it
        learned. Returns at the deadline anyway (a dead node never answers)."""
        since = clock() + 3 * self.shim.append_period()
        deadline = clock() + timeout
        while clock() < deadline and not self.shim.answered_since(address, since):
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------ queries
    def read_model(self) -> ReadModel:
        return self.model_publisher.current

    def add_model_listener(self, cb: Callable[[ReadModel], None]) -> None:
        self.model_publisher.add_listener(cb)

    async def queue_rows(self) -> list[dict[str, Any]]:
        return await self.model_publisher.queue_rows()

    async def management_rows(self) -> Management:
        """Queues, exchanges, bindings, channels, consumers and connections:
        the shared snapshot (row_cache.py), never older than the last batch
        applied when it is returned."""
        return await self.row_cache.get()

    def _state_version(self) -> int:
        """Moves whenever the state does (raft thread writes, the loop reads)."""
        return self.applied_batches + self.restores

    def is_congested(self) -> bool:
        return self.pipeline.congested

    def add_drain_listener(self, cb: Callable[[], None]) -> None:
        self._drain_listeners.append(cb)

    def blocked_reason(self) -> str | None:
        # live for the quorum half: a node that has just found its leader
        # (start, election) must not block connections for up to one more
        # watch period (they would open to connection.blocked, then unblocked)
        if self._blocked is not None and not self._stuck and self.shim.has_quorum():
            return None
        return self._blocked

    def member_id(self, address: str | None) -> str | None:
        if address is None:
            return None
        by_addr = {a: n for n, a in self.read_model().members.items()}
        by_addr.update({a: n for n, a in self.config.peers.items()})
        by_addr[self.address] = self.node_id
        return by_addr.get(address, address)

    def status(self) -> NodeStatus:
        shim = self.shim
        raft = shim.raft_status()
        model = self.read_model()
        members = dict(model.members)
        return NodeStatus(
            node_id=self.node_id,
            role=raft["role"],
            leader=self.member_id(raft["leader"]),
            term=raft["term"],
            commit_index=raft["commit_index"],
            last_applied=raft["last_applied"],
            log_len=raft["log_len"],
            members=list(members) or [self.node_id, *self.config.peers],
            # a restarted member's own log still lists it in sync (the leader's
            # MarkOutOfSync has not reached it): the readiness probe would pass at
            # once and a rolling restart would take a second member down
            in_sync=list(model.in_sync) if self._up else [],
            draining=list(model.draining),
            has_quorum=shim.has_quorum(),
            mirrored_index=self._gate.released,
            blocked=self.blocked_reason() is not None,
            pending_batches=self.pipeline.in_flight(),
            resends=self.pipeline.resends,
            nacked_publishes=self.pipeline.nacked_publishes,
            failed_batches=dict(self.failed_batches),
            queues=model.queue_count,
            journal_flushes=shim.flushes,
            snapshots=shim.snapshots,
            last_snapshot_seconds=round(shim.last_snapshot_seconds, 3),
            last_snapshot_bytes=shim.last_snapshot_bytes,
            applied_batches=self.applied_batches,
            message_bytes=model.message_bytes,
            published=self.published,
            confirmed=self.confirmed,
            nacked=self.nacked,
            delivered=self.delivered,
            redelivered=self.redelivered,
            acked=self.acked,
            leader_changes=self.leader_changes,
            deferred_elections=shim.deferred_elections,
            prevote_rounds=shim.prevote_rounds,
            ignored_votes=shim.ignored_votes,
            fast_elections=shim.fast_elections,
            peer_rejects=shim.peer_rejects(),
            peer_mac_failures=shim.peer_mac_failures(),
            peer_tls=self.peer_security.tls,
            encoded_appends=shim.encoded_appends,
            longest_raft_stall_ms=round(shim.longest_stall * 1000, 1),
            longest_flush_ms=round(shim.longest_flush * 1000, 1),
            journal_write_errors=shim.journal_write_errors,
            journal_flush_errors=shim.journal_flush_errors,
            installed_snapshots=shim.installed_snapshots,
            refused_snapshots=shim.refused_snapshots,
            damaged_snapshots=shim.damaged_snapshots,
            failed_snapshots=shim.failed_snapshots,
            log_segments=shim.log_segments(),
            log_compactions=shim.log_compactions(),
            skipped_closes=self.skipped_closes,
            longest_fork_ms=round(shim.longest_fork * 1000, 1),
            longest_owner_tick_ms=round(shim.longest_owner_tick * 1000, 1),
            forced_compactions=shim.forced_compactions,
            longest_leader_gap_ms=round(shim.longest_leader_gap * 1000, 1),
            longest_send_gap_ms=round(shim.longest_send_gap * 1000, 1),
            in_sync_size=len(model.in_sync),
            machine_version=self.machine_version,
            runs_machine_version=self.config.machine_version,
            confirm_latency=self.confirm_latency.snapshot(),
            peers=peer_rows(self._view, self.member_id),
        )

