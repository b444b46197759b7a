"""Smoke run of the soak (soak/soak.py, `make soak`) with scaled-down counts: a 3-node
cluster, connection and queue churn, confirmed publishing and consuming for 15 s. It must
pass every verdict of the full soak (no lost confirm, no fd or connection leak, flat RSS,
no node death, nothing left behind) and stop every process it started."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.broker_proc import REPO

pytestmark = pytest.mark.slow  # a half-minute soak run: make test-fast leaves it out

SOAK = REPO / "soak" / "soak.py"
HARD_TIMEOUT = 150.0  # the run itself takes ~30 s; this only bounds a hung run on a loaded machine


def _is_our_node(pid: int, workdir: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"node.app" in cmdline and workdir.encode() in cmdline  # pid-reuse guard


def _kill_leftover_nodes(pids_file: Path) -> list[int]:
    """soak.py stops its nodes itself; if it was killed, its pids file is still there."""
    if not pids_file.exists():
        return []
    info = json.loads(pids_file.read_text())
    killed = []
    for pid in info["nodes"].values():
        if pid and _is_our_node(pid, info["workdir"]):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM makes soak.py stop its nodes and write its report; SIGKILL if it hangs."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
    return out or ""


def test_soak_smoke_no_lost_confirms_no_fd_leak(tmp_path: Path) -> None:
    if os.environ.get("MIRRORQ_TARGET"):
        pytest.skip("the soak starts a mirrorq cluster of its own")
    out_dir = tmp_path / "soak"
    cmd = [sys.executable, str(SOAK), "--duration", "15", "--connections", "40",
           "--queues", "150", "--rate", "45", "--sample-interval", "1",
           "--settle-timeout", "10", "--out", str(out_dir)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        try:
            output, _ = proc.communicate(timeout=HARD_TIMEOUT)
        except subprocess.TimeoutExpired:
            output = _stop(proc)
            pytest.fail(f"soak smoke still running after {HARD_TIMEOUT}s:\n{output[-4000:]}")
    finally:
        if proc.poll() is None:
            _stop(proc)
        leftovers = _kill_leftover_nodes(out_dir / "pids.json")
    elapsed = time.monotonic() - started
    assert not leftovers, f"soak.py left node processes running: {leftovers}"

    report_path = out_dir / "soak.json"
    assert report_path.exists(), f"no report (rc={proc.returncode}):\n{output[-4000:]}"
    report = json.loads(report_path.read_text())
    assert "error" not in report, f"{report['error']}\n{report.get('traceback', '')}\n{output[-3000:]}"
    failed = {k: v["detail"] for k, v in report["verdicts"].items() if not v["pass"]}
    assert not failed, f"verdicts failed: {json.dumps(failed, indent=1)}\n{output[-3000:]}"
    assert proc.returncode == 0, output[-3000:]

    steady, counts = report["steady"], report["counts"]
    assert steady["lost"] == 0 and steady["confirmed"] > 100, steady
    assert counts["connections_opened"] >= 40 and counts["queues_deleted"] >= 150, counts
    assert counts.get("connections_closed_abrupt", 0) > 0  # dropped sockets were part of it
    assert counts.get("queues_deleted_implicitly", 0) > 0  # exclusive / auto-delete clean-up
    for node, fds in report["quiet"]["end"]["fds"].items():
        assert fds - report["quiet"]["after_warmup"]["fds"][node] <= report["params"]["fd_slack"]
    assert (out_dir / "soak.png").stat().st_size > 10_000
    assert len({s["t"] for s in report["samples"]}) >= 10  # a curve, not two points
    print(f"soak smoke: {elapsed:.1f}s")
