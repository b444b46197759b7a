"""`local-cluster up` names how a node that died during start-up ended: an empty
log alone said nothing when a CI run saw one go."""
from __future__ import annotations

import os
import signal
import subprocess

from node.app.local_cluster import exit_status


def _ended(proc: subprocess.Popen[bytes]) -> None:
    # wait for the end without reaping it (exit_status must do that)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


def test_exit_status_names_the_signal_or_the_code_once() -> None:
    killed = subprocess.Popen(["sleep", "30"])
    os.kill(killed.pid, signal.SIGKILL)
    _ended(killed)
    assert exit_status(killed.pid) == " (killed by SIGKILL)"
    failed = subprocess.Popen(["sh", "-c", "exit 3"])
    _ended(failed)
    assert exit_status(failed.pid) == " (exit 3)"
    assert exit_status(failed.pid) == ""  # reaped: no longer ours to tell


def test_exit_status_of_a_live_child_says_it_runs() -> None:
    live = subprocess.Popen(["sleep", "30"])
    try:
        assert exit_status(live.pid) == " (still running, but not as our node)"
    finally:
        live.kill()
        live.wait()
