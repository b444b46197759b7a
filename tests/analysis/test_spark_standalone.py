"""The history checker on a real Spark standalone cluster (a master and two
workers started from the pyspark distribution, chaos/analysis/spark_standalone.py),
submitted with spark-submit --master spark://...: the same verdicts as on
local[*], including a corrupted body and a run split over many Parquet files."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.history import T, clean_events, dlv, pub, write_run
from tests.support.history import load_analysis as _load

ss = _load("spark_standalone")

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "chaos" / "analysis" / "check_history.py"
GENERATOR = ROOT / "chaos" / "analysis" / "generate_history.py"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    base = tmp_path_factory.mktemp("spark")
    c = ss.up(base, workers=2, cores=1, memory="1g")
    try:
        yield c, base
    finally:
        ss.down(base)


def test_spark_standalone_up_starts_a_master_and_two_alive_workers(
        cluster: tuple[Any, Path]) -> None:
    c, _ = cluster
    assert c.master_url.startswith("spark://127.0.0.1:")
    assert ss._alive_workers(c.master_ui) == 2


# 1.5 minutes: make test keeps the standalone cluster's start (above) and the same checker's
# verdicts in local mode (test_check_history.py's CLI tests)
@pytest.mark.long
def test_checker_on_standalone_cluster_finds_lost_unexpected_and_corrupted(
        cluster: tuple[Any, Path], tmp_path: Path) -> None:
    c, base = cluster
    # a generated run (several publishers), rewritten as Parquet: many part files
    gen = tmp_path / "gen"
    subprocess.run([sys.executable, str(GENERATOR), str(gen), "--events", "60000", "--seed",
                    "11", "--lost", "7", "--unexpected", "2", "--faults", "2", "--workers", "2",
                    "--parquet"], check=True, capture_output=True, timeout=300)
    parts = list((gen / "events.parquet").glob("part-*.parquet"))
    assert len(parts) > 1, parts
    expected = json.loads((gen / "expected.json").read_text())
    # a small run whose only defect is a damaged body
    evs = clean_events("k") + [pub("k", "k9", T + 1), dlv("k", "k9", T + 1.1, corrupted=True),
                               dlv("k", "k9", T + 1.3, True, corrupted=False)]
    bad_body = write_run(tmp_path, "k", {"a.jsonl": evs})
    out = tmp_path / "report.json"
    proc = subprocess.run(ss.submit_cmd(c, [str(CHECKER), str(gen), bad_body, "--out", str(out)]),
                          env=ss._env(base), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]  # lost, unexpected and corrupted: fail
    rep = json.loads(out.read_text())
    assert rep["checker"]["master"] == c.master_url  # it ran on the cluster
    run = rep["runs"][expected["run"]]
    for key in ("confirmed", "lost", "duplicates", "unexpected", "recovered", "redeliveries"):
        assert run[key] == expected[key], (key, run[key], expected[key])
    k = rep["runs"]["k"]
    assert (k["lost"], k["corrupted"], k["corrupted_ids"]) == (0, 1, ["k9"])
    assert rep["ok"] is False
