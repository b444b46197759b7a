"""One short experiment end to end through `chaos run` (leader kill under load, the
same scenario the broken-build test uses: publishers on the leader, followers stalled,
leader SIGKILLed): the journal shows the steady-state hypothesis met before and after,
and the history check finds every confirmed message delivered."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from chaosmirrorq import suite

from tests.support.chaos_env import KILL_UNDER_BACKLOG, short_env


@pytest.mark.long  # the CI chaos subset runs leader-kill-loop in the gate (docs/testing.md, Pairs)
def test_leader_kill_experiment_end_to_end(tmp_path: Path) -> None:
    row = suite.run_one("leader-kill-loop", tmp_path, short_env(**KILL_UNDER_BACKLOG), timeout=300)
    journal = json.loads((tmp_path / "leader-kill-loop" / "journal.json").read_text())
    print(f"\n{suite.fmt_table([row])}\n{row['reasons']}")
    assert journal["status"] == "completed", journal["status"]
    assert journal["steady_states"]["before"]["steady_state_met"] is True
    assert journal["steady_states"]["after"]["steady_state_met"] is True
    assert not journal["deviated"]
    assert all(r["status"] == "succeeded" for r in journal["run"]), \
        [(r["activity"]["name"], r["status"], r.get("exception")) for r in journal["run"]]
    assert row["confirmed"] and row["confirmed"] > 300, row
    assert row["lost"] == 0, row
    assert row["verdict"] == "PASS", row["reasons"]
    faults = [json.loads(line) for line in
              (tmp_path / "leader-kill-loop" / "history" / "faults.jsonl").read_text().splitlines()]
    assert len(faults) == 1 and faults[0]["name"].startswith("kill-leader ")
    assert faults[0]["end_ts"] > faults[0]["start_ts"]
