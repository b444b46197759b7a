"""The clock fault of chaosmirrorq.clock (issue 16): step_clock moves one node's wall
clock (time.time() of that process, through the clock hook that
start_cluster(faketime=True) puts into every node) forward and back at run time;
reset_clocks (the rollback) undoes a step an interrupted action left behind.

The node's clock is read from outside through its management API: a connection's
`connected_at` is computed by that node as time.time() - (time.monotonic() -
opened), so it jumps by exactly the step while the monotonic clock does not.
Needs no root (127.0.0.1, no mounts)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
from chaosmirrorq import actions, clock

from harness.process import Cluster, ClusterNode, free_port

STEP = 600.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    why = clock.faketime_unavailable_reason("python")
    if why:
        pytest.skip(why)
    actions.stop_cluster()
    actions._STATE.clear()
    actions._STATE.update(base_dir=tmp_path, run_dir=tmp_path / "history", run_id="t-clock",
                          experiment="t-clock")
    (tmp_path / "history").mkdir()
    c = Cluster(tmp_path / "cluster", n=3, node_env=clock.faketime_env(tmp_path / "cluster", "python"))
    for n in c.nodes:
        n.http_port = free_port()  # type: ignore[attr-defined]
        n.extra_args += ["--http-port", str(n.http_port)]
    actions._STATE["cluster"] = c
    try:
        c.start(timeout=60)
        yield c
    finally:
        clock.reset_clocks()
        actions.stop_cluster()


def _skew(node: ClusterNode, conn_port: int) -> float:
    """The node's wall clock minus ours (s), from the connected_at of our connection."""
    deadline = time.monotonic() + 10  # the connection is listed once its registration applied
    while True:
        r = requests.get(f"http://{node.host}:{node.http_port}/api/connections",  # type: ignore[attr-defined]
                         auth=("guest", "guest"), timeout=10)
        assert r.status_code == 200, r.text
        rows = [x for x in r.json() if x.get("node") == node.node_id and x.get("peer_port") == conn_port
                and x.get("connected_at") is not None]
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rows, r.json()
    return rows[0]["connected_at"] / 1000.0 - _opened[conn_port]


_opened: dict[int, float] = {}


def _connect(node: ClusterNode) -> tuple[Any, int]:
    t0 = time.time()
    conn = pika.BlockingConnection(pika.ConnectionParameters(node.host, node.amqp_port))
    conn.channel().queue_declare("", exclusive=True)  # a connection is listed once it has state
    port = conn._impl._transport._sock.getsockname()[1]
    _opened[port] = (t0 + time.time()) / 2
    return conn, port


def test_step_clock_moves_one_nodes_wall_clock_and_back(cluster: Cluster) -> None:
    leader = cluster.leader()
    follower = next(n for n in cluster.nodes if n is not leader)
    conns = {n.node_id: _connect(n) for n in (leader, follower)}
    try:
        for n in (leader, follower):
            assert abs(_skew(n, conns[n.node_id][1])) < 2.0
        out: dict[str, Any] = {}

        def run() -> None:
            out["result"] = clock.step_clock(target=follower.node_id, step_seconds=STEP, seconds=3,
                                             back_and_forth=True)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(1.5)
        fwd = _skew(follower, conns[follower.node_id][1])
        assert abs(fwd - STEP) < 2.0, fwd
        assert abs(_skew(leader, conns[leader.node_id][1])) < 2.0  # the others are not stepped
        time.sleep(3.0)
        back = _skew(follower, conns[follower.node_id][1])
        assert abs(back + STEP) < 2.0, back
        t.join(120)
        assert out["result"]["healthy_after"] and out["result"]["alive"], out
        assert abs(_skew(follower, conns[follower.node_id][1])) < 2.0
        # the rollback: a step left on by an interrupted action is undone by reset_clocks
        path = clock.offset_file(cluster.base_dir, follower.node_id)
        path.write_text(f"{-STEP:g}\n")
        time.sleep(0.5)
        assert abs(_skew(follower, conns[follower.node_id][1]) + STEP) < 2.0
        assert follower.node_id in clock.reset_clocks()["reset"]
        time.sleep(0.5)
        assert abs(_skew(follower, conns[follower.node_id][1])) < 2.0
        cluster.wait_healthy(timeout=30)
    finally:
        for conn, _port in conns.values():
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - best effort
                pass


LIBFAKETIME_PROBE = r"""
import sys, time
t0 = (time.time(), time.monotonic(), time.clock_gettime(time.CLOCK_MONOTONIC_RAW))
open(sys.argv[1], "w").write("+100\n")
end = time.perf_counter() + 3
while time.perf_counter() < end and time.time() - t0[0] < 50:
    pass
now = (time.time(), time.monotonic(), time.clock_gettime(time.CLOCK_MONOTONIC_RAW))
print(" ".join(f"{b - a:.0f}" for a, b in zip(t0, now)))
"""


@pytest.mark.skipif(not clock.LIBFAKETIME.exists(), reason="libfaketime not installed")
def test_libfaketime_steps_every_clock_or_breaks_sleep(tmp_path: Path) -> None:
    """Why the clock-step experiment does not use libfaketime 0.9.10 (chaos/README.md):
    a runtime step through FAKETIME_TIMESTAMP_FILE moves the monotonic clocks too
    (MONOTONIC_RAW included: pysyncobj's clock), and with FAKETIME_DONT_FAKE_MONOTONIC=1
    Python's time.sleep fails with EINVAL."""
    ts = tmp_path / "ft"
    ts.write_text("+0\n")
    env = {"LD_PRELOAD": str(clock.LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(ts),
           "FAKETIME_CACHE_DURATION": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", LIBFAKETIME_PROBE, str(ts)], env=env, capture_output=True,
                       text=True, timeout=30)
    real, mono, raw = (float(x) for x in r.stdout.split())
    assert real >= 99 and mono >= 99 and raw >= 99, r.stdout
    r = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.01)"],
                       env=dict(env, FAKETIME_DONT_FAKE_MONOTONIC="1"), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0 and "Invalid argument" in r.stderr, (r.returncode, r.stderr)
