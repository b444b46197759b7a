"""Issue 4: the CI subset must not pass without its partition experiment. A run without
network namespaces skips the netns experiments; with --subset ci or --no-skip that skip
fails the run, without them it stays a SKIP (make chaos as a normal user)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chaosmirrorq import netns, suite

NETNS_EXPERIMENT = "minority-partition"


@pytest.fixture
def no_netns(monkeypatch: pytest.MonkeyPatch) -> None:
    assert suite.needs_netns(suite.EXPERIMENTS_DIR / f"{NETNS_EXPERIMENT}.json")
    monkeypatch.setattr(netns, "netns_unavailable_reason", lambda: "network namespaces need root")
    # only the netns experiment: nothing may actually run

    def run_one(*_a: Any, **_kw: Any) -> dict[str, Any]:
        raise AssertionError("a skipped experiment was run")
    monkeypatch.setattr(suite, "run_one", run_one)
    monkeypatch.setitem(suite.SUBSETS, "ci", [NETNS_EXPERIMENT])


def _rows(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads((out / "summary.json").read_text())["rows"]
    return rows


@pytest.mark.usefixtures("no_netns")
def test_ci_subset_fails_when_the_partition_experiment_is_skipped(tmp_path: Path) -> None:
    assert suite.main(["--subset", "ci", "--out", str(tmp_path)]) == 1
    assert [r["verdict"] for r in _rows(tmp_path)] == ["SKIP"]


@pytest.mark.usefixtures("no_netns")
def test_no_skip_flag_fails_any_run_with_a_skip(tmp_path: Path) -> None:
    assert suite.main(["--only", NETNS_EXPERIMENT, "--no-skip", "--out", str(tmp_path)]) == 1


@pytest.mark.usefixtures("no_netns")
def test_plain_run_without_netns_still_skips_and_passes(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert suite.main(["--only", NETNS_EXPERIMENT, "--out", str(tmp_path)]) == 0
    assert f"{NETNS_EXPERIMENT}: SKIP" in capsys.readouterr().out
