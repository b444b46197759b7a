"""Four management API behaviours client test suites rely on (issue 28 item 4),
against a real node over HTTP: a vhost created through the API gives its
creator full permissions (RabbitMQ's rabbit_vhost:maybe_grant_full_permissions),
a connection is listed from connection.open on, GET /api/healthchecks/node[/{node}]
answers {"status": "ok"}, POST /api/users/bulk-delete deletes users."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pytest
import requests

from harness.amqp import RawClient
from tests.broker_proc import NodeProcess, start_http_node, uniq, wait_for
from tests.support.http_api import api


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("http-compat") / "n1")
    try:
        yield n
    finally:
        n.stop()


def test_creator_of_a_vhost_gets_full_permissions_and_declares_at_once(node: NodeProcess) -> None:
    v, admin = uniq("vh"), uniq("admin")
    assert api(node, "PUT", f"/api/users/{admin}",
               json={"password": "pw", "tags": "administrator"}).status_code == 201
    assert api(node, "PUT", f"/api/vhosts/{v}", auth=(admin, "pw")).status_code == 201
    r = api(node, "GET", f"/api/permissions/{v}/{admin}")
    assert r.status_code == 200 and r.json() == {"user": admin, "vhost": v, "configure": ".*",
                                                 "write": ".*", "read": ".*"}
    assert api(node, "GET", f"/api/permissions/{v}/guest").status_code == 404  # only the creator
    # the next declare is allowed (it was 403 ACCESS_REFUSED)
    params = pika.URLParameters(f"amqp://{admin}:pw@127.0.0.1:{node.amqp_port}/{v}")
    with pika.BlockingConnection(params) as conn:
        conn.channel().queue_declare("q1")
    # updating an existing vhost grants nothing new
    assert api(node, "DELETE", f"/api/permissions/{v}/{admin}").status_code == 204
    assert api(node, "PUT", f"/api/vhosts/{v}", auth=(admin, "pw")).status_code == 204
    assert api(node, "GET", f"/api/permissions/{v}/{admin}").status_code == 404


def test_connection_listed_from_connection_open_before_any_channel(node: NodeProcess) -> None:
    c = RawClient(node)
    try:
        c.handshake(product="no-channel-yet")

        def listed() -> Any:
            rows = [x for x in api(node, "GET", "/api/connections").json()
                    if x["client_properties"].get("product") == "no-channel-yet"]
            return rows[0] if rows else None
        row = wait_for(listed, timeout=10, what="the channel-less connection listed")
        assert row["user"] == "guest" and row["vhost"] == "/" and row["channels"] == 0
        name = requests.utils.quote(row["name"], safe="")
        assert api(node, "GET", f"/api/connections/{name}").json()["name"] == row["name"]
        assert any(x["name"] == row["name"]
                   for x in api(node, "GET", "/api/vhosts/%2F/connections").json())
        c.open_channel(1)  # and once the log knows it, it is listed once
        rows = [x for x in api(node, "GET", "/api/connections").json() if x["name"] == row["name"]]
        assert len(rows) == 1
        assert api(node, "DELETE", f"/api/connections/{name}").status_code == 204
    finally:
        c.close()


def test_healthchecks_node(node: NodeProcess) -> None:
    assert api(node, "GET", "/api/healthchecks/node").json() == {"status": "ok"}
    assert api(node, "GET", "/api/healthchecks/node/n1").json() == {"status": "ok"}
    assert api(node, "GET", "/api/healthchecks/node/nobody").status_code == 404
    assert api(node, "GET", "/api/healthchecks/node", auth=None).status_code == 401


def test_users_bulk_delete(node: NodeProcess) -> None:
    a, b, keep = uniq("bulk"), uniq("bulk"), uniq("keep")
    for u in (a, b, keep):
        assert api(node, "PUT", f"/api/users/{u}", json={"password": "pw", "tags": ""}).status_code == 201
    r = api(node, "POST", "/api/users/bulk-delete", json={"users": [a, b, "no-such-user"]})
    assert r.status_code == 204
    names = {u["name"] for u in api(node, "GET", "/api/users").json()}
    assert a not in names and b not in names and keep in names
    assert api(node, "POST", "/api/users/bulk-delete", json={"nope": 1}).status_code == 400
    assert api(node, "POST", "/api/users/bulk-delete", auth=(keep, "pw"),
               json={"users": [keep]}).status_code in (401, 403)
