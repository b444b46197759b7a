"""Issue 42 item 4 against a real node: the monitoring tag makes every vhost
visible, never writable. A `monitoring`+`policymaker`+`management` user with
permissions on its own vhost only could write policies in any vhost (a
`max-length: 0` policy emptied another tenant's queue) and read them all.
RabbitMQ requires permissions on the vhost for policy routes
(rabbit_mgmt_util is_authorized_policies) and for every vhost-scoped write
(is_authorized_vhost); docs/security.md's route table names these tests."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.broker_proc import NodeProcess, start_http_node

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="mirrorq's own node")
T = 30.0
VICTIM = "tenant-victim"
HOME = "tenant-spy"
SPY = ("spy", "spy-password")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("vhost-access") / "n1")
    try:
        admin = _session(n, ("guest", "guest"))
        for v in (VICTIM, HOME):
            _ok(admin.put(_url(n, f"/api/vhosts/{v}"), timeout=T))
            _ok(admin.put(_url(n, f"/api/permissions/{v}/guest"), timeout=T,
                          json={"configure": ".*", "write": ".*", "read": ".*"}))
        _ok(admin.put(_url(n, f"/api/users/{SPY[0]}"), timeout=T, json={
            "password": SPY[1], "tags": "monitoring,policymaker,management"}))
        for user, tags in ((SPY[0], "monitoring,policymaker,management"), ("plain", "management"),
                           ("notag", "")):
            if user != SPY[0]:
                _ok(admin.put(_url(n, f"/api/users/{user}"), timeout=T,
                              json={"password": user, "tags": tags}))
            _ok(admin.put(_url(n, f"/api/permissions/{HOME}/{user}"), timeout=T,
                          json={"configure": ".*", "write": ".*", "read": ".*"}))
        _ok(admin.put(_url(n, f"/api/queues/{VICTIM}/orders"), json={"durable": True}, timeout=T))
        _ok(admin.post(_url(n, f"/api/bindings/{VICTIM}/e/amq.direct/q/orders"),
                       json={"routing_key": "k"}, timeout=T))
        for i in range(5):
            _ok(admin.post(_url(n, f"/api/exchanges/{VICTIM}/amq.default/publish"), timeout=T,
                           json={"routing_key": "orders", "payload": f"m{i}",
                                 "payload_encoding": "string", "properties": {}}))
        yield n
    finally:
        n.stop()


def _url(n: NodeProcess, path: str) -> str:
    return f"http://127.0.0.1:{n.http_port}{path}"  # type: ignore[attr-defined]


def _session(n: NodeProcess, auth: tuple[str, str]) -> requests.Session:
    s = requests.Session()
    s.auth = auth
    return s


def _ok(r: requests.Response) -> requests.Response:
    assert r.status_code in (200, 201, 204), (r.request.method, r.url, r.status_code, r.text)
    return r


def _messages(n: NodeProcess) -> int:
    admin = _session(n, ("guest", "guest"))

    def settled() -> int:
        return int(_ok(admin.get(_url(n, f"/api/queues/{VICTIM}/orders"), timeout=T))
                   .json()["messages_ready"])
    return settled()


@pytest.mark.parametrize("definition", [{"max-length": 0}, {"expires": 1},
                                        {"message-ttl": 0}, {"consumer-timeout": 1}])
def test_a_monitoring_policymaker_cannot_set_policies_in_another_vhost(
        node: NodeProcess, definition: dict[str, Any]) -> None:
    """The issue's attack: before, 201 and the victim's queue emptied."""
    spy = _session(node, SPY)
    r = spy.put(_url(node, f"/api/policies/{VICTIM}/drain"), timeout=T,
                json={"pattern": ".*", "definition": definition, "apply-to": "queues"})
    assert r.status_code == 403, (r.status_code, r.text)
    assert _messages(node) == 5
    # in its own vhost the same user may
    r = spy.put(_url(node, f"/api/policies/{HOME}/drain"), timeout=T,
                json={"pattern": "^nothing$", "definition": definition, "apply-to": "queues"})
    assert r.status_code in (201, 204), r.text


def test_a_monitoring_policymaker_reads_only_the_policies_of_its_vhosts(node: NodeProcess) -> None:
    admin = _session(node, ("guest", "guest"))
    _ok(admin.put(_url(node, f"/api/policies/{VICTIM}/victims-own"), timeout=T,
                  json={"pattern": "^nothing$", "definition": {"max-length": 10}}))
    _ok(admin.put(_url(node, f"/api/policies/{HOME}/spys-own"), timeout=T,
                  json={"pattern": "^nothing$", "definition": {"max-length": 10}}))
    spy = _session(node, SPY)
    listed = _ok(spy.get(_url(node, "/api/policies"), timeout=T)).json()
    assert {p["vhost"] for p in listed} == {HOME}, listed
    for path in (f"/api/policies/{VICTIM}", f"/api/policies/{VICTIM}/victims-own",
                 f"/api/parameters/federation-upstream/{VICTIM}"):
        assert spy.get(_url(node, path), timeout=T).status_code == 403, path
    assert "spys-own" in {p["name"] for p in _ok(spy.get(_url(node, f"/api/policies/{HOME}"),
                                                          timeout=T)).json()}
    # monitoring still sees every vhost's queues (RabbitMQ's is_authorized_vhost_visible)
    assert _ok(spy.get(_url(node, f"/api/queues/{VICTIM}/orders"), timeout=T)).json()["name"] \
        == "orders"


POLICY = {"pattern": ".*", "definition": {"max-length": 0}, "apply-to": "queues"}
MESSAGE = {"routing_key": "orders", "payload": "x", "payload_encoding": "string",
           "properties": {}}
# every route that writes in a vhost (docs/security.md's table), as the spy
WRITES: list[tuple[str, str, Any]] = [
    ("PUT", "/api/policies/{v}/p", POLICY),
    ("DELETE", "/api/policies/{v}/victims-policy", None),
    ("PUT", "/api/operator-policies/{v}/p", POLICY),
    ("DELETE", "/api/operator-policies/{v}/victims-op-policy", None),
    ("PUT", "/api/vhost-limits/{v}/max-queues", {"value": 0}),
    ("DELETE", "/api/vhost-limits/{v}/max-connections", None),
    ("PUT", "/api/queues/{v}/intruder", {"durable": True}),
    ("DELETE", "/api/queues/{v}/orders", None),
    ("DELETE", "/api/queues/{v}/orders/contents", None),
    ("POST", "/api/queues/{v}/orders/get", {"count": 5, "ackmode": "ack_requeue_false",
                                             "encoding": "auto"}),
    ("PUT", "/api/exchanges/{v}/intruder", {"type": "direct"}),
    ("DELETE", "/api/exchanges/{v}/victims-exchange", None),
    ("POST", "/api/exchanges/{v}/amq.default/publish", MESSAGE),
    ("POST", "/api/bindings/{v}/e/amq.direct/q/orders", {"routing_key": "x"}),
    ("DELETE", "/api/bindings/{v}/e/amq.direct/q/orders/k", None),
    ("POST", "/api/bindings/{v}/e/amq.direct/e/amq.topic", {"routing_key": "x"}),
    ("PUT", "/api/permissions/{v}/spy", {"configure": ".*", "write": ".*", "read": ".*"}),
    ("DELETE", "/api/permissions/{v}/guest", None),
    ("PUT", "/api/topic-permissions/{v}/spy", {"exchange": "amq.topic", "write": ".*",
                                                "read": ".*"}),
    ("DELETE", "/api/topic-permissions/{v}/guest", None),
    ("POST", "/api/definitions/{v}", {"queues": [{"name": "intruder", "durable": True}]}),
    ("PUT", "/api/vhosts/{v}", {}),
    ("DELETE", "/api/vhosts/{v}", None),
    ("POST", "/api/vhosts/{v}/deletion/protection", None),
    ("DELETE", "/api/vhosts/{v}/deletion/protection", None),
    ("GET", "/api/aliveness-test/{v}", None),  # declares, publishes and gets there
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES,
                         ids=[f"{m} {p}" for m, p, _ in WRITES])
def test_every_vhost_scoped_write_needs_permissions_on_the_vhost(
        node: NodeProcess, method: str, path: str, body: Any) -> None:
    admin = _session(node, ("guest", "guest"))
    _ok(admin.put(_url(node, f"/api/policies/{VICTIM}/victims-policy"), timeout=T,
                  json={"pattern": "^nothing$", "definition": {"max-length": 10}}))
    _ok(admin.put(_url(node, f"/api/operator-policies/{VICTIM}/victims-op-policy"), timeout=T,
                  json={"pattern": "^nothing$", "definition": {"max-length": 10}}))
    _ok(admin.put(_url(node, f"/api/exchanges/{VICTIM}/victims-exchange"), timeout=T,
                  json={"type": "direct"}))
    spy = _session(node, SPY)
    r = spy.request(method, _url(node, path.format(v=VICTIM)), json=body, timeout=T)
    assert r.status_code == 403, (r.status_code, r.text)
    assert _messages(node) == 5
    names = {q["name"] for q in _ok(admin.get(_url(node, f"/api/queues/{VICTIM}"), timeout=T)).json()}
    assert names == {"orders"}


def test_permission_patterns_run_on_re2(node: NodeProcess) -> None:
    """Issue 42 item 10: a pathological configure pattern costs linear time
    (before, Python's backtracking re took seconds of the node's event loop
    over one 26-character name), and a pattern RE2 refuses is a 400."""
    import time

    import pika

    admin = _session(node, ("guest", "guest"))
    _ok(admin.put(_url(node, "/api/users/slowpoke"), json={"password": "slow", "tags": ""},
                  timeout=T))
    for bad in ("(a)\\1", "(?=a)b", "x" * 1001):
        r = admin.put(_url(node, f"/api/permissions/{HOME}/slowpoke"), timeout=T,
                      json={"configure": bad, "write": ".*", "read": ".*"})
        assert r.status_code == 400 and "configure pattern" in r.json()["reason"], r.text
    _ok(admin.put(_url(node, f"/api/permissions/{HOME}/slowpoke"), timeout=T,
                  json={"configure": "^(a+)+$", "write": ".*", "read": ".*"}))
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.amqp_port, HOME, pika.PlainCredentials("slowpoke", "slow"),
        heartbeat=0, connection_attempts=1, socket_timeout=60, blocked_connection_timeout=120))
    try:
        ch = conn.channel()
        t0 = time.monotonic()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("a" * 26 + "!")
        took = time.monotonic() - t0
        assert refused.value.reply_code == 403
        ch = conn.channel()
        ch.queue_declare("a" * 26)  # the pattern still permits what it matches
        ch.queue_delete("a" * 26)
    finally:
        conn.close()
    print(f"\nrefused declare of a 27-character name under ^(a+)+$: {took * 1000:.1f} ms")
    assert took < 1.0, took


def _route_table() -> list[tuple[str, str, str]]:
    """(method, route, tag) of docs/security.md's route table."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    part = text.split("## Management API routes", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows.append((cells[0].strip("`"), cells[1].strip("`"), cells[2]))
    return rows


def test_the_route_table_lists_exactly_the_routers_routes() -> None:
    from node.http.routes import ROUTES
    assert sorted((m, p) for m, p, _t in _route_table()) == sorted((m, p) for m, p, _h in ROUTES)


_FILL = {"vhost": HOME, "name": "x", "user": "guest", "node": "n1", "component": "federation-upstream",
         "props": "~", "source": "amq.direct", "dest": "x", "port": "5672", "protocols": "amqp",
         "pattern": "x", "within": "1", "unit": "days", "username": "guest", "password": "x",
         "exchange": "amq.topic"}
# who each tag excludes (besides a user with no management tag, excluded everywhere)
_EXCLUDED = {"administrator": (SPY, ("plain", "plain")),
             "administrator, or the user itself": (SPY,),
             "monitoring": (("plain", "plain"),), "policymaker": (("plain", "plain"),), "any": ()}


@pytest.mark.parametrize(("method", "route", "tag"), _route_table(),
                         ids=[f"{m} {r}" for m, r, _t in _route_table()])
def test_every_route_refuses_who_its_tag_excludes(node: NodeProcess, method: str, route: str,
                                                  tag: str) -> None:
    """docs/security.md's table, row by row: a user without a management tag
    gets 403 on every route, and so do the users the row's tag excludes (in
    the vhost they have permissions on: the tag alone refuses them)."""
    import re
    path = re.sub(r"\{(\w+)\}", lambda m: _FILL[m.group(1)], route)
    body = None if method in ("GET", "DELETE") else {}
    for auth in (("notag", "notag"), *_EXCLUDED[tag]):
        r = _session(node, auth).request(method, _url(node, path), json=body, timeout=T)
        assert r.status_code == 403, (auth[0], r.status_code, r.text)
