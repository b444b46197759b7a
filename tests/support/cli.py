"""Running the `mirrorq` CLI as a subprocess, and checking its usage errors (exit 2, one line)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.broker_proc import REPO, free_port


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.app", *args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def assert_usage_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {proc.stderr!r}"
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("mirrorq: error:") and needle in lines[0], lines[0]


def serve_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["serve", "--node-id", "c1", "--amqp-port", str(free_port()), "--raft-port",
            str(free_port()), "--data-dir", str(tmp_path / "d"), *extra]
