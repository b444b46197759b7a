"""Celery's Flower reads queue lengths through RabbitMQ's management API:
its broker view (flower/views/broker.py, and /api/queues/length) builds
`flower.utils.broker.Broker(app.broker_uri_with_password, http_api=...)`
from the Celery app's connection and awaits `broker.queues(names)`, which
GETs /api/queues/{vhost} with basic auth and keeps the named queues. Here
that very code runs against a real mirrorq node's HTTP API, for the default
vhost (`amqp://...//`, which Flower asks as /api/queues//) and another one."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import requests

from tests.broker_proc import NodeProcess, start_http_node, uniq

pytest.importorskip("flower")
from celery import Celery  # noqa: E402
from flower.utils.broker import Broker, RabbitMQ  # noqa: E402

AUTH = ("guest", "guest")
T = 15.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("flower-node") / "n1")
    try:
        yield n
    finally:
        n.stop()


def _fill(node: NodeProcess, vhost: str, queue: str, n: int) -> None:
    params = pika.URLParameters(node.url)
    params.virtual_host = vhost
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", queue, f"task {i}".encode(),
                             pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()


def _flower_queues(broker_url: str, http_api: str, names: list[str]) -> list[dict[str, Any]]:
    """What Flower's broker view does: its Celery app's connection URI (with
    the password) and the --broker-api URL into Broker, then queues(names)."""
    capp = Celery("flower-test", broker=broker_url)
    with capp.connection() as conn:
        uri = conn.as_uri(include_password=True)
    broker = Broker(uri, http_api=http_api,
                    broker_options=capp.conf.broker_transport_options,
                    broker_use_ssl=capp.conf.broker_use_ssl)
    assert isinstance(broker, RabbitMQ)
    result = asyncio.run(broker.queues(names))
    assert isinstance(result, list)
    return result


def test_flower_broker_view_default_vhost(node: NodeProcess) -> None:
    q, other = uniq("celery"), uniq("celery-other")
    _fill(node, "/", q, 7)
    _fill(node, "/", other, 2)
    port = node.http_port  # type: ignore[attr-defined]
    queues = _flower_queues(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}//",
                            f"http://guest:guest@127.0.0.1:{port}/api/", [q, "absent"])
    assert [x["name"] for x in queues] == [q]
    assert queues[0]["messages"] == 7
    assert queues[0]["messages_ready"] == 7 and queues[0]["messages_unacknowledged"] == 0
    assert queues[0]["consumers"] == 0 and "idle_since" in queues[0]


def test_flower_broker_view_named_vhost(node: NodeProcess) -> None:
    vhost = uniq("flower-vh")
    port = node.http_port  # type: ignore[attr-defined]
    base = f"http://127.0.0.1:{port}"
    assert requests.put(f"{base}/api/vhosts/{vhost}", auth=AUTH, timeout=T).status_code \
        in (201, 204)
    assert requests.put(f"{base}/api/permissions/{vhost}/guest", auth=AUTH, timeout=T,
                        json={"configure": ".*", "write": ".*", "read": ".*"}).status_code \
        in (201, 204)
    q = uniq("celery")
    _fill(node, vhost, q, 4)
    # no --broker-api: Flower derives http://user:pass@host:15672/api/{vhost} and the
    # queues URL from it; give it the node's port the way --broker-api does
    queues = _flower_queues(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}/{vhost}",
                            f"http://guest:guest@127.0.0.1:{port}/api/", [q])
    assert [(x["name"], x["vhost"], x["messages"]) for x in queues] == [(q, vhost, 4)]


def test_flower_bad_credentials_give_no_queues(node: NodeProcess,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Flower logs the failed call and shows no queues (a 401, not a crash)."""
    port = node.http_port  # type: ignore[attr-defined]
    queues = _flower_queues(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}//",
                            f"http://guest:wrong@127.0.0.1:{port}/api/", ["x"])
    assert queues == []
    assert any("401" in r.getMessage() for r in caplog.records)
