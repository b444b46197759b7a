"""pika-side helpers of the cluster tests, bench and soak: declare, drain, pump, and the
checks on what came out (check_delivered, new_leader_time)."""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from harness.body import body_id
from harness.process import Cluster, ClusterNode, wait_for


def drain(node: ClusterNode, queue: str, idle: float = 3.0, timeout: float = 120.0,
          prefetch: int = 500) -> list[tuple[bytes, bool]]:
    """Consume (manual ack) until the queue is empty and nothing arrived for `idle`
    seconds: [(body, redelivered)]."""
    import pika
    params = pika.ConnectionParameters(host=node.host, port=node.amqp_port, heartbeat=0,
                                       socket_timeout=10, blocked_connection_timeout=60,
                                       connection_attempts=3, retry_delay=0.5,
                                       credentials=pika.PlainCredentials(node.user, node.password))
    conn = pika.BlockingConnection(params)
    out: list[tuple[bytes, bool]] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        last = {"t": time.monotonic(), "tag": 0, "unacked": 0}

        def on_msg(chan: Any, method: Any, _props: Any, body: bytes) -> None:
            out.append((body, bool(method.redelivered)))
            last["t"] = time.monotonic()
            last["tag"] = method.delivery_tag
            last["unacked"] += 1
            if last["unacked"] >= prefetch // 4:
                chan.basic_ack(method.delivery_tag, multiple=True)
                last["unacked"] = 0

        tag = ch.basic_consume(queue, on_msg, auto_ack=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
            if last["unacked"]:
                ch.basic_ack(last["tag"], multiple=True)
                last["unacked"] = 0
            if time.monotonic() - last["t"] > idle:
                # cancel before reading the depth, on this channel: deliveries released
                # late (a leader change) come before the CancelOk, and pika requeues
                # those not yet dispatched; a depth read on the side while they were
                # in flight ended the drain with them unread (chaos drain, same fix)
                ch.basic_cancel(tag)
                if last["unacked"]:
                    ch.basic_ack(last["tag"], multiple=True)
                    last["unacked"] = 0
                ready = ch.queue_declare(queue, passive=True).method.message_count
                if ready == 0:
                    break
                tag = ch.basic_consume(queue, on_msg, auto_ack=False)
                last["t"] = time.monotonic()
        else:
            raise AssertionError(f"drain of {queue} on {node.node_id} did not finish in {timeout}s "
                                 f"({len(out)} received)")
        ch.close()
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
    return out


def declare(node: ClusterNode, *queues: str, durable: bool = True,
            arguments: dict[str, Any] | None = None) -> None:
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=node.host, port=node.amqp_port, heartbeat=0, socket_timeout=10,
        credentials=pika.PlainCredentials(node.user, node.password)))
    try:
        ch = conn.channel()
        for q in queues:
            ch.queue_declare(q, durable=durable, arguments=arguments)
    finally:
        conn.close()


def uniq_queue(prefix: str = "cq") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def check_delivered(confirmed: dict[str, set[int]], got: list[tuple[bytes, bool]]) -> dict[str, Any]:
    """Compare confirmed ids per publisher tag with what was delivered."""
    seen: dict[str, dict[int, int]] = {}
    for body, _red in got:
        tag, mid = body_id(body)
        seen.setdefault(tag, {})
        seen[tag][mid] = seen[tag].get(mid, 0) + 1
    lost = {tag: sorted(ids - set(seen.get(tag, {}))) for tag, ids in confirmed.items()}
    dups = sum(c - 1 for per in seen.values() for c in per.values() if c > 1)
    return {"lost": {t: v for t, v in lost.items() if v},
            "lost_count": sum(len(v) for v in lost.values()),
            "duplicates": dups,
            "delivered": len(got)}


def pika_conn(node: ClusterNode, **kw: Any) -> Any:
    import pika
    kw.setdefault("heartbeat", 0)
    kw.setdefault("socket_timeout", 10)
    kw.setdefault("blocked_connection_timeout", 60)
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=node.host, port=node.amqp_port,
        credentials=pika.PlainCredentials(node.user, node.password), **kw))


def queue_counts(node: ClusterNode, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of `queue` on `node` (queue.declare passive, own
    connection)."""
    conn = pika_conn(node)
    try:
        m = conn.channel().queue_declare(queue, passive=True).method
        return int(m.message_count), int(m.consumer_count)
    finally:
        conn.close()


def queue_depth(node: ClusterNode, queue: str) -> int:
    """Ready messages in `queue` on `node`."""
    return queue_counts(node, queue)[0]


def publish_confirmed(node: ClusterNode, queue: str, n: int = 20) -> None:
    """`n` random 1 KiB bodies to `queue` through the default exchange, each
    confirmed (pika raises if one is nacked or unroutable)."""
    conn = pika_conn(node)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for _ in range(n):
            ch.basic_publish("", queue, os.urandom(1024))
    finally:
        conn.close()


def pump(conn: Any, cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Let pika dispatch callbacks until `cond()` holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        conn.process_data_events(time_limit=0.05)


def new_leader_time(cluster: Cluster, survivors: list[ClusterNode], since: float,
                    timeout: float = 30.0) -> tuple[ClusterNode, float]:
    """Poll the survivors' admin Status until they agree on a leader among themselves:
    (leader, seconds since `since`)."""
    ids = {n.node_id for n in survivors}

    def probe() -> ClusterNode | None:
        leader, _why = cluster.leader_view(survivors)
        return leader if leader is not None and leader.node_id in ids else None
    leader = wait_for(probe, timeout=timeout, interval=0.02, what="a new leader among the survivors")
    return leader, time.monotonic() - since
