"""A member stops on SIGTERM within seconds whatever the cluster's state (issue 30:
rolling restarts that cannot hang). RabbitMQ's operator waits in a preStop hook
until the queues' quorum is safe, and users saw pods stuck Terminating when it
never was; mirrorq has no such hook and its shutdown waits on nobody: a member
that has lost its quorum with publishes outstanding and consumers holding
unacked deliveries exits cleanly (rc 0) well inside the chart's grace period, and
so does the last member of a cluster whose others stopped first. Afterwards every
confirmed message is there."""
from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from harness.body import body_ok
from harness.client import check_delivered, declare, drain, uniq_queue
from harness.datafs import tmpfs_unavailable_reason
from harness.process import Cluster, ClusterNode, wait_for
from harness.publisher import StreamPublisher

# far below the chart's terminationGracePeriodSeconds (120 s) and the e2e tests' 30 s
BOUND = 15.0


def timed_sigterm(node: ClusterNode) -> tuple[float, int | None]:
    """SIGTERM `node`; (seconds until it exited, its exit code). Never SIGKILLs: a
    node still running after 3 x BOUND fails the caller's assertion."""
    assert node.proc is not None and node.proc.poll() is None
    t0 = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    try:
        rc = node.proc.wait(timeout=3 * BOUND)
    except Exception:  # noqa: BLE001 - reported by the assertion below
        rc = None
    took = time.monotonic() - t0
    if rc is None:
        node.kill9()
    return took, rc


def hold_unacked(node: ClusterNode, queue: str, want: int, stop: threading.Event,
                 held: list[int]) -> None:
    """A consumer that takes deliveries and never acks them (prefetch `want`),
    until `stop`; its connection stays open across the SIGTERM."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=node.host, port=node.amqp_port, heartbeat=0,
        credentials=pika.PlainCredentials(node.user, node.password)))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=want)
        ch.basic_consume(queue, lambda _c, _m, _p, _b: held.append(1), auto_ack=False)
        while not stop.is_set():
            conn.process_data_events(time_limit=0.2)
    except Exception:  # noqa: BLE001 - the node going away ends it
        return
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - already closed by the node
            pass


def test_a_member_without_quorum_and_the_last_member_exit_on_sigterm_within_seconds(
        cluster: Cluster) -> None:
    leader = cluster.leader()
    others = [n for n in cluster.nodes if n is not leader]
    q = uniq_queue("shutdown")
    declare(leader, q)
    # random bodies of 1-64 KiB, streaming confirms through the leader
    pub = StreamPublisher("sd", q, lambda: [leader], total=None, window=500, size=1024,
                          max_size=65536, seed=30, stall_timeout=120, deadline=300)
    pub.start()
    wait_for(lambda: len(pub.confirmed) >= 1500, 60, what="1,500 confirms")
    stop = threading.Event()
    held: list[int] = []
    consumer = threading.Thread(target=hold_unacked, args=(leader, q, 200, stop, held), daemon=True)
    consumer.start()
    wait_for(lambda: len(held) >= 200, 30, what="200 unacked deliveries held")

    # the quorum goes (kill -9 of both followers) while publishes are in flight
    for n in others:
        n.kill9()
    t_lost = time.monotonic()
    wait_for(lambda: pub.progress_since(t_lost + 1.0) == 0 and time.monotonic() > t_lost + 3.0,
             30, what="confirms stopped after the quorum went")
    took, rc = timed_sigterm(leader)
    print(f"\nmember without quorum: exited {rc} {took:.2f}s after SIGTERM "
          f"(publisher: {pub.summary()}, {len(held)} unacked held)")
    stop.set()
    pub.abandon()
    pub.join(30)
    consumer.join(10)
    assert rc == 0 and took < BOUND, (rc, took)

    # back up: then the members stop one by one, the last one without a quorum too
    cluster.start()
    cluster.leader(timeout=60)
    times = []
    for n in sorted(cluster.nodes, key=lambda n: n.node_id):
        took, rc = timed_sigterm(n)
        times.append((n.node_id, rc, round(took, 2)))
    print(f"one by one: {times}")
    assert all(rc == 0 and took < BOUND for _nid, rc, took in times), times

    # nothing confirmed is lost by any of it
    cluster.start()
    got = drain(cluster.leader(timeout=30), q)
    res = check_delivered({pub.tag: pub.confirmed}, got)
    assert res["lost_count"] == 0 and res["duplicates"] == 0, res
    assert all(body_ok(body) for body, _red in got)


def _fill_until_enospc(path: Path) -> int:
    """Append random bytes to `path` until the filesystem is full; bytes written."""
    written, chunk = 0, os.urandom(1 << 20)
    with open(path, "ab", buffering=0) as f:
        while len(chunk) >= 4096:
            try:
                written += f.write(chunk) or 0
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 4]  # the last pages too
    return written


@pytest.mark.skipif(tmpfs_unavailable_reason() is not None, reason=str(tmpfs_unavailable_reason()))
def test_a_node_on_a_full_disk_exits_on_sigterm_within_the_bound_and_keeps_every_confirm(
        cluster_factory: Callable[..., Cluster]) -> None:
    """Issue 46: a full disk keeps a node running (ENOSPC is not fatal), and its
    clean stop wanted a snapshot of the 40 MB of log since the last one: it
    waited 60 s for one that could not be written. Now it gives up at the first
    failure (or takes none while they fail) and exits within BOUND; after the
    space returns every confirmed message is there."""
    c = cluster_factory(1, data_fs_mb=96)
    try:
        c.start()
        _full_disk_stop(c)
    finally:
        c.kill_all()
        c.unmount_all()  # (the tmpfs outlives the processes)


def _full_disk_stop(c: Cluster) -> None:
    node = c.leader()
    q = uniq_queue("fulldisk")
    declare(node, q)
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=node.host, port=node.amqp_port, heartbeat=0,
        credentials=pika.PlainCredentials(node.user, node.password)))
    ch = conn.channel()
    ch.confirm_delivery()
    sent = [os.urandom(64 << 10) for _ in range(640)]  # 40 MiB: past STOP_SNAPSHOT_BYTES
    for body in sent:
        ch.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2))
    conn.close()
    ballast = node.data_dir / "ballast"
    print(f"\nfilled {_fill_until_enospc(ballast) >> 20} MiB of ballast")
    took, rc = timed_sigterm(node)
    print(f"full disk: exited {rc} {took:.2f}s after SIGTERM; "
          f"{[ln for ln in node.tail_log(40).splitlines() if 'before stopping' in ln]}")
    assert rc == 0 and took < BOUND, (rc, took)
    ballast.unlink()
    node.start()
    got = drain(c.leader(timeout=30), q)
    assert sorted(b for b, _ in got) == sorted(sent), f"{len(got)} of {len(sent)} back"
