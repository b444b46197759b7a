"""Management HTTP API hardening (issue 26): a user's regex runs in linear
time (RE2) with a length cap. Real node processes."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from urllib.parse import quote

import pika
import pytest
import requests

from tests.broker_proc import NodeProcess, start_http_node

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own HTTP server")

GUEST = ("guest", "guest")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("http-sec") / "n1")
    try:
        yield n
    finally:
        n.stop()


def _url(node: NodeProcess, path: str) -> str:
    return f"http://127.0.0.1:{node.http_port}{path}"  # type: ignore[attr-defined]


def test_catastrophic_regex_answers_fast(node: NodeProcess) -> None:
    """^(a+)+$ over 'a'*28+'!' took 6.4 s with Python's re (and deposed the
    leader); with RE2 it is linear: well under a second, node still answers."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port))
    try:
        conn.channel().queue_declare("a" * 28 + "!")
    finally:
        conn.close()
    t0 = time.monotonic()
    r = requests.get(_url(node, "/api/queues?use_regex=true&name=" + quote("^(a+)+$")),
                     auth=GUEST, timeout=30)
    took = time.monotonic() - t0
    assert r.status_code == 200 and r.json() == []
    assert took < 1.0, f"regex filter took {took:.2f} s"
    assert requests.get(_url(node, "/api/overview"), auth=GUEST, timeout=5).status_code == 200
    r = requests.get(_url(node, "/api/queues?use_regex=true&name=" + quote("^a+!$")),
                     auth=GUEST, timeout=5)
    assert [q["name"] for q in r.json()] == ["a" * 28 + "!"]


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)", "x" * 1001, "("])
def test_bad_regex_is_400(node: NodeProcess, pattern: str) -> None:
    r = requests.get(_url(node, "/api/queues?use_regex=true&name=" + quote(pattern)),
                     auth=GUEST, timeout=10)
    assert r.status_code == 400
    assert r.json()["error"] == "bad_request" and "regex" in r.json()["reason"]
