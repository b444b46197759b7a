"""Issue 27 item 1, first step: queued messages keep a location in the Raft
log, and their bodies and properties are read back from each node's own log
when delivered. Real nodes; random bodies of mixed sizes (up to 256 KiB, some
past frame_max so multi-frame); every body checked by its SHA-256, across
consumers on the leader and on followers, restarts, and snapshots taken with
messages queued (bodies written inline from the log) and installed by a
follower that was behind."""
from __future__ import annotations

import hashlib
import os
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pika

from harness.client import declare, drain, pika_conn, uniq_queue
from harness.process import Cluster, ClusterNode, wait_for

# a snapshot every 60 entries, small segments: messages outlive the entries Raft keeps
SMALL = "compaction_min_entries = 60\nsegment_bytes = 262144\n"


def _bodies(n: int, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        size = rnd.choice((0, 1, 100, 1024, 4096, 70_000, 140_000, 200_000, 262_144))
        out.append(b"%d:" % i + os.urandom(size))
    return out


def _props(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, message_id=f"m{i}", priority=i % 3,
                                headers={"i": i, "tag": "x" * (i % 7)} if i % 2 else None)


def _publish(node: ClusterNode, exchange: str, key: str, bodies: list[bytes], start: int = 0) -> None:
    conn = pika_conn(node)
    try:
        ch = conn.channel()
        ch.confirm_delivery()  # one publish per confirm round trip: one entry each, many entries
        for i, body in enumerate(bodies, start):
            ch.basic_publish(exchange, key, body, _props(i), mandatory=True)
    finally:
        conn.close()


def _take(node: ClusterNode, queue: str, n: int) -> list[tuple[bytes, Any]]:
    """Consume and ack exactly n messages: [(body, properties)]."""
    conn = pika_conn(node)
    got: list[tuple[bytes, Any]] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=7)

        def on_msg(chan: Any, method: Any, props: Any, body: bytes) -> None:
            if len(got) < n:
                got.append((body, props))
                chan.basic_ack(method.delivery_tag)
            else:
                chan.basic_nack(method.delivery_tag, requeue=True)

        ch.basic_consume(queue, on_msg)
        for _ in range(600):
            if len(got) >= n:
                break
            conn.process_data_events(time_limit=0.1)
        assert len(got) == n, f"{len(got)} of {n} consumed from {queue} on {node.node_id}"
    finally:
        conn.close()
    return got


def _digest(bodies: list[bytes]) -> Counter[str]:
    return Counter(hashlib.sha256(b).hexdigest() for b in bodies)


def _check_props(got: list[tuple[bytes, Any]]) -> None:
    for body, props in got:
        i = int(body.split(b":", 1)[0])
        assert props.message_id == f"m{i}" and props.delivery_mode == 2 and props.priority == i % 3
        assert props.headers == ({"i": i, "tag": "x" * (i % 7)} if i % 2 else None)


def _segments(node: ClusterNode) -> int:
    return len(list((node.data_dir / "log").glob("*.seg")))


def test_one_node_restart_and_snapshot_in_the_middle(cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(1, config=SMALL)
    c.start()
    node = c.leader()
    q = uniq_queue("store1")
    declare(node, q)
    sent = _bodies(90, seed=1)
    _publish(node, "", q, sent[:60])
    got = _take(node, q, 20)  # read back from the log
    wait_for(lambda: node.status()["snapshots"] >= 1, timeout=60, what="a snapshot with messages queued")
    _publish(node, "", q, sent[60:], start=60)
    got += _take(node, q, 20)
    node.kill9()
    node.start(wait=True)  # the snapshot (places in the log) plus the entries after it
    got += _take(node, q, 20)
    got += [(b, None) for b, _r in drain(node, q, idle=1.0)]
    _check_props([g for g in got if g[1] is not None])
    assert _digest([b for b, _p in got]) == _digest(sent)
    # drained: after the next snapshot no segment below it is kept for messages
    filler = uniq_queue("filler")
    declare(node, filler)
    _publish(node, "", filler, [b"f"] * 70)
    wait_for(lambda: _segments(node) <= 3, timeout=60, what="the drained log's segments released")


def test_three_nodes_consumers_on_followers_snapshot_installed(cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3, config=SMALL)
    c.start()
    leader = c.leader()
    lagger, other = c.followers()
    q1, q2 = uniq_queue("store3a"), uniq_queue("store3b")
    declare(leader, q1, q2)
    conn = pika_conn(leader)
    try:  # one publish, two queues: stored once, delivered from both
        ch = conn.channel()
        for q in (q1, q2):
            ch.queue_bind(q, "amq.fanout")
    finally:
        conn.close()
    lagger.kill9()
    wait_for(lambda: lagger.node_id not in leader.status()["in_sync"], timeout=30,
             what="the killed follower to leave the in-sync set")
    sent = _bodies(100, seed=3)
    _publish(leader, "amq.fanout", "", sent[:70])
    got1 = _take(other, q1, 25)  # a follower reads its own log
    got2 = _take(leader, q2, 10)
    wait_for(lambda: leader.status()["snapshots"] >= 1, timeout=60, what="a snapshot on the leader")
    _publish(leader, "amq.fanout", "", sent[70:], start=70)
    wait_for(lambda: leader.status()["log_len"] < 100, timeout=60, what="the leader's log compacted")

    lagger.start(wait=True)  # behind the leader's snapshot: installs it (bodies inline)
    target = leader.status()["commit_index"]
    wait_for(lambda: (s := lagger.try_status()) is not None and s["last_applied"] >= target,
             timeout=60, what="the restarted follower to catch up")
    assert lagger.status()["installed_snapshots"] >= 1
    got1 += _take(lagger, q1, 25)
    got2 += _take(other, q2, 30)

    leader.kill9()  # a restart in the middle, on what was the leader
    leader.start(wait=True)
    got1 += [(b, None) for b, _r in drain(leader, q1, idle=1.0)]
    got2 += [(b, None) for b, _r in drain(lagger, q2, idle=1.0)]
    _check_props([g for g in got1 + got2 if g[1] is not None])
    assert _digest([b for b, _p in got1]) == _digest(sent)
    assert _digest([b for b, _p in got2]) == _digest(sent)


def _rss(node: ClusterNode) -> int:
    assert node.pid is not None
    for line in open(f"/proc/{node.pid}/status").read().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_queued_bodies_stay_out_of_the_heap(cluster_factory: Callable[..., Cluster]) -> None:
    """3,000 x 32 KiB queued (96 MiB of bodies): the node's RSS grows by a small
    part of that (the bytes are in the log and the page cache). Before issue 27
    every body was in the heap: RSS grew by more than the bytes queued."""
    c = cluster_factory(1)
    c.start()
    node = c.leader()
    q = uniq_queue("heap")
    declare(node, q)
    body = os.urandom(32 << 10)
    before = _rss(node)
    conn = pika_conn(node)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(3000):
            ch.basic_publish("", q, b"%d:" % i + body)
    finally:
        conn.close()
    grown = _rss(node) - before
    assert grown < 0.25 * 3000 * len(body), f"RSS grew {grown} bytes for {3000 * len(body)} bytes queued"
    got = drain(node, q, idle=1.0)
    assert sorted(int(b.split(b":", 1)[0]) for b, _r in got) == list(range(3000))
    assert all(b.split(b":", 1)[1] == body for b, _r in got)


def _flip(path: Any, seed: int, count: int = 8) -> None:
    data = bytearray(path.read_bytes())
    rnd = random.Random(seed)
    for _ in range(count):  # past the 32-byte header: inside records
        data[rnd.randrange(64, len(data))] ^= 1 << rnd.randrange(8)
    path.write_bytes(bytes(data))


def test_snapshots_hold_the_index_and_a_follower_repairs_damaged_imported_entries(
        cluster_factory: Callable[..., Cluster]) -> None:
    """Issue 27 items 3 and 5: the leader's snapshot holds messages' places,
    not their bodies (the file is a small part of the bytes queued); a
    follower behind it receives the snapshot and the log entries it needs,
    checked, stored in a segment of their own (.lseg), and serves every body
    from there, also after a restart. Bits flipped in that segment while the
    follower is down: it forgets its log, the leader repairs it, and no
    consumer on it ever gets a damaged body. Before: snapshots carried every
    body inline (a file as large as the backlog, rewritten every 60 entries)."""
    c = cluster_factory(3, config=SMALL)
    c.start()
    leader = c.leader()
    lagger, _other = c.followers()
    q = uniq_queue("index")
    declare(leader, q)
    lagger.kill9()
    wait_for(lambda: lagger.node_id not in leader.status()["in_sync"], timeout=30,
             what="the killed follower to leave the in-sync set")
    sent = _bodies(90, seed=5)
    _publish(leader, "", q, sent)
    wait_for(lambda: leader.status()["snapshots"] >= 1 and leader.status()["log_len"] < 100, timeout=60,
             what="a snapshot on the leader and its log compacted")
    queued = sum(len(b) for b in sent)
    assert leader.status()["last_snapshot_bytes"] < queued // 20, (leader.status()["last_snapshot_bytes"], queued)

    lagger.start(wait=True)  # behind the leader's snapshot: installs it with the entries it needs
    target = leader.status()["commit_index"]
    wait_for(lambda: (s := lagger.try_status()) is not None and s["last_applied"] >= target,
             timeout=60, what="the restarted follower to catch up")
    assert lagger.status()["installed_snapshots"] >= 1
    imported = list((lagger.data_dir / "log").glob("*.lseg"))
    assert imported, sorted(p.name for p in (lagger.data_dir / "log").iterdir())

    lagger.kill9()
    for path in imported:
        _flip(path, seed=7)
    lagger.start(wait=True)  # forgets its log, installs the leader's snapshot again
    wait_for(lambda: (s := lagger.try_status()) is not None and s["last_applied"] >= target,
             timeout=60, what="the damaged follower to be repaired")
    assert lagger.status()["installed_snapshots"] >= 1
    got = _take(lagger, q, 45)
    got += [(b, None) for b, _r in drain(lagger, q, idle=1.0)]
    _check_props([g for g in got if g[1] is not None])
    assert _digest([b for b, _p in got]) == _digest(sent)
    text = lagger.log_path.read_text(errors="replace")
    assert "the log and state are forgotten and the leader repairs this member" in text


def _log_dir_bytes(node: ClusterNode) -> int:
    return sum(p.stat().st_size for p in (node.data_dir / "log").iterdir()
               if p.suffix in (".seg", ".lseg"))


def test_a_few_unsettled_messages_do_not_keep_the_log_on_disk(cluster_factory: Callable[..., Cluster]) -> None:
    """Issue 27 item 4: one publish in 100 goes to a queue nobody consumes,
    the rest pass through a consumer (1.5-3.5 KB bodies, about 100 to a
    256 KiB segment: a stuck message in nearly every segment, each keeping its
    16-entry bucket live, 16 % of the segment). Those few messages sit in every
    segment; compaction moves their entries into sparse segments and frees
    the rest: the log on disk ends at a small part of the bytes that passed,
    and the stuck messages are served intact, also after a restart. Without
    compaction every segment stays (one live message keeps a whole segment)."""
    c = cluster_factory(1, config="compaction_min_entries = 200\nsegment_bytes = 262144\n")
    c.start()
    node = c.leader()
    flow, stuck = uniq_queue("flow"), uniq_queue("stuck")
    declare(node, flow, stuck)
    rnd = random.Random(11)
    sent_stuck: list[bytes] = []
    passed = 0
    conn = pika_conn(node)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(1500):
            body = b"%d:" % i + rnd.randbytes(rnd.randrange(1500, 3500))
            if i % 100 == 50:
                sent_stuck.append(body)
                ch.basic_publish("", stuck, body, pika.BasicProperties(delivery_mode=2))
            else:
                passed += len(body)
                ch.basic_publish("", flow, body, pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()
    assert len(drain(node, flow, idle=1.0)) == 1500 - len(sent_stuck)
    # (a snapshot is forced once the last one pins mostly settled entries, then one segment a second)
    wait_for(lambda: node.status()["log_compactions"] >= 3 and _log_dir_bytes(node) < passed // 4,
             timeout=120, what=f"the log compacted below a quarter of the {passed} bytes that passed")
    node.kill9()
    node.start(wait=True)
    got = [b for b, _r in drain(node, stuck, idle=1.0)]
    assert _digest(got) == _digest(sent_stuck)
