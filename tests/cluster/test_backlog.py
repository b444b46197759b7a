"""Issue 27: a backlog beyond the old 1,000,000 cap, held with bodies on disk.

One node takes 2,000,000 random 1 KiB persistent messages with no consumer
(streaming confirms, window 10,000), keeps its resident memory under a
bound that the code before issue 27 exceeded at half the count (2.95 GB at
1,000,000), restarts (kill -9) and serves every one of them, checked body by
body against its checksum (harness.drainer), and after the drain holds at
most 2 log segments on disk. MIRRORQ_BACKLOG_MESSAGES scales it (development
only). Figures are printed for the closing note."""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from harness.client import declare, uniq_queue
from harness.drainer import drain_checked
from harness.process import Cluster, ClusterNode, wait_for
from harness.publisher import StreamPublisher
from tests.support.memory import rss

N = int(os.environ.get("MIRRORQ_BACKLOG_MESSAGES", "2000000"))
# resident memory per queued 1 KiB message, above an idle node's: the index in
# the heap, never the bodies (before issue 27: ~2,900 B)
BYTES_PER_MESSAGE = 600
FIXED = 64 << 20  # caches of a busy node (log entries, payloads, buffers): not per message


def _log_bytes(node: ClusterNode) -> int:
    return sum(p.stat().st_size for p in (node.data_dir / "log").iterdir() if p.suffix in (".seg", ".lseg"))


def test_one_node_holds_two_million_messages_restarts_and_drains_them_intact(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(1)
    c.start()
    node = c.leader()
    q = uniq_queue("backlog")
    declare(node, q)  # no x-max-length: unbounded, as in RabbitMQ
    idle = rss(node)
    pub = StreamPublisher("bl", q, lambda: [node], total=N, window=10_000, size=1024, deadline=1200,
                          stall_timeout=60)
    t0 = time.monotonic()
    pub.start()
    pub.join(1200)
    fill = time.monotonic() - t0
    assert not pub.is_alive() and pub.error is None and pub.nacked == 0, pub.summary()
    assert len(pub.confirmed) == N, pub.summary()
    full = rss(node)
    st = node.status()
    disk = _log_bytes(node)
    print(f"\nbacklog {N}: filled in {fill:.1f}s ({N / fill:,.0f} msg/s); RSS idle {idle / 1e6:.0f} MB, "
          f"full {full / 1e6:.0f} MB ({(full - idle) / N:.0f} B/message); log {disk / 1e6:.0f} MB in "
          f"{st['log_segments']} segments; snapshots {st['snapshots']} (last {st['last_snapshot_bytes'] / 1e6:.1f} MB)")
    assert full - idle < FIXED + N * BYTES_PER_MESSAGE, f"{(full - idle) / N:.0f} B per queued message"

    node.kill9()
    t0 = time.monotonic()
    node.start(wait=True, timeout=300)
    restart = time.monotonic() - t0
    restarted = rss(node)
    got = drain_checked(node, q, N, timeout=1200)
    print(f"restart {restart:.1f}s, RSS after it {restarted / 1e6:.0f} MB; drained {got.count} in "
          f"{got.seconds:.1f}s ({got.count / max(got.seconds, 1e-9):,.0f} msg/s), damaged {got.damaged}")
    assert got.damaged == 0
    ids = got.ids.get("bl", [])
    assert len(ids) == N and set(ids) == pub.confirmed, (got.count, len(ids), len(set(ids)))
    assert restarted - idle < FIXED + N * BYTES_PER_MESSAGE
    # drained: the segments go (a snapshot is forced once the last one pins settled entries)
    wait_for(lambda: node.status()["log_segments"] <= 2, timeout=180, what="at most 2 log segments after the drain")
    print(f"after the drain: {node.status()['log_segments']} segments, {_log_bytes(node) / 1e6:.0f} MB, "
          f"RSS {rss(node) / 1e6:.0f} MB")
