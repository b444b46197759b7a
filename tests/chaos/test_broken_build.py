"""The suite catches a broken build: with MIRRORQ_UNSAFE_EARLY_CONFIRM=1 the node
confirms publishes on receipt, before replication. Every publisher is pinned to the
leader; its followers are SIGSTOPped for 2 s (the leader keeps taking publishes it
cannot replicate, and this build confirms them), then the leader is SIGKILLed: what it
confirmed but never replicated is gone, the history check reports lost > 0, the
hypothesis after the method fails and the suite's verdict is FAIL. The very same
scenario passes on the correct build (test_experiment_e2e)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chaosmirrorq import suite
from chaosmirrorq.netns import require_netns

from harness.process import REPO
from tests.support.chaos_env import KILL_UNDER_BACKLOG, short_env


def _node_has_unsafe_flag() -> bool:
    return any("MIRRORQ_UNSAFE_EARLY_CONFIRM" in p.read_text(errors="replace")
               for p in (REPO / "node").rglob("*.py"))


def _run_broken(experiment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                **extra: str) -> tuple[int, dict[str, Any]]:
    """The suite on `experiment` against the broken build: (exit code, its row)."""
    env = short_env(MIRRORQ_UNSAFE_EARLY_CONFIRM="1", **extra)
    for k in list(env):
        monkeypatch.setenv(k, env[k])
    code = suite.main(["--only", experiment, "--out", str(tmp_path), "--long"])
    row = json.loads((tmp_path / "summary.json").read_text())["rows"][0]
    print(f"\n{suite.fmt_table([row])}\n{row['reasons']}")
    return code, row


# a minute: make test keeps test_power_cut.py's broken build (confirms before fsync: the
# power-cut experiment reports the loss and fails) and the confirm gate's unit tests
@pytest.mark.long
def test_unsafe_early_confirm_makes_the_suite_fail(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # a failure, not a skip: without the flag the proof that the suite catches loss is gone
    assert _node_has_unsafe_flag(), "no MIRRORQ_UNSAFE_EARLY_CONFIRM flag under node/: the broken build is gone"
    code, row = _run_broken("leader-kill-loop", tmp_path, monkeypatch, **KILL_UNDER_BACKLOG)
    assert row["lost"] is not None and row["lost"] > 0, row
    assert row["verdict"] == "FAIL", row
    assert code != 0
    assert any("steady state after" in r for r in row["reasons"]), row["reasons"]


# 74 s in CI: make test keeps test_power_cut.py's broken build
@pytest.mark.long
def test_unsafe_early_confirm_is_caught_by_the_mixed_experiment(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue-16 faults catch it too: in `mixed` (loss, a paused follower, the leader
    SIGKILLed, a one-way partition, overlapping) with the publishers on the leader, what
    the broken build confirmed before replicating dies with the leader. The same
    experiment passes on the correct build (make chaos; chaos-long)."""
    require_netns()
    assert _node_has_unsafe_flag()
    code, row = _run_broken("mixed", tmp_path, monkeypatch, CHAOS_PIN_PUBLISHERS="leader", CHAOS_RATE="100",
                            CHAOS_WINDOW="300", CHAOS_FAULT_SECONDS="6")
    assert row["lost"] is not None and row["lost"] > 0, row
    assert row["verdict"] == "FAIL" and code != 0, row
