"""A follower behind the leader's snapshot catches up while the leader keeps snapshotting.

A follower that returns behind the leader's snapshot receives the snapshot and
the log entries its live messages are in, in bounded chunks: seconds for a large
backlog. A leader that took a new snapshot (and dropped the log up to it) during
that transfer left the follower, once the transfer ended, behind the new
snapshot: another transfer, overtaken again, for as long as the load lasted (the
chaos corruption experiments, with a snapshot every second, saw it). The leader
now takes no new snapshot while one is on its way to a follower (bounded: see
replicator.Replicator._holds_compaction).

Here a snapshot is due every second (compaction_min_time = 1.0) and publishing
goes on throughout; the returning follower must be back in the in-sync set
within the deadline, having installed few snapshots, with its copy complete.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

from harness.client import declare, publish_confirmed, queue_depth, uniq_queue
from harness.process import Cluster, ClusterNode
from harness.publisher import StreamPublisher
from tests.broker_proc import wait_for

BACKLOG = 100_000  # random 4 KiB messages the follower misses: ~400 MB to send it
SIZE = 4096
CONFIG = "compaction_min_entries = 200\ncompaction_min_time = 1.0\nsegment_bytes = 4194304\n"


def _depth_is(node: ClusterNode, queue: str, want: int) -> bool:
    return queue_depth(node, queue) == want


def test_follower_behind_the_snapshot_catches_up_under_load_with_a_snapshot_every_second(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3, config=CONFIG).start()
    leader = c.leader()
    behind, other = c.followers()
    q, trickle_q = uniq_queue("catchup"), uniq_queue("trickle")
    declare(leader, q, trickle_q)
    behind.stop()
    pub = StreamPublisher("b", q, lambda: [leader], total=BACKLOG, window=2000, size=SIZE,
                          deadline=300)
    pub.start()
    pub.join(300)  # it stops by itself at `total`
    assert not pub.is_alive(), pub.summary()
    assert pub.nacked == 0 and len(pub.confirmed) == BACKLOG, pub.summary()
    wait_for(lambda: leader.status()["snapshots"] >= 2, timeout=30, interval=0.2,
             what="the leader's log compacted past what the stopped follower holds")

    # load during the catch-up: each second's entries make a snapshot due
    stop = threading.Event()
    trickled = [0]

    def trickle() -> None:
        while not stop.is_set():
            publish_confirmed(leader, trickle_q, n=20)
            trickled[0] += 20

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        snaps_before = leader.status()["snapshots"]
        t0 = time.monotonic()
        behind.start(wait=False)
        wait_for(lambda: behind.node_id in leader.status()["in_sync"], timeout=120, interval=0.5,
                 what=f"{behind.node_id} back in the in-sync set")
        took = time.monotonic() - t0
        during = leader.status()["snapshots"] - snaps_before
    finally:
        stop.set()
        t.join(60)
    st = behind.status()
    for n in c.nodes:
        s = n.status()
        print(n.node_id, {k: s.get(k) for k in ("role", "term", "leader", "snapshots", "installed_snapshots",
                                                 "refused_snapshots", "commit_index")})
    print(f"caught up in {took:.1f}s; snapshots installed {st['installed_snapshots']}, "
          f"leader snapshots meanwhile {during}, trickled {trickled[0]}")
    assert trickled[0] > 0
    assert st["installed_snapshots"] <= 3, st
    # its own copy: the leader's log is compacted, so these come from the snapshot it installed
    c.wait_healthy(60)
    for node in (behind, other):
        wait_for(partial(_depth_is, node, q, BACKLOG), timeout=60, interval=0.5,
                 what=f"{node.node_id} holds the backlog")
        wait_for(partial(_depth_is, node, trickle_q, trickled[0]), timeout=60, interval=0.5,
                 what=f"{node.node_id} holds the trickle")
