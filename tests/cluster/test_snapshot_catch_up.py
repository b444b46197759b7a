"""Issue 11: a follower that is behind the leader's snapshot catches up through
the new transport (the snapshot in bounded chunks, then entries), holds every
confirmed message, and the majority keeps its leader and term throughout."""
from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable

from harness.client import declare, drain, pika_conn, uniq_queue
from harness.process import Cluster, wait_for


def test_follower_behind_the_snapshot_installs_it_and_catches_up(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3, config="compaction_min_entries = 60\n")
    c.start()
    leader = c.leader()
    lagger = c.followers()[0]
    queue = uniq_queue("snapcatch")
    declare(leader, queue)
    lagger.kill9()
    wait_for(lambda: lagger.node_id not in leader.status()["in_sync"], timeout=30,
             what="the killed follower to leave the in-sync set")
    term = leader.status()["term"]

    # one publish per confirm round trip: many Raft entries, several snapshots
    conn = pika_conn(leader)
    bodies = []
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(300):
            body = b"%d:" % i + os.urandom(2048)
            ch.basic_publish("", queue, body)
            bodies.append(body)
    finally:
        conn.close()
    wait_for(lambda: leader.status()["snapshots"] >= 2, timeout=60, what="two snapshots on the leader")
    st = leader.status()
    assert st["log_len"] < 300, st  # the entries the lagger misses are gone from the log

    lagger.start(wait=True)
    target = leader.status()["commit_index"]
    wait_for(lambda: (s := lagger.try_status()) is not None and s["last_applied"] >= target
             and s["leader"] == leader.node_id, timeout=60, what="the restarted follower to catch up")
    wait_for(lambda: lagger.node_id in leader.status()["in_sync"], timeout=30,
             what="the follower back in sync")
    for n in (leader, c.followers()[1] if c.followers()[0] is lagger else c.followers()[0]):
        assert n.status()["term"] == term
    # the snapshot pysyncobj received from the leader is private like the rest (issue 26)
    dump = lagger.data_dir / "raft.dump"
    assert lagger.status()["installed_snapshots"] >= 1 and dump.exists()
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600, oct(dump.stat().st_mode)

    # the caught-up follower serves every message, intact
    got = [body for body, _redelivered in drain(lagger, queue, idle=2.0)]
    digest = lambda bs: sorted(hashlib.sha256(b).hexdigest() for b in bs)  # noqa: E731
    assert digest(got) == digest(bodies)
