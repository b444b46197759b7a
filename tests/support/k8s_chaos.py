"""Run one of chaos/experiments/k8s with `chaos run` against a chart install of the
tests' control plane, judged by its steady-state probes (the operator reports every
member in sync; the history checker, PySpark, finds 0 confirmed messages lost)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.k8s_env import NAME, NS, Env

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "chaos" / "experiments" / "k8s"


def run_experiment(env: Env, name: str, tmp_path: Path, rate: int = 150) -> dict[str, Any]:
    journal = tmp_path / "journal.json"
    run_env = dict(os.environ, KUBECONFIG=str(env.cp.kubeconfig), MIRRORQ_K8S_NAMESPACE=NS,
                   MIRRORQ_K8S_CLUSTER=NAME, MIRRORQ_AMQP=f"k8s:{NS}/{NAME}",
                   CHAOS_BASE_DIR=str(tmp_path / "run"), CHAOS_RATE=str(rate))
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "chaos"), "--no-log-file", "run",
         "--journal-path", str(journal), str(EXPERIMENTS / f"{name}.json")],
        cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=840)
    took = time.monotonic() - t0
    assert journal.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(journal.read_text())
    reports = sorted((tmp_path / "run").glob("*-report.json"))
    summary = [json.loads(r.read_text()) for r in reports]
    brief = [{k: r.get(k) for k in ("run", "confirmed", "lost", "corrupted", "duplicates",
                                    "checker", "verdict") if k in r} for r in summary]
    # each activity's duration: where the time of a slow run went
    steps = [(r["activity"]["name"], round(r.get("duration", 0.0), 1))
             for r in result.get("run", [])]
    for when, probes in (result.get("steady_states") or {}).items():
        for r in probes.get("probes", []) if isinstance(probes, dict) else []:
            steps.append((f"{when}:{r['activity']['name']}", round(r.get("duration", 0.0), 1)))
    # the method's own waits for convergence (cluster_converged, 180 s) return False
    # on a timeout without failing the run; the steady state after the method judges
    # convergence. Reported here: a member's catch-up under load is slow on this
    # machine (docs/kubernetes.md, "Catching up under load").
    waits = {r["activity"]["name"]: r.get("output") for r in result.get("run", [])
             if r["activity"].get("provider", {}).get("func") == "cluster_converged"}
    print(f"{name}: status={result['status']} deviated={result['deviated']} "
          f"in {took:.0f}s; steps {steps}; converged in the method: {waits}; "
          f"reports {brief}")
    print(catch_up_lines(env))
    if result["status"] != "completed" or result["deviated"]:
        print(proc.stdout[-4000:], proc.stderr[-4000:])
        print(env.diagnostics())
    assert result["status"] == "completed", result["status"]
    assert not result["deviated"], "steady state deviated (a loss, or not back in sync)"
    assert summary, "no history report was written"
    assert all(r.get("lost", 0) == 0 for r in summary), brief
    return result


# what a member's catch-up looks like in the brokers' logs: raft/replicator.py ("caught up",
# "made no progress", "sending ... the snapshot"), raft/snapshot/ and raft/compaction.py (the
# other snapshot lines), raft_node.py ("raft ready", "NodeUp applied"), raft/election.py
# ("stepping down"), raft/log/retention.py ("compacted")
CATCH_UP_MARKS = ("snapshot", "caught up", "raft ready", "NodeUp applied", "stepping down",
                  "made no progress", "compacted")


def catch_up_lines(env: Env) -> str:
    """The catch-up lines of every broker pod's current container (a killed pod's
    lines went with it; its replacement's and the leader's tell the catch-up)."""
    out = []
    for pod in sorted(p["metadata"]["name"] for p in env.pods()):
        res = env.kubectl("logs", pod, "-c", "mirrorq", check=False)
        lines = [line for line in res.stdout.splitlines() if any(m in line for m in CATCH_UP_MARKS)]
        out.append(f"== {pod}: {len(lines)} catch-up lines" + "".join(f"\n   {line[:220]}" for line in lines[-40:]))
    return "\n".join(out)
