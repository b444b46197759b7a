"""The disk faults of chaosmirrorq.disk (issue 16) and the journal behaviour they test.

- full disk (fill_disk on a per-node tmpfs, start_cluster(data_fs_mb=N)): writes in
  the follower's data dir fail with ENOSPC, the follower stays up, leaves the
  in-sync set and rejoins once the ballast is gone; heal_disks (the rollback) frees
  a disk left full by an interrupted action; stop_cluster / the suite's clean-up
  unmount everything;
- the journal on a full filesystem: an append is an OSError(ENOSPC), not a SIGBUS,
  and the log stays consistent (node/replication/raft/log/segment_log.py, fallocate before pwrite);
- slow disk (slow_disk on the FUSE mount chaosmirrorq.slowfs, start_cluster(slow_fs=True)):
  an fsync in the follower's data dir takes at least the delay while the fault is on,
  and is fast again after it and after heal_disks.

Root only (mounts); the FUSE tests also need /dev/fuse and fusepy (libfuse2).
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaosmirrorq import actions, disk
from chaosmirrorq.probes import cluster_status

from harness.datafs import (
    DataFs,
    fuse_unavailable_reason,
    mounted,
    mounts_under,
    tmpfs_unavailable_reason,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts a tmpfs / FUSE fs per node")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def chaos_state(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    disk.heal_disks()
    actions.stop_cluster()
    from harness.datafs import cleanup_registry
    cleanup_registry(tmp_path / "mounts.json", tmp_path)
    assert mounts_under(tmp_path) == []


def _enospc_in(path: Path) -> bool:
    try:
        with open(path / "probe.bin", "wb") as f:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
        return True
    finally:
        with __import__("contextlib").suppress(FileNotFoundError):
            os.unlink(path / "probe.bin")
    return False


def _run(fn: Any, **kw: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["result"] = fn(**kw)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["error"] = exc
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


JOURNAL_ON_FULL_DISK = r"""
import errno, os, sys
from node.replication.raft.log.meta import FsyncMetaStorer
from node.replication.raft.log import SegmentLog
d = sys.argv[1]
j = SegmentLog(os.path.join(d, "log"), os.path.join(d, "raft.journal.meta"))
j.add(b"first", 1, 1)
fd = os.open(os.path.join(d, "ballast"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError as exc:
    assert exc.errno == errno.ENOSPC
os.close(fd)
n, err = 1, None
try:
    for i in range(2, 1_000_000):
        j.add(b"y" * 3000, i, 1)
        n = i
except OSError as exc:
    err = exc.errno
assert err == errno.ENOSPC, err
assert len(j) == n, (len(j), n)  # the failed entry is not in the log
# the commit index (no sync) is skipped on a full disk; a term/vote change still raises
m = FsyncMetaStorer(os.path.join(d, "raft.journal.meta"))
m._durable = (1, None)
m.storeMeta({"currentTerm": 1, "votedForNodeId": None, "raftCommitIndex": 5})
try:
    m.storeMeta({"currentTerm": 2, "votedForNodeId": "n1", "raftCommitIndex": 5})
    raise SystemExit("a term change on a full disk did not raise")
except OSError as exc:
    assert exc.errno == errno.ENOSPC
os.unlink(os.path.join(d, "ballast"))
for i in range(n + 1, n + 200):
    j.add(b"z" * 3000, i, 1)
j.flush()
j._destroy()
k = SegmentLog(os.path.join(d, "log"), os.path.join(d, "raft.journal.meta"))
assert [k[x][1] for x in range(len(k))] == list(range(1, n + 200)), "journal damaged"
assert k.recovered == [], k.recovered
print("ok", n)
"""


def test_journal_on_a_full_disk_raises_enospc_instead_of_sigbus(tmp_path: Path) -> None:
    """pysyncobj's FileJournal grew a sparse mmap'd file: the first write into a hole
    on a full tmpfs killed the process with SIGBUS (exit -7). The segment log
    reserves space with fallocate before it writes with pwrite: the append is
    OSError(ENOSPC), the entry is not in the log, appends work again once there
    is space, the log reopens intact."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        r = subprocess.run([sys.executable, "-c", JOURNAL_ON_FULL_DISK, str(mnt)], cwd=str(REPO),
                           capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert r.stdout.startswith("ok")


@pytest.mark.skipif(tmpfs_unavailable_reason() is not None, reason=str(tmpfs_unavailable_reason()))
def test_fill_disk_follower_leaves_in_sync_and_rejoins(chaos_state: Path) -> None:
    actions.start_cluster(nodes=3, netns=False, base_dir=str(chaos_state), experiment="t-disk-full",
                          baseline=False, data_fs_mb=256)
    c = actions._cluster()
    for n in c.nodes:
        assert n.datafs is not None and mounted(n.datafs.disk_dir)
    # ~2 MB/s of bodies: the journal's 1 MiB preallocation is used up at once
    actions.start_workload(publishers=1, consumers=1, rate=150, warmup=1, kinds="classic",
                           windows="100")
    t, out = _run(disk.fill_disk, target="follower", seconds=10)
    deadline = time.monotonic() + 20
    target = None
    while target is None and time.monotonic() < deadline:
        time.sleep(0.2)
        target = next((n for n in c.nodes if n.datafs and (n.datafs.disk_dir / disk.BALLAST).exists()), None)
    assert target is not None, "no ballast appeared"
    time.sleep(1.0)
    assert _enospc_in(target.data_dir), "the follower's disk is not full"
    left = False
    while time.monotonic() < deadline and t.is_alive():
        st = cluster_status()
        if st.get("in_sync") is not None and target.node_id not in st["in_sync"]:
            left = True
            break
        time.sleep(0.2)
    assert left, f"{target.node_id} stayed in sync on a full disk: {cluster_status()}"
    assert target.alive(), f"{target.node_id} died on a full disk:\n{target.tail_log(20)}"
    st = target.status()
    assert int(st.get("journal_write_errors") or 0) > 0, st
    t.join(90)
    assert "error" not in out, out
    res = out["result"]
    assert res["healthy_after"] and res["alive_at_end"], res
    assert res["left_in_sync_after"] is not None, res
    assert not _enospc_in(target.data_dir)
    assert target.node_id in cluster_status()["in_sync"]
    actions.stop_workload()


@pytest.mark.skipif(tmpfs_unavailable_reason() is not None, reason=str(tmpfs_unavailable_reason()))
def test_heal_disks_and_cleanup_undo_an_interrupted_fill(chaos_state: Path) -> None:
    """The action died with the disk full (here: the ballast written as fill_disk
    does, the action never ran to its end): heal_disks frees it; after a killed
    run the suite's clean-up unmounts every recorded tmpfs."""
    from chaosmirrorq.suite import cleanup_leftovers
    actions.start_cluster(nodes=3, netns=False, base_dir=str(chaos_state), experiment="t-disk-rb",
                          baseline=False, data_fs_mb=64)
    c = actions._cluster()
    node = c.followers()[0]
    assert node.datafs is not None
    ballast = node.datafs.disk_dir / disk.BALLAST
    actions._STATE.setdefault("ballasts", set()).add(str(ballast))
    assert disk.fill(ballast) > 0
    assert _enospc_in(node.data_dir)
    res = disk.heal_disks()
    assert str(ballast) in res["freed"]
    assert not _enospc_in(node.data_dir)
    assert (chaos_state / "mounts.json").exists()
    assert len(mounts_under(chaos_state)) == 3
    c.kill_all()  # as if `chaos run` had been killed: nodes gone, mounts left
    cleanup_leftovers(chaos_state)
    assert mounts_under(chaos_state) == []


@pytest.mark.skipif(fuse_unavailable_reason() is not None, reason=str(fuse_unavailable_reason()))
def test_slow_disk_delays_fsync_on_the_follower_only(chaos_state: Path) -> None:
    actions.start_cluster(nodes=3, netns=False, base_dir=str(chaos_state), experiment="t-slow-disk",
                          baseline=False, slow_fs=True)
    c = actions._cluster()
    for n in c.nodes:
        assert n.datafs is not None and mounted(n.data_dir)

    def fsync_seconds(d: Path, tries: int = 1) -> float:
        """The fastest of `tries` fsyncs: a delayed fsync sleeps the delay every
        time, while a real disk under the cluster's own writes may take a
        slow one now and then (CI saw 0.47 s without any delay)."""
        best = float("inf")
        for _ in range(tries):
            fd = os.open(d / "fsync-probe", os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.write(fd, b"x" * 4096)
                t0 = time.perf_counter()
                os.fsync(fd)
                best = min(best, time.perf_counter() - t0)
            finally:
                os.close(fd)
                os.unlink(d / "fsync-probe")
        return best
    delay = 1.5
    t, out = _run(disk.slow_disk, target="follower", delay_ms=delay * 1000, seconds=6)
    deadline = time.monotonic() + 10
    target = None
    while target is None and time.monotonic() < deadline:
        time.sleep(0.1)
        target = next((n for n in c.nodes if n.datafs and n.datafs.delay_file.read_text().strip() != "0"), None)
    assert target is not None
    time.sleep(0.2)
    assert fsync_seconds(target.data_dir) >= delay
    other = next(n for n in c.nodes if n is not target)
    assert fsync_seconds(other.data_dir, tries=3) < delay
    t.join(90)
    assert "error" not in out and out["result"]["healthy_after"], out
    assert fsync_seconds(target.data_dir, tries=3) < delay
    # rollback after an interrupted action: a delay left on is cleared by heal_disks
    assert target.datafs is not None
    target.datafs.set_delay_ms(delay * 1000)
    time.sleep(0.1)
    assert fsync_seconds(target.data_dir) >= delay
    assert target.node_id in disk.heal_disks()["delay_cleared"]
    time.sleep(0.1)
    assert fsync_seconds(target.data_dir, tries=3) < delay
    pids = [n.datafs.fuse_proc.pid for n in c.nodes if n.datafs and n.datafs.fuse_proc]
    actions.stop_cluster()
    assert mounts_under(chaos_state) == []
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or b"slowfs" not in Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.mark.skipif(fuse_unavailable_reason() is not None, reason=str(fuse_unavailable_reason()))
@pytest.mark.parametrize("lazy", [False, True])
def test_a_file_created_read_write_through_the_fuse_mount_reads_back(tmp_path: Path, lazy: bool) -> None:
    """The node creates a log segment O_RDWR and reads it back through the same
    fd. slowfs opened every created file O_WRONLY (fusepy does not pass the
    flags): those reads failed with EBADF, the raft ticks with them."""
    fs = DataFs(tmp_path / "data", slow=not lazy, lazy=lazy)
    fs.mount()
    try:
        fd = os.open(fs.data_dir / "seg", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.pwrite(fd, b"record" * 1000, 0)
            os.fsync(fd)  # past the kernel's page cache: the read goes to the daemon
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            assert os.pread(fd, 6000, 0) == b"record" * 1000
        finally:
            os.close(fd)
    finally:
        fs.unmount()


@pytest.mark.skipif(fuse_unavailable_reason() is not None, reason=str(fuse_unavailable_reason()))
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("mode,err", [("eio", errno.EIO), ("erofs", errno.EROFS)])
def test_a_fault_mode_fails_every_change_but_not_reads_and_lifts(tmp_path: Path, lazy: bool, mode: str,
                                                                 err: int) -> None:
    """The failing-disk fault (issue 46): writes to an fd opened before, creates,
    renames, unlinks and fsyncs fail with the mode's errno; reads and stat go
    on; lifted, everything works again."""
    fs = DataFs(tmp_path / "data", slow=not lazy, lazy=lazy)
    fs.mount()
    try:
        seg = fs.data_dir / "seg"
        seg.write_bytes(b"before")
        fd = os.open(seg, os.O_RDWR)
        try:
            fs.set_fault(mode)
            calls = [lambda: os.pwrite(fd, b"x", 0), lambda: os.fsync(fd),
                     lambda: (fs.data_dir / "new").write_bytes(b""), lambda: os.rename(seg, fs.data_dir / "b"),
                     lambda: os.unlink(seg), lambda: os.mkdir(fs.data_dir / "d"), lambda: os.truncate(seg, 0)]
            for call in calls:
                with pytest.raises(OSError) as caught:
                    call()
                assert caught.value.errno == err
            assert os.pread(fd, 6, 0) == b"before" and seg.read_bytes() == b"before"
            assert os.listdir(fs.data_dir) == ["seg"]
            fs.set_fault(None)
            os.pwrite(fd, b"after!", 0)
            os.fsync(fd)
            assert seg.read_bytes() == b"after!"
        finally:
            os.close(fd)
    finally:
        fs.unmount()


@pytest.mark.skipif(fuse_unavailable_reason() is not None, reason=str(fuse_unavailable_reason()))
def test_failed_disk_fail_stops_the_follower_and_it_rejoins_after_its_restart(chaos_state: Path) -> None:
    actions.start_cluster(nodes=3, netns=False, base_dir=str(chaos_state), experiment="t-failed-disk",
                          baseline=False, slow_fs=True)
    c = actions._cluster()
    out = disk.failed_disk(target="follower", mode="eio", seconds=1)
    assert out["exit_code"] == 5 and out["exited_after"] < disk.FAIL_STOP_WITHIN, out
    assert out["healthy_after"], out
    node = c.node(out["node"])
    assert node.alive() and node.datafs is not None and node.datafs._writable()
    assert "storage failure:" in node.log_path.read_text(errors="replace")
