"""Property test: random interleavings never lose or duplicate a message.

A model follows the effects (deliveries, gets) and the commands (acks, nacks,
recover, close) and, after every batch, checks the state against it: every
published message is in exactly one place (ready in one queue, unacked on
exactly one channel, or settled), and delivery tags per channel run 1, 2, 3...

Two channels live on node n1 and one on n2, which the leader may declare down
(S25: its unacked deliveries go back and reach n1's consumers; its client
reconnects). Batches are numbered per node like the Raft adapter does, with
retries: already applied batches are delivered again, and a batch may arrive
ahead of a missing one (a gap) and must change nothing; each batch applies
exactly once, in its proposer's order.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.broker.ids import ChanId
from node.replication.command import (
    APPLIED,
    DUPLICATE,
    GAP,
    BasicCancel,
    BasicCredit,
    BasicQos,
    BasicRecover,
    Batch,
    ChannelClose,
    ChannelOpen,
    Command,
    NodeDown,
)
from node.replication.effect import ChannelError, ConnectionFailure, Deliver, Effect, GetOk
from node.replication.machine import (
    apply_batch,
    batch_verdict,
    default_state,
)
from tests.support.machine import (
    Harness,
    ack,
    consume,
    get,
    nack,
    pub,
    qdecl,
    reject,
)
from tests.support.snapshot import snapshot_bytes

QUEUES = ("q0", "q1")
# weighted: publishes and gets often enough that several deliveries are outstanding
OPS = ("publish",) * 5 + ("get",) * 2 + (
    "consume", "cancel", "ack", "ack_multi", "nack", "reject", "recover", "close", "qos",
    "credit", "node_down", "dup", "dup", "gap")
NODES = ("n1", "n1", "n2")  # node of each channel slot

op_st = st.tuples(st.sampled_from(OPS), st.integers(0, 2), st.integers(0, 1),
                  st.booleans(), st.integers(0, 4))


class Model:
    def __init__(self) -> None:
        self.h = Harness()
        self.next_seq = {"n1": 1, "n2": 1}
        self.log: list[Batch] = []
        self.serial = 0
        self.conn = {"n1": 1, "n2": 100}
        self.slots: list[ChanId] = [self.new_chan(n) for n in NODES]
        self.apply(*(qdecl(self.slots[0], q) for q in QUEUES))
        self.published: list[bytes] = []
        self.settled: set[bytes] = set()
        # chan -> tag -> body, for manual-ack deliveries the client holds
        self.out: dict[ChanId, dict[int, bytes]] = {c: {} for c in self.slots}
        self.last_tag: dict[ChanId, int] = {c: 0 for c in self.slots}
        self.ctags = 0

    def apply(self, *cmds: Command, node: str = "n1") -> list[Effect]:
        """One batch of `node`, numbered like the adapter numbers them."""
        seq = self.next_seq[node]
        self.next_seq[node] = seq + 1
        b = Batch(node, 1, seq, self.h.now, list(cmds))
        self.log.append(b)
        assert batch_verdict(self.h.state, b) == APPLIED
        fx = apply_batch(self.h.state, b)
        assert self.h.state.dedup[(node, 1)] == self.next_seq[node]
        return fx

    def new_chan(self, node: str) -> ChanId:
        self.serial += 1
        c = ChanId(node, self.conn[node], self.serial)
        self.apply(ChannelOpen(c), node=node)
        return c

    def reopen(self, slot: int) -> ChanId:
        c = self.new_chan(NODES[slot])
        self.slots[slot] = c
        self.out[c] = {}
        self.last_tag[c] = 0
        return c

    def step(self, op: str, slot: int, qi: int, flag: bool, n: int) -> None:
        c = self.slots[slot]
        node = NODES[slot]
        if op == "gap":
            # a batch ahead of one that has not arrived: ignored entirely
            ahead = Batch(node, 1, self.next_seq[node] + 1 + n, self.h.now,
                          [pub(c, QUEUES[qi], b"never")])
            before = snapshot_bytes(self.h.state)
            assert batch_verdict(self.h.state, ahead) == GAP
            assert apply_batch(self.h.state, ahead) == []
            assert snapshot_bytes(self.h.state) == before
            return
        if op == "dup":
            if self.log:
                b = self.log[(-1 - n if flag else n) % len(self.log)]
                self.log.append(b)
                assert batch_verdict(self.h.state, b) == DUPLICATE
                assert apply_batch(self.h.state, b) == [], "a batch applies once"
                self.check()
            return
        if op == "node_down":
            self.node_down()
            return
        q = QUEUES[qi]
        outstanding = list(self.out[c])
        tag = outstanding[min(n, len(outstanding) - 1)] if outstanding and n < 4 else n + 50
        cmd: Command
        if op == "publish":
            body = str(len(self.published)).encode()
            self.published.append(body)
            cmd = pub(c, q, body)
        elif op == "consume":
            self.ctags += 1
            cmd = consume(c, q, f"t{self.ctags}", no_ack=flag, credit=n + 1)
        elif op == "cancel":
            ch = self.h.state.channels[c]
            tags = list(ch.consumers)
            cmd = BasicCancel(c, tags[n % len(tags)] if tags else "none", False)
        elif op == "ack":
            cmd = ack(c, tag)
        elif op == "ack_multi":
            cmd = ack(c, 0 if flag else tag, multiple=True)
        elif op == "nack":
            cmd = nack(c, tag, multiple=n % 2 == 0, requeue=flag)
        elif op == "reject":
            cmd = reject(c, tag, requeue=flag)
        elif op == "recover":
            cmd = BasicRecover(c)
        elif op == "close":
            cmd = ChannelClose(c, True)
        elif op == "get":
            cmd = get(c, q, no_ack=flag)
        elif op == "qos":
            cmd = BasicQos(c, n, flag)
        else:
            ch = self.h.state.channels[c]
            tags = list(ch.consumers)
            cmd = BasicCredit(c, tags[n % len(tags)] if tags else "none", n)
        fx = self.apply(cmd, node=node)
        self.observe(cmd, op, fx)
        if c not in self.h.state.channels:
            self.reopen(slot)
        self.check()

    def node_down(self) -> None:
        """The leader (n1) declares n2 down: n2's client loses its deliveries
        (returned, redelivered) and reconnects with a new connection."""
        c = self.slots[2]
        fx = self.apply(NodeDown("n2"))
        assert [e for e in fx if isinstance(e, ConnectionFailure)] == [
            ConnectionFailure(c.conn_id, 320,
                            "CONNECTION_FORCED - node n2 was declared down by the cluster",
                            0, 0)]
        assert not any(e.chan.node == "n2" for e in fx if isinstance(e, Deliver))
        self.out[c].clear()
        self.conn["n2"] += 1
        self.observe(None, "node_down", fx)
        self.reopen(2)
        self.check()

    def observe(self, cmd: Command | None, op: str, fx: list[Effect]) -> None:
        c = None if cmd is None else cmd.chan  # type: ignore[union-attr]
        failed = any(isinstance(e, ChannelError) for e in fx)
        if c is None:
            pass  # node_down: handled by the caller
        elif failed or op in ("close", "recover"):
            self.out[c].clear()  # requeued (S06, S08, S12)
        elif op in ("ack", "ack_multi", "nack", "reject"):
            t, multiple = cmd.delivery_tag, cmd.multiple  # type: ignore[union-attr]
            if op == "reject":
                multiple = False
            covered = [x for x in self.out[c]
                       if (multiple and (t == 0 or x <= t)) or x == t]
            requeue = op in ("nack", "reject") and cmd.requeue  # type: ignore[union-attr]
            for x in covered:
                body = self.out[c].pop(x)
                if not requeue:
                    self.settled.add(body)
        for e in fx:
            if isinstance(e, Deliver | GetOk):
                assert e.delivery_tag == self.last_tag[e.chan] + 1, "tags grow by one (S01)"
                self.last_tag[e.chan] = e.delivery_tag
                no_ack = (isinstance(e, GetOk) and cmd.no_ack  # type: ignore[union-attr]
                          ) or (isinstance(e, Deliver) and self.consumer_no_ack(e))
                if no_ack:
                    assert e.body not in self.settled
                    self.settled.add(e.body)
                else:
                    self.out[e.chan][e.delivery_tag] = e.body

    def consumer_no_ack(self, e: Deliver) -> bool:
        ch = self.h.state.channels.get(e.chan)
        if ch is not None and e.consumer_tag in ch.consumers:
            return ch.consumers[e.consumer_tag].no_ack
        # consumer gone in the same batch: not with single-command batches
        raise AssertionError("delivery from an unknown consumer")

    def check(self) -> None:
        s = self.h.state
        seen: Counter[bytes] = Counter()
        for q in s.queues.values():
            for _, m in q.returned:
                seen[m.body] += 1
            for m in q.ready:
                seen[m.body] += 1
        for cid, ch in s.channels.items():
            held = {t: m.body for t, (_, m, _) in ch.unacked.items()}
            assert held == self.out.get(cid, {}), "unacked matches what the client holds"
            for b in held.values():
                seen[b] += 1
        for b in self.settled:
            seen[b] += 1
        # internal counters agree with the records they summarise
        for q in s.queues.values():
            assert q.ready_bytes == sum(m.size for _, m in q.returned) + sum(
                m.size for m in q.ready)
            for c in q.consumers.values():
                assert c.channel.consumers[c.tag] is c
        for ch in s.channels.values():
            per_consumer = Counter(c.tag for _, _, c in ch.unacked.values() if c is not None)
            assert ch.limited_unacked == sum(per_consumer.values())
            for tag, c in ch.consumers.items():
                assert c.unacked == per_consumer[tag]
                assert c.queue.consumers[(ch.id, tag)] is c
        dup = [b for b, k in seen.items() if k != 1]
        assert not dup, f"duplicated: {dup}"
        assert set(seen) == set(self.published), "lost or unknown messages"
        assert s.message_bytes == sum(
            len(b) for b in self.published if b not in self.settled)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, min_size=20, max_size=80))
def test_no_message_lost_or_duplicated(ops: list[tuple[str, int, int, bool, int]]) -> None:
    m = Model()
    for op in ops:
        m.step(*op)
    # determinism: another node folding the same log reaches the same state
    other = default_state()
    for b in m.log:
        apply_batch(other, b)
    assert snapshot_bytes(other) == snapshot_bytes(m.h.state)
