"""`chaos validate` accepts every experiment, the local ones and the Kubernetes ones
(validation imports the extensions and checks the activities' signatures; it needs
no cluster)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.chaos_env import EXPERIMENTS

FILES = sorted(EXPERIMENTS.glob("*.json")) + sorted((EXPERIMENTS / "k8s").glob("*.json"))
NAMES = ["leader-kill-loop", "follower-kill", "leader-pause", "minority-partition",
         "leader-in-minority", "full-restart", "rolling-restart", "scale-out-in",
         "network-delay", "packet-loss", "one-way-partition",
         "crash-during-partition", "crash-during-pause", "membership-lost-writes"]
K8S_NAMES = ["leader-pod-kill", "scale-out-in"]  # run by tests/k8s/test_kubelet_e2e.py, test_chaos_k8s.py


def chaos_cli() -> str:
    return str(Path(sys.executable).parent / "chaos")


def test_every_experiment_exists_locally_and_for_k8s() -> None:
    for name in NAMES:
        assert (EXPERIMENTS / f"{name}.json").exists(), name
    assert sorted(p.stem for p in (EXPERIMENTS / "k8s").glob("*.json")) == sorted(K8S_NAMES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(EXPERIMENTS)))
def test_chaos_validate(path: Path, tmp_path: Path) -> None:
    exp = json.loads(path.read_text())
    assert exp.get("steady-state-hypothesis", {}).get("probes"), "no steady-state hypothesis"
    assert exp.get("rollbacks"), "no rollbacks"
    proc = subprocess.run([chaos_cli(), "--no-log-file", "validate", str(path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "look valid" in out, out
