"""The RabbitMQ Java client (5.0.0, Debian's amqp-client.jar) against the broker.

Three small Java programs in tests/java/ exercise the semantics a real client
relies on; each prints one JSON line and exits non-zero on any violation.
Run against RabbitMQ with MIRRORQ_TARGET=amqp://guest:guest@127.0.0.1:5690/
to prove the programs encode RabbitMQ's behaviour.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.broker_proc import REPO

JAVA_SRC = REPO / "tests" / "java"
JARS = [Path("/usr/share/java/amqp-client.jar"), Path("/usr/share/java/slf4j-api.jar"),
        Path("/usr/share/java/slf4j-nop.jar")]
COMPILE_TIMEOUT = 120
pytestmark = [pytest.mark.rabbitmq_ok, pytest.mark.slow]  # slow: a JVM per test (not in make test-fast)


@pytest.fixture(scope="module")
def java_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        pytest.skip("javac/java not on PATH (install openjdk-17-jdk-headless)")
    missing = [str(j) for j in JARS if not j.exists()]
    if missing:
        pytest.skip(f"RabbitMQ Java client jars missing: {', '.join(missing)} "
                    "(install librabbitmq-client-java and libslf4j-java)")
    out = tmp_path_factory.mktemp("javaclasses")
    jars = os.pathsep.join(str(j) for j in JARS)
    sources = sorted(str(p) for p in JAVA_SRC.glob("*.java"))
    proc = subprocess.run([javac, "-nowarn", "-d", str(out), "-cp", jars, *sources],
                          capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
    assert proc.returncode == 0, f"javac failed:\n{proc.stdout}\n{proc.stderr}"
    return os.pathsep.join([str(out), jars])


def run_java(classpath: str, main: str, *args: str, timeout: float) -> dict[str, Any]:
    """Run one program; return its JSON result, failing with its output if it broke."""
    cmd = ["java", "-Xmx256m", "-cp", classpath, main, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{main} did not finish within {timeout}s; stdout={exc.stdout!r} stderr={exc.stderr!r}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"{main} printed no JSON (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert proc.returncode == 0 and result.get("ok"), (
        f"{main} reported violations (rc={proc.returncode}): "
        f"error={result.get('error')!r} violations={result.get('violations')!r}\nresult={result}\n"
        f"stderr={proc.stderr[-2000:]}")
    print(json.dumps(result))
    return result


def test_s14_s15_java_streaming_confirms_10000(broker, java_classpath: str) -> None:
    """S14/S15: 10,000 persistent 1 KiB publishes with streaming confirms, each
    seq acked or nacked exactly once; then all acked ones consumed exactly once."""
    r = run_java(java_classpath, "ConfirmsStreaming", broker.url, "10000", "1024", "60", timeout=100)
    assert r["acked"] + r["nacked"] == 10000
    assert r["never_confirmed"] == 0 and r["confirmed_more_than_once"] == 0
    assert r["acked_but_not_consumed"] == 0
    assert r["consumed"] >= r["acked"]
    assert r["msg_per_s"] > 0


def test_s24_java_tx_commit_each(broker, java_classpath: str) -> None:
    """S24: 2,000 persistent publishes, tx.commit after each; queue holds exactly
    2,000; tx.rollback discards uncommitted publishes."""
    r = run_java(java_classpath, "TxPerMessage", broker.url, "2000", "1024", timeout=120)
    assert r["queue_count"] == 2000
    assert r["count_after_rollback"] == 2000
    assert r["drained"] == 2000 and r["missing"] == 0
    assert r["msg_per_s"] > 0


def test_s04_s05_s07_java_nack_multiple_requeue(broker, java_classpath: str) -> None:
    """S04/S05/S07 (+S01/S09): ack multiple, then nack multiple requeue=true on
    the rest of the prefetch window; those come back with redelivered=true, first
    deliveries have redelivered=false; nothing lost or duplicated after settling."""
    r = run_java(java_classpath, "ManualAckNack", broker.url, "500", "50", "10", "40", timeout=70)
    assert r["deliveries"] == r["expected_deliveries"] == 540
    assert r["redelivered_true"] == 40
    assert r["lost"] == 0 and r["duplicated"] == 0
    assert r["max_unacked"] <= 50
