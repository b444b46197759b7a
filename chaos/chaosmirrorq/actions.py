"""chaostoolkit actions for a local mirrorq cluster (harness.process + netns).

`chaos run` executes every activity of one experiment in one Python process, so the
cluster, the network lab, the workload and the run's history dir live in
`chaosmirrorq.fault.STATE` (here `_STATE`).
Every fault action writes one `fault` event (name, start_ts, end_ts) to
RUN_DIR/faults.jsonl when its fault window closes (the window ends when the cluster
is healthy again, or when the fault is lifted for a fault that is held open).
Durations and counts accept strings (configuration values from the environment).
"""
from __future__ import annotations

import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaosmirrorq.clock import faketime_env
from chaosmirrorq.fault import STATE as _STATE
from chaosmirrorq.fault import as_bool as _b
from chaosmirrorq.fault import as_float as _f
from chaosmirrorq.fault import cluster as _cluster
from chaosmirrorq.fault import pick as _pick
from chaosmirrorq.fault import record_fault
from chaosmirrorq.fault import run_dir as _run_dir
from chaosmirrorq.fault import wait_healthy as _wait_healthy
from chaosmirrorq.workload import (
    DEFAULT_MAX_LENGTH,
    DEFAULT_MAX_SIZE,
    DEFAULT_MIN_SIZE,
    DEFAULT_RATE,
    DEFAULT_SEED,
    DEFAULT_TTL_MS,
    Workload,
    declare_queues,
    endpoints_fn,
    parse_kinds,
    parse_windows,
    queue_plan,
)
from harness.process import Cluster, ClusterNode

__all__ = ["start_cluster", "stop_cluster", "kill_node", "restart_node", "pause_node",
           "partition_node", "partition_minority", "partition_one_way", "delay_node",
           "lose_packets", "partition_bridge", "kill_during_snapshot",
           "membership_change_during_partition", "heal_all", "restart_cluster",
           "rolling_restart", "add_member", "remove_member", "start_workload",
           "stop_workload", "stop_workload_and_drain"]


# ------------------------------------------------------------------ helpers

def _i(x: Any) -> int:
    return int(float(x))


def _body_config() -> dict[str, int]:
    """Body sizes and seed of the workload: CHAOS_MIN_SIZE / CHAOS_MAX_SIZE (bytes,
    default 1 KiB / 64 KiB) and CHAOS_SEED (default 1)."""
    return {"min_size": _i(os.environ.get("CHAOS_MIN_SIZE") or DEFAULT_MIN_SIZE),
            "max_size": _i(os.environ.get("CHAOS_MAX_SIZE") or DEFAULT_MAX_SIZE),
            "seed": _i(os.environ.get("CHAOS_SEED") or DEFAULT_SEED)}


def _lab_index(node: ClusterNode) -> int:
    lab = _STATE.get("lab")
    if lab is None:
        raise RuntimeError("partitions need start_cluster(netns=True) (root, ip netns, iptables)")
    return lab.node(node.host).index


# ------------------------------------------------------------------ cluster life

def start_cluster(nodes: int = 3, netns: bool = True, base_dir: str | None = None,
                  experiment: str = "", config: str = "", baseline: bool = True,
                  spare: int = 2, data_fs_mb: int | str | None = None, slow_fs: bool | str = False,
                  faketime: bool | str = False, lazy_fs: bool | str = False) -> dict[str, Any]:
    """Start `nodes` mirrorq processes (each in its own network namespace when
    netns=True, plus `spare` empty namespaces for add_member), wait until healthy,
    and open the run's history dir BASE_DIR/history. With baseline=True a short
    publish+drain run goes to BASE_DIR/baseline: the steady-state check before the
    method judges it (the main run is only complete after its drain).

    Opt-ins of the disk and clock faults (chaosmirrorq.disk, chaosmirrorq.clock):
    `data_fs_mb` puts each node's data dir on its own tmpfs of that many MiB,
    `slow_fs` on a FUSE passthrough with a switchable fsync delay, `lazy_fs` on
    harness.lazyfs (what was not fsync'd is lost by kill_with_loss / power_cut), `faketime`
    preloads libfaketime into every node with its own timestamp file (offset +0
    until step_clock). Mounts are recorded in BASE_DIR/mounts.json."""
    stop_cluster()
    nodes, netns, baseline = _i(nodes), _b(netns), _b(baseline)
    base = Path(base_dir or os.environ.get("CHAOS_BASE_DIR") or tempfile.mkdtemp(prefix="mirrorq-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    run_id = f"{experiment or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    _STATE.clear()
    _STATE.update(base_dir=base, run_dir=base / "history", run_id=run_id, experiment=experiment,
                  check_target=None)
    hosts = ns_names = None
    if netns:
        from chaosmirrorq.netns import NetLab, ensure_iptables, netns_unavailable_reason
        reason = netns_unavailable_reason()
        if reason:
            raise RuntimeError(f"netns=True but {reason}")
        ensure_iptables()
        lab = NetLab(nodes + _i(spare)).__enter__()
        _STATE["lab"] = lab
        # for the suite's clean-up should this process be killed
        (base / "netlab.json").write_text(json.dumps({"namespaces": lab._created_ns,
                                                      "links": lab._created_links}))
        hosts = [n.addr for n in lab.nodes[:nodes]]
        ns_names = [n.ns for n in lab.nodes[:nodes]]
    fs_mb = _i(data_fs_mb) if data_fs_mb not in (None, "", 0, "0") else None
    node_env = None
    if _b(faketime):
        node_env = faketime_env(base / "cluster")
    cluster = Cluster(base / "cluster", n=nodes, hosts=hosts, netns=ns_names, config=config,
                      data_fs_mb=fs_mb, slow_fs=_b(slow_fs), lazy_fs=_b(lazy_fs),
                      mounts_registry=base / "mounts.json",
                      node_env=node_env)
    _STATE["cluster"] = cluster
    cluster.start(timeout=90)
    (base / "history").mkdir(parents=True, exist_ok=True)
    (base / "history" / "run.json").write_text(json.dumps(
        {"run": run_id, "experiment": experiment, "started": time.time(), "ended": None}))
    out: dict[str, Any] = {"base_dir": str(base), "nodes": [repr(n) for n in cluster.nodes],
                           "netns": netns, "leader": cluster.leader().node_id}
    if baseline:
        out["baseline"] = run_baseline()
    return out


def _ensure_external_run(experiment: str = "external") -> None:
    if _STATE.get("run_dir") is None:
        base = Path(os.environ.get("CHAOS_BASE_DIR") or tempfile.mkdtemp(prefix="mirrorq-chaos-"))
        _STATE.update(base_dir=base, run_dir=base / "history", experiment=experiment,
                      run_id=f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}")


def run_baseline(seconds: float = 2.0, amqp: str | None = None) -> dict[str, Any]:
    """A short workload + drain into BASE_DIR/baseline (the before-method history),
    on the local cluster or on `amqp` endpoints ("id=host:port,...")."""
    if amqp:
        _ensure_external_run()
        nodes_fn: Callable[[], list[Any]] = endpoints_fn(amqp)
        first: Any = nodes_fn()[0]
        last: Any = first
    else:
        c = _cluster()
        nodes_fn = lambda: list(c.nodes)  # noqa: E731
        first = c.leader()
        last = None
    bdir = Path(_STATE["base_dir"]) / "baseline"
    rid = f"{_STATE['run_id']}-baseline"
    bdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    queues = ["chaos-baseline"]
    declare_queues(first, queues)
    body = _body_config()
    wl = Workload(bdir, rid, nodes_fn, queues=queues, publishers=1, consumers=1,
                  rate=DEFAULT_RATE, crash_every=0, min_size=body["min_size"],
                  max_size=body["max_size"], seed=body["seed"])
    wl.start()
    time.sleep(seconds)
    wl.stop_publishers()
    wl.stop_consumers()
    n = wl.drain(last or _cluster().leader(), idle=1.0, min_time=1.0)
    wl.close()
    (bdir / "run.json").write_text(json.dumps({"run": rid, "experiment": f"{_STATE['experiment']}-baseline",
                                               "started": t0, "ended": time.time()}))
    _STATE["check_target"] = bdir
    return {"drained": n, **wl.summary()}


def stop_cluster() -> dict[str, Any]:
    """SIGCONT + SIGKILL every node, tear the namespaces down. Idempotent."""
    out: dict[str, Any] = {}
    wl = _STATE.get("workload")
    if wl is not None and _STATE.get("workload_running"):
        for t in [*wl.publishers, *wl.consumers]:
            t.stop()
        _STATE["workload_running"] = False
    c = _STATE.get("cluster")
    if c is not None:
        for n in c.nodes + c.removed:
            if n.paused:
                n.resume()
        c.kill_all()
        c.unmount_all()  # the disk faults' tmpfs / FUSE data dirs, if any
        out["stopped"] = [n.node_id for n in c.nodes + c.removed]
        _STATE["cluster"] = None
    lab = _STATE.get("lab")
    if lab is not None:
        lab.close()
        _STATE["lab"] = None
    w = _STATE.get("faults")
    if w is not None:
        w.close()
        _STATE["faults"] = None
    return out


# ------------------------------------------------------------------ process faults

def kill_node(target: str = "leader", down_seconds: float = 2.0, restart: bool = True,
              times: int = 1, interval: float = 3.0, stall_followers: float = 0.0) -> list[dict[str, Any]]:
    """SIGKILL `target` (leader | follower | random | node id), keep it down for
    `down_seconds`, restart it (restart=True) and wait until the cluster is healthy;
    `times` rounds, `interval` seconds apart.

    stall_followers > 0 (target "leader"): first SIGSTOP every follower for that many
    seconds, so the leader keeps taking publishes it cannot replicate, then SIGKILL the
    leader and SIGCONT the followers (who elect a new leader). A correct build confirms
    none of those publishes; a build that confirms before replication loses them."""
    c = _cluster()
    out = []
    for i in range(_i(times)):
        if i:
            time.sleep(_f(interval))
        node = _pick(target)
        t0 = time.time()
        stalled = []
        if _f(stall_followers) > 0:
            stalled = [n for n in c.live() if n is not node]
            for n in stalled:
                n.pause()
            time.sleep(_f(stall_followers))
        node.kill9()
        for n in stalled:
            n.resume()
        name = f"kill-{target} {node.node_id}" + (" (followers stalled)" if stalled else "")
        time.sleep(_f(down_seconds))
        if _b(restart):
            node.start(wait=True, timeout=60)
            healthy = _wait_healthy()
            record_fault(name, t0, time.time())
        else:
            healthy = None
            _STATE.setdefault("open_faults", {})[node.node_id] = (name, t0)
        out.append({"killed": node.node_id, "stalled": [n.node_id for n in stalled],
                    "healthy_after": healthy, "leader": c.leader().node_id if healthy else None})
    return out


def restart_node(target: str) -> dict[str, Any]:
    """Start a node that kill_node(restart=False) left down; closes its fault window."""
    node = _cluster().node(target)
    if not node.alive():
        node.start(wait=True, timeout=60)
    healthy = _wait_healthy()
    opened = _STATE.setdefault("open_faults", {}).pop(node.node_id, None)
    if opened:
        record_fault(opened[0], opened[1], time.time())
    return {"restarted": node.node_id, "healthy": healthy}


def _acks() -> int:
    """Publishes the running workload has had confirmed so far (0 without one)."""
    wl = _STATE.get("workload")
    if wl is None:
        return 0
    return sum(int(p.counts.get("ack", 0)) for p in wl.publishers)


def pause_node(target: str = "leader", seconds: float = 4.0, watch_in_sync: bool = False) -> dict[str, Any]:
    """SIGSTOP `target` for `seconds` (longer than the 0.5-1 s election timeout), SIGCONT.

    watch_in_sync (a follower's pause): sample the leader's in-sync set and the
    workload's confirm count every 0.5 s while the node is stopped; the result gives
    `left_in_sync_after` (seconds into the pause when the leader dropped it, None if
    never), `confirmed_while_out` (confirms after that) and the samples."""
    node = _pick(target)
    leader = _cluster().leader(timeout=30) if _b(watch_in_sync) else None
    if leader is node:
        leader = None  # a paused leader cannot be asked
    t0 = time.time()
    samples: list[tuple[float, bool | None, int]] = []  # (s into the pause, in sync?, acks)
    node.pause()
    try:
        end = time.monotonic() + _f(seconds)
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(0.5, left) if leader is not None else left)
            if leader is not None:
                st = leader.try_status()
                samples.append((round(time.time() - t0, 2),
                                None if st is None else node.node_id in (st.get("in_sync") or []),
                                _acks()))
    finally:
        node.resume()
    healthy = _wait_healthy()
    record_fault(f"pause-{target} {node.node_id}", t0, time.time())
    out: dict[str, Any] = {"paused": node.node_id, "seconds": _f(seconds), "healthy_after": healthy,
                           "rejoined_after": round(time.time() - t0 - _f(seconds), 2)}
    if leader is not None:
        out_at = [s for s in samples if s[1] is False]
        out.update(leader=leader.node_id, samples=samples,
                   left_in_sync_after=out_at[0][0] if out_at else None,
                   confirmed_while_out=(samples[-1][2] - out_at[0][2]) if out_at else 0)
    return out


def restart_cluster(down_seconds: float = 1.0) -> dict[str, Any]:
    """SIGKILL every node, then start them all and wait until healthy."""
    c = _cluster()
    t0 = time.time()
    for n in c.nodes:
        if n.paused:
            n.resume()
        n.kill9()
    time.sleep(_f(down_seconds))
    for n in c.nodes:
        n.start(wait=False)
    for n in c.nodes:
        n.wait_serving(90)
    healthy = _wait_healthy()
    record_fault("restart-cluster", t0, time.time())
    return {"healthy_after": healthy, "leader": c.leader().node_id if healthy else None}


def rolling_restart(graceful: bool = False, pause_between: float = 1.0) -> list[dict[str, Any]]:
    """One node at a time (followers first, the leader last): stop (SIGTERM when
    graceful, else SIGKILL), start, wait until healthy before the next."""
    c = _cluster()
    leader = c.leader()
    order = [n for n in c.nodes if n is not leader] + [leader]
    out = []
    for node in order:
        t0 = time.time()
        if _b(graceful):
            node.stop()
        else:
            node.kill9()
        node.start(wait=True, timeout=60)
        healthy = _wait_healthy()
        record_fault(f"rolling-restart {node.node_id}", t0, time.time())
        out.append({"node": node.node_id, "healthy_after": healthy})
        time.sleep(_f(pause_between))
    return out


# ------------------------------------------------------------------ network faults

def partition_node(target: str = "follower", seconds: float = 6.0) -> dict[str, Any]:
    """Cut `target`'s Raft links to every other member (iptables inside its namespace;
    clients still reach it) for `seconds`, heal, wait until healthy."""
    c = _cluster()
    node = _pick(target)
    lab = _STATE["lab"] if _STATE.get("lab") else None
    me = _lab_index(node)
    others = [_lab_index(n) for n in c.nodes if n is not node]
    t0 = time.time()
    assert lab is not None
    lab.partition(me, others)
    try:
        time.sleep(_f(seconds))
    finally:
        lab.heal(me)
    healthy = _wait_healthy()
    record_fault(f"partition-{target} {node.node_id}", t0, time.time())
    return {"partitioned": node.node_id, "healthy_after": healthy}


def partition_minority(seconds: float = 6.0, include_leader: bool = False) -> dict[str, Any]:
    """Split the members into a minority (floor((n-1)/2) nodes; the leader among them
    when include_leader) and a majority for `seconds`, heal, wait until healthy."""
    c = _cluster()
    lab = _STATE.get("lab")
    if lab is None:
        raise RuntimeError("partitions need start_cluster(netns=True)")
    leader = c.leader()
    size = max(1, (len(c.nodes) - 1) // 2)
    pool = [n for n in c.nodes if n is not leader]
    random.shuffle(pool)
    minority = ([leader] + pool[:size - 1]) if _b(include_leader) else pool[:size]
    majority = [n for n in c.nodes if n not in minority]
    t0 = time.time()
    lab.partition_groups([_lab_index(n) for n in minority], [_lab_index(n) for n in majority])
    try:
        time.sleep(_f(seconds))
    finally:
        lab.heal(None)
    healthy = _wait_healthy()
    ids = ",".join(n.node_id for n in minority)
    record_fault(f"partition-minority {ids}" + (" (leader)" if _b(include_leader) else ""), t0, time.time())
    return {"minority": [n.node_id for n in minority], "healthy_after": healthy}


def _need_lab(what: str) -> Any:
    lab = _STATE.get("lab")
    if lab is None:
        raise RuntimeError(f"{what} needs start_cluster(netns=True) (root, ip netns, iptables, tc)")
    return lab


def partition_one_way(a: str = "leader", b: str = "follower", seconds: float = 6.0) -> dict[str, Any]:
    """One-way partition for `seconds`: `a` hears `b`, `b` does not hear `a` (iptables
    DROP of everything from a, in b's namespace; clients are unaffected), heal, wait
    until healthy. `a`/`b`: leader, follower, random or a node id (b != a)."""
    c = _cluster()
    lab = _need_lab("partition_one_way")
    na = _pick(a)
    nb = _pick(b)
    if nb is na:
        others = [n for n in c.live() if n is not na]
        if not others:
            raise RuntimeError("partition_one_way needs two live nodes")
        nb = random.choice(others)
    t0 = time.time()
    try:
        lab.partition_one_way(_lab_index(na), _lab_index(nb))
        time.sleep(_f(seconds))
    finally:
        lab.heal(_lab_index(nb))
    healthy = _wait_healthy()
    record_fault(f"partition-one-way {nb.node_id} deaf to {na.node_id}", t0, time.time())
    return {"hears": na.node_id, "deaf": nb.node_id, "healthy_after": healthy}


def delay_node(target: str = "follower", delay_ms: float = 100.0, jitter_ms: float = 20.0,
               seconds: float = 6.0) -> dict[str, Any]:
    """`tc netem delay delay_ms jitter_ms` on both ends of `target`'s veth (every packet
    to and from it, clients included) for `seconds`, remove it, wait until healthy.
    Fails with the reason when the kernel has no sch_netem."""
    lab = _need_lab("delay_node")
    node = _pick(target)
    idx = _lab_index(node)
    t0 = time.time()
    try:
        lab.delay(idx, _f(delay_ms), _f(jitter_ms))
        time.sleep(_f(seconds))
    finally:
        lab.clear_qdiscs(idx)
    healthy = _wait_healthy()
    record_fault(f"delay-{target} {node.node_id} {_f(delay_ms):g}+-{_f(jitter_ms):g}ms", t0, time.time())
    return {"delayed": node.node_id, "delay_ms": _f(delay_ms), "jitter_ms": _f(jitter_ms),
            "healthy_after": healthy}


def lose_packets(target: str = "follower", percent: float = 10.0, seconds: float = 6.0) -> dict[str, Any]:
    """Lose `percent` % of `target`'s packets in one direction (netem loss on what it
    sends, or an iptables `statistic` DROP on what it receives where the kernel has no
    sch_netem) for `seconds`, remove it, wait until healthy."""
    lab = _need_lab("lose_packets")
    node = _pick(target)
    idx = _lab_index(node)
    t0 = time.time()
    how = None
    try:
        how = lab.lose(idx, _f(percent))
        time.sleep(_f(seconds))
    finally:
        lab.clear_qdiscs(idx)
        lab.heal(idx)
    healthy = _wait_healthy()
    record_fault(f"loss-{target} {node.node_id} {_f(percent):g}%", t0, time.time())
    return {"lossy": node.node_id, "percent": _f(percent), "mechanism": how, "healthy_after": healthy}


def partition_bridge(seconds: float = 6.0, bridge: str = "follower") -> dict[str, Any]:
    """Jepsen's bridge for `seconds`: every member but `bridge` is put on one of two
    sides (the leader's side first), the links between the two sides are cut (iptables
    DROP at both ends, `NetLab.partition_pair`) and `bridge` still reaches everybody;
    heal, wait until healthy. With 3 members (A, B = bridge, C): A and C cannot reach
    each other, both reach B. `bridge` defaults to a follower, so the leader keeps its
    quorum through B and the other side's member falls out of sync (or, if it wins an
    election through B, the old leader does). The result has each member's view of the
    leader just before the heal."""
    c = _cluster()
    lab = _need_lab("partition_bridge")
    leader = c.leader(timeout=30)
    b = _pick(bridge)
    rest = sorted((n for n in c.live() if n is not b), key=lambda n: n is not leader)
    if len(rest) < 2:
        raise RuntimeError("partition_bridge needs at least 3 live members")
    half = (len(rest) + 1) // 2
    side_a, side_c = rest[:half], rest[half:]
    pairs = [(_lab_index(x), _lab_index(y)) for x in side_a for y in side_c]
    t0 = time.time()
    views: dict[str, Any] = {}
    try:
        for x, y in pairs:
            lab.partition_pair(x, y)
        time.sleep(_f(seconds))
        views = {k: (None if v is None else {"role": v.get("role"), "leader": v.get("leader"),
                                             "term": v.get("term"), "in_sync": v.get("in_sync")})
                 for k, v in c.statuses(c.nodes).items()}
    finally:
        for x, y in pairs:
            lab.heal(x)
            lab.heal(y)
    healthy = _wait_healthy()
    a_ids, c_ids = [n.node_id for n in side_a], [n.node_id for n in side_c]
    record_fault(f"partition-bridge {','.join(a_ids)} | {b.node_id} | {','.join(c_ids)}", t0, time.time())
    return {"bridge": b.node_id, "side_a": a_ids, "side_c": c_ids, "leader_before": leader.node_id,
            "views_during": views, "healthy_after": healthy,
            "leader_after": c.leader().node_id if healthy else None}


SNAPSHOT_PART = "raft.dump.part"  # node/replication/raft/snapshot/child.py: the forked child writes it


def _children(pid: int) -> list[int]:
    """Child pids of every thread of `pid` (the snapshot is forked by the raft thread)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as fh:
                out += [int(x) for x in fh.read().split()]
        except OSError:
            continue
    return out


def _proc_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, Z, ...), None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[0]


def _has_open(pid: int, suffix: str) -> bool:
    """`pid` has a file whose path ends with `suffix` open (/proc/PID/fd)."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith(suffix)
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def kill_during_snapshot(target: str = "follower", timeout: float = 60.0, down_seconds: float = 2.0,
                         poll: float = 0.001) -> dict[str, Any]:
    """SIGKILL `target` while it takes a snapshot, then its snapshot child, restart the
    node after `down_seconds` and wait until healthy.

    A snapshot (node/replication/raft/snapshot/mixin.py `_serialize`) is a child forked by the node
    that writes DATA_DIR/raft.dump.part; the node renames it to raft.dump once the child
    has exited (`_check_snapshot`). The action polls the node's children every `poll`
    seconds; when a fork of the node (same cmdline) has raft.dump.part open it SIGKILLs
    the node, and the kill counts as caught when raft.dump.part is left behind (the node
    died before it could install it). A miss (the child finished and the node installed
    the file in between) restarts the node and tries again, until `timeout`: then
    RuntimeError. The experiment makes snapshots frequent (small
    compaction_min_entries/_min_time)."""
    c = _cluster()
    deadline = time.monotonic() + _f(timeout)
    polls = attempts = 0
    misses: list[dict[str, Any]] = []
    t0 = time.time()
    while True:
        node = _pick(target)
        pid = node.pid
        assert pid is not None
        me = _cmdline(pid)
        kids: list[int] = []
        while not kids:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no snapshot in progress on a {target} within {_f(timeout):g} s "
                                   f"({polls} polls, {attempts} kills, misses {misses}): are the "
                                   "compaction thresholds small (compaction_min_entries/_min_time) "
                                   "and is there load?")
            polls += 1
            kids = [k for k in _children(pid) if _cmdline(k) == me and _has_open(k, SNAPSHOT_PART)]
            if not kids:
                time.sleep(_f(poll))
        part = Path(node.data_dir) / SNAPSHOT_PART
        attempts += 1
        t_kill = time.time()
        node.kill9()  # SIGKILL + reap: the node is gone
        running = [k for k in kids if _proc_state(k) not in (None, "Z")]
        part_left = part.exists()
        part_bytes = part.stat().st_size if part_left else None
        for k in running:
            try:
                os.kill(k, 9)
            except ProcessLookupError:
                pass
        gone_by = time.monotonic() + 5
        while any(_proc_state(k) not in (None, "Z") for k in kids) and time.monotonic() < gone_by:
            time.sleep(0.01)
        caught = part_left
        time.sleep(_f(down_seconds))
        node.start(wait=True, timeout=60)
        healthy = _wait_healthy()
        if caught:
            break
        misses.append({"node": node.node_id, "child": kids})
    record_fault(f"kill-during-snapshot-{target} {node.node_id}", t0, time.time())
    return {"killed": node.node_id, "target": target, "snapshot_child": kids, "polls": polls,
            "attempts": attempts, "child_alive_after_kill": bool(running), "part_file": str(part),
            "part_left_behind": part_left, "part_bytes": part_bytes, "kill_ts": t_kill,
            "waited_seconds": round(t_kill - t0, 2), "healthy_after": healthy,
            "leader": c.leader().node_id if healthy else None}


def heal_all(wait: bool = True) -> dict[str, Any]:
    """Rollback: flush every partition/loss rule, remove every netem qdisc, bring
    isolated links up, SIGCONT paused nodes, start nodes that are down, close open
    fault windows; wait until healthy."""
    c = _STATE.get("cluster")
    lab = _STATE.get("lab")
    if lab is not None:
        lab.heal(None)
        lab.clear_qdiscs(None)
        for nd in lab.nodes:
            lab.unisolate(nd)
    if c is None:
        return {"cluster": None}
    for n in c.nodes:
        if n.paused:
            n.resume()
        if not n.alive():
            n.start(wait=True, timeout=60)
    for nid, (name, t0) in list(_STATE.get("open_faults", {}).items()):
        record_fault(name, t0, time.time())
        _STATE["open_faults"].pop(nid, None)
    healthy = _wait_healthy() if _b(wait) else None
    return {"healthy": healthy}


# ------------------------------------------------------------------ membership

def _spare_host() -> tuple[str, str | None]:
    """(host, namespace) for a new member: 127.0.0.1, or under netns the first
    namespace no member (current or removed) uses."""
    c = _cluster()
    lab = _STATE.get("lab")
    if lab is None:
        return "127.0.0.1", None
    used = {n.host for n in c.nodes + c.removed}
    free = [nd for nd in lab.nodes if nd.addr not in used]
    if not free:
        raise RuntimeError("no spare namespace left (start_cluster(spare=...))")
    return free[0].addr, free[0].ns


def add_member(timeout: float = 90.0) -> dict[str, Any]:
    """AddMember through the leader's admin API, start the new node with --join (in a
    spare namespace under netns), wait until every member is in sync."""
    c = _cluster()
    host, ns = _spare_host()
    t0 = time.time()
    node = c.add_node(host=host, netns=ns, timeout=_f(timeout))
    healthy = _wait_healthy()
    record_fault(f"add-member {node.node_id}", t0, time.time())
    return {"added": node.node_id, "healthy_after": healthy, "members": [n.node_id for n in c.nodes]}


def remove_member(target: str = "follower", timeout: float = 90.0) -> dict[str, Any]:
    """RemoveMember through the leader's admin API; the removed process is expected to
    exit by itself (it is SIGKILLed after 30 s otherwise); wait until healthy."""
    c = _cluster()
    node = _pick(target)
    t0 = time.time()
    res = c.remove_node(node, timeout=_f(timeout))
    deadline = time.monotonic() + 30
    while node.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    exited = not node.alive()
    node.kill9()
    healthy = _wait_healthy()
    record_fault(f"remove-member {node.node_id}", t0, time.time())
    return {"removed": node.node_id, "exited_by_itself": exited, "healthy_after": healthy,
            "members": [n.node_id for n in c.nodes], "result": res}


def membership_change_during_partition(seconds: float = 6.0, target: str = "follower",
                                       observe: float = 8.0, timeout: float = 90.0) -> dict[str, Any]:
    """Cut a follower off (iptables in its namespace against every other namespace,
    spares included; clients still reach it), and while it is cut off RemoveMember it
    and AddMember a new node (spare namespace, --join); keep the partition at least
    `seconds` in all, heal, then watch `observe` seconds: the removed node never learnt
    it was removed (it missed DropMember), so it must not reappear in any member's
    member list, be named leader by anyone, or break the cluster's health. Finally
    SIGKILL it if it is still running (an operator would stop it) and wait until
    healthy. Raises (after healing) when the removed node came back."""
    c = _cluster()
    lab = _need_lab("membership_change_during_partition")
    node = _pick(target)
    if node is c.leader(timeout=30):
        raise RuntimeError("membership_change_during_partition: target must not be the leader")
    me = _lab_index(node)
    t0 = time.time()
    t0m = time.monotonic()
    added: ClusterNode | None = None
    removal: Any = None
    try:
        lab.partition(me, [nd.index for nd in lab.nodes if nd.index != me])
        time.sleep(min(1.0, _f(seconds)))
        removal = c.remove_node(node, timeout=_f(timeout))
        host, ns = _spare_host()
        added = c.add_node(host=host, netns=ns, timeout=_f(timeout))
        healthy_cut = _wait_healthy()
        time.sleep(max(0.0, _f(seconds) - (time.monotonic() - t0m)))
    finally:
        lab.heal(me)
    # after the heal: the removed node must stay out
    violations: list[str] = []
    leaders: set[str] = set()
    x_views: list[Any] = []
    end = time.monotonic() + _f(observe)
    while time.monotonic() < end:
        for k, st in c.statuses(c.nodes).items():
            if st is None:
                continue
            if node.node_id in (st.get("members") or []):
                violations.append(f"{k} lists {node.node_id} as a member: {st.get('members')}")
            if st.get("leader"):
                leaders.add(str(st.get("leader")))
                if c.node_for(st.get("leader")) is node:
                    violations.append(f"{k} names {node.node_id} leader")
        xs = node.try_status(timeout=1.0)
        if xs is not None:
            x_views.append({f: xs.get(f) for f in ("role", "leader", "term", "members")})
        time.sleep(0.5)
    exited = not node.alive()
    node.kill9()
    healthy = _wait_healthy()
    st = c.leader().try_status() if healthy else None
    members = sorted((st or {}).get("members") or [])
    if healthy and (node.node_id in members or added is None or added.node_id not in members):
        violations.append(f"final members {members}")
    record_fault(f"membership-during-partition -{node.node_id} +{added.node_id if added else '?'}",
                 t0, time.time())
    out = {"removed": node.node_id, "added": added.node_id if added else None, "members": members,
           "healthy_while_cut": healthy_cut, "healthy_after": healthy, "leaders_seen_after_heal": sorted(leaders),
           "removed_node_exited_by_itself": exited, "removed_node_views": x_views[-3:],
           "removal": removal, "violations": violations[:10]}
    if violations:
        raise RuntimeError(f"the removed member came back: {out}")
    return out


# ------------------------------------------------------------------ workload

def start_workload(publishers: int = 3, consumers: int = 3, rate: float = DEFAULT_RATE,
                   window: int = 100, queues: str = "chaos-a,chaos-b", warmup: float = 2.0,
                   pin_publishers_to: str | None = None, amqp: str | None = None,
                   publish_timeout: float = 15.0, crash_every: int = 150,
                   min_size: int | None = None, max_size: int | None = None,
                   seed: int | None = None, windows: str | None = None, kinds: str | None = None,
                   ttl_ms: int | None = None, max_length: int | None = None) -> dict[str, Any]:
    """Start the history-writing publishers/consumers (RUN_DIR/pub-*.jsonl, con-*.jsonl)
    over the cluster's nodes (or over `amqp` = "id=host:port,..." for a cluster we did
    not start, e.g. through a Kubernetes Service). pin_publishers_to="leader" makes
    every publisher prefer the current leader (e.g. to kill it under load). `rate` is
    msg/s per publisher; bodies are random, min_size..max_size bytes (default from
    CHAOS_MIN_SIZE / CHAOS_MAX_SIZE, 1 KiB..256 KiB), sizes drawn from `seed` (CHAOS_SEED).

    Queues: the classic `queues` (`consumers` consumers over them) plus the `kinds`
    (CHAOS_QUEUE_KINDS, default "ttl,maxlen,priority,sac"; "classic": none of them) of
    chaosmirrorq.workload.queue_plan, with x-message-ttl `ttl_ms` (CHAOS_TTL_MS, 3000)
    and x-max-length `max_length` (CHAOS_MAX_LENGTH, 20). windows: each publisher's
    window, e.g. "none,100,100" (CHAOS_WINDOWS; default: the first publisher has none,
    the others `window`). The configuration goes to run.json ("workload")."""
    qs = [q.strip() for q in queues.split(",") if q.strip()]
    env = os.environ.get

    def _opt(v: Any, key: str) -> str | None:
        return str(v) if v not in (None, "") else (env(key) or None)
    plan = queue_plan(qs, kinds=parse_kinds(_opt(kinds, "CHAOS_QUEUE_KINDS")), consumers=_i(consumers),
                      crash_every=_i(crash_every),
                      ttl_ms=_i(_opt(ttl_ms, "CHAOS_TTL_MS") or DEFAULT_TTL_MS),
                      max_length=_i(_opt(max_length, "CHAOS_MAX_LENGTH") or DEFAULT_MAX_LENGTH))
    wins = parse_windows(_opt(windows, "CHAOS_WINDOWS"), _i(publishers), _i(window))
    if amqp:
        nodes_fn: Callable[[], list[Any]] = endpoints_fn(amqp)
        _ensure_external_run()
        declare_node: Any = nodes_fn()[0]
    else:
        c = _cluster()
        nodes_fn = lambda: list(c.nodes)  # noqa: E731
        declare_node = c.leader()
    pin = None
    if pin_publishers_to:
        pin = _pick(pin_publishers_to).node_id if not amqp else pin_publishers_to
    run_dir = _run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    declare_queues(declare_node, plan)
    bodies = _body_config()
    for k, v in (("min_size", min_size), ("max_size", max_size), ("seed", seed)):
        if v not in (None, ""):
            bodies[k] = _i(v)
    wl = Workload(run_dir, _STATE["run_id"], nodes_fn, plan=plan, publishers=_i(publishers),
                  rate=_f(rate), windows=wins,
                  publish_timeout=_f(publish_timeout), crash_every=_i(crash_every),
                  pin_publishers_to=pin, min_size=bodies["min_size"],
                  max_size=bodies["max_size"], seed=bodies["seed"])
    rj = run_dir / "run.json"
    meta = json.loads(rj.read_text()) if rj.exists() else \
        {"run": _STATE["run_id"], "experiment": _STATE.get("experiment", ""), "started": time.time(),
         "ended": None}
    meta["workload"] = dict(wl.config(), seed=bodies["seed"], pinned_to=pin)
    rj.write_text(json.dumps(meta))
    wl.start()
    _STATE.update(workload=wl, workload_running=True, check_target=run_dir, drain_node=declare_node,
                  drain_nodes=nodes_fn if amqp else None)
    time.sleep(_f(warmup))
    return {"queues": [q.name for q in plan], "windows": wins, "pinned_to": pin, "rate": _f(rate),
            "bodies": bodies, **wl.summary()}


def stop_workload() -> dict[str, Any]:
    """Rollback: stop the workload's clients without draining (the run stays incomplete)."""
    wl: Workload | None = _STATE.get("workload")
    if wl is None or not _STATE.get("workload_running"):
        return {"workload": None}
    for pub in wl.publishers:
        pub.stop()
    for con in wl.consumers:
        con.stop()
    for thread in [*wl.publishers, *wl.consumers]:
        thread.join(30)
    wl.close()
    _STATE["workload_running"] = False
    return wl.summary()


def stop_workload_and_drain(heal: bool = True, idle: float = 3.0, min_time: float = 6.0) -> dict[str, Any]:
    """After the faults: (heal everything and wait until healthy), stop the publishers
    (outstanding publishes settle or time out), stop the consumers, drain every queue
    through the leader (phase "drain"), write drain_done and close run.json."""
    wl: Workload | None = _STATE.get("workload")
    if wl is None:
        raise RuntimeError("no workload running")
    c = _STATE.get("cluster")
    if c is not None and _b(heal):
        heal_all(wait=True)
    wl.stop_publishers()
    wl.stop_consumers()
    _STATE["workload_running"] = False
    # endpoints looked up now (k8s: the pods' current IPs), else the declaring one
    node = c.leader(timeout=60) if c is not None else \
        (_STATE["drain_nodes"]()[0] if _STATE.get("drain_nodes") else _STATE["drain_node"])
    drained = wl.drain(node, idle=_f(idle), min_time=_f(min_time))
    wl.close()
    summary = wl.summary()
    rj = _run_dir() / "run.json"
    meta = json.loads(rj.read_text()) if rj.exists() else {"run": _STATE["run_id"]}
    meta["ended"] = time.time()
    # per queue: publish outcomes (nack: reject-publish), deliveries, drained
    meta["workload_counts"] = summary["queues"]
    rj.write_text(json.dumps(meta))
    return {"drained": drained, "drain_node": node.node_id, **summary}
