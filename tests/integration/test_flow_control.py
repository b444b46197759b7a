"""The memory alarm (issue 27 item 6): the node compares its resident set with
memory_high_watermark, set HEADROOM above an idle node's RSS. Queued bodies
live in the Raft log, not the heap (issue 27 item 1), so what raises the RSS
here is what a client makes the node hold: an open transaction of random
bodies on another connection (its own buffer set above the headroom). A
confirming publisher of random 1 KiB..64 KiB persistent bodies gets
connection.blocked ("low on memory") and nothing is nacked (no queue bound:
queues are unbounded unless x-max-length says otherwise). Once the holder
hangs up the node hands the freed pages back (malloc_trim), RSS falls under
the watermark, the publisher is unblocked, its later publishes are confirmed,
and a consumer drains every body intact. The figures are read from the node's
Prometheus endpoint (mem_used, mem_limit, mem_alarm), as an operator would."""
from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands as spec
from pamqp.body import ContentBody

from harness.amqp import RawClient
from tests.broker_proc import NodeProcess, uniq, wait_for
from tests.support.memory import idle_rss, metric, rss

pytestmark = [pytest.mark.own_node,
              pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                 reason="needs a mirrorq node of its own")]

MIB = 1024 * 1024
HEADROOM = 60 * MIB  # the watermark above the idle node's RSS
WINDOW = 64  # unconfirmed publishes in flight
HOLD_MAX = 4 * HEADROOM  # the holder's own buffer: the node alarm comes first
HOLD_BODY = 500_000  # bytes per publish in the holder's transaction


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    idle = idle_rss(tmp_path / "probe")
    n = NodeProcess(tmp_path / "data", config=f"memory_high_watermark = {idle + HEADROOM}\n"
                                              f"max_connection_buffer = {HOLD_MAX}\n")
    n.start()
    try:
        yield n
    finally:
        n.kill9()


class Publisher:
    """A confirming publisher with a window; numbers its bodies (first 8 bytes)."""

    def __init__(self, node: NodeProcess, q: str) -> None:
        self.c = RawClient(node)
        self.c.handshake()
        self.c.open_channel(1)
        self.c.call(spec.Queue.Declare(queue=q, durable=True), spec.Queue.DeclareOk)
        self.c.call(spec.Confirm.Select(), spec.Confirm.SelectOk)
        self.q = q
        self.sent = self.acked = self.nacked = 0
        self.digests: list[bytes] = []
        self.rng = random.Random(27)

    def body(self) -> bytes:
        n = len(self.digests)
        data = n.to_bytes(8, "big") + self.rng.randbytes(self.rng.randint(1024, 64 * 1024) - 8)
        self.digests.append(hashlib.sha256(data).digest())
        return data

    def pump(self, timeout: float) -> None:
        """Read what arrives (confirms, blocked/unblocked) for up to `timeout`."""
        if self.c.fill(timeout):
            for _, v in self.c.frames():
                if isinstance(v, spec.Basic.Ack | spec.Basic.Nack):
                    done = v.delivery_tag - (self.acked + self.nacked) if v.multiple else 1
                    if isinstance(v, spec.Basic.Ack):
                        self.acked += done
                    else:
                        self.nacked += done

    def publish_until(self, stop: int | None, timeout: float) -> None:
        """Publish (window permitting, not blocked) until blocked, or `stop` sent."""
        deadline = time.monotonic() + timeout
        while not self.c.blocked and (stop is None or self.sent < stop):
            assert time.monotonic() < deadline, f"not blocked after {self.sent} publishes"
            if self.sent - self.acked - self.nacked < WINDOW:
                self.c.publish("", self.q, self.body(), persistent=True)
                self.sent += 1
                self.pump(0)
            else:
                self.pump(1.0)

    def settle(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.acked + self.nacked < n:
            assert time.monotonic() < deadline, f"{self.acked}+{self.nacked} of {n} confirmed"
            self.pump(1.0)


def queued(node: NodeProcess, q: str) -> int:
    c = RawClient(node)
    try:
        c.handshake()
        c.open_channel(1)
        ok = c.call(spec.Queue.Declare(queue=q, passive=True), spec.Queue.DeclareOk)
        return int(ok.message_count)
    finally:
        c.close()


def drain(node: NodeProcess, q: str, digests: list[bytes], count: int) -> None:
    """Consume `count` messages (acked in batches), each body checked by its
    digest (a body of at most 64 KiB comes in one frame here)."""
    c = RawClient(node)
    try:
        c.handshake()
        c.open_channel(1)
        c.call(spec.Basic.Qos(prefetch_count=500), spec.Basic.QosOk)
        c.call(spec.Basic.Consume(queue=q), spec.Basic.ConsumeOk)
        got, tag = 0, 0
        deadline = time.monotonic() + 120
        while got < count:
            assert time.monotonic() < deadline, f"drained {got} of {count}"
            c.fill(1.0)
            for _, v in c.frames():
                if isinstance(v, spec.Basic.Deliver):
                    tag = v.delivery_tag
                elif isinstance(v, ContentBody):
                    data = bytes(v.value)
                    assert hashlib.sha256(data).digest() == digests[int.from_bytes(data[:8], "big")]
                    got += 1
                    if got % 100 == 0 or got == count:
                        c.send_method(spec.Basic.Ack(delivery_tag=tag, multiple=True), 1)
        c.call(spec.Basic.Qos(prefetch_count=500), spec.Basic.QosOk)  # the last ack was read
    finally:
        c.close()


def hold_until_alarm(node: NodeProcess, q: str) -> RawClient:
    """Another connection publishes random bodies into an open transaction (held
    in the node's heap until commit) until the node-wide alarm blocks it."""
    c = RawClient(node)
    c.handshake()
    c.open_channel(1)
    c.call(spec.Tx.Select(), spec.Tx.SelectOk)
    sent = read = 0
    deadline = time.monotonic() + 60
    while not c.blocked:
        assert sent * HOLD_BODY < HOLD_MAX, "the holder's transaction raised no alarm"
        c.publish("", q, os.urandom(HOLD_BODY))
        c.send_method(spec.Queue.Declare(queue=q, passive=True), 1)  # answered once read
        sent += 1
        while not c.blocked and read < sent:
            assert time.monotonic() < deadline, "the holder was neither read nor blocked"
            c.fill(1.0)
            read += sum(isinstance(v, spec.Queue.DeclareOk) for _, v in c.frames())
    assert c.blocked_reason == "low on memory", c.blocked_reason
    return c


def test_memory_alarm_blocks_publishers_nothing_nacked_drain_unblocks(node: NodeProcess) -> None:
    q = uniq("alarm")
    p = Publisher(node, q)
    holder: RawClient | None = None
    try:
        p.publish_until(300, timeout=60)  # under the watermark: all taken
        p.settle(300, timeout=60)
        assert p.nacked == 0
        holder = hold_until_alarm(node, q)
        p.publish_until(None, timeout=60)
        assert p.c.blocked_reason == "low on memory"
        limit = metric(node, "mem_limit")
        assert metric(node, "mem_alarm") == 1 and metric(node, "mem_used") > limit
        # what the node read before blocking is queued and confirmed (the rest of
        # the window waits unread in the socket until the alarm clears)
        def settled() -> bool:
            p.pump(0.2)
            return p.acked + p.nacked == queued(node, q)
        wait_for(settled, timeout=60, what="the read publishes confirmed")
        blocked_at = p.sent
        print(f"blocked after {blocked_at} publishes, RSS {rss(node) / MIB:.0f} MiB, "
              f"watermark {limit / MIB:.0f} MiB")
        assert p.nacked == 0 and p.acked > 0
        holder.abort()  # its transaction is freed: RSS falls once trimmed
        holder = None
        wait_for(lambda: metric(node, "mem_alarm") == 0, timeout=30,
                 what=f"the alarm to clear (RSS {rss(node) / MIB:.0f} MiB)")
        assert metric(node, "mem_used") <= limit
        deadline = time.monotonic() + 20
        while p.c.blocked:
            assert time.monotonic() < deadline, "no connection.unblocked"
            p.pump(1.0)
        p.publish_until(blocked_at + 200, timeout=60)
        p.settle(p.sent, timeout=60)
        assert p.nacked == 0 and p.acked == p.sent
        drain(node, q, p.digests, p.acked)
    finally:
        if holder is not None:
            holder.abort()
        p.c.close()
