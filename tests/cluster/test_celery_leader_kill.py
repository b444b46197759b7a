"""Issue 14: Celery as users run it on a 3-node mirrorq cluster, with the Raft leader
SIGKILLed while 2,000 tasks are published and worked off; every task runs at least once.

The worker is a real `celery worker` process (solo pool, concurrency 1: on two shared cores
a second process only adds contention) with late acks, prefetch 1, publisher confirms and
its task queue declared `x-queue-type: quorum` (tests/cluster/celery_app.py). Worker and
producer get every node's URL as a failover list that starts with the leader, so the kill
takes both of their connections away and both must carry on through another node. Celery's
other defaults are left alone: among them the worker's remote-control queue
(`<hostname>.celery.pidbox`, exclusive since Celery 5.5), which the worker declares again
on the node it fails over to.
"""
from __future__ import annotations

import os
import random
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.process import REPO, Cluster, ClusterNode
from tests.cluster.celery_app import (
    BROKERS_ENV,
    RUNS_ENV,
    TASK_NAME,
    make_app,
    payload_crc,
)

TASKS = 2_000
KILL_AFTER_RUNS = 500  # the leader dies once this many tasks have run (a quarter)
PAYLOAD_MIN, PAYLOAD_MAX = 100, 8 * 1024  # bytes of random hex per task, log-uniform
# apply_async(retry=True): kombu reconnects (next URL of the failover list) and publishes
# again; ~40 s of attempts before the producer gives up
RETRY_POLICY = {"max_retries": 60, "interval_start": 0.1, "interval_step": 0.2,
                "interval_max": 1.0}
WORKER_READY_WITHIN = 60.0
ALL_RUN_WITHIN = 90.0  # after the kill (Celery's own reconnect costs ~20 s: see the end)


class Producer(threading.Thread):
    """Sends TASKS tasks with apply_async under confirm_publish, as an application
    would: one after another, kombu retrying on connection errors."""

    def __init__(self, broker_url: str, runs: Path) -> None:
        super().__init__(name="celery-producer", daemon=True)
        self.app = make_app(broker_url, str(runs))
        self.rng = random.Random()
        self.ids: list[str] = []
        self.error: str | None = None

    def payload(self) -> str:
        size = int(PAYLOAD_MIN * (PAYLOAD_MAX / PAYLOAD_MIN) ** self.rng.random())
        return secrets.token_hex(max(1, size // 2))

    def run(self) -> None:
        task = self.app.tasks[TASK_NAME]
        try:
            for number in range(TASKS):
                payload = self.payload()
                result = task.apply_async((number, payload, payload_crc(payload)),
                                          retry=True, retry_policy=RETRY_POLICY)
                self.ids.append(str(result.id))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = f"task {len(self.ids)}: {type(exc).__name__}: {exc}"
        finally:
            try:
                self.app.pool.force_close_all()
            except Exception:  # noqa: BLE001 - best effort
                pass


def read_runs(runs: Path) -> list[tuple[str, int, str]]:
    """(task id, number, ok|corrupt) per task run; a line still being written is skipped."""
    try:
        text = runs.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((parts[0], int(parts[1]), parts[2]))
    return out


def distinct_runs(runs: Path) -> int:
    return len({task_id for task_id, _n, _ok in read_runs(runs)})


@contextmanager
def celery_worker(broker_url: str, runs: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`celery -A tests.cluster.celery_app worker -P solo -c 1` in its own session; on the
    way out the process (and its group, should a pool have forked) gets SIGKILL by pid."""
    env = {**os.environ, BROKERS_ENV: broker_url, RUNS_ENV: str(runs),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "celery", "-A", "tests.cluster.celery_app", "worker",
            "-P", "solo", "-c", "1", "-l", "INFO", "-n", "w1@%h"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)


def worker_log(log_path: Path) -> str:
    return log_path.read_text(errors="replace")


def log_tail(log_path: Path, n: int = 40) -> str:
    """The last `n` lines of the worker's log without the per-task lines."""
    lines = [ln for ln in worker_log(log_path).splitlines() if f"{TASK_NAME}[" not in ln]
    return "\n".join(lines[-n:])


def log_errors(log_path: Path) -> list[str]:
    """The worker's CRITICAL and ERROR lines (e.g. 'Unrecoverable error: ...')."""
    return [ln for ln in worker_log(log_path).splitlines() if "CRITICAL/" in ln or "ERROR/" in ln]


def connected_ports(log_path: Path) -> list[int]:
    """The AMQP ports the worker's consumer connected to, in order ('Connected to amqp://...')."""
    return [int(p) for p in re.findall(r"Connected to amqp://[^@\s]*@[\d.]+:(\d+)/", worker_log(log_path))]


def test_celery_worker_runs_every_task_at_least_once_across_leader_sigkill(
        cluster: Cluster, tmp_path: Path) -> None:
    leader = cluster.leader()
    nodes = [leader, *[n for n in cluster.nodes if n is not leader]]
    broker_url = ";".join(n.url for n in nodes)
    runs = tmp_path / "runs.txt"
    log_path = tmp_path / "worker.log"
    t0 = time.monotonic()
    with celery_worker(broker_url, runs, log_path) as worker:

        def worker_alive() -> None:
            assert worker.poll() is None, \
                f"the celery worker exited with {worker.returncode}; its errors: " \
                f"{log_errors(log_path)}\n{log_tail(log_path)}"

        def ready() -> bool:
            worker_alive()
            return " ready." in worker_log(log_path)
        deadline = time.monotonic() + WORKER_READY_WITHIN
        while not ready():
            assert time.monotonic() < deadline, \
                f"worker not ready after {WORKER_READY_WITHIN}s:\n{log_tail(log_path)}"
            time.sleep(0.1)
        t_ready = time.monotonic()

        producer = Producer(broker_url, runs)
        producer.start()
        deadline = time.monotonic() + 60
        while distinct_runs(runs) < KILL_AFTER_RUNS:
            worker_alive()
            assert producer.error is None, producer.error
            assert time.monotonic() < deadline, \
                f"only {distinct_runs(runs)} tasks ran in 60 s:\n{log_tail(log_path)}"
            time.sleep(0.02)

        victim = cluster.leader()
        ran_at_kill, sent_at_kill = distinct_runs(runs), len(producer.ids)
        t_kill = time.monotonic()
        victim.kill9()
        survivors: list[ClusterNode] = [n for n in cluster.nodes if n is not victim]
        new_leader = cluster.leader(timeout=20, among=survivors)
        t_new_leader = time.monotonic()

        deadline = t_kill + ALL_RUN_WITHIN
        while producer.is_alive():
            worker_alive()
            assert time.monotonic() < deadline, \
                f"producer still sending after {ALL_RUN_WITHIN}s ({len(producer.ids)} sent)"
            producer.join(0.1)
        assert producer.error is None, f"the producer gave up: {producer.error}"
        t_sent = time.monotonic()
        sent = set(producer.ids)
        assert len(sent) == TASKS

        while not sent <= {task_id for task_id, _n, _ok in read_runs(runs)}:
            worker_alive()
            if time.monotonic() > deadline:
                missing = sent - {task_id for task_id, _n, _ok in read_runs(runs)}
                raise AssertionError(
                    f"{len(missing)} of {TASKS} tasks never ran within {ALL_RUN_WITHIN}s of "
                    f"the kill:\n{log_tail(log_path)}")
            time.sleep(0.1)
        t_done = time.monotonic()
        worker_alive()  # still serving after the failover: not restarted by anyone

    records = read_runs(runs)
    per_id = Counter(task_id for task_id, _n, _ok in records)
    corrupt = [r for r in records if r[2] != "ok"]
    ports = connected_ports(log_path)
    print(f"\ncelery leader kill: worker ready {t_ready - t0:.1f}s after start; killed "
          f"{victim.node_id} (leader) after {ran_at_kill} runs / {sent_at_kill} sent; new leader "
          f"{new_leader.node_id} {t_new_leader - t_kill:.2f}s after the kill; all {TASKS} sent "
          f"{t_sent - t_kill:.1f}s and all run {t_done - t_kill:.1f}s after the kill; "
          f"{len(records)} runs, {sum(c - 1 for c in per_id.values())} duplicates; worker "
          f"connected to ports {ports} (victim {victim.amqp_port})")
    assert not corrupt, f"payloads that arrived damaged: {corrupt[:5]}"
    assert set(per_id) == sent, f"runs of tasks never sent: {sorted(set(per_id) - sent)[:5]}"
    assert new_leader is not victim and new_leader.alive()
    if ports and ports[0] == victim.amqp_port:
        # the worker lost its broker with the leader: it must have failed over to a survivor
        assert any(p != victim.amqp_port for p in ports[1:]), \
            f"the worker never reconnected elsewhere: {ports}"
