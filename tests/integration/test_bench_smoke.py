"""Smoke runs of the benchmark harnesses (bench/run.py, bench/suite.py).

Not speed assertions: they check that the harness can start a node (and, when the
rabbitmq-server package is installed, a RabbitMQ), drive the Java load generator through
every scenario with tiny counts, pass its sanity checks and write positive rates to its JSON.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.broker_proc import REPO

pytestmark = pytest.mark.slow  # the Java bench client: make test-fast leaves it out

JARS = ["/usr/share/java/amqp-client.jar", "/usr/share/java/slf4j-api.jar",
        "/usr/share/java/slf4j-nop.jar"]


def test_bench_quick_smoke_mirrorq(tmp_path: Path) -> None:
    if os.environ.get("MIRRORQ_TARGET"):
        pytest.skip("the bench smoke run starts a mirrorq node of its own")
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("javac/java not on PATH (install openjdk-17-jdk-headless)")
    missing = [j for j in JARS if not os.path.exists(j)]
    if missing:
        pytest.skip(f"RabbitMQ Java client jars missing: {missing}")
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--skip-rabbitmq",
           "--out", str(out), "--timeout", "90", "--stall", "30"]
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert out.exists(), f"no JSON written (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    report = json.loads(out.read_text())
    node = report["brokers"]["mirrorq"]
    assert "error" not in node, f"mirrorq run failed: {node['error']}\n{proc.stderr[-3000:]}"
    scenarios = node["scenarios"]
    for name in ("confirms", "consume", "tx"):
        res = scenarios[name]
        assert "error" not in res, f"{name} failed: {res['error']}\n{proc.stderr[-3000:]}"
        assert res["msg_per_s"] > 0, f"{name}: {res}"
    assert scenarios["confirms"]["acked"] == report["params"]["count"]
    assert scenarios["confirms"]["double_confirms"] == 0
    assert scenarios["consume"]["consumed"] == report["params"]["count"]
    assert scenarios["tx"]["queue_count"] == report["params"]["tx_count"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["comparison"][0]["scenario"] == "confirms"


# --------------------------------------------------------------------------- bench/suite.py

def _java_or_skip() -> None:
    if os.environ.get("MIRRORQ_TARGET"):
        pytest.skip("the bench smoke run starts brokers of its own")
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("javac/java not on PATH (install openjdk-17-jdk-headless)")
    missing = [j for j in JARS if not os.path.exists(j)]
    if missing:
        pytest.skip(f"RabbitMQ Java client jars missing: {missing}")


def _run_suite(tmp_path: Path, targets: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    out = tmp_path / "suite.json"
    cmd = [sys.executable, str(REPO / "bench" / "suite.py"), "--smoke", "--targets", targets,
           "--out", str(out), "--timeout", "120", "--stall", "30", "--pause", "0"]
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert out.exists(), f"no JSON written (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text()), proc


def _check_target(report: dict[str, Any], key: str, expected: list[str], log: str) -> None:
    entry = report["targets"][key]
    assert "error" not in entry, f"{key}: {entry['error']}\n{log}"
    assert sorted(entry["scenarios"]) == sorted(expected), (key, sorted(entry["scenarios"]))
    for sid, sc in entry["scenarios"].items():
        s = sc["summary"]
        assert s["sanity_ok"], f"{key} {sid}: {s.get('errors')}\n{log}"
        assert s["repeats"] == s["ok"] == len(sc["repeats"]) == 1
        assert s["msg_per_s"]["median"] > 0, (key, sid, s)
        for r in sc["repeats"]:
            assert r["sanity_ok"] is True and "error" not in r, (key, sid, r)
            if "double_confirms" in r:
                assert r["double_confirms"] == 0 and r["nacked"] == 0, (key, sid, r)
            if r["mode"] == "confirms":
                assert r["acked"] == r["count"] == r["queue_count"], (key, sid, r)
            if r["mode"] in ("consume", "latency"):
                assert r["consumed"] == r["count"] and r["duplicates"] == 0, (key, sid, r)
            if r["mode"] in ("tx", "publish"):
                assert r["queue_count"] == r["count"], (key, sid, r)
    for sid in ("S1w100", "S1w1000", "S2", "S4", "S5"):
        assert entry["scenarios"][sid]["summary"]["p99_ms"]["median"] > 0, (key, sid)
    assert entry["scenarios"]["S5"]["summary"]["publish_split_ratio"]["median"] > 0


ALL_BUT_S0 = ["S1", "S1w100", "S1w1000", "S2", "S3p1", "S3p100", "S3p300", "S3auto", "S4", "S5"]


def test_suite_smoke_mirrorq(tmp_path: Path) -> None:
    _java_or_skip()
    report, proc = _run_suite(tmp_path, "mirrorq-1")
    _check_target(report, "mirrorq-1", ALL_BUT_S0, proc.stderr[-3000:])
    assert report["sanity_ok"] and report["errors"] == [], report["errors"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["params"]["targets"] == ["mirrorq-1"]
    assert report["machine"]["cores"] and report["versions"]["mirrorq"]
    assert Path(report["chart"]).is_file(), report.get("chart")


def test_suite_smoke_mirrorq_vs_rabbitmq(tmp_path: Path) -> None:
    _java_or_skip()
    if not os.path.exists("/usr/lib/rabbitmq/bin/rabbitmq-server"):
        pytest.skip("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
    if os.geteuid() != 0:
        pytest.skip("the suite starts RabbitMQ as user rabbitmq: needs root")
    report, proc = _run_suite(tmp_path, "mirrorq-1,rabbitmq-1")
    log = proc.stderr[-3000:]
    _check_target(report, "mirrorq-1", ALL_BUT_S0, log)
    _check_target(report, "rabbitmq-1", ["S0", "S0p", *ALL_BUT_S0], log)
    assert proc.returncode == 0, log
    assert report["s0_generator"]["msg_per_s"]["median"] > 0
    ratios = {c["scenario"]: c for c in report["comparisons"]
              if (c["mirrorq"], c["rabbitmq"]) == ("mirrorq-1", "rabbitmq-1")}
    assert sorted(ratios) == sorted(ALL_BUT_S0)
    for sid, c in ratios.items():
        assert c["ratio"] and c["ratio"] > 0, (sid, c)
    assert report["versions"]["rabbitmq"] and report["versions"]["erlang_otp"]
