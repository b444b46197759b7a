"""A power cut of the whole cluster over harness.lazyfs (every node SIGKILLed at
once, every write it had not fsync'd thrown away), through `chaos run` with the
history check: the real build loses no confirmed message; the broken build
MIRRORQ_UNSAFE_NO_FSYNC=1, whose log flush skips its fdatasync (so it acks and
confirms entries that are only in the page cache), loses confirmed messages, and
the suite says FAIL. A plain kill -9 (full-restart) cannot tell the two apart:
the page cache outlives the process. The pure-Python checker keeps these cheap
(same counts as Spark's; the CI chaos subset runs power-cut with Spark)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chaosmirrorq import suite

from harness.datafs import fuse_unavailable_reason
from tests.support.chaos_env import short_env


def _power_cut(tmp_path: Path, **extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The suite's row of one power-cut run and the power_cut action's result."""
    if (reason := fuse_unavailable_reason()) is not None:
        pytest.skip(reason)
    env = short_env(CHAOS_RATE="60", CHAOS_CHECKER="fallback", **extra)
    row = suite.run_one("power-cut", tmp_path, env, timeout=300)
    print(f"\n{suite.fmt_table([row])}\n{row['reasons']}")
    journal = json.loads((tmp_path / "power-cut" / "journal.json").read_text())
    cut = next(r for r in journal["run"] if r["activity"]["name"] == "power-cut")
    assert cut["status"] == "succeeded", cut.get("exception")
    out: dict[str, Any] = cut["output"]
    assert sorted(out["dropped"]) == ["n1", "n2", "n3"], out  # every node's disk went through the drop
    return row, out


@pytest.mark.long  # the CI chaos subset runs power-cut in the gate (docs/testing.md, Pairs)
def test_power_cut_loses_no_confirmed_message(tmp_path: Path) -> None:
    row, out = _power_cut(tmp_path)
    assert row["confirmed"] and row["confirmed"] > 200, row
    assert row["lost"] == 0 and row["corrupted"] == 0, row
    assert row["verdict"] == "PASS", row["reasons"]
    assert out["healthy_after"] is True


def test_power_cut_catches_a_build_that_confirms_before_fsync(tmp_path: Path) -> None:
    row, out = _power_cut(tmp_path, MIRRORQ_UNSAFE_NO_FSYNC="1")
    assert sum(d["bytes_dropped"] for d in out["dropped"].values()) > 0, out
    assert row["lost"] is not None and row["lost"] > 0, row
    assert row["verdict"] == "FAIL", row
