"""Disk faults (issues 16, 46): a full, a slow and a failing disk on one node.

They need the cluster started with the matching opt-in (harness.datafs):

- `fill_disk(target, seconds)` needs `start_cluster(data_fs_mb=N)`: it fills that
  node's own tmpfs with a ballast file until ENOSPC (topping it up while held,
  should the node free something), holds it `seconds`, deletes it and waits
  until the cluster is healthy again;
- `slow_disk(target, delay_ms, seconds)` needs `start_cluster(slow_fs=True)`: the
  node's FUSE data dir (harness.slowfs) sleeps `delay_ms` in every fsync
  (which is what the journal's msync and the snapshot's fsync turn into) for
  `seconds`;
- `failed_disk(target, mode, seconds)` needs `start_cluster(slow_fs=True)`: every
  changing operation under the node's FUSE data dir fails with EIO (`mode`
  "eio", a failing disk) or EROFS ("erofs", a read-only remount). The node
  must stop within 10 s with exit code 5 (fail-stop, issue 46); it stays down
  `seconds`, then the fault is lifted and it is restarted on its data dir as
  a supervisor would, and the cluster must be healthy again.

`heal_disks()` is the rollback: it deletes every ballast file, sets every
fsync delay back to 0 and lifts every failure mode (also after a run that
failed half way).
"""
from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path
from typing import Any

from chaosmirrorq.fault import STATE, as_float, cluster, pick, record_fault, wait_healthy
from harness.datafs import DataFs
from harness.process import ClusterNode

__all__ = ["fill_disk", "slow_disk", "failed_disk", "heal_disks", "fill", "BALLAST"]

FAIL_STOP_WITHIN = 10.0  # s: a node whose disk fails must have exited by then (issue 46)
EXIT_STORAGE = 5  # the node's exit code then (node.replication.raft.storage_fault)

BALLAST = "chaos-ballast.bin"
_CHUNK = b"\xa5" * (1 << 20)


def _datafs(node: ClusterNode, what: str) -> DataFs:
    fs = node.datafs
    if fs is None:
        raise RuntimeError(f"{what} needs start_cluster({'data_fs_mb=N' if what == 'fill_disk' else 'slow_fs=True'})")
    return fs


def fill(path: Path) -> int:
    """Append to `path` until the filesystem answers ENOSPC (then fsync what got
    in); returns the bytes written by this call. Any other error is raised."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        chunk = memoryview(_CHUNK)
        while True:
            try:
                n = os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) <= 4096:
                    break
                chunk = chunk[: len(chunk) // 4]  # fill the last pages too
                continue
            written += n
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _in_sync(node_id: str) -> bool | None:
    """Whether `node_id` is in the leader's in-sync set (None: no leader answered)."""
    c = cluster()
    for n in c.live():
        st = n.try_status(timeout=1.0)
        if st and st.get("role") == "leader":
            return node_id in (st.get("in_sync") or [])
    return None


def fill_disk(target: str = "follower", seconds: float = 6.0) -> dict[str, Any]:
    """Fill `target`'s data filesystem with a ballast file until ENOSPC, keep it
    full for `seconds` (watching whether the node leaves the in-sync set), delete
    the ballast, wait until the cluster is healthy again."""
    node = pick(target)
    fs = _datafs(node, "fill_disk")
    ballast = fs.disk_dir / BALLAST
    STATE.setdefault("ballasts", set()).add(str(ballast))
    t0 = time.time()
    STATE.setdefault("open_faults", {})[node.node_id] = (f"disk-full-{target} {node.node_id}", t0)
    out: dict[str, Any] = {"node": node.node_id, "mount": str(fs.disk_dir)}
    left_at = None
    try:
        out["ballast_bytes"] = fill(ballast)
        end = time.monotonic() + as_float(seconds)
        while time.monotonic() < end:
            out["ballast_bytes"] += fill(ballast)  # top up: stay full
            if left_at is None and _in_sync(node.node_id) is False:
                left_at = time.time()
            time.sleep(0.2)
        out["alive_at_end"] = node.alive()
    finally:
        with contextlib.suppress(FileNotFoundError):
            ballast.unlink()
        freed = time.time()
    healthy = wait_healthy()
    end_ts = time.time()
    STATE.get("open_faults", {}).pop(node.node_id, None)
    record_fault(f"disk-full-{target} {node.node_id}", t0, end_ts)
    out.update(left_in_sync_after=None if left_at is None else round(left_at - t0, 2),
               rejoined_after_free=round(end_ts - freed, 2), healthy_after=healthy)
    return out


def slow_disk(target: str = "follower", delay_ms: float = 200.0, seconds: float = 6.0) -> dict[str, Any]:
    """Every fsync (msync) in `target`'s data dir sleeps `delay_ms` for `seconds`;
    then back to 0 and wait until healthy."""
    node = pick(target)
    fs = _datafs(node, "slow_disk")
    STATE.setdefault("slowed", set()).add(node.node_id)
    t0 = time.time()
    STATE.setdefault("open_faults", {})[node.node_id] = (f"slow-disk-{target} {node.node_id}", t0)
    try:
        fs.set_delay_ms(as_float(delay_ms))
        time.sleep(as_float(seconds))
    finally:
        fs.set_delay_ms(0)
    healthy = wait_healthy()
    STATE.get("open_faults", {}).pop(node.node_id, None)
    record_fault(f"slow-disk-{target} {node.node_id} {as_float(delay_ms):g}ms", t0, time.time())
    return {"node": node.node_id, "delay_ms": as_float(delay_ms), "healthy_after": healthy}


def failed_disk(target: str = "follower", mode: str = "eio", seconds: float = 6.0) -> dict[str, Any]:
    """Fail every write under `target`'s data dir (EIO or EROFS): it must exit
    with code 5 within FAIL_STOP_WITHIN s (else this action fails); down for
    `seconds`, then the fault is lifted, the node restarted on its data dir
    (its supervisor's part) and the cluster must be healthy again."""
    node = pick(target)
    fs = _datafs(node, "failed_disk")
    name = f"failed-disk-{mode}-{target} {node.node_id}"
    STATE.setdefault("failed", set()).add(node.node_id)
    t0 = time.time()
    STATE.setdefault("open_faults", {})[node.node_id] = (name, t0)
    began = time.monotonic()
    try:
        fs.set_fault(mode)
        while node.alive() and time.monotonic() - began < FAIL_STOP_WITHIN:
            time.sleep(0.02)
        exited_after = time.monotonic() - began
        code = node.proc.returncode if node.proc is not None else None
        if node.alive() or code != EXIT_STORAGE:
            node.kill9()
            raise RuntimeError(f"{node.node_id} did not fail-stop on {mode}: "
                               f"{'still running' if code is None else f'exit code {code}'} "
                               f"after {exited_after:.1f} s:\n{node.tail_log(8)}")
        node.kill9()  # reaps it and waits for its children (none should be left)
        time.sleep(max(0.0, as_float(seconds) - exited_after))
    finally:
        fs.set_fault(None)  # (returns once writes go through again)
    node.start(wait=True, timeout=90)
    healthy = wait_healthy()
    STATE.get("open_faults", {}).pop(node.node_id, None)
    record_fault(name, t0, time.time())
    return {"node": node.node_id, "mode": mode, "exited_after": round(exited_after, 2),
            "exit_code": code, "healthy_after": healthy}


def heal_disks() -> dict[str, Any]:
    """Rollback: delete every ballast file, set every fsync delay to 0, lift
    every failure mode."""
    freed, cleared = [], []
    c = STATE.get("cluster")
    paths = set(STATE.get("ballasts", set()))
    if c is not None:
        for n in c.nodes + c.removed:
            if n.datafs is not None:
                paths.add(str(n.datafs.disk_dir / BALLAST))
                if n.datafs.slow:
                    n.datafs.set_delay_ms(0)
                    n.datafs.set_fault(None)
                    cleared.append(n.node_id)
    for p in sorted(paths):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
            freed.append(p)
    STATE["ballasts"] = set()
    return {"freed": freed, "delay_cleared": cleared}
