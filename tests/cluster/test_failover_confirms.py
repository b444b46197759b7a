"""Issue 12: confirms resume within 2 s (target: 1 s) after SIGKILL of the leader
or of a follower under streaming confirms, and nothing confirmed is lost.

The killed member's Raft links break (EOF/reset, then connect refused): the
leader marks it out of sync at once instead of after the 5 s silence bound,
and when the leader itself dies the survivors campaign at once instead of
after an election timeout. Random 1 KiB persistent bodies, window 100."""
from __future__ import annotations

import time

from harness.client import check_delivered, declare, drain, uniq_queue
from harness.process import Cluster, ClusterNode
from harness.publisher import StreamPublisher
from tests.broker_proc import wait_for

RESUME_WITHIN = 2.0  # issue 12: "never later than 2 s" (target 1 s)
WARM_UP = 1500


def kill_under_confirms(cluster: Cluster, victim: ClusterNode, publish_to: list[ClusterNode],
                        tag: str) -> float:
    """Kill `victim` while a publisher streams to `publish_to`; returns the
    seconds from the kill until confirms resumed: the end of the longest
    silence between confirms after the kill (confirms already mirrored
    before the kill may still trickle out at once); asserts 0 lost."""
    q = uniq_queue(tag)
    declare(publish_to[0], q)
    pub = StreamPublisher(tag, q, lambda: publish_to, total=None, window=100)
    pub.start()
    try:
        wait_for(lambda: len(pub.confirmed) >= WARM_UP or pub.error is not None, timeout=120,
                 what=f"{WARM_UP} confirms before the kill")
        assert pub.error is None, pub.summary()
        t_kill = time.monotonic()
        victim.kill9()
        wait_for(lambda: pub.progress_since(t_kill) > 0 or pub.error is not None, timeout=60,
                 what="a confirm after the kill")
        # keep publishing a while after the failover: the new configuration works
        wait_for(lambda: pub.progress_since(t_kill) >= WARM_UP or pub.error is not None, timeout=120,
                 what="confirms keep coming after the kill")
    finally:
        pub.finish(180)
    assert pub.error is None, pub.summary()
    after = sorted(t for t in pub.confirm_times if t >= t_kill)[:WARM_UP]
    gaps = [(b - a, b) for a, b in zip([t_kill, *after], after, strict=False)]
    longest, resumed_at = max(gaps)
    resumed = resumed_at - t_kill
    got = drain(publish_to[0], q)
    res = check_delivered({tag: pub.confirmed}, got)
    print(f"\n{tag}: killed {victim.node_id}; first confirm {after[0] - t_kill:.3f}s after the "
          f"kill; confirms resumed {resumed:.3f}s after it (longest gap {longest:.3f}s); "
          f"{pub.summary()}; delivered={res['delivered']} lost={res['lost_count']} "
          f"corrupted={res.get('corrupted', 0)}")
    assert res["lost_count"] == 0, f"confirmed but never delivered: {res['lost'][tag][:20]}"
    return resumed


def test_confirms_resume_within_2s_after_follower_sigkill(cluster: Cluster) -> None:
    leader = cluster.leader()
    victim, other = cluster.followers()
    resumed = kill_under_confirms(cluster, victim, [leader, other], "fo-follower")
    assert resumed < RESUME_WITHIN, f"confirms resumed {resumed:.2f}s after the follower's kill"


def test_confirms_resume_within_2s_after_leader_sigkill(cluster: Cluster) -> None:
    leader = cluster.leader()
    f1, f2 = cluster.followers()
    resumed = kill_under_confirms(cluster, leader, [f1, f2], "fo-leader")
    assert resumed < RESUME_WITHIN, f"confirms resumed {resumed:.2f}s after the leader's kill"
