"""Crashes that lose what was not synced (issue 29, "lost unsynced writes").

They need `start_cluster(lazy_fs=True)`: every node's data dir is a
harness.lazyfs mount, which keeps apart what the node has not fsync'd (data
of a file: fsync/fdatasync of it; a create, rename or unlink: fsync of its
directory) and drops it on DataFs.crash_drop(), as a power loss would.

- `kill_with_loss(target, down_seconds)`: SIGKILL one node, drop its
  unsynced writes, restart it, wait until the cluster is healthy;
- `power_cut(down_seconds)`: SIGKILL every node at once, drop every node's
  unsynced writes, start them all, wait until healthy.

Every confirm waits until each in-sync member has fdatasync'd the entry, so no
confirmed message may be lost by either. `restart_down()` is the rollback: it
starts every node of the cluster that is not running (a run that failed
between the kill and the restart) and waits until healthy.
"""
from __future__ import annotations

import signal
import time
from typing import Any

from chaosmirrorq.fault import STATE, as_float, cluster, pick, record_fault, wait_healthy
from harness.datafs import DataFs
from harness.process import ClusterNode, _children, _wait_gone

__all__ = ["kill_with_loss", "power_cut", "restart_down"]


def _lazy(node: ClusterNode) -> DataFs:
    fs = node.datafs
    if fs is None or not fs.lazy:
        raise RuntimeError("kill_with_loss / power_cut need start_cluster(lazy_fs=True)")
    return fs


def kill_with_loss(target: str = "follower", down_seconds: float = 2.0) -> dict[str, Any]:
    """SIGKILL `target` (leader | follower | random | id), throw away what it had
    not synced, keep it down `down_seconds`, restart it, wait until healthy."""
    node = pick(target)
    fs = _lazy(node)
    t0 = time.time()
    name = f"kill-with-loss-{target} {node.node_id}"
    STATE.setdefault("open_faults", {})[node.node_id] = (name, t0)
    node.kill9()
    dropped = fs.crash_drop()
    time.sleep(as_float(down_seconds))
    node.start(wait=True, timeout=90)
    healthy = wait_healthy()
    STATE.get("open_faults", {}).pop(node.node_id, None)
    record_fault(name, t0, time.time())
    return {"node": node.node_id, "dropped": dropped, "healthy_after": healthy,
            "leader": cluster().leader().node_id if healthy else None}


def power_cut(down_seconds: float = 1.0) -> dict[str, Any]:
    """SIGKILL every node at once (one signal each, before any is reaped), drop
    every node's unsynced writes, start them all, wait until healthy."""
    c = cluster()
    for n in c.nodes:
        _lazy(n)
    t0 = time.time()
    STATE.setdefault("open_faults", {})["*"] = ("power-cut", t0)
    # the children (a snapshot writer) first: kill9 of a reaped node no longer finds them
    kids = [pid for n in c.nodes if n.alive() and n.pid is not None for pid in _children(n.pid)]
    for n in c.nodes:
        if n.alive() and n.proc is not None:
            n.proc.send_signal(signal.SIGKILL)
    for n in c.nodes:
        n.kill9()  # reaps it
    _wait_gone(kids, timeout=30)  # they hold the nodes' listening sockets
    dropped = {n.node_id: _lazy(n).crash_drop() for n in c.nodes}
    time.sleep(as_float(down_seconds))
    for n in c.nodes:
        n.start(wait=False)
    for n in c.nodes:
        n.wait_serving(90)
    healthy = wait_healthy()
    STATE.get("open_faults", {}).pop("*", None)
    record_fault("power-cut", t0, time.time())
    return {"dropped": dropped, "healthy_after": healthy,
            "leader": c.leader().node_id if healthy else None}


def restart_down() -> dict[str, Any]:
    """Rollback: start every node that is not running, wait until healthy."""
    c = STATE.get("cluster")
    if c is None:
        return {"started": []}
    down = [n for n in c.nodes if not n.alive()]
    for n in down:
        n.start(wait=False)
    for n in down:
        n.wait_serving(90)
    return {"started": [n.node_id for n in down], "healthy_after": wait_healthy() if down else True}
