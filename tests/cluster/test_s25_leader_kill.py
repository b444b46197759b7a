"""S25: SIGKILL of the leader at a random moment while 20,000 persistent 1 KiB
messages are published with streaming confirms from publishers on the two
other nodes; every confirmed message id is delivered afterwards."""
from __future__ import annotations

import random
import time

from tests.broker_proc import wait_for
from tests.cluster_proc import (
    Cluster,
    StreamPublisher,
    check_delivered,
    declare,
    drain,
    new_leader_time,
    uniq_queue,
)

TOTAL_PER_PUBLISHER = 10_000


def test_s25_leader_sigkill_under_confirmed_load_loses_nothing(cluster: Cluster) -> None:
    leader = cluster.leader()
    f1, f2 = cluster.followers()
    qa, qb = uniq_queue("s25a"), uniq_queue("s25b")
    declare(f1, qa, qb)
    # each publisher prefers its own follower and falls back to the other survivor
    pa = StreamPublisher("a", qa, lambda: [f1, f2], total=TOTAL_PER_PUBLISHER)
    pb = StreamPublisher("b", qb, lambda: [f2, f1], total=TOTAL_PER_PUBLISHER)
    t_start = time.monotonic()
    pa.start()
    pb.start()

    frac = random.uniform(0.1, 0.7)
    threshold = int(2 * TOTAL_PER_PUBLISHER * frac)
    wait_for(lambda: len(pa.confirmed) + len(pb.confirmed) >= threshold or pa.error or pb.error,
             timeout=120, what=f"{threshold} confirms before the kill")
    assert not (pa.error or pb.error), f"{pa.summary()} / {pb.summary()}"
    confirmed_at_kill = len(pa.confirmed) + len(pb.confirmed)
    t_kill = time.monotonic()
    leader.kill9()
    new_leader, failover = new_leader_time(cluster, [f1, f2], t_kill, timeout=30)
    # first confirm that left after the new leader was known
    t_new = t_kill + failover
    wait_for(lambda: pa.progress_since(t_new) + pb.progress_since(t_new) > 0 or pa.error or pb.error,
             timeout=60, what="confirms after the failover")
    first_after = min([t for t in pa.confirm_times + pb.confirm_times if t >= t_new], default=t_new)

    pa.join(240)
    pb.join(240)
    elapsed = time.monotonic() - t_start
    times = sorted(pa.confirm_times + pb.confirm_times)
    during = sum(1 for t in times if t_kill <= t < t_new)
    after = [t for t in times if t >= t_kill]
    gaps = [b - a for a, b in zip([t_kill] + after, after, strict=False)]
    stall = max(gaps, default=0.0)
    print(f"\nS25 leader kill: killed {leader.node_id} after {confirmed_at_kill} confirms "
          f"({frac:.0%}); new leader {new_leader.node_id} after {failover:.3f}s; first confirm "
          f"{first_after - t_kill:.3f}s after the kill; {during} confirms between kill and new leader; "
          f"longest confirm gap after the kill {stall:.3f}s; 20k published in {elapsed:.1f}s\n"
          f"  {pa.summary()}\n  {pb.summary()}")
    assert not pa.is_alive() and not pb.is_alive(), "publishers did not finish"
    assert pa.error is None and pb.error is None, f"{pa.summary()} / {pb.summary()}"
    assert len(pa.confirmed) == len(pb.confirmed) == TOTAL_PER_PUBLISHER

    got = drain(f1, qa) + drain(f2, qb)
    res = check_delivered({"a": pa.confirmed, "b": pb.confirmed}, got)
    print(f"  drain: delivered={res['delivered']} duplicates={res['duplicates']} lost={res['lost_count']}")
    assert res["lost_count"] == 0, f"confirmed but never delivered: { {k: v[:20] for k, v in res['lost'].items()} }"
    assert failover < 5.0, f"new leader only after {failover:.2f}s"
