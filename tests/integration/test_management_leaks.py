"""Issue 42 item 9 (leaks) and item 2's per-user limit, against real nodes.

- /api/mirrorq/cluster (member addresses, the leader, the commit index) needs
  the monitoring tag (or administrator), as RabbitMQ's /api/nodes: a
  `management` user gets 403, and /api/overview leaves the cluster view out
  for it (before: 200 with every member's Raft address).
- the metrics port names no queue or vhost by default: /metrics sums the
  queues per node, /metrics/per-object answers only when configured, and a
  configured bearer token is required on every path (401 without it).
- [http] max_requests_per_user: a user's request beyond it, while the others
  wait for the shared rows, is answered 429 (held a second).
"""
from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import requests

from tests.broker_proc import NodeProcess, start_http_node, wait_for

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="mirrorq's own management API and metrics")

GUEST = ("guest", "guest")
SECRET_QUEUE = "tenant-secret-orders"
SECRET_VHOST = "tenant-secret-vhost"
TOKEN = "metrics-token-8f2c1d"


def _base(node: NodeProcess) -> str:
    return f"http://127.0.0.1:{node.http_port}"  # type: ignore[attr-defined]


def _put(node: NodeProcess, path: str, body: object | None = None) -> None:
    r = requests.put(_base(node) + path, auth=GUEST, json=body, timeout=10)
    assert r.status_code in (201, 204), r.text


def _tenant_queue(node: NodeProcess) -> None:
    _put(node, f"/api/vhosts/{SECRET_VHOST}")
    _put(node, f"/api/permissions/{SECRET_VHOST}/guest",
         {"configure": ".*", "write": ".*", "read": ".*"})
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.amqp_port, virtual_host=SECRET_VHOST))
    try:
        ch = conn.channel()
        ch.queue_declare(SECRET_QUEUE)
        ch.basic_publish("", SECRET_QUEUE, b"x")
    finally:
        conn.close()


def _scrape(node: NodeProcess, path: str = "/metrics",
            token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{node.metrics_port}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node with the defaults."""
    n = start_http_node(tmp_path_factory.mktemp("leaks") / "n1")
    try:
        _tenant_queue(n)
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A metrics token and /metrics/per-object; one request in flight per user,
    builds of the rows at least 5 s apart (a request waits for the next one)."""
    d: Path = tmp_path_factory.mktemp("leaks-conf")
    n = start_http_node(d / "n1", config=(
        "[metrics]\n"
        f'token = "{TOKEN}"\n'
        "per_object_endpoint = true\n"
        "[http]\n"
        "max_requests_per_user = 1\n"
        "rows_min_interval = 5\n"))
    try:
        _tenant_queue(n)
        yield n
    finally:
        n.stop()


def test_cluster_view_needs_monitoring(plain: NodeProcess) -> None:
    _put(plain, "/api/users/mgmt", {"password": "mgmt-pw", "tags": "management"})
    _put(plain, "/api/users/mon", {"password": "mon-pw", "tags": "monitoring"})
    mgmt, mon = ("mgmt", "mgmt-pw"), ("mon", "mon-pw")

    def get(path: str, who: tuple[str, str]) -> requests.Response:
        return requests.get(_base(plain) + path, auth=who, timeout=10)

    r = get("/api/mirrorq/cluster", mgmt)
    assert r.status_code == 403, r.text  # before: 200 with the members' addresses
    assert r.json()["error"] == "not_authorised"
    assert get("/api/nodes", mgmt).status_code == 403
    assert get(f"/api/nodes/{plain.node_id}", mgmt).status_code == 403
    ov = get("/api/overview", mgmt)
    assert ov.status_code == 200 and "mirrorq" not in ov.json()
    assert "members" not in ov.text and str(plain.raft_port) not in ov.text  # type: ignore[attr-defined]
    for method in ("PUT", "DELETE"):
        r = requests.request(method, _base(plain) + "/api/mirrorq/members/nX", auth=mon,
                             json={"address": "127.0.0.1:1"}, timeout=10)
        assert r.status_code == 403, (method, r.text)
    # monitoring and administrators read it
    for who in (mon, GUEST):
        r = get("/api/mirrorq/cluster", who)
        assert r.status_code == 200 and r.json()["members"], r.text
        assert "mirrorq" in get("/api/overview", who).json()
    assert get("/api/nodes", mon).status_code == 200


def test_metrics_name_no_queue_or_vhost_by_default(plain: NodeProcess) -> None:
    def summed() -> str | None:
        code, text = _scrape(plain)
        assert code == 200
        return text if f'mirrorq_queue_messages_ready{{node="{plain.node_id}"}} 1' in text \
            else None
    text = wait_for(summed, 10, what="the aggregated ready count")
    # before: mirrorq_queue_messages_ready{node=..,vhost="tenant-secret-vhost",queue=...}
    assert SECRET_QUEUE not in text and SECRET_VHOST not in text
    assert "queue=" not in text and "vhost=" not in text
    assert _scrape(plain, "/metrics/per-object")[0] == 404


def test_metrics_token_and_per_object_endpoint(configured: NodeProcess) -> None:
    assert _scrape(configured)[0] == 401
    assert _scrape(configured, token="wrong")[0] == 401
    assert _scrape(configured, "/metrics/per-object")[0] == 401
    code, text = _scrape(configured, token=TOKEN)
    assert code == 200 and "mirrorq_term" in text and SECRET_QUEUE not in text
    code, text = _scrape(configured, "/metrics/per-object", token=TOKEN)
    assert code == 200
    assert (f'mirrorq_queue_messages_ready{{node="{configured.node_id}",'
            f'vhost="{SECRET_VHOST}",queue="{SECRET_QUEUE}"}} 1') in text


@pytest.mark.slow  # make test runs it, make test-fast does not
def test_a_users_requests_in_flight_are_capped(configured: NodeProcess) -> None:
    """With one request allowed in flight, a second one of the same user while
    the first waits for the next build of the rows (5 s after the last) is 429,
    its answer held a second (a looping client cannot spin on refusals)."""
    _put(configured, "/api/users/mon", {"password": "mon-pw", "tags": "monitoring"})
    # a write: the next read needs a new build, 5 s after the last one
    _put(configured, "/api/queues/%2F/capped-q", {"durable": True})
    got: list[tuple[int, str, float]] = []
    lock = threading.Lock()

    def read() -> None:
        t0 = time.monotonic()
        r = requests.get(_base(configured) + "/api/overview", auth=("mon", "mon-pw"),
                         timeout=30)
        with lock:
            got.append((r.status_code, r.headers.get("Retry-After", ""),
                        time.monotonic() - t0))
    threads = [threading.Thread(target=read, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    statuses = sorted((status, retry) for status, retry, _took in got)
    assert statuses == [(200, ""), (429, "1")], got
    refused = next(took for status, _retry, took in got if status == 429)
    assert refused >= 0.9, got  # held, not answered at once
