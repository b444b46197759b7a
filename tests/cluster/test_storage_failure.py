"""A member whose disk fails under it stops cleanly instead of spinning (issue 46).

Before, a follower whose data dir was removed ran on for hours: its open fds
kept working, every snapshot writer failed twice a second, its heap grew and it
held its slot in the in-sync set. Now an error that means the data dir can no
longer be trusted ends the node within seconds, with one CRITICAL line naming
file, operation and errno, and exit code 5 (storage_fault.EXIT_STORAGE), as a
crash would; restarted on an empty directory it is repaired from its peers.

The faults are real: the directory removed under a running node, and
harness.slowfs's error modes (every changing operation under the mount fails
with EIO, or EROFS as after a read-only remount), mounted on the one node they
hit.
"""
from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.client import check_delivered, declare, drain, uniq_queue
from harness.datafs import DataFs, fuse_unavailable_reason
from harness.process import Cluster, ClusterNode, wait_for
from harness.publisher import StreamPublisher
from node.replication.raft.storage_fault import EXIT_STORAGE

EXIT_WITHIN = 10.0  # s after the fault (the bound)
needs_fuse = pytest.mark.skipif(fuse_unavailable_reason() is not None, reason=str(fuse_unavailable_reason()))


def _log_since_start(node: ClusterNode) -> str:
    return node.log_path.read_text(errors="replace").rsplit("==== start", 1)[-1]


def _wait_exit(node: ClusterNode, since: float) -> float:
    """Seconds from `since` until `node` exited; checks its code and its one CRITICAL line."""
    wait_for(lambda: not node.alive(), timeout=EXIT_WITHIN, interval=0.02,
             what=f"{node.node_id} to exit after its storage failed")
    took = time.monotonic() - since
    assert node.proc is not None and node.proc.returncode == EXIT_STORAGE, (node.proc, node.tail_log(20))
    critical = [ln for ln in _log_since_start(node).splitlines() if "CRITICAL" in ln]
    assert len(critical) == 1, critical
    return took


def _critical(node: ClusterNode) -> str:
    return next(ln for ln in _log_since_start(node).splitlines() if "CRITICAL" in ln)


def _left_in_sync(leader: ClusterNode, victim: ClusterNode) -> None:
    wait_for(lambda: victim.node_id not in leader.status()["in_sync"], timeout=10,
             what=f"{victim.node_id} to leave the in-sync set")


def _confirms_go_on(pub: StreamPublisher, since: float, n: int = 300) -> None:
    wait_for(lambda: pub.progress_since(since) >= n or pub.error, timeout=20,
             what=f"{n} confirms after {since:.1f}")
    assert pub.error is None, pub.summary()


def _rejoins_from_empty(cluster: Cluster, victim: ClusterNode, pub: StreamPublisher, queue: str) -> None:
    """Restart `victim` on an empty data dir: back in the in-sync set, and it
    serves every message confirmed meanwhile."""
    assert not any(victim.data_dir.iterdir()), "the data dir was not emptied"
    victim.start()
    leader = cluster.leader()
    wait_for(lambda: victim.node_id in leader.status()["in_sync"], timeout=30, interval=0.1,
             what=f"{victim.node_id} back in the in-sync set")
    t = time.monotonic()
    _confirms_go_on(pub, t, 200)
    pub.finish(60)
    got = drain(victim, queue, idle=1.5)
    res = check_delivered({pub.tag: pub.confirmed}, got)
    assert res["lost_count"] == 0, res
    assert victim.alive(), victim.tail_log(20)


def _empty(path: Path) -> None:
    for entry in list(path.iterdir()):
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _publisher(cluster: Cluster, node: ClusterNode, queue: str) -> StreamPublisher:
    declare(node, queue)
    pub = StreamPublisher(queue, queue, lambda: [node, *(n for n in cluster.live() if n is not node)],
                          total=None, rate=2000)
    pub.start()
    wait_for(lambda: len(pub.confirmed) >= 300 or pub.error, timeout=20, what="300 confirms")
    assert pub.error is None, pub.summary()
    return pub


@pytest.fixture
def one_fuse_node(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    """A 3-node cluster whose n3 has its data dir on the slowfs FUSE mount (the
    others on plain disk: one FUSE daemon, not three, on a small machine)."""
    cluster = cluster_factory(3)
    n3 = cluster.nodes[2]
    n3.datafs = DataFs(n3.data_dir, slow=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.kill_all()
        cluster.unmount_all()


def _make_leader(cluster: Cluster, node: ClusterNode) -> None:
    from node.admin.client import call_transfer_leadership
    leader = cluster.leader()
    if leader is not node:
        call_transfer_leadership(leader.host, leader.admin_port, node.node_id, token=leader.admin_token)
    wait_for(lambda: cluster.leader(timeout=5) is node, timeout=20, what=f"{node.node_id} to lead")
    cluster.wait_healthy(20)


def _make_follower(cluster: Cluster, node: ClusterNode) -> None:
    if cluster.leader() is node:
        _make_leader(cluster, next(n for n in cluster.nodes if n is not node))


def test_follower_whose_data_dir_is_removed_exits_then_rejoins_from_empty(cluster: Cluster) -> None:
    leader = cluster.leader()
    victim = cluster.followers()[0]
    q = uniq_queue("gone")
    pub = _publisher(cluster, leader, q)
    try:
        t0 = time.monotonic()
        # as a failed or unmounted volume: the directory goes while the node runs
        wait_for(lambda: (shutil.rmtree(victim.data_dir, ignore_errors=True), not victim.data_dir.exists())[1],
                 timeout=5, what="the data dir removed")
        took = _wait_exit(victim, t0)
        line = _critical(victim)
        assert "storage failure:" in line and "ENOENT" in line and str(victim.data_dir) in line, line
        _left_in_sync(leader, victim)
        _confirms_go_on(pub, time.monotonic())  # the leader confirms with the other member
        print(f"\nexited {took:.2f} s after its data dir was removed: {line.split('CRITICAL', 1)[-1].strip()}")
        victim.data_dir.mkdir(parents=True)
        _rejoins_from_empty(cluster, victim, pub, q)
    finally:
        pub.abandon()


def test_follower_whose_data_dir_is_swapped_for_an_empty_one_exits_then_rejoins(cluster: Cluster) -> None:
    """An empty directory in its place in one step (a volume mounted again
    empty): every later write there succeeds, in the wrong directory; the
    once-a-second check of the data dir's identity stops the node."""
    leader = cluster.leader()
    victim = cluster.followers()[0]
    q = uniq_queue("swap")
    pub = _publisher(cluster, leader, q)
    aside = victim.data_dir.with_name("data.empty")
    aside.mkdir()
    try:
        t0 = time.monotonic()
        _exchange(aside, victim.data_dir)  # atomic: the path never lacks a directory
        took = _wait_exit(victim, t0)
        line = _critical(victim)
        assert f"stat of {victim.data_dir} failed: ENOENT" in line and "replaced" in line, line
        _left_in_sync(leader, victim)
        _confirms_go_on(pub, time.monotonic())
        print(f"\nexited {took:.2f} s after its data dir was swapped: {line.split('CRITICAL', 1)[-1].strip()}")
        _empty(victim.data_dir)  # (what it wrote there before it noticed)
        _rejoins_from_empty(cluster, victim, pub, q)
    finally:
        pub.abandon()


def _exchange(a: Path, b: Path) -> None:
    """renameat2(RENAME_EXCHANGE): `a` and `b` swap places in one step."""
    import ctypes
    import os
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, bytes(a), at_fdcwd, bytes(b), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@needs_fuse
@pytest.mark.parametrize("mode,err", [("eio", "EIO"), ("erofs", "EROFS")])
def test_follower_whose_disk_fails_exits_then_rejoins_from_empty(one_fuse_node: Cluster, mode: str,
                                                                 err: str) -> None:
    cluster = one_fuse_node
    victim = cluster.nodes[2]
    assert victim.datafs is not None
    _make_follower(cluster, victim)
    leader = cluster.leader()
    q = uniq_queue(mode)
    pub = _publisher(cluster, leader, q)
    try:
        t0 = time.monotonic()
        victim.datafs.set_fault(mode)  # every write, create, rename, fsync ... under it fails
        took = _wait_exit(victim, t0)
        line = _critical(victim)
        assert "storage failure:" in line and err in line and str(victim.data_dir) in line, line
        _left_in_sync(leader, victim)
        _confirms_go_on(pub, time.monotonic())
        print(f"\n{mode}: exited {took:.2f} s after the fault: {line.split('CRITICAL', 1)[-1].strip()}")
        victim.datafs.set_fault(None)  # (returns once writes go through again)
        _empty(victim.data_dir)
        _rejoins_from_empty(cluster, victim, pub, q)
    finally:
        pub.abandon()


@needs_fuse
def test_leader_whose_disk_fails_exits_and_nothing_confirmed_is_lost(one_fuse_node: Cluster) -> None:
    cluster = one_fuse_node
    victim = cluster.nodes[2]
    assert victim.datafs is not None
    _make_leader(cluster, victim)
    survivors = [n for n in cluster.nodes if n is not victim]
    q = uniq_queue("leader-eio")
    declare(victim, q)
    # publishing to a survivor: its client sees the leader change, not the death of its node
    pub = StreamPublisher(q, q, lambda: survivors, total=None, rate=2000)
    pub.start()
    try:
        wait_for(lambda: len(pub.confirmed) >= 300 or pub.error, timeout=20, what="300 confirms")
        t0 = time.monotonic()
        victim.datafs.set_fault("eio")
        took = _wait_exit(victim, t0)
        line = _critical(victim)
        assert "storage failure:" in line and "EIO" in line, line
        new = cluster.leader(timeout=10, among=survivors)
        assert new in survivors
        _confirms_go_on(pub, time.monotonic())
        pub.finish(60)
    finally:
        pub.abandon()
    print(f"\nleader exited {took:.2f} s after EIO; {new.node_id} leads: "
          f"{line.split('CRITICAL', 1)[-1].strip()}")
    got = drain(survivors[0], q, idle=1.5)
    res = check_delivered({pub.tag: pub.confirmed}, got)
    assert res["lost_count"] == 0, res
    assert re.search(r"exiting \(code 5\)", line), line
