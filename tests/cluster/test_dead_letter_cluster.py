"""At-least-once dead-lettering on a 3-node cluster (issue 28, machine
version 5): the dead letters a quorum queue keeps are replicated state, in
every member's snapshots (the dead-letter section) and log. After SIGKILL of
the leader, and the killed member's restart from its own snapshot and log,
every member still shows them (messages_dlx), and once a queue is bound to
the dead-letter exchange each kept message reaches it exactly once, intact
(S25: a minority lost loses nothing that was confirmed)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import requests

from harness.body import body_ok, make_body
from harness.client import pika_conn
from harness.process import Cluster, ClusterNode, wait_for
from node.replication.machine.version import MACHINE_VERSION
from tests.broker_proc import free_port, uniq

AUTH = ("guest", "guest")
T = 15.0
N = 20


def kept(node: ClusterNode, queue: str) -> int | None:
    try:
        r = requests.get(f"http://{node.host}:{node.http_port}/api/queues/%2F/{queue}",  # type: ignore[attr-defined]
                         auth=AUTH, timeout=T)
    except requests.RequestException:
        return None
    return int(r.json()["messages_dlx"]) if r.status_code == 200 else None


def test_kept_dead_letters_survive_a_leader_kill_and_are_delivered_once_routable(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3, config="compaction_min_entries = 60\n")  # snapshots early
    for n in c.nodes:
        n.http_port = free_port()  # type: ignore[attr-defined]
        n.extra_args += ["--http-port", str(n.http_port)]  # type: ignore[attr-defined]
    c.start()
    wait_for(lambda: all((s := n.try_status()) is not None
                         and s["machine_version"] == MACHINE_VERSION for n in c.nodes),
             timeout=30, what="machine version 5 on every member")
    leader = c.leader()
    follower = next(n for n in c.nodes if n is not leader)
    dlx, src, dead = uniq("dlc-x"), uniq("dlc-src"), uniq("dlc-dead")
    bodies = [make_body("dlc", i, 1024 + 97 * i) for i in range(N)]
    conn = pika_conn(follower)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare(dlx, "fanout", durable=True)
        ch.queue_declare(src, durable=True, arguments={
            "x-queue-type": "quorum", "x-overflow": "reject-publish",
            "x-dead-letter-exchange": dlx, "x-dead-letter-strategy": "at-least-once"})
        for b in bodies:
            ch.basic_publish("", src, b, pika.BasicProperties(delivery_mode=2))
        for _ in range(N):  # no queue bound to the DLX: each is kept
            m, _p, _b = ch.basic_get(src)
            ch.basic_reject(m.delivery_tag, requeue=False)
        ch.queue_declare(dead, durable=True)  # declared now, bound after the kill
    finally:
        conn.close()
    for n in c.nodes:
        wait_for(lambda n=n: kept(n, src) == N, timeout=30, what=f"{n.node_id} to keep {N}")
    # enough entries (Ticks, publishes) for every member to snapshot the store
    before = {n.node_id: n.status()["snapshots"] for n in c.nodes}
    conn = pika_conn(follower)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        filler = uniq("dlc-fill")
        ch.queue_declare(filler, durable=True)
        for i in range(100):
            ch.basic_publish("", filler, make_body("fill", i, 256))
        ch.queue_delete(filler)
    finally:
        conn.close()
    wait_for(lambda: all(n.status()["snapshots"] > before[n.node_id] for n in c.nodes),
             timeout=60, what="a snapshot on every member after the dead letters")

    leader.kill9()
    survivors = [n for n in c.nodes if n is not leader]
    c.leader(timeout=30, among=survivors)
    leader.start(wait=True)  # from its own snapshot and log
    wait_for(lambda: kept(leader, src) == N, timeout=30, what="the restarted member's store")
    for n in survivors:
        assert kept(n, src) == N

    conn = pika_conn(survivors[0])
    try:
        ch = conn.channel()
        ch.queue_bind(dead, dlx)  # routable now: every kept message moves at once
        got: list[tuple[Any, bytes]] = []

        def drained() -> bool:
            while True:
                _m, p, b = ch.basic_get(dead, auto_ack=True)
                if b is None:
                    return len(got) >= N
                got.append((p, b))

        wait_for(drained, timeout=30, what=f"{N} dead letters in {dead}")
        assert sorted(b for _p, b in got) == sorted(bodies)  # each once, intact
        assert all(body_ok(b) for _p, b in got)
        assert all(p.headers["x-death"][0]["reason"] == "rejected" for p, _b in got)
        _m, _p, extra = ch.basic_get(dead, auto_ack=True)
        assert extra is None
    finally:
        conn.close()
    for n in c.nodes:
        wait_for(lambda n=n: kept(n, src) == 0, timeout=30, what=f"{n.node_id} settled")
