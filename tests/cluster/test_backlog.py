"""Issue 27: a backlog beyond the old 1,000,000 cap, held with bodies on disk.

- One node takes 2,000,000 random 1 KiB persistent messages with no consumer
  (streaming confirms, window 10,000), keeps its resident memory under a
  bound that the code before issue 27 exceeded at half the count (2.95 GB at
  1,000,000), restarts (kill -9) and serves every one of them, checked body by
  body against its checksum (harness.drainer), and after the drain holds at
  most 2 log segments on disk.
- A 3-node cluster does the same: RSS per node under the same bound (before
  issue 27: ~2.2 KB per queued 1 KiB message on every node, 2.27 GB at 1M),
  a full restart (every node kill -9'd, every one recovering from its own
  disk) serves all of them to a consumer on a follower, and every node ends
  with at most 2 segments.
- A queue whose first message is held unacked by a consumer while 1,000,000
  others pass through it (published and consumed at once): every node's data
  directory stays within a few segments (compaction moves the held entry out
  of its segment), sampled throughout; the held message is intact.
- An x-max-priority queue of 300,000 messages of 11 priorities: the same
  memory bound (one packed FIFO per priority), and after a kill -9 all of
  them intact, highest priority first.

MIRRORQ_BACKLOG_MESSAGES, MIRRORQ_BACKLOG_CLUSTER_MESSAGES,
MIRRORQ_PASS_THROUGH_MESSAGES and MIRRORQ_PRIORITY_BACKLOG_MESSAGES scale them. Figures are printed for the
closing note."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import header as pheader

from harness.amqp import RawClient
from harness.body import body_id, body_ok, make_body
from harness.client import declare, uniq_queue
from harness.drainer import drain_checked
from harness.process import Cluster, ClusterNode, wait_for
from harness.publisher import StreamPublisher
from tests.support.memory import rss

N = int(os.environ.get("MIRRORQ_BACKLOG_MESSAGES", "2000000"))
N_CLUSTER = int(os.environ.get("MIRRORQ_BACKLOG_CLUSTER_MESSAGES", "2000000"))
N_PASS = int(os.environ.get("MIRRORQ_PASS_THROUGH_MESSAGES", "1000000"))
N_PRIORITY = int(os.environ.get("MIRRORQ_PRIORITY_BACKLOG_MESSAGES", "300000"))
# resident memory per queued 1 KiB message, above an idle node's: the packed
# index (node/broker/fifo.py), never the bodies. Measured 53-63 B full and
# after a restart; one Python object per message (before the packed index)
# measured 272-287 B, ~410 B after a 3-node restart; before issue 27 ~2,900 B
BYTES_PER_MESSAGE = 150
# a drained node hands its memory back (idle malloc trim every 20 s, payload
# cache released after 10 s without a read): measured 2-21 MB above a fresh
# node's; with one object per message 291 MB against 62 MB fresh
DRAINED_SLACK = 48 << 20
FIXED = 64 << 20  # caches of a busy node (log entries, payloads, buffers): not per message
# messages pass through in rounds of PASS_ROUND (published, then drained): the
# queue never holds more, whatever the order the node serves publishers and
# consumers in (a flat-out publisher fills it first, measured: 945k deep at 1M)
PASS_ROUND = 20_000
# small segments and snapshots every 64 MiB of log, so the bound stays far
# below the bytes that pass (1 GiB at 1M) even at a smaller CI count
PASS_CONFIG = "segment_bytes = 16777216\ncompaction_max_bytes = 67108864\ncompaction_min_gap = 2\n"
# a node's data directory meanwhile: the log Raft keeps between snapshots
# (64 MiB, a gap of 2 s at ~30 MB/s), a round's messages (22 MB), the segment
# being written, one being compacted and the held entry's, snapshots (small)
PASS_DISK_BOUND = 192 << 20


def _log_bytes(node: ClusterNode) -> int:
    return sum(p.stat().st_size for p in (node.data_dir / "log").iterdir() if p.suffix in (".seg", ".lseg"))


def _fill_one(node: ClusterNode, q: str, tag: str, total: int, deadline: float,
              priorities: int = 0) -> tuple[StreamPublisher, float]:
    """Publish `total` random 1 KiB persistent messages to `q` on `node`
    (streaming confirms, window 10,000) and wait until all are confirmed;
    returns the publisher and the seconds it took."""
    pub = StreamPublisher(tag, q, lambda: [node], total=total, window=10_000, size=1024,
                          deadline=deadline, stall_timeout=60, priorities=priorities)
    t0 = time.monotonic()
    pub.start()
    pub.join(deadline)
    fill = time.monotonic() - t0
    assert not pub.is_alive() and pub.error is None and pub.nacked == 0, pub.summary()
    assert len(pub.confirmed) == total, pub.summary()
    return pub, fill


# make test's backlog of millions (about 3 minutes in CI; the 3-node one below, 5 minutes,
# is in make test-long)
@pytest.mark.timeout(900)
def test_one_node_holds_two_million_messages_restarts_and_drains_them_intact(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(1)
    c.start()
    node = c.leader()
    q = uniq_queue("backlog")
    declare(node, q)  # no x-max-length: unbounded, as in RabbitMQ
    idle = rss(node)
    pub, fill = _fill_one(node, q, "bl", N, 1200)
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
    # issue 27's bound: within 20% of the fresh node's RSS (measured +4 MB
    # over 59 MB at 1M with the pinned mmap threshold, +10-17 MB without)
    wait_for(lambda: rss(node) < idle * 1.2, timeout=90,
             what=f"RSS within 20% of the idle node's {idle >> 20} MB after the drain")
    print(f"RSS back to {rss(node) / 1e6:.0f} MB (idle {idle / 1e6:.0f} MB)")


def test_a_priority_queue_backlog_is_packed_and_drains_in_priority_order_after_a_restart(
        cluster_factory: Callable[..., Cluster]) -> None:
    """An x-max-priority 10 queue with 300,000 random 1 KiB messages of
    priorities 0-10 (no consumer): one packed FIFO per priority, so the same
    memory bound per message as a plain queue (before: every message an
    object in a heap, measured 452 B each against 98 B); after a kill -9 every
    one comes back intact, highest priority first, FIFO within a priority."""
    c = cluster_factory(1)
    c.start()
    node = c.leader()
    q = uniq_queue("prio-backlog")
    declare(node, q, arguments={"x-max-priority": 10})
    idle = rss(node)
    pub, fill = _fill_one(node, q, "pq", N_PRIORITY, 900, priorities=10)
    assert pub.republished == 0, pub.summary()  # one pass: the drain order is the publish order
    full = rss(node)
    print(f"\npriority backlog {N_PRIORITY}: filled in {fill:.1f}s ({N_PRIORITY / fill:,.0f} msg/s); RSS idle "
          f"{idle / 1e6:.0f} MB, full {full / 1e6:.0f} MB ({(full - idle) / N_PRIORITY:.0f} B/message)")
    assert full - idle < FIXED + N_PRIORITY * BYTES_PER_MESSAGE, f"{(full - idle) / N_PRIORITY:.0f} B per message"

    node.kill9()
    node.start(wait=True, timeout=300)
    restarted = rss(node)
    got = drain_checked(node, q, N_PRIORITY, timeout=900)
    print(f"RSS after the restart {restarted / 1e6:.0f} MB; drained {got.count} in {got.seconds:.1f}s, "
          f"damaged {got.damaged}")
    assert got.damaged == 0
    ids = got.ids.get("pq", [])
    assert len(ids) == N_PRIORITY and set(ids) == pub.confirmed
    order = [(-(mid % 11), mid) for mid in ids]  # the publisher's priority: id % 11
    assert order == sorted(order), "not highest priority first, FIFO within a priority"
    assert restarted - idle < FIXED + N_PRIORITY * BYTES_PER_MESSAGE


def _disk_bytes(node: ClusterNode) -> int:
    """Bytes allocated on disk under the node's data directory (log segments,
    snapshots, meta): files may come and go while it is summed."""
    total = 0
    for root, _dirs, files in os.walk(node.data_dir):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _wait_segments(nodes: list[ClusterNode], most: int, when: str, timeout: float = 300) -> None:
    """Wait until every node holds at most `most` log segments (segments go
    once a snapshot passes them and compaction has run: seconds apart)."""
    for n in nodes:
        def few(n: ClusterNode = n) -> bool:
            return bool(n.status()["log_segments"] <= most)
        wait_for(few, timeout=timeout, what=f"at most {most} log segments on {n.node_id} {when}")


# 5 minutes in CI: make test keeps the same 2 million on one node (above: RSS bound, kill -9,
# drained intact, at most 2 segments) and the 3-node restarts of test_message_store.py and
# test_s25_full_restart.py
@pytest.mark.long
@pytest.mark.timeout(1200)  # 3.5 min measured on a quiet machine; more under CI load
def test_three_nodes_hold_two_million_messages_restart_and_drain_them_intact(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3)
    c.start()
    leader = c.leader()
    q = uniq_queue("backlog3")
    declare(leader, q)  # no x-max-length: unbounded
    idle = {n.node_id: rss(n) for n in c.nodes}

    def candidates() -> list[ClusterNode]:  # the leader first: a follower forwards every publish to it
        first = c.leader()
        return [first] + [n for n in c.live() if n is not first]

    pub = StreamPublisher("bl3", q, candidates, total=N_CLUSTER, window=10_000, size=1024, deadline=1800,
                          stall_timeout=60)
    t0 = time.monotonic()
    pub.start()
    pub.join(1800)
    fill = time.monotonic() - t0
    assert not pub.is_alive() and pub.error is None and pub.nacked == 0, pub.summary()
    assert len(pub.confirmed) == N_CLUSTER, pub.summary()
    print(f"\nbacklog {N_CLUSTER} on 3 nodes: filled in {fill:.1f}s ({N_CLUSTER / fill:,.0f} msg/s), "
          f"{pub.summary()}")
    full = {n.node_id: rss(n) for n in c.nodes}
    for n in c.nodes:
        st = n.status()
        print(f"{n.node_id} ({st['role']}): RSS idle {idle[n.node_id] / 1e6:.0f} MB, full "
              f"{full[n.node_id] / 1e6:.0f} MB ({(full[n.node_id] - idle[n.node_id]) / N_CLUSTER:.0f} B/message); "
              f"log {_log_bytes(n) / 1e6:.0f} MB in {st['log_segments']} segments; snapshots "
              f"{st['snapshots']} (last {st['last_snapshot_bytes'] / 1e6:.1f} MB)")
    for n in c.nodes:
        grown = full[n.node_id] - idle[n.node_id]
        assert grown < FIXED + N_CLUSTER * BYTES_PER_MESSAGE, \
            f"{n.node_id}: {grown / N_CLUSTER:.0f} B per queued message"

    # a full restart: every node recovers the backlog from its own disk
    c.kill_all()
    t0 = time.monotonic()
    c.start(timeout=600)
    restart = time.monotonic() - t0
    restarted = {n.node_id: rss(n) for n in c.nodes}
    print(f"full restart until healthy {restart:.1f}s; RSS after it "
          + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in restarted.items()))
    for n in c.nodes:
        assert restarted[n.node_id] - idle[n.node_id] < FIXED + N_CLUSTER * BYTES_PER_MESSAGE, n.node_id
    reader = c.followers()[0]  # bodies read back from a follower's own log
    got = drain_checked(reader, q, N_CLUSTER, timeout=1800)
    print(f"drained {got.count} from {reader.node_id} in {got.seconds:.1f}s "
          f"({got.count / max(got.seconds, 1e-9):,.0f} msg/s), damaged {got.damaged}")
    assert got.damaged == 0
    ids = got.ids.get("bl3", [])
    assert len(ids) == N_CLUSTER and set(ids) == pub.confirmed, (got.count, len(ids), len(set(ids)))
    _wait_segments(c.nodes, 2, "after the drain")
    print("after the drain: " + ", ".join(
        f"{n.node_id} {n.status()['log_segments']} segments {_log_bytes(n) / 1e6:.0f} MB RSS {rss(n) / 1e6:.0f} MB"
        for n in c.nodes))
    for n in c.nodes:
        wait_for(lambda n=n: rss(n) < idle[n.node_id] + DRAINED_SLACK, timeout=90,  # type: ignore[misc]
                 what=f"{n.node_id}: RSS within {DRAINED_SLACK >> 20} MB of its idle size after the drain")


class _Holder:
    """A consumer (prefetch 1, manual ack) that receives the queue's first
    message and holds it unacked until told to ack: it pins that message's
    log entry on every node. No heartbeats, so the idle connection stays."""

    def __init__(self, node: ClusterNode, queue: str) -> None:
        self.client = RawClient(node)
        self.client.handshake(heartbeat=0)
        self.client.open_channel()
        self.body = make_body("held", 1)
        self.tag = 0

    def _expect(self, cls: type, timeout: float = 30) -> Any:
        """The next frame, which must be a `cls`; connection.blocked and
        unblocked may come at any time in between (a node that has just
        started blocks publishers until it reaches the majority: CI saw one
        right after the cluster's start) and are passed over."""
        deadline = time.monotonic() + timeout
        while True:
            _, v = self.client.read_frame(timeout=max(0.1, deadline - time.monotonic()))
            if isinstance(v, spec.Connection.Blocked | spec.Connection.Unblocked):
                continue
            assert isinstance(v, cls), f"expected {cls.__name__}, got {v!r}"
            return v

    def publish_and_take(self, queue: str) -> bytes:
        c = self.client
        c.send_frame(spec.Confirm.Select(), 1)
        self._expect(spec.Confirm.SelectOk)
        c.publish("", queue, self.body, persistent=True)
        self._expect(spec.Basic.Ack, timeout=60)
        c.send_frame(spec.Basic.Qos(prefetch_count=1), 1)
        self._expect(spec.Basic.QosOk)
        c.send_frame(spec.Basic.Consume(queue=queue, consumer_tag="hold"), 1)
        self._expect(spec.Basic.ConsumeOk)
        deliver = self._expect(spec.Basic.Deliver)
        self.tag = deliver.delivery_tag
        head = self._expect(pheader.ContentHeader)
        body = b""
        while len(body) < head.body_size:
            body += self._expect(pbody.ContentBody).value
        return body

    def ack(self) -> None:
        self.client.send_frame(spec.Basic.Ack(delivery_tag=self.tag), 1)

    def close(self) -> None:
        self.client.close()


# 2.5 minutes in CI: make test keeps tests/cluster/test_message_store.py's
# test_a_few_unsettled_messages_do_not_keep_the_log_on_disk (the same rule, smaller)
@pytest.mark.long
@pytest.mark.timeout(900)  # ~1.5 min measured on a quiet machine
def test_one_unacked_message_does_not_keep_a_million_passing_through_on_disk(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3, config=PASS_CONFIG)
    c.start()
    leader = c.wait_healthy()
    follower_a, follower_b = c.followers()
    q = uniq_queue("held")
    declare(leader, q)
    holder = _Holder(follower_a, q)
    try:
        held = holder.publish_and_take(q)
        assert held == holder.body and body_ok(held) and body_id(held) == ("held", 1)

        peak = {n.node_id: 0 for n in c.nodes}
        samples = [0]
        stop = threading.Event()
        timeline: list[str] = []  # every few seconds, for the failure message

        def sample() -> None:
            start = time.monotonic()
            while not stop.is_set():
                sizes = {n.node_id: _disk_bytes(n) for n in c.nodes}
                for k, v in sizes.items():
                    peak[k] = max(peak[k], v)
                if samples[0] % 10 == 0:
                    timeline.append(f"{time.monotonic() - start:.0f}s " + " ".join(
                        f"{k}={v >> 20}M/{(n.try_status() or {}).get('log_segments')}seg"
                        for n, (k, v) in zip(c.nodes, sizes.items(), strict=True)))
                samples[0] += 1
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, name="disk-sampler", daemon=True)
        sampler.start()
        t0 = time.monotonic()
        passed = damaged = redelivered = 0
        try:
            for r in range((N_PASS + PASS_ROUND - 1) // PASS_ROUND):
                count = min(PASS_ROUND, N_PASS - r * PASS_ROUND)
                pub = StreamPublisher(f"p{r}", q, lambda: [leader], total=count, window=10_000, size=1024,
                                      deadline=600, stall_timeout=60)
                pub.start()
                got = drain_checked(follower_b, q, count, timeout=600, idle=60)
                pub.join(60)
                assert not pub.is_alive() and pub.error is None and pub.nacked == 0, pub.summary()
                assert set(got.ids) <= {pub.tag}, got.ids.keys()  # never the held message
                ids = got.ids.get(pub.tag, [])
                assert len(ids) == count and set(ids) == pub.confirmed, (r, got.count, len(ids), len(set(ids)))
                passed += got.count
                damaged += got.damaged
                redelivered += got.redelivered
        finally:
            stop.set()
            sampler.join(10)
        took = time.monotonic() - t0
        print("\n" + "\n".join(timeline))
        print(f"{passed} passed through in {took:.1f}s ({passed / took:,.0f} msg/s) with one held; "
              f"disk peak per node (sampled {samples[0]} times): "
              + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in peak.items()))
        assert passed == N_PASS and damaged == 0 and redelivered == 0, (passed, damaged, redelivered)
        for n in c.nodes:
            assert peak[n.node_id] < PASS_DISK_BOUND, \
                f"{n.node_id}: {peak[n.node_id] / 1e6:.0f} MB on disk; " + "; ".join(timeline)
        print("passed, one held: " + ", ".join(
            f"{n.node_id} {n.status()['log_segments']} segments {_disk_bytes(n) / 1e6:.0f} MB" for n in c.nodes))
        # acked: its sparse segment goes, and with it the last reason to keep
        # the log since the last snapshot (one is forced after 30 s quiet)
        holder.ack()
        _wait_segments(c.nodes, 2, "once the held message is acked", timeout=180)
    finally:
        holder.close()


def test_a_drained_queue_frees_its_log_segments_within_seconds(
        cluster_factory: Callable[..., Cluster]) -> None:
    """After a drain the latest snapshot alone pins settled segments; with a
    small state left a snapshot is forced after 3 quiet seconds, not 30
    (RabbitMQ 4.3.6 frees its segments right after a drain: 17 MB at 1M)."""
    n = 150_000  # ~160 MB of log: ~10 segments of 16 MiB
    c = cluster_factory(1, config=PASS_CONFIG)
    c.start()
    node = c.leader()
    q = uniq_queue("freed")
    declare(node, q)
    pub = StreamPublisher("fr", q, lambda: [node], total=n, window=5_000, size=1024, deadline=300,
                          stall_timeout=60)
    pub.start()
    pub.join(300)
    assert not pub.is_alive() and pub.error is None and len(pub.confirmed) == n, pub.summary()
    assert node.status()["log_segments"] > 2
    got = drain_checked(node, q, n, timeout=300)
    assert got.damaged == 0 and got.count == n
    drained = time.monotonic()
    # 30 s would be the old quiet period alone; 3 s quiet + a tiny snapshot
    wait_for(lambda: node.status()["log_segments"] <= 2, timeout=20,
             what="at most 2 log segments within 20 s of the drain")
    print(f"\nsegments freed {time.monotonic() - drained:.1f}s after the drain")


# no snapshot by size, count or time while the test runs: only the stop's
NO_AUTO_SNAPSHOT = ("compaction_max_bytes = 1073741824\ncompaction_min_entries = 10000000\n"
                    "compaction_min_time = 3600\n")


def _log_lines(node: ClusterNode, marker: str, since: int) -> list[str]:
    text = node.log_path.read_text(errors="replace")[since:]
    return [line for line in text.splitlines() if marker in line]


@pytest.mark.timeout(600)
def test_a_clean_stop_snapshots_so_the_restart_replays_nothing_and_reads_sealed_segments_by_index(
        cluster_factory: Callable[..., Cluster]) -> None:
    """Issue 27's restart target (10M in 5 s): a SIGTERM'd node with more than
    32 MiB of log since its last snapshot writes one before it exits, so the
    restart applies (almost) no batches; and the restart reads the sealed
    segments' positions from their index files, walking only the last one.
    Before: every batch since the last snapshot was applied again (3,400
    batches, 3.4 s at 10M) and every segment was walked (5.6 s at 10M)."""
    n = 60_000  # ~64 MB of log in 16 MiB segments
    c = cluster_factory(1, config="segment_bytes = 16777216\n" + NO_AUTO_SNAPSHOT)
    c.start()
    node = c.leader()
    q = uniq_queue("stopsnap")
    declare(node, q)
    pub = StreamPublisher("ss", q, lambda: [node], total=n, window=5_000, size=1024, deadline=300,
                          stall_timeout=60)
    pub.start()
    pub.join(300)
    assert not pub.is_alive() and pub.error is None and len(pub.confirmed) == n, pub.summary()
    assert node.status()["snapshots"] == 0
    segments = node.status()["log_segments"]
    assert segments >= 4
    since = node.log_path.stat().st_size
    node.stop(timeout=120)
    written = _log_lines(node, "snapshot before stopping", since)
    assert len(written) == 1 and ": done in" in written[0], written
    since = node.log_path.stat().st_size
    node.start(wait=True, timeout=120)
    ready = _log_lines(node, "raft ready in", since)
    assert len(ready) == 1, ready
    batches = int(ready[0].split(": ")[-1].split()[0])
    assert batches < 10, ready[0]  # NodeUp and the like, not the publishes
    opened = _log_lines(node, "raft log opened", since)
    assert len(opened) == 1 and opened[0].endswith(", 1 of them record by record"), opened
    got = drain_checked(node, q, n, timeout=300)
    assert got.damaged == 0 and got.count == n and set(got.ids.get("ss", [])) == pub.confirmed
