"""Issue 14: single active consumer (`x-single-active-consumer`) on a 3-node cluster.

The active consumer sits on a follower; when that node is SIGKILLed the waiting consumer on
another node takes over and receives the dead consumer's unacked messages again, flagged
redelivered and in their original order, then the rest. When the active consumer cancels,
the next one becomes active.

Every connection is driven from the test's thread (pika BlockingConnection, pumped in turn
with a time limit), so what each consumer has seen at any moment is exact.
"""
from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
import pytest

from harness.client import pika_conn, queue_counts, uniq_queue
from harness.process import Cluster, ClusterNode

MESSAGES = 200
PREFETCH = 50
ACKED_BY_FIRST = 10  # the active consumer acks these before its node dies
TAKEOVER_WITHIN = 30.0  # kill -> the waiting consumer has received everything


def body(n: int) -> bytes:
    """Message `n`: its number, then random bytes of a mixed size (16 B..4 KiB)."""
    return f"{n:06d}:".encode() + os.urandom(random.randint(16, 4096))


def number(b: bytes) -> int:
    return int(b.split(b":", 1)[0])


@dataclass
class Delivery:
    n: int
    redelivered: bool
    tag: int
    at: float  # time.monotonic() when pika dispatched it


@dataclass
class Consumer:
    """A pika consumer on one node: what it got, in order; acks on request."""
    node: ClusterNode
    queue: str
    tag: str
    prefetch: int
    auto_ack_each: bool = False  # ack every delivery as it arrives
    conn: Any = None
    ch: Any = None
    got: list[Delivery] = field(default_factory=list)

    def start(self) -> Consumer:
        self.conn = pika_conn(self.node)
        self.ch = self.conn.channel()
        self.ch.basic_qos(prefetch_count=self.prefetch)
        # basic_consume waits for consume-ok: the consumer is registered in the replicated
        # queue state (consume-ok is an effect of applying it) when this returns
        self.ch.basic_consume(self.queue, self._on_message, consumer_tag=self.tag)
        return self

    def _on_message(self, ch: Any, method: Any, props: Any, payload: bytes) -> None:
        n = number(payload)
        assert props.headers and props.headers.get("n") == n, f"header/body mismatch: {props.headers}"
        self.got.append(Delivery(n, bool(method.redelivered), method.delivery_tag, time.monotonic()))
        if self.auto_ack_each:
            ch.basic_ack(method.delivery_tag)

    def pump(self, seconds: float = 0.02) -> None:
        self.conn.process_data_events(time_limit=seconds)

    def close(self) -> None:
        try:
            if self.conn is not None and self.conn.is_open:
                self.conn.close()
        except Exception:  # noqa: BLE001 - its node may be dead
            pass


def pump_until(consumers: list[Consumer], cond: Callable[[], bool], timeout: float,
               what: str) -> float:
    """Pump every consumer in turn until `cond()`; returns the seconds it took."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            counts = {c.tag: len(c.got) for c in consumers}
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (received: {counts})")
        for c in consumers:
            c.pump()
    return time.monotonic() - t0


def pump_for(consumers: list[Consumer], seconds: float) -> None:
    """A bounded look: pump every consumer for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for c in consumers:
            c.pump()


def declare_sac_queue(node: ClusterNode, queue_type: str = "quorum") -> str:
    q = uniq_queue("sac")
    conn = pika_conn(node)
    try:
        conn.channel().queue_declare(q, durable=True, arguments={
            "x-single-active-consumer": True, "x-queue-type": queue_type})
    finally:
        conn.close()
    return q


def publish_confirmed(node: ClusterNode, queue: str, numbers: range) -> None:
    """Persistent messages numbered in a header and at the start of the body, each
    confirmed (pika's BlockingChannel raises on a nack or a return)."""
    conn = pika_conn(node)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for n in numbers:
            ch.basic_publish("", queue, body(n), pika.BasicProperties(
                delivery_mode=2, headers={"n": n}), mandatory=True)
    finally:
        conn.close()


def test_single_active_consumer_on_killed_follower_hands_over_unacked_redelivered_in_order(
        cluster: Cluster) -> None:
    leader = cluster.leader()
    follower_a, follower_b = cluster.followers()
    q = declare_sac_queue(leader)
    first = Consumer(follower_a, q, "first", PREFETCH).start()  # registered first: active
    second = Consumer(follower_b, q, "second", PREFETCH, auto_ack_each=True).start()
    both = [first, second]
    try:
        publish_confirmed(leader, q, range(MESSAGES))
        pump_until(both, lambda: len(first.got) >= PREFETCH, 30,
                   f"the active consumer's first {PREFETCH} deliveries")
        for d in first.got[:ACKED_BY_FIRST]:
            first.ch.basic_ack(d.tag)
        # the acks free prefetch room: the next ACKED_BY_FIRST deliveries come only once
        # the acks are applied, so they are settled in the replicated state
        pump_until(both, lambda: len(first.got) >= PREFETCH + ACKED_BY_FIRST, 30,
                   "deliveries after the active consumer's acks")
        pump_for(both, 0.5)
        held = PREFETCH + ACKED_BY_FIRST
        assert [(d.n, d.redelivered) for d in first.got] == [(n, False) for n in range(held)], \
            "the active consumer gets the queue in order, up to its prefetch"
        assert second.got == [], "the waiting consumer got messages while the first was active"

        t_kill = time.monotonic()
        follower_a.kill9()
        expected = MESSAGES - ACKED_BY_FIRST
        took = pump_until([second], lambda: len(second.got) >= expected, TAKEOVER_WITHIN,
                          f"the waiting consumer to take over all {expected} messages")
        pump_for([second], 0.5)  # nothing beyond: no duplicates
        got = [(d.n, d.redelivered) for d in second.got]
        want = [(n, n < held) for n in range(ACKED_BY_FIRST, MESSAGES)]
        print(f"\nSAC failover: {follower_a.node_id} killed with {held - ACKED_BY_FIRST} unacked; "
              f"{second.node.node_id}'s consumer got its first message "
              f"{second.got[0].at - t_kill:.2f}s and all {expected} {took:.2f}s after the kill")
        diff = [(i, g, w) for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w]
        assert got == want, \
            f"takeover: first differences {diff[:5]}, received {len(got)}, expected {len(want)}"
        assert queue_counts(leader, q) == (0, 1)
    finally:
        for c in both:
            c.close()


@pytest.mark.parametrize("queue_type,consumers_while_waiting", [
    # RabbitMQ 3.10's quorum queue counts only the active consumer in declare-ok
    # (rabbit_fifo:query_stat sizes `consumers`; the waiting ones are kept apart), a
    # classic queue counts every registered consumer
    ("quorum", 1),
    ("classic", 2),
])
def test_single_active_consumer_cancel_makes_next_consumer_active(
        shared_cluster: Cluster, queue_type: str, consumers_while_waiting: int) -> None:
    leader = shared_cluster.leader()
    follower_a, follower_b = shared_cluster.followers()
    q = declare_sac_queue(leader, queue_type)
    first = Consumer(follower_a, q, "first", 10, auto_ack_each=True).start()
    second = Consumer(follower_b, q, "second", 10, auto_ack_each=True).start()
    both = [first, second]
    try:
        publish_confirmed(leader, q, range(20))
        pump_until(both, lambda: len(first.got) >= 20, 30, "the active consumer's 20 messages")
        pump_for(both, 0.3)
        assert [d.n for d in first.got] == list(range(20))
        assert second.got == []
        for node in (leader, follower_a, follower_b):
            assert queue_counts(node, q) == (0, consumers_while_waiting), node.node_id

        first.ch.basic_cancel("first")  # waits for cancel-ok
        publish_confirmed(leader, q, range(20, 40))
        pump_until(both, lambda: len(second.got) >= 20, 30, "the next consumer's 20 messages")
        pump_for(both, 0.3)
        assert [(d.n, d.redelivered) for d in second.got] == [(n, False) for n in range(20, 40)]
        assert len(first.got) == 20, "a cancelled consumer got messages"
        assert queue_counts(follower_a, q) == (0, 1)
    finally:
        for c in both:
            c.close()
