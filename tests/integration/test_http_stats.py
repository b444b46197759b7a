"""The management API's figures against a real node: the overview's message
rates (confirm included), the confirm latency of the last seconds (not bucket
edges since start), and /api/nodes' memory (the process's RSS, not message
bytes)."""
from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import requests

from tests.broker_proc import NodeProcess, start_http_node, uniq, wait_for

AUTH = ("guest", "guest")
T = 15.0


@pytest.fixture()
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    """A fresh node per test (the latency window and counters start empty)."""
    n = start_http_node(tmp_path / "n1")
    try:
        yield n
    finally:
        n.stop()


def get(n: NodeProcess, path: str) -> Any:
    r = requests.get(f"http://127.0.0.1:{n.http_port}{path}",  # type: ignore[attr-defined]
                     auth=AUTH, timeout=T)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


def _histogram(n: NodeProcess) -> tuple[list[float], list[int]]:
    """The node's since-start confirm-latency histogram from its Prometheus
    endpoint: finite bucket bounds and per-bucket counts (last: +Inf)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{n.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    bounds: list[float] = []
    cum: list[int] = []
    for line in text.splitlines():
        if line.startswith("mirrorq_confirm_latency_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            if le != "+Inf":
                bounds.append(float(le))
            cum.append(int(float(line.rsplit(" ", 1)[1])))
    counts = [c - (cum[i - 1] if i else 0) for i, c in enumerate(cum)]
    return bounds, counts


def _interpolated_p(bounds: list[float], counts: list[int], q: float) -> float:
    want, below = q * sum(counts), 0
    for i, c in enumerate(counts):
        if c and below + c >= want:
            lower = bounds[i - 1] if i else 0.0
            if i >= len(bounds):
                return lower * 1000
            return (lower + (bounds[i] - lower) * (want - below) / c) * 1000
        below += c
    raise AssertionError("empty histogram")


def test_overview_rates_include_confirms(node: NodeProcess) -> None:
    """publish, deliver_get, ack and confirm rates all move while a confirming
    publisher and an acking consumer run (the confirm rate used to be 0)."""
    q = uniq("rates")
    stop = threading.Event()
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(node.url))
            ch = conn.channel()
            ch.queue_declare(q)
            ch.confirm_delivery()
            ch.basic_qos(prefetch_count=50)
            ch.basic_consume(q, lambda c, m, _p, _b: c.basic_ack(m.delivery_tag))
            while not stop.is_set():
                ch.basic_publish("", q, b"x" * 100)  # waits for its confirm
                conn.process_data_events(0)
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=publisher, daemon=True)
    t.start()
    try:
        def rates() -> dict[str, float] | None:
            assert not errors, errors
            ms = get(node, "/api/overview")["message_stats"]
            r = {k: ms.get(f"{k}_details", {}).get("rate", 0.0)
                 for k in ("publish", "deliver_get", "ack", "confirm")}
            return r if all(v > 0 for v in r.values()) else None
        r = wait_for(rates, timeout=40, what="every overview rate above 0")
        # one publisher, its confirms on this node: about the publish rate
        assert r["confirm"] <= r["publish"] * 1.5 + 1
        assert r["confirm"] >= r["publish"] * 0.5 - 1
    finally:
        stop.set()
        t.join(timeout=T)
    assert not errors, errors


def test_confirm_latency_is_interpolated_over_the_window(node: NodeProcess) -> None:
    """p50/p99 come from the confirms of the last 30 s, interpolated within
    their bucket (this node is younger than the window: all of its confirms),
    not the upper edge of a since-start bucket; those stay under since_start."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        q = uniq("lat")
        ch.queue_declare(q)
        ch.confirm_delivery()
        for _ in range(200):
            ch.basic_publish("", q, b"y")
    finally:
        conn.close()
    lat = get(node, "/api/mirrorq/cluster")["confirm_latency"]
    bounds, counts = _histogram(node)
    assert sum(counts) == lat["count"] == lat["since_start"]["count"] == 200
    assert lat["window_seconds"] == 30.0
    for key, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
        assert lat[key] == pytest.approx(_interpolated_p(bounds, counts, q), abs=0.002), key
        edges = [b * 1000 for b in bounds]
        assert lat["since_start"][key] in edges  # the old figure: a bucket edge


def test_nodes_report_process_memory(node: NodeProcess) -> None:
    """mem_used is the node's resident memory (RabbitMQ's meaning), the bytes
    of queued messages are message_bytes."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        q = uniq("mem")
        ch.queue_declare(q)
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish("", q, b"z" * 1000)
        me = get(node, f"/api/nodes/{node.node_id}")
        assert node.proc is not None
        status = Path(f"/proc/{node.proc.pid}/status").read_text()
        rss = int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1]) * 1024
        assert me["message_bytes"] == 3000
        # the watermark is on by default (0.4 of RAM or the cgroup limit); nothing
        # is held by connections between messages
        assert me["mem_limit"] > 0 and me["connection_held_bytes"] == 0
        assert me["mem_used"] > 10 * 1024 * 1024  # a Python process, not 3000 bytes
        assert 0.5 * rss <= me["mem_used"] <= 2 * rss
        assert me["sockets_used"] >= 3  # AMQP, HTTP and Raft listeners at least
        assert me["fd_used"] >= me["sockets_used"] and me["proc_used"] >= 2
        assert isinstance(me["uptime"], int) and me["uptime"] > 0
        listed = {n["name"]: n for n in get(node, "/api/nodes")}
        assert listed[node.node_id]["mem_used"] > 10 * 1024 * 1024
    finally:
        conn.close()
