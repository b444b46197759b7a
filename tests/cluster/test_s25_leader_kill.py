"""S25: SIGKILL of the leader at a random moment while 20,000 persistent 1 KiB
messages are published with streaming confirms from publishers on the two
other nodes; every confirmed message id is delivered afterwards."""
from __future__ import annotations

import random
import time

from harness.client import check_delivered, declare, drain, uniq_queue
from harness.process import Cluster, ClusterNode
from harness.publisher import StreamPublisher
from tests.broker_proc import wait_for

TOTAL_PER_PUBLISHER = 10_000
# issue 3: "after SIGKILL of the leader, a new leader within 2 s with the default
# settings on loopback" (election timeout 0.5-1.0 s, heartbeat 0.1 s)
NEW_LEADER_WITHIN = 2.0
LOADED_BOUND = 2 * 1.0 + 1.5  # see the end of the loaded test


def failover_times(cluster: Cluster, survivors: list[ClusterNode], t_kill: float,
                   timeout: float = 30.0) -> tuple[ClusterNode, float, float]:
    """Poll the survivors' admin Status every 20 ms: (agreed leader, seconds from the kill
    until a survivor first names a leader among the survivors, seconds until they all
    agree on it). Times are taken when the naming answer arrived (an upper bound)."""
    ids = {n.node_id for n in survivors}
    first: float | None = None
    deadline = t_kill + timeout
    while time.monotonic() < deadline:
        named: set[ClusterNode | None] = set()
        for n in survivors:
            st = n.try_status()
            ref = cluster.node_for(st.get("leader")) if st else None
            named.add(ref)
            if first is None and ref is not None and ref.node_id in ids:
                first = time.monotonic() - t_kill
        if first is not None and len(named) == 1:
            leader = named.pop()
            st = leader.try_status() if leader is not None else None
            if leader is not None and leader.node_id in ids and st and st.get("role") == "leader":
                return leader, first, time.monotonic() - t_kill
        time.sleep(0.02)
    raise AssertionError(f"no leader agreed among {sorted(ids)} within {timeout}s of the kill")


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
    new_leader, first_named, failover = failover_times(cluster, [f1, f2], t_kill)
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
          f"({frac:.0%}); new leader {new_leader.node_id} named after {first_named:.3f}s, agreed after "
          f"{failover:.3f}s; first confirm "
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
    # Not the 2 s of the requirement here (test_s25_new_leader_within_2s_after_leader_sigkill
    # asserts that): under this flat-out load on 2 cores the survivors' raft threads are
    # starved, and the first survivor named the new leader 1.08-1.93 s after the kill (50
    # runs, load average 8-12), too close to 2 s for a CI gate; a split vote adds up to
    # another election timeout. Bound: two maximal election timeouts + 1.5 s of starvation.
    assert first_named < LOADED_BOUND, \
        f"first survivor named a new leader only {first_named:.2f}s after the kill " \
        f"(agreed after {failover:.2f}s; requirement {NEW_LEADER_WITHIN}s, unloaded)"


def test_s25_new_leader_within_2s_after_leader_sigkill(cluster: Cluster) -> None:
    """Issue 3: after SIGKILL of the leader, a new leader within 2 s with the default
    settings on loopback (no client load: see the bound of the loaded test above)."""
    leader = cluster.leader()
    survivors = cluster.followers()
    t_kill = time.monotonic()
    leader.kill9()
    new_leader, first_named, agreed = failover_times(cluster, survivors, t_kill)
    print(f"\nS25 leader kill (no load): {leader.node_id} killed; {new_leader.node_id} named "
          f"after {first_named:.3f}s, agreed after {agreed:.3f}s")
    assert first_named < NEW_LEADER_WITHIN, \
        f"first survivor named a new leader only {first_named:.2f}s after the kill " \
        f"(agreed after {agreed:.2f}s)"
