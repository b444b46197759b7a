"""The chaos suite's one Spark job over every experiment's history
(chaosmirrorq.suite.spark_verdicts): a row the per-experiment Python check
passed fails when Spark finds a lost message in its history or counts
differently; an experiment that left no history is not sent to Spark."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.history import load_analysis

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("Spark needs java on PATH", allow_module_level=True)

from chaosmirrorq.probes import fallback_check  # noqa: E402
from chaosmirrorq.suite import AGREE, spark_verdicts  # noqa: E402

gh = load_analysis("generate_history")


def _row(tmp: Path, name: str, seed: int, lost: int = 0) -> dict[str, Any]:
    """A row as run_one leaves it after a passing Python check of a synthetic history
    (no republishes: the chaos publishers make none, so any duplicate is a defect)."""
    base = tmp / name
    gh.generate(gh.Params(out=str(base / "history"), events=3000, seed=seed, lost=lost, run=f"{name}-run", republish=0.0,
                          experiment=name))
    py = fallback_check(base / "history")
    row: dict[str, Any] = {"experiment": name, "dir": str(base), "verdict": "PASS", "reasons": []}
    row.update({k: py.get(k) for k in AGREE})
    return row


def test_spark_fails_the_rows_with_a_loss_or_other_counts_and_passes_the_rest(tmp_path: Path) -> None:
    clean = _row(tmp_path, "clean", seed=1)
    lossy = _row(tmp_path, "lossy", seed=2, lost=3)
    miscounted = _row(tmp_path, "miscounted", seed=3)
    assert lossy["lost"] == 3  # the Python check sees it too; the row is forced to PASS below
    miscounted["confirmed"] += 1
    no_history = {"experiment": "skipped", "dir": str(tmp_path / "skipped"), "verdict": "FAIL",
                  "reasons": ["no journal"]}
    rows = [clean, lossy, miscounted, no_history]

    spark_verdicts(rows, tmp_path, timeout=300)

    assert clean["verdict"] == "PASS", clean["reasons"]
    assert clean["spark"]["ok"] is True and clean["spark"]["confirmed"] == clean["confirmed"]
    assert lossy["verdict"] == "FAIL" and any("lost=3" in r for r in lossy["reasons"]), lossy["reasons"]
    assert miscounted["verdict"] == "FAIL"
    assert any("disagree" in r and "confirmed" in r for r in miscounted["reasons"]), miscounted["reasons"]
    assert "spark" not in no_history and no_history["reasons"] == ["no journal"]
    assert (tmp_path / "spark-report.json").exists()
