"""SIGKILL of every node while persistent messages are being confirmed, then a
restart of the whole cluster: every confirmed message is still there."""
from __future__ import annotations

import time

from harness.client import check_delivered, declare, drain, uniq_queue
from harness.process import Cluster
from harness.publisher import StreamPublisher
from tests.broker_proc import wait_for


def test_full_cluster_sigkill_and_restart_keeps_confirmed_persistent_messages(cluster: Cluster) -> None:
    leader = cluster.leader()
    f1, f2 = cluster.followers()
    qa, qb = uniq_queue("fulla"), uniq_queue("fullb")
    declare(leader, qa, qb)
    pa = StreamPublisher("a", qa, lambda: [f1], total=None)
    pb = StreamPublisher("b", qb, lambda: [leader], total=None)
    pa.start()
    pb.start()
    try:
        wait_for(lambda: len(pa.confirmed) >= 2000 and len(pb.confirmed) >= 2000 or pa.error or pb.error,
                 timeout=60, what="2000 confirms on each publisher")
        assert pa.error is None and pb.error is None, f"{pa.summary()} / {pb.summary()}"
        for n in cluster.nodes:  # publishers still streaming: some confirms are in flight
            n.kill9()
    finally:
        pa.abandon()
        pb.abandon()
        pa.join(30)
        pb.join(30)
    confirmed = {"a": set(pa.confirmed), "b": set(pb.confirmed)}
    t0 = time.monotonic()
    for n in cluster.nodes:
        n.start(wait=False)
    for n in cluster.nodes:
        n.wait_serving(60)
    new_leader = cluster.wait_healthy(60)
    restart = time.monotonic() - t0
    got = drain(f2, qa) + drain(f2, qb)
    res = check_delivered(confirmed, got)
    print(f"\nfull restart: {sum(map(len, confirmed.values()))} confirmed before the kill; cluster healthy "
          f"{restart:.2f}s after restarting (leader {new_leader.node_id}); delivered {res['delivered']}, "
          f"duplicates {res['duplicates']}")
    assert res["lost_count"] == 0, f"lost {res['lost_count']}: { {k: v[:20] for k, v in res['lost'].items()} }"
