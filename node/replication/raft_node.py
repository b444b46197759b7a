"""The Raft adapter: the only module that imports pysyncobj.

Threads: the asyncio loop proposes commands (batched here) and receives
effects; a dedicated raft thread ticks SyncObj, applies committed batches to
the pure state machine and flushes the journal. Hand-off back to the loop is
one call_soon_threadsafe per tick.

Durability: pysyncobj writes its journal through mmap and never syncs it. We
flush it (msync) in an on-tick callback, which pysyncobj runs after
appending the tick's new entries and before the next tick's commit step; so
on a single node every entry is on disk before it is committed and before any
effect of it (a confirm, a declare-ok) leaves the node. One flush per tick
covers every entry appended in it: group commit.
"""
from __future__ import annotations

import asyncio
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from node.replication.command import Batch, Command, NodeUp, Tick
from node.replication.effect import Effect, effect_node
from node.replication.port import EffectSink
from node.replication.state_machine import BrokerState, apply_batch, default_state, failure_effects

log = logging.getLogger(__name__)

SNAPSHOT_PROTOCOL = pickle.HIGHEST_PROTOCOL  # protocol 5: bodies copied as raw bytes, not protocol-2 strings


@dataclass
class RaftConfig:
    host: str = "127.0.0.1"
    port: int = 25672
    peers: dict[str, str] = field(default_factory=dict)  # node id -> host:port (others)
    join: bool = False  # joining a running cluster: wait to hear a leader before campaigning
    password: str | None = None
    batch_max_commands: int = 128
    batch_max_bytes: int = 512 * 1024  # well under append_entries_batch_bytes
    append_entries_batch_bytes: int = 4 * 1024 * 1024
    max_inflight_batches: int = 64
    max_inflight_bytes: int = 32 * 1024 * 1024
    idle_tick: float = 0.02
    tick_interval: float = 1.0  # Tick command (TTL / x-expires)
    election_min: float = 0.4
    election_max: float = 1.0
    leader_fallback: float = 5.0
    compaction_min_entries: int = 2000
    compaction_min_time: float = 120.0


class _BrokerLog(SyncObj):  # type: ignore[misc]
    """SyncObj whose single replicated method applies one Batch."""

    def __init__(self, owner: RaftNode, self_addr: str, others: list[str], conf: SyncObjConf) -> None:
        self._owner = owner
        super().__init__(self_addr, others, conf)

    @replicated  # type: ignore[misc]
    def apply(self, batch: Batch) -> None:
        self._owner._apply(batch)

    def journal_flush(self) -> None:
        # The journal object is private to SyncObj; flush() is its public method.
        self._SyncObj__raftLog.flush()

    def wake(self) -> None:
        """Make the coming poll return at once (uncommitted entries wait for
        the next tick's commit step, so sleeping there costs a full tick)."""
        self._SyncObj__pipeNotifier.notify()

    def last_log_index(self) -> int:
        log_ = self._SyncObj__raftLog
        return int(log_[-1][1]) if len(log_) else 0


class RaftNode:
    """Implements node.replication.port.Proposer on top of pysyncobj."""

    def __init__(self, node_id: str, data_dir: str, loop: asyncio.AbstractEventLoop,
                 sink: EffectSink, config: RaftConfig) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.loop = loop
        self.sink = sink
        self.config = config
        self.incarnation = time.time_ns()
        self.state: BrokerState = default_state()
        # loop-thread state
        self._batch: list[Command] = []
        self._batch_bytes = 0
        self._flush_scheduled = False
        self._seq = 0
        self._inflight: dict[int, tuple[Batch, int]] = {}
        self._inflight_bytes = 0
        self._congested = False
        self._drain_listeners: list[Callable[[], None]] = []
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._tick_handle: asyncio.TimerHandle | None = None
        # raft-thread state, handed over once per tick
        self._out_effects: list[Effect] = []
        self._out_done: list[tuple[int, int]] = []  # (seq, fail reason)
        self._flushed_index = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._syncobj: _BrokerLog | None = None
        self.flushes = 0
        self.applied_batches = 0

    # ---------------------------------------------------------------- life
    def start(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        c = self.config
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,  # wake the poller on every proposal: latency
            journalFile=os.path.join(self.data_dir, "raft.journal"),
            fullDumpFile=os.path.join(self.data_dir, "raft.dump"),  # never journal without dump
            serializer=self._serialize,
            deserializer=self._deserialize,
            appendEntriesBatchSizeBytes=c.append_entries_batch_bytes,
            raftMinTimeout=c.election_min,
            raftMaxTimeout=c.election_max,
            appendEntriesPeriod=min(0.1, c.election_min / 4),
            leaderFallbackTimeout=c.leader_fallback,
            logCompactionMinEntries=c.compaction_min_entries,
            logCompactionMinTime=c.compaction_min_time,
            password=c.password,
            commandsQueueSize=0,
        )
        self_addr = f"{c.host}:{c.port}"
        self._syncobj = _BrokerLog(self, self_addr, list(c.peers.values()), conf)
        self._syncobj.addOnTickCallback(self._on_tick)
        self._thread = threading.Thread(target=self._run, name=f"raft-{self.node_id}", daemon=True)
        self._thread.start()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Leader known, log applied, and our NodeUp applied."""
        deadline = time.monotonic() + timeout
        so = self._syncobj
        assert so is not None
        while not (so.isReady() and so._getLeader() is not None):
            if time.monotonic() > deadline:
                raise TimeoutError("raft did not become ready")
            await asyncio.sleep(0.02)
        seq = self._send_now([NodeUp(self.node_id, self.incarnation)])
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiters[seq] = fut
        await asyncio.wait_for(fut, max(0.1, deadline - time.monotonic()))
        self._tick_handle = self.loop.call_later(self.config.tick_interval, self._propose_tick)

    def stop(self) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._syncobj is not None:
            self._syncobj.destroy()  # flushes and closes the journal

    def _run(self) -> None:
        so = self._syncobj
        assert so is not None
        while not self._stop.is_set():
            try:
                so.doTick(self.config.idle_tick)
            except Exception:  # noqa: BLE001 - a bad tick must not kill replication
                log.exception("raft tick failed")
                time.sleep(0.05)

    # ------------------------------------------------------- raft thread
    def _apply(self, batch: Batch) -> None:
        effects = apply_batch(self.state, batch)
        self.applied_batches += 1
        me = self.node_id
        self._out_effects.extend(e for e in effects if effect_node(e) == me)

    def _on_result(self, seq: int, _res: Any, err: int) -> None:
        self._out_done.append((seq, err))

    def _on_tick(self) -> None:
        so = self._syncobj
        assert so is not None
        last = so.last_log_index()
        if last != self._flushed_index:
            so.journal_flush()
            self._flushed_index = last
            self.flushes += 1
        if not self.config.peers and so.raftCommitIndex < last:
            so.wake()  # alone, nothing else would wake us to commit
        if self._out_effects or self._out_done:
            effects, done = self._out_effects, self._out_done
            self._out_effects, self._out_done = [], []
            self.loop.call_soon_threadsafe(self._deliver, effects, done)

    def _serialize(self, filename: str, raft_data: Any) -> None:
        # Runs in the raft thread between applies, so the state is consistent.
        with open(filename, "wb") as f:
            pickle.dump((self.state, raft_data), f, protocol=SNAPSHOT_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())

    def _deserialize(self, filename: str) -> Any:
        with open(filename, "rb") as f:
            state, raft_data = pickle.load(f)
        self.state = state
        return raft_data

    # --------------------------------------------------------- loop thread
    def propose(self, cmd: Command, size: int = 0) -> None:
        self._batch.append(cmd)
        self._batch_bytes += size
        if len(self._batch) >= self.config.batch_max_commands or self._batch_bytes >= self.config.batch_max_bytes:
            self._flush_batch()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_batch)

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
        self._inflight[seq] = (batch, size)
        self._inflight_bytes += size
        so = self._syncobj
        assert so is not None
        so.apply(batch, callback=lambda res, err, s=seq: self._on_result(s, res, err))
        if not self._congested and (len(self._inflight) > self.config.max_inflight_batches
                                    or self._inflight_bytes > self.config.max_inflight_bytes):
            self._congested = True
        return seq

    def _deliver(self, effects: list[Effect], done: list[tuple[int, int]]) -> None:
        for seq, err in done:
            entry = self._inflight.pop(seq, None)
            if entry is None:
                continue
            batch, size = entry
            self._inflight_bytes -= size
            if err != FAIL_REASON.SUCCESS:
                log.warning("batch %d not committed (reason %s)", seq, err)
                effects.extend(e for e in failure_effects(batch) if effect_node(e) == self.node_id)
            fut = self._waiters.pop(seq, None)
            if fut is not None and not fut.done():
                if err == FAIL_REASON.SUCCESS:
                    fut.set_result(None)
                else:
                    fut.set_exception(RuntimeError(f"batch failed: {err}"))
        if effects:
            self.sink(effects)
        if self._congested and len(self._inflight) <= self.config.max_inflight_batches // 2 \
                and self._inflight_bytes <= self.config.max_inflight_bytes // 2:
            self._congested = False
            for cb in list(self._drain_listeners):
                cb()

    def _propose_tick(self) -> None:
        self.propose(Tick())
        self._tick_handle = self.loop.call_later(self.config.tick_interval, self._propose_tick)

    def is_congested(self) -> bool:
        return self._congested

    def add_drain_listener(self, cb: Callable[[], None]) -> None:
        self._drain_listeners.append(cb)

    def message_bytes(self) -> int:
        return int(self.state.message_bytes)

    def status(self) -> dict[str, Any]:
        so = self._syncobj
        assert so is not None
        st = so.getStatus()
        return {
            "node_id": self.node_id,
            "role": {0: "follower", 1: "candidate", 2: "leader"}.get(st.get("state"), str(st.get("state"))),
            "leader": str(st.get("leader")) if st.get("leader") is not None else None,
            "term": st.get("raft_term"),
            "commit_index": st.get("commit_idx"),
            "last_applied": st.get("last_applied"),
            "log_len": st.get("log_len"),
            "inflight_batches": len(self._inflight),
            "journal_flushes": self.flushes,
            "applied_batches": self.applied_batches,
            "message_bytes": self.message_bytes(),
        }
