"""Clock fault (issue 16): step one node's clock at run time and back.

`start_cluster(faketime=True)` gives every node its own offset file
(CLUSTER/<node>.clock-offset, "0") and starts it with a clock hook:

- mode "python" (the default, CHAOS_CLOCK_MODE): PYTHONPATH starts with
  chaosmirrorq/clockhook, whose sitecustomize offsets time.time() and
  time.time_ns() of that node process by the file's seconds. That is what an
  NTP or operator step does: CLOCK_REALTIME jumps, the monotonic clocks do not.
  It reaches everything in the node that reads the wall clock through Python's
  `time` (the wall time each proposed batch carries, which the state machine
  uses for TTL expiry; log timestamps; the HTTP API's timestamps); not C code
  that calls clock_gettime itself (datetime.now(), gRPC).
- mode "libfaketime": LD_PRELOAD=libfaketimeMT.so.1 with FAKETIME_TIMESTAMP_FILE
  (the same file, written as "+N"/"-N") and FAKETIME_CACHE_DURATION=1. With
  libfaketime 0.9.10 (Debian 12) this steps *every* clock of the process
  (realtime, monotonic and the CLOCK_MONOTONIC_RAW pysyncobj uses), and
  FAKETIME_DONT_FAKE_MONOTONIC=1 makes every time.sleep() fail with EINVAL
  (libfaketime's clock_nanosleep wrapper, without a syscall), so it cannot step
  the wall clock alone; a forward step also stalls every timed lock wait of
  Python (sem_clockwait is not intercepted) by the step. Kept for manual runs;
  see chaos/README.md.

`step_clock(target, step_seconds, seconds, back_and_forth)` writes the offset of
one node, holds it, (optionally steps the other way for as long), then writes 0
and waits until the cluster is healthy; `reset_clocks()` (rollback) writes 0
for every node.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaosmirrorq.fault import STATE, as_bool, as_float, cluster, pick, record_fault, wait_healthy

__all__ = ["step_clock", "reset_clocks", "faketime_env", "faketime_unavailable_reason", "offset_file",
           "LIBFAKETIME", "HOOK_DIR"]

HOOK_DIR = Path(__file__).resolve().parent / "clockhook"
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


def _mode() -> str:
    return (os.environ.get("CHAOS_CLOCK_MODE") or "python").strip().lower()


def faketime_unavailable_reason(mode: str | None = None) -> str | None:
    mode = mode or _mode()
    if mode == "libfaketime" and not LIBFAKETIME.exists():
        return f"{LIBFAKETIME} missing (apt-get install libfaketime)"
    if mode not in ("python", "libfaketime"):
        return f"unknown CHAOS_CLOCK_MODE {mode!r} (python | libfaketime)"
    if not (HOOK_DIR / "sitecustomize.py").exists():
        return f"{HOOK_DIR}/sitecustomize.py missing"
    return None


def offset_file(cluster_dir: Path, node_id: str) -> Path:
    return Path(cluster_dir) / f"{node_id}.clock-offset"


def _write_offset(path: Path, seconds: float, mode: str) -> None:
    text = f"{seconds:+g}" if mode == "libfaketime" else f"{seconds:g}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def faketime_env(cluster_dir: Path, mode: str | None = None) -> Callable[[str], dict[str, str]]:
    """Cluster(node_env=...): the environment that puts the clock hook into a node."""
    mode = mode or _mode()
    why = faketime_unavailable_reason(mode)
    if why:
        raise RuntimeError(f"clock fault: {why}")
    STATE["clock_mode"] = mode
    cluster_dir = Path(cluster_dir)
    cluster_dir.mkdir(parents=True, exist_ok=True)

    def env(node_id: str) -> dict[str, str]:
        path = offset_file(cluster_dir, node_id)
        _write_offset(path, 0.0, mode)
        if mode == "libfaketime":
            return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(path),
                    "FAKETIME_CACHE_DURATION": "1"}
        pp = os.environ.get("PYTHONPATH")
        return {"PYTHONPATH": str(HOOK_DIR) + (os.pathsep + pp if pp else ""),
                "MIRRORQ_CLOCK_OFFSET_FILE": str(path)}
    return env


def _offset_path(node_id: str) -> Path:
    c = cluster()
    node = c.node(node_id)
    path = node.env.get("MIRRORQ_CLOCK_OFFSET_FILE") or node.env.get("FAKETIME_TIMESTAMP_FILE")
    if not path:
        raise RuntimeError("step_clock needs start_cluster(faketime=True)")
    return Path(path)


def step_clock(target: str = "follower", step_seconds: float = 30.0, seconds: float = 6.0,
               back_and_forth: bool | str = False) -> dict[str, Any]:
    """Step `target`'s clock by `step_seconds` (negative: backward) for `seconds`;
    with back_and_forth, then by -step_seconds for as long; then back to 0. Waits
    until the cluster is healthy."""
    node = pick(target)
    path = _offset_path(node.node_id)
    mode = STATE.get("clock_mode", _mode())
    step = as_float(step_seconds)
    t0 = time.time()
    STATE.setdefault("open_faults", {})[node.node_id] = (f"clock-step-{target} {node.node_id} {step:+g}s", t0)
    steps = [step, -step] if as_bool(back_and_forth) else [step]
    try:
        for s in steps:
            _write_offset(path, s, mode)
            time.sleep(as_float(seconds))
    finally:
        _write_offset(path, 0.0, mode)
        # the hook re-reads the file every 0.1 s, libfaketime every second
        time.sleep(1.1 if mode == "libfaketime" else 0.3)
    healthy = wait_healthy()
    STATE.get("open_faults", {}).pop(node.node_id, None)
    record_fault(f"clock-step-{target} {node.node_id} {step:+g}s", t0, time.time())
    return {"node": node.node_id, "steps": steps, "mode": mode, "alive": node.alive(),
            "healthy_after": healthy}


def reset_clocks() -> dict[str, Any]:
    """Rollback: every node's clock offset back to 0."""
    c = STATE.get("cluster")
    reset = []
    mode = STATE.get("clock_mode", _mode())
    if c is not None:
        for n in c.nodes + c.removed:
            path = n.env.get("MIRRORQ_CLOCK_OFFSET_FILE") or n.env.get("FAKETIME_TIMESTAMP_FILE")
            if path:
                _write_offset(Path(path), 0.0, mode)
                reset.append(n.node_id)
    return {"reset": reset}
