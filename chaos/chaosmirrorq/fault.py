"""State and helpers every fault action shares (chaosmirrorq.actions, .clock, .disk,
.mixed, .probes): `chaos run` executes every activity of one experiment in one Python
process, so the cluster, the network lab, the workload and the run's history dir live
in STATE. record_fault writes one `fault` event (name, start_ts, end_ts) to
RUN_DIR/faults.jsonl when a fault window closes."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from chaosmirrorq.workload import HistoryWriter
from harness.process import Cluster, ClusterNode

STATE: dict[str, Any] = {}
HEAL_TIMEOUT = 90.0


def as_float(x: Any) -> float:
    return float(x)


def as_bool(x: Any) -> bool:
    if isinstance(x, str):
        return x.strip().lower() in ("1", "true", "yes", "on")
    return bool(x)


def cluster() -> Cluster:
    c = STATE.get("cluster")
    if c is None:
        raise RuntimeError("no cluster: start_cluster first")
    return c


def run_dir() -> Path:
    d = STATE.get("run_dir")
    if d is None:
        raise RuntimeError("no run dir: start_cluster first")
    return Path(d)


def faults() -> HistoryWriter:
    w = STATE.get("faults")
    if w is None:
        w = STATE["faults"] = HistoryWriter(run_dir() / "faults.jsonl")
    return w


def record_fault(name: str, start_ts: float, end_ts: float | None) -> None:
    faults().write({"type": "fault", "run": STATE.get("run_id", ""), "name": name,
                    "start_ts": start_ts, "end_ts": end_ts})
    STATE.setdefault("fault_log", []).append({"name": name, "start_ts": start_ts, "end_ts": end_ts})


def pick(target: str) -> ClusterNode:
    c = cluster()
    if target == "leader":
        return c.leader(timeout=30)
    if target == "follower":
        return random.choice(c.followers(timeout=30))
    if target == "random":
        return random.choice(c.live())
    return c.node(target)


def wait_healthy(timeout: float = HEAL_TIMEOUT) -> bool:
    try:
        cluster().wait_healthy(timeout=timeout)
        return True
    except AssertionError as exc:
        STATE.setdefault("errors", []).append(str(exc))
        return False
