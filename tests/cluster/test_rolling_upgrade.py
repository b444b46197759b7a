"""Upgrades from the previous release's real build (issue 27 item 7).

The old build is tests/data/release-<commit>.tar.gz (the node/ package of
the release, made by tests/data/make-release-fixture.sh), extracted and run
with this venv's python; every process prints the node package it imported
and the tests check it (the venv's editable install of this checkout must
not win). The new build is this checkout.

- A 3-node cluster of the old build with a backlog in a quorum and a classic
  queue is rolled one member at a time (followers first, the leader last,
  as the operator does: SIGTERM, the new build on the same data dir, back
  in sync before the next) under streaming-confirm publishers: confirms go
  on while each member is down and after it is back, every member ends at
  this build's machine version, and every confirmed message is drained
  intact (checksummed bodies): 0 lost.
- One node's data dir written by the old build (a snapshot in it and log
  entries after it) starts under the new build and serves every message.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from harness.body import RandomBodies
from harness.client import declare, drain, pika_conn, queue_depth, uniq_queue
from harness.drainer import Drained, drain_checked
from harness.process import REPO, Cluster, ClusterNode, wait_for
from harness.publisher import StreamPublisher
from harness.release import extract, imported_from, release_name
from node.replication.machine.version import MACHINE_VERSION

BACKLOG = 3000  # per queue, before the roll
MIN_SIZE, MAX_SIZE = 64, 16384  # log-uniform body sizes (mean ~3 KiB)
PHASE_CONFIRMS = 150  # confirms each publisher must get in each phase of the roll
QUORUM = {"x-queue-type": "quorum"}
# snapshots every 2 s and 8 MiB segments: the old build's snapshots and segments are
# on disk when each member restarts as the new build (and a member behind may be sent
# the old leader's snapshot)
OFTEN = "compaction_min_entries = 500\ncompaction_min_time = 2.0\nsegment_bytes = 8388608\n"


@pytest.fixture(scope="module")
def old_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extracted old release: the directory holding its node/ package."""
    return extract(tmp_path_factory.mktemp("release"))


def _run_as(node: ClusterNode, source: Path) -> None:
    node.source_dir = source


def _check_imported(node: ClusterNode, source: Path) -> None:
    got = imported_from(node)
    want = (source / "node" / "__init__.py").resolve()
    assert got is not None and got.resolve() == want, \
        f"{node.node_id} imported {got}, not {want}:\n{node.tail_log(10)}"


def _versions(nodes: list[ClusterNode]) -> dict[str, tuple[int, int] | None]:
    """member -> (the cluster's machine version as applied there, the one its build runs)."""
    return {n.node_id: (st["machine_version"], st["runs_machine_version"]) if st else None
            for n, st in ((n, n.try_status()) for n in nodes)}


def _confirms(pubs: list[StreamPublisher], since: float, n: int, timeout: float, what: str,
              up: list[ClusterNode]) -> None:
    """Each publisher has `n` confirms after `since` (none has failed); every node of
    `up` stays running (one that exits, e.g. on a record it cannot read, fails at once)."""
    def ok() -> bool:
        for node in up:
            assert node.alive(), f"{node.node_id} exited ({node.proc and node.proc.returncode}) " \
                                 f"while waiting for {what}:\n{node.tail_log(8)}"
        for p in pubs:
            assert p.error is None and p.is_alive(), f"publisher stopped: {p.summary()}"
        return all(p.progress_since(since) >= n for p in pubs)
    try:
        wait_for(ok, timeout, interval=0.05, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {[p.progress_since(since) for p in pubs]} confirms since; "
                             f"{[p.summary() for p in pubs]}") from None


def _caught_up(cluster: Cluster, node: ClusterNode, timeout: float) -> None:
    """`node` is in the leader's in-sync set and has applied what the leader had
    committed when it was seen in sync."""
    leader = cluster.wait_healthy(timeout)
    if leader is node:
        return
    commit = leader.status()["commit_index"]
    wait_for(lambda: (st := node.try_status()) is not None and st["last_applied"] >= commit,
             timeout, what=f"{node.node_id} to apply up to the leader's commit index {commit}")


def _check_drained(queue: str, got: Drained, pubs: list[StreamPublisher]) -> tuple[int, int]:
    """Every confirmed id of `pubs` is in `got`, every body intact, nothing unknown;
    duplicates only of republished ids (outstanding when a connection died).
    Returns (lost, duplicates)."""
    assert got.damaged == 0, f"{queue}: {got.damaged} bodies failed their checksum"
    assert set(got.ids) <= {p.tag for p in pubs}, f"{queue}: bodies of other publishers: {set(got.ids)}"
    lost = dups = 0
    for p in pubs:
        ids = Counter(got.ids.get(p.tag, []))
        missing = p.confirmed - ids.keys()
        lost += len(missing)
        assert not missing, f"{queue}: {len(missing)} confirmed ids of {p.tag} lost, e.g. {sorted(missing)[:10]}"
        # a finished publisher has every id it published confirmed: nothing else may come
        unknown = ids.keys() - p.confirmed
        assert not unknown, f"{queue}: ids of {p.tag} never confirmed: {sorted(unknown)[:10]}"
        extra = sum(c - 1 for c in ids.values())
        assert extra <= p.republished, f"{queue}: {extra} duplicates of {p.tag}, {p.republished} republished"
        dups += extra
    return lost, dups


def test_a_cluster_rolls_from_the_previous_release_under_streaming_confirms(
        cluster_factory: Callable[..., Cluster], old_build: Path) -> None:
    t_start = time.monotonic()
    cluster = cluster_factory(3, config=OFTEN)
    for n in cluster.nodes:
        _run_as(n, old_build)
    cluster.start(timeout=90)
    for n in cluster.nodes:
        _check_imported(n, old_build)
    leader = cluster.leader()
    qq, cq = uniq_queue("rollq"), uniq_queue("rollc")
    declare(leader, qq, arguments=QUORUM)
    declare(leader, cq)

    # the backlog: thousands of random persistent messages in each queue
    def live() -> list[ClusterNode]:
        return [n for n in cluster.nodes if n.alive()]

    backlog = [StreamPublisher("qb", qq, live, total=BACKLOG, size=MIN_SIZE, max_size=MAX_SIZE, seed=1),
               StreamPublisher("cb", cq, lambda: live()[::-1], total=BACKLOG, size=MIN_SIZE,
                               max_size=MAX_SIZE, seed=2)]
    for p in backlog:
        p.start()
    for p in backlog:
        p.join(120)
        assert not p.is_alive() and p.error is None and len(p.confirmed) == BACKLOG, p.summary()
    t_backlog = time.monotonic() - t_start

    # streaming-confirm publishers, one per queue, preferring different members
    stream = [StreamPublisher("qs", qq, live, total=None, window=100, size=MIN_SIZE,
                              max_size=MAX_SIZE // 2, seed=3, deadline=600),
              StreamPublisher("cs", cq, lambda: live()[::-1], total=None, window=100, size=MIN_SIZE,
                              max_size=MAX_SIZE // 2, seed=4, deadline=600)]
    figures: list[str] = []
    try:
        for p in stream:
            p.start()
        _confirms(stream, 0.0, PHASE_CONFIRMS, 60, "confirms before the roll", cluster.nodes)
        wait_for(lambda: all((n.status().get("snapshots") or 0) >= 1 for n in cluster.nodes), 60,
                 what="a snapshot by the old build on every member")
        old_snapshots = {n.node_id: n.status()["snapshots"] for n in cluster.nodes}
        order = cluster.followers() + [leader]  # the leader last, as the operator rolls
        for node in order:
            t0 = time.monotonic()
            node.stop(timeout=30)  # SIGTERM
            assert node.proc is not None and node.proc.returncode == 0, \
                f"{node.node_id} did not exit cleanly on SIGTERM ({node.proc and node.proc.returncode}):\n" \
                f"{node.tail_log(15)}"
            t_stopped = time.monotonic()
            _confirms(stream, t_stopped, PHASE_CONFIRMS, 60, f"confirms while {node.node_id} is down",
                      [n for n in cluster.nodes if n is not node])
            _run_as(node, REPO)
            t1 = time.monotonic()
            node.start(timeout=60)
            _check_imported(node, REPO)
            t_serving = time.monotonic()
            _caught_up(cluster, node, 60)
            t_back = time.monotonic()
            during = sum(p.progress_since(t0) for p in stream)
            _confirms(stream, t_back, PHASE_CONFIRMS, 60, f"confirms with {node.node_id} back on the new build",
                      cluster.nodes)
            figures.append(f"{node.node_id}: stop {t_stopped - t0:.2f}s, start to serving {t_serving - t1:.2f}s, "
                           f"in sync {t_back - t_serving:.2f}s, {t_back - t0:.2f}s in all, "
                           f"{during} confirmed meanwhile")

        # every member runs the new build; the leader raises the cluster to its machine version
        want = {n.node_id: (MACHINE_VERSION, MACHINE_VERSION) for n in cluster.nodes}
        wait_for(lambda: _versions(cluster.nodes) == want, 30,
                 what=f"every member at machine version {MACHINE_VERSION}")
        _confirms(stream, time.monotonic(), PHASE_CONFIRMS, 60, "confirms after the roll", cluster.nodes)
    finally:
        for p in stream:
            p.stop()
    for p in stream:
        p.finish(60)
        assert p.error is None, p.summary()

    # every confirmed message, intact, on a member that was rolled early and on the last one
    cluster.wait_healthy(60)
    lost = dups = drained = 0
    for queue, node, pubs in ((qq, order[0], [backlog[0], stream[0]]), (cq, order[-1], [backlog[1], stream[1]])):
        ready = queue_depth(node, queue)
        got = drain_checked(node, queue, expect=ready, idle=30, timeout=120)
        assert got.count == ready, f"{queue}: {ready} ready on {node.node_id}, drained {got.count}"
        ql, qd = _check_drained(queue, got, pubs)
        lost, dups, drained = lost + ql, dups + qd, drained + got.count
    confirmed = sum(len(p.confirmed) for p in backlog + stream)
    snapshots = {n.node_id: (old_snapshots[n.node_id], n.status().get("snapshots")) for n in cluster.nodes}
    print(f"\nrolling upgrade {release_name()} -> this checkout (machine version {MACHINE_VERSION}): "
          f"backlog {2 * BACKLOG} in {t_backlog:.1f}s; " + "; ".join(figures)
          + f"; confirmed {confirmed}, drained {drained}, lost {lost}, duplicates {dups} "
          f"(republished {sum(p.republished for p in stream)}, "
          f"reconnects {sum(len(p.reconnects) for p in stream)}); snapshots (old build, new build since its "
          f"start) {snapshots}; {time.monotonic() - t_start:.1f}s wall")


def _publish(node: ClusterNode, queue: str, bodies: RandomBodies, tag: str, ids: range) -> Counter[str]:
    """One confirmed publish per message (one log entry each): their sha256."""
    conn = pika_conn(node)
    sent: Counter[str] = Counter()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2, headers={"n": 0})
        for i in ids:
            body = bodies.make(tag, i)
            props.headers = {"n": i}
            ch.basic_publish("", queue, body, props)
            sent[hashlib.sha256(body).hexdigest()] += 1
    finally:
        conn.close()
    return sent


def _take(node: ClusterNode, queue: str, n: int) -> Counter[str]:
    """basic.get and ack the first `n` messages of `queue`: their sha256."""
    conn = pika_conn(node)
    taken: Counter[str] = Counter()
    try:
        ch = conn.channel()
        for _ in range(n):
            method, _props, body = ch.basic_get(queue, auto_ack=False)
            assert method is not None, f"{queue} ran dry after {sum(taken.values())}"
            ch.basic_ack(method.delivery_tag)
            taken[hashlib.sha256(body).hexdigest()] += 1
    finally:
        conn.close()
    return taken


def test_a_data_dir_of_the_previous_release_with_a_snapshot_serves_every_message(
        cluster_factory: Callable[..., Cluster], old_build: Path) -> None:
    """One node of the old build, snapshots every 40 entries: messages before and
    after its snapshot, some of them acked; SIGTERM; the new build on the same data
    dir serves exactly the rest, bodies intact."""
    cluster = cluster_factory(1, config="compaction_min_entries = 40\ncompaction_min_time = 0.5\n")
    node = cluster.nodes[0]
    _run_as(node, old_build)
    node.start(timeout=60)
    cluster.wait_healthy(60)
    _check_imported(node, old_build)
    qq, cq = uniq_queue("oldq"), uniq_queue("oldc")
    declare(node, qq, arguments=QUORUM)
    declare(node, cq)
    bodies = RandomBodies(MIN_SIZE, MAX_SIZE, seed=os.urandom(8).hex())
    want = {qq: _publish(node, qq, bodies, "q", range(1, 301)), cq: _publish(node, cq, bodies, "c", range(1, 301))}
    dump = node.data_dir / "raft.dump"
    wait_for(lambda: dump.exists() and (node.status().get("snapshots") or 0) >= 1, 60,
             what="a snapshot by the old build")
    snapshot_size = dump.stat().st_size
    for q, tag in ((qq, "q"), (cq, "c")):  # acked ones are gone, and entries after the snapshot
        want[q] -= _take(node, q, 50)
        want[q] += _publish(node, q, bodies, tag, range(301, 341))
    node.stop(timeout=30)
    assert node.proc is not None and node.proc.returncode == 0, node.tail_log(15)

    _run_as(node, REPO)
    node.start(timeout=60)
    _check_imported(node, REPO)
    cluster.wait_healthy(60)
    wait_for(lambda: _versions([node])[node.node_id] == (MACHINE_VERSION, MACHINE_VERSION), 30,
             what=f"machine version {MACHINE_VERSION}")
    for q in (qq, cq):
        got = drain(node, q)
        assert Counter(hashlib.sha256(b).hexdigest() for b, _r in got) == want[q], \
            f"{q}: {sum(want[q].values())} left by the old build, {len(got)} served by the new one"
    print(f"\nold data dir ({release_name()}): snapshot {snapshot_size} B, "
          f"{sum(sum(c.values()) for c in want.values())} messages served by the new build")
