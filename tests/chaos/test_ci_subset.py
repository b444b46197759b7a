"""The CI chaos subset through `python -m chaosmirrorq.suite --subset ci`, as
`make chaos CHAOS_ARGS='--subset ci'` runs it: leader kill loop, minority
partition, full restart, one-way partition and power cut, each a `chaos run`
of the chaostoolkit experiment under the mixed workload (random bodies of
1-256 KiB, seven queue kinds), judged from its journal, by the pure-Python
history check and by one Spark job over all five histories. Any lost,
corrupted or duplicated confirmed message, a skipped experiment (no root or
network namespaces) or a disagreement between the checkers fails it. The
suite's output is kept in data/chaos-ci/suite.log (tests/suite.sh prints its
table at the end of make test)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from chaosmirrorq.suite import SUBSETS

from harness.process import REPO

OUT = REPO / "data" / "chaos-ci"


@pytest.mark.timeout(1500)
def test_ci_chaos_subset_loses_no_confirmed_message_in_any_experiment() -> None:
    if os.geteuid() != 0:
        pytest.skip("the subset's partitions need root (network namespaces)")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").unlink(missing_ok=True)
    with open(OUT / "suite.log", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "chaosmirrorq.suite", "--subset", "ci", "--out", str(OUT)],
                              cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=1400)
    text = (OUT / "suite.log").read_text()
    print(text)
    rows = json.loads((OUT / "summary.json").read_text())["rows"]
    assert [r["experiment"] for r in rows] == SUBSETS["ci"], text
    for r in rows:
        assert r["verdict"] == "PASS", (r["experiment"], r["reasons"])
        assert r["lost"] == 0 and r["corrupted"] == 0 and r["duplicates"] == 0, r
        assert r["confirmed"] > 100, r  # the workload ran through the fault
        assert r["spark"]["lost"] == 0 and r["spark"]["confirmed"] == r["confirmed"], r
    assert proc.returncode == 0, text[-3000:]
