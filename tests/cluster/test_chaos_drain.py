"""The chaos drain's end (chaos/chaosmirrorq/workload.py drain_queue) against a real
3-node cluster: it must not end while deliveries to it are still on their way.

A kubelet leader-pod-kill run reported 14 confirmed messages lost. They were
delivered to the drain about 8 s late, after a leader change: the drain had gone
idle, read the queue's depth on a second connection (0 ready, 1 consumer: itself)
and closed its own connection with those deliveries unread in the socket. The close
requeued them and nobody drained them. Here the late deliveries are made to happen
on purpose: an in-sync follower is SIGSTOPped, so the leader holds every effect (the
deliveries and the replies alike) until it marks that follower out of sync
(out_of_sync_after); messages published meanwhile are delivered to the drain, held,
and released just before the depth check's reply."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pika
from chaosmirrorq.workload import HistoryWriter, drain_queue

from harness.body import RandomBodies
from harness.client import pika_conn, uniq_queue
from harness.process import Cluster
from tests.broker_proc import wait_for


def test_drain_ends_only_after_deliveries_held_by_a_stopped_follower_reach_it(
        cluster: Cluster, tmp_path: Path) -> None:
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
    m = pika_conn(leader).channel().queue_declare(q, passive=True).method
    assert (m.message_count, m.consumer_count) == (0, 0), "the drain left messages or a consumer"
