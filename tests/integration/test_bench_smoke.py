"""Smoke run of the benchmark harness against a fresh mirrorq node.

Not a speed assertion: it checks that bench/run.py can start a node, drive the
Java load generator through every scenario and write positive rates to its JSON.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker_proc import REPO

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
