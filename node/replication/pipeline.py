"""The proposal pipeline (sans-IO): batching, linger, resends, the nack deadline.

A node's commands go to the log in Batches (one Raft entry each) numbered by
seq; apply takes a node's batches once each, in seq order. The pipeline
decides, and the raft node carries out; it reads no clock (time is passed
in) and does no I/O. The rules, tested in tests/unit/replication/test_pipeline.py:

P1 a batch is cut when it holds batch_max_commands or batch_max_bytes; else
   at once while fewer than `linger_after` batches are in flight (latency),
   else after a linger (more commands per Raft entry under load).
P2 a batch that fails (no leader, a leader change, a gap before it) is sent
   again with every batch after it (go-back-N with the same seqs: apply
   drops duplicates); new batches wait behind a resend, keeping the order.
P3 a batch without an outcome after block_after while nothing progressed for
   block_after (a forward lost with its leader) is resent the same way, and
   the pipeline reports itself stuck (publishers get blocked).
P4 the publishes of a batch not made safe within nack_after are nacked once;
   a late outcome of that batch must not confirm them (S15, S16, S26).
P5 congestion: more than max_inflight batches or bytes unresolved; it ends
   (drain listeners) below half of both.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from node.broker.ids import NodeId
from node.replication.command import BasicPublish, Batch, Command
from node.replication.effect import Confirm


class Flush(Enum):
    NONE = 0  # a flush is already due
    NOW = 1  # full: cut it now
    SOON = 2  # at the end of this loop iteration
    LINGER = 3  # after the linger


@dataclass(frozen=True, slots=True)
class Limits:
    batch_max_commands: int = 128
    batch_max_bytes: int = 512 * 1024
    max_inflight_batches: int = 64
    max_inflight_bytes: int = 32 * 1024 * 1024
    linger_after: int = 2
    block_after: float = 2.0
    nack_after: float = 10.0


@dataclass(slots=True)
class Pending:
    batch: Batch
    size: int
    sent_at: float
    resent_at: float = 0.0
    abandoned: bool = False


@dataclass(frozen=True, slots=True)
class Watch:
    nacks: list[Confirm]  # P4: publishes to nack now
    resend: bool  # P3: call resend()
    stuck: bool  # P3: batches without outcome and no progress


class Pipeline:
    def __init__(self, node: NodeId, incarnation: int, limits: Limits) -> None:
        self.node, self.incarnation, self.limits = node, incarnation, limits
        self._queued: list[Command] = []
        self._queued_bytes = 0
        self._flush_due = False
        self._seq = 0
        self._pending: dict[int, Pending] = {}  # unresolved, by seq (ascending)
        self._pending_bytes = 0
        self._resend_from: int | None = None  # a resend is due from this seq
        self._abandoned: set[int] = set()
        self.congested = False
        self.last_progress = 0.0
        self.resends = 0
        self.nacked_publishes = 0

    # -------------------------------------------------------------- queueing
    def add(self, cmd: Command, size: int) -> Flush:
        self._queued.append(cmd)
        self._queued_bytes += size
        lim = self.limits
        if len(self._queued) >= lim.batch_max_commands or self._queued_bytes >= lim.batch_max_bytes:
            return Flush.NOW  # P1
        if self._flush_due:
            return Flush.NONE
        self._flush_due = True
        return Flush.SOON if len(self._pending) < lim.linger_after else Flush.LINGER

    def cut(self, now: float, wall: float) -> Batch | None:
        """The queued commands as the next batch; returns it if it is to be
        submitted now (not while a resend is due: it goes out with that)."""
        self._flush_due = False
        if not self._queued:
            return None
        cmds, size = self._queued, self._queued_bytes
        self._queued, self._queued_bytes = [], 0
        return self._open(cmds, size, now, wall)

    def send_now(self, cmds: list[Command], now: float, wall: float) -> tuple[int, list[Batch]]:
        """Commands that must not wait (admin, bookkeeping): cut what is queued
        first (FIFO), then these; returns their seq and the batches to submit."""
        out = []
        first = self.cut(now, wall)
        if first is not None:
            out.append(first)
        batch = self._open(cmds, 0, now, wall)
        if batch is not None:
            out.append(batch)
        return self._seq, out

    def _open(self, cmds: list[Command], size: int, now: float, wall: float) -> Batch | None:
        self._seq += 1
        batch = Batch(self.node, self.incarnation, self._seq, wall, cmds)
        self._pending[self._seq] = Pending(batch, size, now)
        self._pending_bytes += size
        lim = self.limits
        if len(self._pending) > lim.max_inflight_batches or self._pending_bytes > lim.max_inflight_bytes:
            self.congested = True  # P5
        return batch if self._resend_from is None else None  # P2: keep the order

    # -------------------------------------------------------------- outcomes
    def outcome(self, seq: int, ok: bool, now: float) -> bool:
        """A batch's outcome from the log: applied (or a duplicate of an applied
        one) or failed. True if a resend became due (call resend() soon)."""
        pending = self._pending.get(seq)
        if pending is None:
            return False
        if ok:
            self.last_progress = now
            del self._pending[seq]
            self._pending_bytes -= pending.size
            # stays abandoned: its effects may arrive after its outcome (P4)
            return False
        due = self._resend_from is None
        if due or seq < self._resend_from:  # type: ignore[operator]
            self._resend_from = seq  # P2
        return due

    def resend(self, now: float) -> list[Batch]:
        start, self._resend_from = self._resend_from, None
        if start is None:
            return []
        out = []
        for seq, pending in self._pending.items():
            if seq >= start:
                self.resends += 1
                pending.resent_at = now
                out.append(pending.batch)
        return out

    def relieved(self) -> bool:
        """True once, when congestion ends (P5)."""
        lim = self.limits
        if self.congested and len(self._pending) <= lim.max_inflight_batches // 2 \
                and self._pending_bytes <= lim.max_inflight_bytes // 2:
            self.congested = False
            return True
        return False

    def watch(self, now: float) -> Watch:
        lim = self.limits
        nacks: list[Confirm] = []
        stuck = resend = False
        idle = now - self.last_progress > lim.block_after
        for seq, pending in self._pending.items():
            age = now - pending.sent_at
            if idle and age > lim.block_after:
                stuck = True  # P3
                if now - pending.resent_at > lim.block_after and self._resend_from is None:
                    self._resend_from = seq
                    resend = True
            if age > lim.nack_after and not pending.abandoned:  # P4
                pending.abandoned = True
                self._abandoned.add(seq)
                nacks.extend(Confirm(c.chan, c.seq, False) for c in pending.batch.commands
                             if isinstance(c, BasicPublish) and c.seq)
        self.nacked_publishes += len(nacks)
        return Watch(nacks, resend, stuck)

    # --------------------------------------------------------------- queries
    def abandoned(self, seq: int) -> bool:
        return seq in self._abandoned

    def sent_at(self, seq: int) -> float | None:
        pending = self._pending.get(seq)
        return None if pending is None else pending.sent_at

    def in_flight(self) -> int:
        return len(self._pending)

    def pending(self) -> Iterator[Pending]:
        return iter(self._pending.values())
