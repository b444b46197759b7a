"""Issue 3: "Flat-out publishing for 60 s on 3 nodes causes no leader change and no
DISCARDED outcome." Two publishers with streaming confirms, one on each follower of a
3-node cluster, publish persistent 1 KiB messages as fast as the cluster takes them for
MIRRORQ_FLAT_OUT_SECONDS (default 60; shorter only for development). The bodies are
random (`TAG:ID:CRC:` + random bytes, cut from a pool so that making them costs the
publisher no random-number generation): like real payloads, they do not compress. The window per
publisher is above a node's in-flight replication bound, so the broker's own
back-pressure, not the client, sets the pace. Afterwards every node's admin Status must
show the same term and leader as before, no DISCARDED batch outcome and no nacked
publish, and each queue must hold exactly the messages confirmed into it."""
from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

import pytest

from harness.client import declare, queue_depth, uniq_queue
from harness.process import Cluster, ClusterNode
from harness.publisher import StreamPublisher
from tests.broker_proc import wait_for

SECONDS = float(os.environ.get("MIRRORQ_FLAT_OUT_SECONDS", "60"))
# above max_inflight_batches x batch_max_commands (64 x 128): the node stops reading
# from its publishers before they run out of window
WINDOW = 10_000
SIZE = 1024  # bytes per body: random, incompressible (StreamPublisher / RandomBodies)


def _depth_is(node: ClusterNode, queue: str, want: int) -> bool:
    return queue_depth(node, queue) == want


def _brief(st: dict[str, Any]) -> dict[str, Any]:
    return {k: st.get(k) for k in ("role", "leader", "term", "commit_index", "failed_batches",
                                   "nacked_publishes", "resends", "snapshots", "queues", "fast_elections",
                                   "prevote_rounds", "deferred_elections", "longest_raft_stall_ms",
                                   "longest_flush_ms", "longest_fork_ms", "longest_owner_tick_ms",
                                   "longest_leader_gap_ms")}


# a minute of load: make test keeps test_replication_load.py's no-election tests (4 publishers
# with no window on 2 followers: no term change, no leader change, no DISCARDED)
@pytest.mark.long
def test_flat_out_60s_no_leader_change_no_discarded(cluster: Cluster) -> None:
    leader = cluster.leader()
    f1, f2 = cluster.followers()
    before = {n.node_id: n.status() for n in cluster.nodes}
    term = before[leader.node_id]["term"]
    assert all(st["term"] == term for st in before.values()), before
    qa, qb = uniq_queue("flat-a"), uniq_queue("flat-b")
    # no x-max-length: unbounded (issue 27; the old 1,000,000 default nacked a fast run)
    declare(f1, qa, qb)

    # pinned to their node: a reconnect elsewhere would hide a failure
    pubs = [StreamPublisher("a", qa, lambda: [f1], total=None, window=WINDOW, size=SIZE,
                            deadline=SECONDS + 90),
            StreamPublisher("b", qb, lambda: [f2], total=None, window=WINDOW, size=SIZE,
                            deadline=SECONDS + 90)]
    t0 = time.monotonic()
    for p in pubs:
        p.start()
    # sample every node's Status once a second: fail fast on an election, and record
    # how deep the in-flight replication ran (the back-pressure bound is 64 batches)
    max_pending = dict.fromkeys(before, 0)
    blocked_seen: set[str] = set()
    while (left := t0 + SECONDS - time.monotonic()) > 0:
        for n in cluster.nodes:
            st = n.try_status(timeout=2.0)
            if st is None:
                continue
            if st["term"] != term:
                every = {m.node_id: _brief(m.try_status(timeout=2.0) or {}) for m in cluster.nodes}
                raise AssertionError(f"term changed during the run ({n.node_id}): {every}")
            max_pending[n.node_id] = max(max_pending[n.node_id], st["pending_batches"])
            if st["blocked"]:
                blocked_seen.add(n.node_id)
        assert all(p.is_alive() and p.error is None for p in pubs), [p.summary() for p in pubs]
        time.sleep(min(1.0, max(0.0, left)))
    t_stop = time.monotonic()
    for p in pubs:
        p.finish(timeout=60)  # outstanding publishes settle
    elapsed = t_stop - t0
    confirmed = sum(len(p.confirmed) for p in pubs)
    after = {n.node_id: n.status() for n in cluster.nodes}
    body_mb = sum(p.body_bytes for p in pubs) / 1e6
    print(f"\nflat out for {elapsed:.1f}s: {confirmed} confirmed, {confirmed / elapsed:,.0f} msg/s "
          f"(publishing phase), {body_mb / elapsed:.1f} MB/s of random {SIZE} B bodies sent, window {WINDOW}/publisher; max pending batches {max_pending}; "
          f"blocked seen on {sorted(blocked_seen)}; term {term} -> "
          f"{ {k: v['term'] for k, v in after.items()} }")
    for k, v in after.items():
        print(f"  {k}: {_brief(v)}")
    for p in pubs:
        print(f"  {p.summary()}")

    for k, st in after.items():
        assert st["term"] == term, f"{k}: term {term} -> {st['term']}"
        assert cluster.node_for(st["leader"]) is leader, f"{k}: leader {leader.node_id} -> {st['leader']}"
        assert "failed_batches" in st, f"{k}: Status has no failed_batches counters"
        assert st["failed_batches"]["discarded"] == 0, f"{k}: DISCARDED outcomes {st['failed_batches']}"
        assert st["nacked_publishes"] == 0, f"{k}: {st['nacked_publishes']} publishes nacked"
    for p in pubs:
        assert p.error is None and p.nacked == 0 and p.uncertain == 0 and not p.reconnects, p.summary()
        assert len(p.confirmed) > 0, p.summary()
    # a confirm leaves only once the batch is applied on the publisher's node
    for p, node in ((pubs[0], f1), (pubs[1], f2)):
        depth = queue_depth(node, p.queue)
        assert depth == len(p.confirmed), f"{p.queue} on {node.node_id}: {depth} queued, " \
                                          f"{len(p.confirmed)} confirmed"
    # and every other node holds the same (they apply the same log, perhaps a moment later)
    for p in pubs:
        for node in cluster.nodes:
            want = len(p.confirmed)
            wait_for(partial(_depth_is, node, p.queue, want), timeout=30,
                     what=f"{p.queue} depth {want} on {node.node_id}")
