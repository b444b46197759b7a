"""Crashes that lose what was not synced (issue 29, "lost unsynced writes").

They need `start_cluster(lazy_fs=True)`: every node's data dir is a
harness.lazyfs mount, which keeps apart what the node has not fsync'd (data
of a file: fsync/fdatasync of it; a create, rename or unlink: fsync of its
directory) and drops it on DataFs.crash_drop(), as a power loss would.

- `kill_with_loss(target, down_seconds)`: SIGKILL one node, drop its
  unsynced writes, restart it, wait until the cluster is healthy;
- `power_cut(down_seconds)`: SIGKILL every node at once, drop every node's
  unsynced writes, start them all, wait until healthy.

Crashes overlapping other faults ("crash plus partition, crash plus pause",
"membership under these faults"):

- `crash_down(target)` / `restart_crashed(target)`: the kill and the restart
  as two steps, so that other faults can happen in between;
- `crash_during(fault="partition"|"pause", seconds, heal_first, seed)`: a
  follower A partitioned (or SIGSTOPped), another member B (the leader or the
  other follower, by seed) killed with loss while A is out, then the two healed
  in the order `heal_first` says ("crash": B restarts first, "fault": A comes
  back first, "seeded": odd seed crash first, even seed fault first);
- `membership_after_loss(seed)`: a follower killed with loss and left down;
  AddMember must be refused while it is down (it would stall every commit);
  the crashed one restarted, a new member added, the crashed one removed.

Every confirm waits until each in-sync member has fdatasync'd the entry, so no
confirmed message may be lost by any of them. `restart_down()` is the rollback: it
starts every node of the cluster that is not running (a run that failed
between the kill and the restart) and waits until healthy.
"""
from __future__ import annotations

import random
import signal
import time
from typing import Any

from chaosmirrorq import actions
from chaosmirrorq.fault import STATE, as_float, cluster, pick, record_fault, wait_healthy
from harness.datafs import DataFs
from harness.process import ClusterNode, _children, _wait_gone

__all__ = ["crash_down", "crash_during", "kill_with_loss", "membership_after_loss", "power_cut",
           "restart_crashed", "restart_down"]


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


def _open_faults() -> dict[str, tuple[str, float]]:
    return STATE.setdefault("open_faults", {})  # type: ignore[no-any-return]


def crash_down(target: str = "follower", role: str = "") -> dict[str, Any]:
    """SIGKILL `target`, drop its unsynced writes and leave it down: its fault
    window (named after `role`, else `target`) stays open until restart_crashed
    (or the heal_all rollback)."""
    node = pick(target)
    fs = _lazy(node)
    t0 = time.time()
    _open_faults()[node.node_id] = (f"kill-with-loss-{role or target} {node.node_id}", t0)
    node.kill9()
    return {"node": node.node_id, "dropped": fs.crash_drop(), "killed_ts": t0}


def restart_crashed(target: str, healthy: bool = True, timeout: float = 90.0) -> dict[str, Any]:
    """Start a node crash_down left down and wait until it serves AMQP; with
    `healthy` also until the whole cluster is (False while another fault still
    keeps a member out). Closes its fault window."""
    node = cluster().node(target)
    if not node.alive():
        node.start(wait=True, timeout=as_float(timeout))
    ok = wait_healthy(as_float(timeout)) if healthy else None
    opened = _open_faults().pop(node.node_id, None)
    if opened:
        record_fault(opened[0], opened[1], time.time())
    return {"restarted": node.node_id, "healthy_after": ok}


def _heal_order(heal_first: str, seed: int | None) -> str:
    if heal_first in ("crash", "fault"):
        return heal_first
    if heal_first != "seeded":
        raise ValueError(f"heal_first {heal_first!r}: crash, fault or seeded")
    return "crash" if (seed or 0) % 2 else "fault"  # consecutive seeds cover both orders


def crash_during(fault: str = "partition", seconds: float = 5.0, heal_first: str = "seeded",
                 seed: int | str | None = None) -> dict[str, Any]:
    """Follower A partitioned from every member (clients still reach it) or
    SIGSTOPped; 0.2 F later member B (leader or the other follower, by seed)
    SIGKILLed with its unsynced writes dropped; both kept so until 0.8 F (no
    quorum: one member left); then healed one after the other 0.4 F apart, in
    `heal_first` order; finally wait until the cluster is healthy."""
    if fault not in ("partition", "pause"):
        raise ValueError(f"fault {fault!r}: partition or pause")
    f = as_float(seconds)
    s = None if seed in (None, "") else int(seed)  # type: ignore[arg-type]
    order = _heal_order(str(heal_first), s)
    rng = random.Random(s)
    c = cluster()
    leader = c.leader(timeout=30)
    followers = sorted(c.followers(timeout=30), key=lambda n: n.node_id)
    if len(followers) < 2:
        raise RuntimeError(f"crash_during needs two followers, has {[n.node_id for n in followers]}")
    a = rng.choice(followers)
    b = rng.choice([leader, *[n for n in followers if n is not a]])
    _lazy(b)
    lab: Any = STATE.get("lab")
    if fault == "partition" and lab is None:
        raise RuntimeError("crash_during(partition) needs start_cluster(netns=True)")
    fname = f"{fault}-follower {a.node_id}"
    t0 = time.time()
    _open_faults()[a.node_id] = (fname, t0)
    me = actions._lab_index(a) if fault == "partition" else -1

    def heal_a() -> None:
        if fault == "partition":
            lab.heal(me)
        else:
            a.resume()
        opened = _open_faults().pop(a.node_id, None)
        if opened:
            record_fault(opened[0], opened[1], time.time())

    healed: list[str] = []
    try:
        if fault == "partition":
            lab.partition(me, [actions._lab_index(n) for n in c.nodes if n is not a])
        else:
            a.pause()
        time.sleep(0.2 * f)
        crashed = crash_down(b.node_id, "leader" if b is leader else "follower")
        time.sleep(0.6 * f)
        if order == "crash":
            restart_crashed(b.node_id, healthy=False)
            healed.append(b.node_id)
            time.sleep(0.4 * f)
            heal_a()
            healed.append(a.node_id)
        else:
            heal_a()
            healed.append(a.node_id)
            time.sleep(0.4 * f)
            restart_crashed(b.node_id, healthy=False)
            healed.append(b.node_id)
    finally:
        if a.node_id not in healed:  # a failure half way: lift A's fault, heal_all restarts B
            heal_a()
    healthy = wait_healthy()
    if not healthy:
        raise RuntimeError(f"not healthy after crash_during: {STATE.get('errors', [])[-1:]}")
    return {"faulted": a.node_id, "fault": fault, "crashed": b.node_id, "crashed_was_leader": b is leader,
            "heal_first": order, "heal_order": healed, "dropped": crashed["dropped"],
            "elapsed": round(time.time() - t0, 1), "leader": c.leader().node_id}


def membership_after_loss(seed: int | str | None = None, down_seconds: float = 1.0,
                          timeout: float = 90.0) -> dict[str, Any]:
    """A follower B killed with loss and left down. AddMember now must be refused
    at once (4 members would need 3 answering, only 2 do: every commit would
    stall until the new one caught up); before that check it stalled every
    confirm until B came back. Restart B (it lost its unsynced tail), wait until
    healthy, AddMember D, RemoveMember B, wait until healthy."""
    s = None if seed in (None, "") else int(seed)  # type: ignore[arg-type]
    c = cluster()
    b = random.Random(s).choice(sorted(c.followers(timeout=30), key=lambda n: n.node_id))
    crashed = crash_down(b.node_id, "follower")
    time.sleep(as_float(down_seconds))
    host, ns = actions._spare_host()
    t_add = time.monotonic()
    try:
        early = c.add_node(host=host, netns=ns, timeout=as_float(timeout))
    except Exception as exc:  # noqa: BLE001 - the refusal is the expected outcome
        refusal = str(exc)
    else:
        raise RuntimeError(f"AddMember with {b.node_id} down was accepted ({early.node_id})")
    refused_in = round(time.monotonic() - t_add, 2)
    if "refused" not in refusal or refused_in > 10:
        raise RuntimeError(f"AddMember with {b.node_id} down failed otherwise after {refused_in} s: {refusal}")
    restarted = restart_crashed(b.node_id, timeout=timeout)
    if not restarted["healthy_after"]:
        raise RuntimeError(f"{b.node_id} did not rejoin after its crash: {STATE.get('errors', [])[-1:]}")
    added = actions.add_member(timeout=as_float(timeout))
    removed = actions.remove_member(b.node_id, timeout=as_float(timeout))
    if not (added["healthy_after"] and removed["healthy_after"]):
        raise RuntimeError(f"not healthy after adding / removing: {STATE.get('errors', [])[-1:]}")
    return {"crashed": b.node_id, "dropped": crashed["dropped"], "add_refused_in_s": refused_in,
            "refusal": refusal[-300:], "added": added["added"], "removed": removed["removed"],
            "members": [n.node_id for n in c.nodes]}
