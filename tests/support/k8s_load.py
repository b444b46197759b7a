"""Load for the Kubernetes tests: an AMQP round trip through one pod, and a
streaming-confirm publisher kept running while the cluster is changed."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika

from harness.body import body_ok
from harness.client import check_delivered, drain, uniq_queue
from harness.publisher import StreamPublisher
from tests.support.k8s_env import Env, PodEndpoint, wait


def amqp_roundtrip(ep: PodEndpoint, queue: str, body: bytes) -> bytes:
    """Publish with a confirm through this pod, then get it back through it."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=ep.host, port=ep.amqp_port, heartbeat=0, socket_timeout=10,
        credentials=pika.PlainCredentials(ep.user, ep.password)))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
        method, _props, got = wait(lambda: (lambda r: r if r[0] else None)(
            ch.basic_get(queue, auto_ack=True)), 10, f"the message on {ep.node_id}")
        return bytes(got)
    finally:
        conn.close()


def one_change_at_a_time(views: list[tuple[float, tuple[str, ...]]]) -> None:
    for (_, a), (_, b) in zip(views, views[1:], strict=False):
        assert len(set(a) ^ set(b)) == 1, f"membership jumped {a} -> {b}: {views}"


def publish_while(env: Env, tag: str, change: Callable[[], None],
                  rate: float | None = None) -> dict[str, Any]:
    """Streaming confirms into a new queue while `change` runs; then every confirmed
    message must be delivered. `rate` caps new messages per second, so that the
    backlog of a change that takes minutes drains in bounded time. The result has
    the publisher's `confirm_times` (monotonic)."""
    queue = uniq_queue(tag)
    eps = env.endpoints()
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=eps[0].host, credentials=pika.PlainCredentials(eps[0].user, eps[0].password)))
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    # random bodies of 1-16 KiB (log-uniform); nothing consumes until the end, so
    # the queue must stay below the memory watermark (values: 1 GiB) or the
    # publisher is blocked (connection.blocked), which is back-pressure, not a fault
    pub = StreamPublisher(tag, queue, env.endpoints, total=None, window=50, size=1024,
                          max_size=16 * 1024, seed=tag, deadline=900, rate=rate)
    pub.start()

    def diag() -> str:
        return f"publisher {pub.summary()} events {pub.events[-10:]}\n{env.diagnostics()}"

    wait(lambda: len(pub.confirmed) > 200, 60, f"{tag}: confirms flowing", diag)
    change()
    mark = time.monotonic()
    wait(lambda: pub.progress_since(mark) > 200, 60, f"{tag}: confirms after the change", diag)
    pub.finish(120)
    assert pub.error is None, pub.summary()
    got = drain(env.endpoints()[0], queue)
    result = check_delivered({tag: pub.confirmed}, got)
    assert all(body_ok(b) for b, _ in got), f"{tag}: a message came back damaged"
    print(f"{tag}: {pub.summary()} -> {result['delivered']} delivered, "
          f"{result['lost_count']} lost, {result['duplicates']} duplicates")
    assert result["lost_count"] == 0, result
    return {**result, "confirm_times": list(pub.confirm_times)}


def delete_leader_pod_and_wait_for_it(env: Env) -> None:
    """Delete the leader's pod; the StatefulSet controller recreates it (a new uid),
    and it comes back in sync under its own name."""
    leader = env.status()["leader"]
    old_uid = env.json("pod", leader)["metadata"]["uid"]
    t0 = time.monotonic()
    env.kubectl("delete", "pod", leader, "--wait=false")
    wait(lambda: env.json("pod", leader)["metadata"]["uid"] != old_uid, 120,
         f"{leader} recreated by the StatefulSet controller", env.diagnostics)
    wait(lambda: env.converged(3), 180, f"{leader} back in sync", env.diagnostics)
    print(f"leader pod {leader} deleted -> recreated and in sync: {time.monotonic() - t0:.1f}s")
    assert env.admin_status(leader)["node_id"] == leader
