"""S25: SIGKILL of a follower under confirmed load. The in-sync set shrinks
(by a replicated command, never below a majority), confirms resume; the
follower restarts, catches up and rejoins the in-sync set; nothing confirmed
is lost, and the rejoined node itself serves the whole queue."""
from __future__ import annotations

import time

from harness.client import check_delivered, declare, drain, uniq_queue
from harness.process import Cluster
from harness.publisher import StreamPublisher
from tests.broker_proc import wait_for


def test_s25_follower_sigkill_in_sync_shrinks_then_rejoins(cluster: Cluster) -> None:
    leader = cluster.leader()
    victim, other = cluster.followers()
    q = uniq_queue("s25f")
    declare(other, q)
    pub = StreamPublisher("f", q, lambda: [other, leader], total=None)
    pub.start()
    try:
        wait_for(lambda: len(pub.confirmed) >= 1000 or pub.error, timeout=60, what="1000 confirms")
        assert pub.error is None, pub.summary()
        t_kill = time.monotonic()
        victim.kill9()

        def shrunk() -> dict | None:
            st = leader.status()
            return st if victim.node_id not in st["in_sync"] else None
        st = wait_for(shrunk, timeout=30, interval=0.05,
                      what=f"{victim.node_id} to leave the leader's in-sync set")
        t_shrink = time.monotonic()
        assert victim.node_id in st["members"], "a dead follower stays a member"
        assert len(st["in_sync"]) * 2 > len(st["members"]), f"in_sync below a majority: {st}"
        assert st["leader"] == leader.node_id and st["has_quorum"] is True, st

        wait_for(lambda: pub.progress_since(t_shrink) >= 500 or pub.error, timeout=30,
                 what="confirms to resume after the in-sync set shrank")
        assert pub.error is None, pub.summary()
        after = sorted(t for t in pub.confirm_times if t >= t_kill)
        stall = max((b - a for a, b in zip([t_kill] + after, after, strict=False)), default=0.0)

        n_before_restart = len(pub.confirmed)
        t_restart = time.monotonic()
        victim.start()
        st = wait_for(lambda: (lambda s: s if victim.node_id in s["in_sync"] else None)(leader.status()),
                      timeout=60, interval=0.1, what=f"{victim.node_id} to rejoin the in-sync set")
        t_rejoin = time.monotonic()
        vst = victim.status()
        assert vst["leader"] == leader.node_id, f"the restarted follower deposed the leader: {vst}"
        wait_for(lambda: pub.progress_since(t_rejoin) >= 500 or pub.error, timeout=30,
                 what="confirms with the follower back in sync")
        assert pub.error is None, pub.summary()
    finally:
        pub.finish(60)
    print(f"\nS25 follower kill: in-sync shrank {t_shrink - t_kill:.2f}s after the kill, longest confirm "
          f"gap {stall:.2f}s; restarted follower back in sync {t_rejoin - t_restart:.2f}s after its "
          f"start ({n_before_restart} confirmed before restart)\n  {pub.summary()}")
    assert pub.error is None, pub.summary()
    got = drain(victim, q)  # the rejoined follower serves everything
    res = check_delivered({"f": pub.confirmed}, got)
    assert res["lost_count"] == 0, f"lost {res['lost_count']}: {res['lost']['f'][:20]}"
