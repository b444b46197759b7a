"""The drains' end (chaos/chaosmirrorq/workload.py drain_queue, and
harness.client.drain that the cluster tests use) against a real 3-node cluster: a
drain must not end while deliveries to it are still on their way.

A kubelet leader-pod-kill run reported 14 confirmed messages lost. They were
delivered to the drain about 8 s late, after a leader change: the drain had gone
idle, read the queue's depth on a second connection (0 ready, 1 consumer: itself)
and closed its own connection with those deliveries unread in the socket. The close
requeued them and nobody drained them. Here the late deliveries are made to happen
on purpose: an in-sync follower is SIGSTOPped, so the leader holds every effect (the
deliveries and the replies alike) until it marks that follower out of sync
(out_of_sync_after); messages published meanwhile are delivered to the drain, held,
and released just before the depth check's reply. out_of_sync_after is raised to
OUT_OF_SYNC_AFTER s so the hold outlasts each drain's check by seconds."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pika
from chaosmirrorq.workload import HistoryWriter, drain_queue

from harness.body import RandomBodies
from harness.client import drain, pika_conn, queue_counts, uniq_queue
from harness.process import Cluster
from tests.broker_proc import wait_for

OUT_OF_SYNC_AFTER = 15.0


def _cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    return cluster_factory(3, config=f"out_of_sync_after = {OUT_OF_SYNC_AFTER}\n").start()


def test_chaos_drain_ends_only_after_deliveries_held_by_a_stopped_follower_reach_it(
        cluster_factory: Callable[..., Cluster], tmp_path: Path) -> None:
    cluster = _cluster(cluster_factory)
    leader = cluster.leader()
    stopped = cluster.followers()[0]
    q = uniq_queue()
    conn = pika_conn(leader)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    bodies = RandomBodies(1024, 200_000, seed=7)
    first = [bodies.make("d", i) for i in range(20)]
    for b in first:
        ch.basic_publish("", q, b, pika.BasicProperties(delivery_mode=2))

    writer = HistoryWriter(tmp_path / "drain.jsonl")
    result: dict[str, object] = {}
    # the drain may end only after this (as the DLX queue's waits for the TTL queue's)
    published = threading.Event()

    def run() -> None:
        try:
            result["n"] = drain_queue("t", leader, q, writer, idle=1.0, min_time=1.0, timeout=90.0,
                                      after=[published])
        except Exception as exc:  # noqa: BLE001 - asserted below
            result["error"] = f"{type(exc).__name__}: {exc}"

    drain = threading.Thread(target=run, name="drain", daemon=True)
    drain.start()
    wait_for(lambda: writer.count >= len(first), timeout=30, what="the first 20 drained")

    ch2 = pika_conn(leader).channel()  # no confirms: they would be held too
    stopped.pause()
    try:
        # published while the follower is stopped: applied, delivered to the drain, held
        for i in range(20, 50):
            ch2.basic_publish("", q, bodies.make("d", i), pika.BasicProperties(delivery_mode=2))
        ch2.connection.process_data_events(0)
        published.set()
        drain.join(60)
    finally:
        stopped.resume()
    assert not drain.is_alive(), "the drain did not end"
    writer.close()
    assert "error" not in result, result
    got = [line for line in (tmp_path / "drain.jsonl").read_text().splitlines() if line]
    ids = {f"d-{i}" for i in range(50)}
    seen = {json.loads(line)["msg_id"] for line in got}
    assert seen == ids, f"not drained: {sorted(ids - seen)}"
    assert result["n"] == 50
    assert queue_counts(leader, q) == (0, 0), "the drain left messages or a consumer"


def test_pika_drain_ends_only_after_deliveries_held_by_a_stopped_follower_reach_it(
        cluster_factory: Callable[..., Cluster]) -> None:
    """harness.client.drain: idle IDLE s after its last delivery it checks the depth.
    The follower is stopped once the first 20 are out (0 ready), the next 30 are
    published, and the check falls inside the hold."""
    idle = 6.0
    cluster = _cluster(cluster_factory)
    leader = cluster.leader()
    stopped = cluster.followers()[0]
    q = uniq_queue()
    ch = pika_conn(leader).channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    bodies = RandomBodies(1024, 200_000, seed=8)
    sent = [bodies.make("d", i) for i in range(50)]
    for b in sent[:20]:
        ch.basic_publish("", q, b, pika.BasicProperties(delivery_mode=2))
    ch2 = pika_conn(leader).channel()  # no confirms: they would be held too
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["got"] = drain(leader, q, idle=idle, timeout=90.0)
        except Exception as exc:  # noqa: BLE001 - asserted below
            result["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=run, name="drain", daemon=True)
    t.start()
    wait_for(lambda: queue_counts(leader, q) == (0, 1), timeout=30, interval=0.05,
             what="the first 20 delivered to the drain")
    stopped.pause()
    try:
        for b in sent[20:]:
            ch2.basic_publish("", q, b, pika.BasicProperties(delivery_mode=2))
        ch2.connection.process_data_events(0)
        t.join(90)
    finally:
        stopped.resume()
    assert not t.is_alive(), "the drain did not end"
    assert "error" not in result, result
    got = result["got"]
    assert isinstance(got, list)
    missing = set(sent) - {body for body, _red in got}
    assert not missing, f"{len(missing)} of 50 not drained"
    assert queue_counts(leader, q)[0] == 0
