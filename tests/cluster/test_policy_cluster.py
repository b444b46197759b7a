"""Policies on a 3-node cluster (issue 28): a policy set through one node's
management API is replicated like every change: a follower caps its queue
at once and shows the policy, and the policies and their effect survive a
restart of the whole cluster (replayed from the log), reaching queues
declared after it."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import requests

from harness.process import Cluster, ClusterNode
from tests.broker_proc import free_port, uniq, wait_for

AUTH = ("guest", "guest")
T = 15.0


def url(node: ClusterNode, path: str) -> str:
    return f"http://{node.host}:{node.http_port}{path}"  # type: ignore[attr-defined]


def get(node: ClusterNode, path: str) -> Any:
    r = requests.get(url(node, path), auth=AUTH, timeout=T)
    assert r.status_code == 200, (node.node_id, path, r.status_code, r.text)
    return r.json()


def publish(node: ClusterNode, queue: str, n: int, declare: bool = True) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        if declare:
            ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        for i in range(n):
            ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()


def capped(node: ClusterNode, queue: str, n: int) -> dict[str, Any] | None:
    row: dict[str, Any] = get(node, f"/api/queues/%2F/{queue}")
    return row if row["messages"] == n and row["policy"] == "cap" else None


def test_a_policy_set_on_one_node_applies_on_a_follower_and_survives_a_restart(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3)
    for n in c.nodes:
        n.http_port = free_port()  # type: ignore[attr-defined]
        n.extra_args += ["--http-port", str(n.http_port)]  # type: ignore[attr-defined]
    c.start()
    leader = c.leader()
    follower = next(n for n in c.nodes if n is not leader)
    q = uniq("pc")
    publish(follower, q, 10)
    r = requests.put(url(leader, "/api/policies/%2F/cap"), auth=AUTH, timeout=T,
                     json={"pattern": "^pc", "definition": {"max-length": 4},
                           "apply-to": "quorum_queues", "priority": 1})
    assert r.status_code == 201, r.text
    row = wait_for(lambda: capped(follower, q, 4), what="the follower to cap the queue")
    assert row["effective_policy_definition"] == {"max-length": 4}

    c.stop_all()
    c.start()
    for n in c.nodes:
        assert [p["name"] for p in get(n, "/api/policies")] == ["cap"]
        wait_for(lambda n=n: capped(n, q, 4), what=f"{n.node_id} to replay the cap")
    q2 = uniq("pc")  # a queue declared after the restart takes the policy too
    publish(c.nodes[2], q2, 9)
    wait_for(lambda: capped(c.nodes[0], q2, 4), what="the new queue's cap")
