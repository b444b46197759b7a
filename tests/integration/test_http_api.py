"""The management HTTP API (issue 15) against a real node over real sockets:
every endpoint family with `requests`, auth and tag rules, bad requests, the
definitions round trip of a file RabbitMQ 3.10 exported, and RabbitMQ's own
`rabbitmqadmin` (from Debian's package, tests/rabbitmqadmin.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import requests

from node.replication.machine.version import MACHINE_VERSION
from tests.broker_proc import NodeProcess, free_port, start_http_node, uniq, wait_for

DATA = Path(__file__).resolve().parent.parent / "data"
TOKEN = "test-token-0123456789"
GUEST = ("guest", "guest")
T = 15.0  # seconds per HTTP call


class Api:
    def __init__(self, port: int, auth: tuple[str, str] | None = GUEST) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.s = requests.Session()
        self.auth = auth

    def __call__(self, method: str, path: str, auth: Any = "default", **kw: Any) -> Any:
        kw.setdefault("timeout", T)
        return self.s.request(method, self.base + path,
                              auth=self.auth if auth == "default" else auth, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        r = self("GET", path, **kw)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("http-node") / "n1",
                        config=f'[admin]\ntoken = "{TOKEN}"\n')
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture()
def http(node: NodeProcess) -> Api:
    return Api(node.http_port)  # type: ignore[attr-defined]


def _user(http: Api, name: str, tags: str, vhost_perms: dict[str, tuple[str, str, str]]) -> None:
    assert http("PUT", f"/api/users/{name}", json={"password": "pw", "tags": tags}).status_code \
        in (201, 204)
    for vhost, (c, w, r) in vhost_perms.items():
        v = requests.utils.quote(vhost, safe="")
        assert http("PUT", f"/api/permissions/{v}/{name}",
                    json={"configure": c, "write": w, "read": r}).status_code in (201, 204)


# ------------------------------------------------------------------ reads


def test_overview_nodes_whoami_cluster(http: Api) -> None:
    ov = http.get("/api/overview")
    assert ov["node"] == "n1" and ov["management_version"].startswith("3.10")
    for key in ("object_totals", "queue_totals", "message_stats", "listeners", "exchange_types"):
        assert key in ov, key
    assert isinstance(ov["object_totals"]["queues"], int)
    nodes = http.get("/api/nodes")
    assert [n["name"] for n in nodes] == ["n1"] and nodes[0]["running"] is True
    assert http.get("/api/nodes/n1")["name"] == "n1"
    assert http("GET", "/api/nodes/zz").status_code == 404
    assert http.get("/api/whoami") == {"name": "guest", "tags": ["administrator"]}
    c = http.get("/api/mirrorq/cluster")
    assert c["leader"] == "n1" and c["in_sync"] == ["n1"] and c["term"] >= 1
    assert c["members"][0]["name"] == "n1" and c["members"][0]["leader"] is True
    assert isinstance(c["commit_index"], int) and isinstance(c["mirrored_index"], int)
    assert set(c["confirm_latency"]) >= {"p50_ms", "p99_ms"}
    # a single node runs its build's machine version as soon as it leads (upgrade.py)
    wait_for(lambda: http.get("/api/overview")["mirrorq"]["machine_version"] == MACHINE_VERSION,
             10, what="the overview's machine_version")
    assert http.get("/api/mirrorq/cluster")["runs_machine_version"] == MACHINE_VERSION


def test_queue_lifecycle_publish_get_purge_delete(http: Api, node: NodeProcess) -> None:
    q = uniq("hq")
    r = http("PUT", f"/api/queues/%2F/{q}",
             json={"durable": True, "auto_delete": False, "arguments": {"x-max-length": 100}})
    assert r.status_code == 201, r.text
    assert http("PUT", f"/api/queues/%2F/{q}",
                json={"durable": True, "arguments": {"x-max-length": 100}}).status_code == 204
    # the same validation and text as a client's queue.declare gets
    r = http("PUT", f"/api/queues/%2F/{q}", json={"durable": False})
    assert r.status_code == 400
    assert r.json() == {"error": "bad_request", "reason": f"inequivalent arg 'durable' for queue "
                        f"'{q}' in vhost '/': received 'false' but current is 'true'"}
    for i in range(3):
        r = http("POST", "/api/exchanges/%2F/amq.default/publish",
                 json={"properties": {"delivery_mode": 2, "headers": {"i": i}}, "routing_key": q,
                       "payload": f"m{i}", "payload_encoding": "string"})
        assert r.status_code == 200 and r.json() == {"routed": True}, r.text
    r = http("POST", "/api/exchanges/%2F/amq.default/publish",
             json={"properties": {}, "routing_key": uniq("nowhere"), "payload": "x",
                   "payload_encoding": "string"})
    assert r.json() == {"routed": False}
    row = http.get(f"/api/queues/%2F/{q}")
    assert (row["messages"], row["messages_ready"], row["messages_unacknowledged"]) == (3, 3, 0)
    assert row["durable"] is True and row["arguments"] == {"x-max-length": 100}
    assert row["node"] == "n1" and row["vhost"] == "/" and row["name"] == q
    assert row["message_stats"]["publish"] == 3
    assert "rate" in row["message_stats"]["publish_details"]
    # get with requeue: the messages stay, redelivered afterwards
    got = http("POST", f"/api/queues/%2F/{q}/get",
               json={"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"}).json()
    assert [m["payload"] for m in got] == ["m0", "m1"]
    assert got[0]["properties"]["headers"] == {"i": 0} and got[0]["payload_encoding"] == "string"
    assert http.get(f"/api/queues/%2F/{q}")["messages"] == 3
    got = http("POST", f"/api/queues/%2F/{q}/get",
               json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"}).json()
    assert got[0]["redelivered"] is True and got[0]["payload_encoding"] == "base64"
    assert http.get(f"/api/queues/%2F/{q}")["messages"] == 2
    assert any(row["name"] == q for row in http.get("/api/queues"))
    assert any(row["name"] == q for row in http.get("/api/queues/%2F"))
    assert http.get(f"/api/queues?name={q}&columns=name,messages") == [{"name": q, "messages": 2}]
    # columns apply to one object too (RabbitMQ's reply/3), dotted names nest
    assert http.get(f"/api/queues/%2F/{q}?columns=name,messages,message_stats.publish") \
        == {"name": q, "messages": 2, "message_stats": {"publish": 3}}
    assert set(http.get("/api/overview?columns=node,object_totals.queues")) == {"node",
                                                                                "object_totals"}
    assert http("DELETE", f"/api/queues/%2F/{q}/contents").status_code == 204
    assert http.get(f"/api/queues/%2F/{q}")["messages"] == 0
    assert http("DELETE", f"/api/queues/%2F/{q}").status_code == 204
    assert http("GET", f"/api/queues/%2F/{q}").status_code == 404


def test_message_rates_appear(http: Api, node: NodeProcess) -> None:
    """The rate sampler (every 5 s) sees a publish burst."""
    q = uniq("rate")
    http("PUT", f"/api/queues/%2F/{q}", json={"durable": False})
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        deadline = time.monotonic() + 20
        rate = 0.0
        while time.monotonic() < deadline and rate <= 0:
            for _ in range(50):
                ch.basic_publish("", q, b"x")
            conn.process_data_events(0.2)
            rate = http.get(f"/api/queues/%2F/{q}")["message_stats"]["publish_details"]["rate"]
        assert rate > 0
    finally:
        conn.close()
        http("DELETE", f"/api/queues/%2F/{q}")


def test_exchanges_bindings(http: Api) -> None:
    x, x2, q = uniq("hx"), uniq("hx2"), uniq("hbq")
    assert http("PUT", f"/api/exchanges/%2F/{x}", json={"type": "topic", "durable": True}
                ).status_code == 201
    assert http("PUT", f"/api/exchanges/%2F/{x2}", json={"type": "fanout"}).status_code == 201
    r = http("PUT", f"/api/exchanges/%2F/{x}", json={"type": "direct", "durable": True})
    assert r.status_code == 400 and "inequivalent arg 'type'" in r.json()["reason"]
    assert http("PUT", f"/api/exchanges/%2F/{uniq()}", json={"type": "nope"}).status_code in \
        (400, 503)
    http("PUT", f"/api/queues/%2F/{q}", json={"durable": True})
    r = http("POST", f"/api/bindings/%2F/e/{x}/q/{q}", json={"routing_key": "a.*"})
    assert r.status_code == 201 and r.headers["Location"].endswith("/a.%2A")
    assert http("POST", f"/api/bindings/%2F/e/{x}/e/{x2}", json={"routing_key": "#"}
                ).status_code == 201
    binds = http.get(f"/api/queues/%2F/{q}/bindings")
    assert {(b["source"], b["routing_key"]) for b in binds} == {("", q), (x, "a.*")}
    listed = http.get(f"/api/bindings/%2F/e/{x}/q/{q}")
    assert len(listed) == 1 and listed[0]["properties_key"] == "a.%2A"
    assert any(b["destination"] == x2 for b in http.get("/api/bindings/%2F"))
    assert http.get(f"/api/exchanges/%2F/{x}")["type"] == "topic"
    assert any(e["name"] == x for e in http.get("/api/exchanges"))
    r = http("POST", f"/api/exchanges/%2F/{x}/publish",
             json={"properties": {}, "routing_key": "a.b", "payload": "via-x",
                   "payload_encoding": "string"})
    assert r.json() == {"routed": True}
    assert http("DELETE", f"/api/bindings/%2F/e/{x}/q/{q}/a.%252A").status_code == 204
    assert http.get(f"/api/bindings/%2F/e/{x}/q/{q}") == []
    assert http("DELETE", f"/api/bindings/%2F/e/{x}/q/{q}/a.%252A").status_code == 404
    assert http("POST", f"/api/bindings/%2F/e/{x}/q/{uniq('none')}", json={}).status_code == 404
    assert http("DELETE", f"/api/exchanges/%2F/{x}").status_code == 204
    assert http("GET", f"/api/exchanges/%2F/{x}").status_code == 404
    http("DELETE", f"/api/exchanges/%2F/{x2}")
    http("DELETE", f"/api/queues/%2F/{q}")


def test_connections_channels_consumers_close(http: Api, node: NodeProcess) -> None:
    q = uniq("cq")
    conn = pika.BlockingConnection(pika.URLParameters(node.url + "?client_properties="
                                                      "{'connection_name':'it-conn'}"))
    try:
        ch = conn.channel()
        ch.queue_declare(q, auto_delete=True)
        ch.basic_qos(prefetch_count=7)
        ch.basic_consume(q, lambda *a: None, consumer_tag="tag-1")

        def mine() -> Any:
            rows = [c for c in http.get("/api/connections")
                    if c["client_properties"].get("connection_name") == "it-conn"]
            return rows[0] if rows else None
        c = wait_for(mine, timeout=10, what="the connection listed")
        assert c["user"] == "guest" and c["vhost"] == "/" and c["node"] == "n1"
        assert c["peer_host"] == "127.0.0.1" and isinstance(c["peer_port"], int)
        assert http.get(f"/api/connections/{requests.utils.quote(c['name'], safe='')}")["name"] \
            == c["name"]
        chans = [x for x in http.get("/api/channels")
                 if x["connection_details"]["name"] == c["name"]]
        assert chans and chans[0]["prefetch_count"] == 7 and chans[0]["consumer_count"] == 1
        cons = [x for x in http.get("/api/consumers") if x["queue"]["name"] == q]
        assert cons and cons[0]["consumer_tag"] == "tag-1" and cons[0]["ack_required"] is True
        assert cons[0]["channel_details"]["connection_name"] == c["name"]
        assert http.get(f"/api/queues/%2F/{q}")["consumer_details"][0]["consumer_tag"] == "tag-1"
        r = http("DELETE", f"/api/connections/{requests.utils.quote(c['name'], safe='')}",
                 headers={"X-Reason": "bye"})
        assert r.status_code == 204
        with pytest.raises(pika.exceptions.AMQPError):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(0.2)
        wait_for(lambda: mine() is None, timeout=10, what="the closed connection unlisted")
    finally:
        if conn.is_open:
            conn.close()
    assert http("DELETE", "/api/connections/n1.12345").status_code == 404


def test_vhosts_users_permissions(http: Api) -> None:
    v, u = uniq("vh"), uniq("user")
    assert http("PUT", f"/api/vhosts/{v}").status_code == 201
    assert http("PUT", f"/api/vhosts/{v}").status_code == 204
    assert http.get(f"/api/vhosts/{v}")["name"] == v
    assert any(x["name"] == v for x in http.get("/api/vhosts"))
    _user(http, u, "management", {v: (".*", ".*", ".*")})
    assert http.get(f"/api/users/{u}")["tags"] == ["management"]
    assert http.get(f"/api/permissions/{v}/{u}") == {"user": u, "vhost": v, "configure": ".*",
                                                     "write": ".*", "read": ".*"}
    assert any(p["user"] == u for p in http.get("/api/permissions"))
    assert http.get(f"/api/users/{u}/permissions")[0]["vhost"] == v
    r = http("PUT", f"/api/permissions/{v}/{u}", json={"configure": "(", "write": "", "read": ""})
    assert r.status_code == 400
    assert http("PUT", f"/api/permissions/nope/{u}", json={"configure": "", "write": "",
                                                          "read": ""}).status_code == 404
    # the user works over AMQP with its new password, and the API shows it its vhost only
    me = Api(http.base.rpartition(":")[2] and int(http.base.rpartition(":")[2]), (u, "pw"))
    assert me.get("/api/whoami") == {"name": u, "tags": ["management"]}
    assert [x["name"] for x in me.get("/api/vhosts")] == [v]
    assert me("GET", "/api/queues/%2F").status_code == 403
    assert me("GET", "/api/users").status_code == 403
    assert me("PUT", f"/api/vhosts/{uniq()}").status_code == 403
    # a management user writes in its vhost through its own AMQP permissions
    assert me("PUT", f"/api/queues/{v}/mine", json={"durable": True}).status_code == 201
    assert [q["name"] for q in me.get("/api/queues")] == ["mine"]
    assert http("DELETE", f"/api/permissions/{v}/{u}").status_code == 204
    assert http("DELETE", f"/api/users/{u}").status_code == 204
    assert http("GET", f"/api/users/{u}").status_code == 404
    assert http("DELETE", f"/api/vhosts/{v}").status_code == 204
    assert http("GET", f"/api/vhosts/{v}").status_code == 404


def test_auth_rules(http: Api, node: NodeProcess) -> None:
    r = http("GET", "/api/overview", auth=None)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'
    assert r.json()["error"] == "not_authorized"
    assert http("GET", "/api/overview", auth=("guest", "bad")).status_code == 401
    mon, plain = uniq("mon"), uniq("plain")
    _user(http, mon, "monitoring", {})
    _user(http, plain, "", {"/": (".*", ".*", ".*")})
    assert http("GET", "/api/queues", auth=(mon, "pw")).status_code == 200
    assert http("GET", "/api/nodes", auth=(mon, "pw")).status_code == 200
    assert http("GET", "/api/users", auth=(mon, "pw")).status_code == 403
    assert http("PUT", f"/api/users/{uniq()}", auth=(mon, "pw"),
                json={"password": "x"}).status_code == 403
    assert http("GET", "/api/overview", auth=(plain, "pw")).status_code == 403
    # the admin token is an administrator too
    r = http("GET", "/api/users", auth=None, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    assert http("GET", "/api/users", auth=None,
                headers={"Authorization": "Bearer wrong"}).status_code == 401
    http("DELETE", f"/api/users/{mon}")
    http("DELETE", f"/api/users/{plain}")


def test_bad_requests(http: Api) -> None:
    r = http("PUT", "/api/queues/%2F/x", data=b"{not json",
             headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "bad_request"
    r = http("PUT", "/api/queues/no-such-vhost/x", json={})
    assert r.status_code == 404 and r.json() == {"error": "not_found", "reason": "vhost_not_found"}
    r = http("PUT", f"/api/queues/%2F/{uniq()}", json={"arguments": {"x-max-length": "abc"}})
    assert r.status_code == 400 and "x-max-length" in r.json()["reason"]
    r = http("PUT", f"/api/queues/%2F/{uniq()}", json={"durable": "maybe"})
    assert r.status_code == 400
    r = http("PATCH", "/api/queues/%2F/x")
    assert r.status_code == 405 and "Allow" in r.headers
    assert http("GET", "/api/nothing-here").status_code == 404
    assert http("GET", "/api/queues/%2F/no-such-queue").status_code == 404
    assert http("GET", "/api/queues/no-such-vhost").status_code == 404
    r = http("POST", "/api/exchanges/%2F/amq.default/publish", json={"payload": "x"})
    assert r.status_code == 400
    r = http("POST", f"/api/queues/%2F/{uniq()}/get", json={"count": 1, "ackmode": "x"})
    assert r.status_code in (400, 404)
    # garbage on the socket: an error answer or a close, and the node still serves
    import socket
    with socket.create_connection(("127.0.0.1", int(http.base.rpartition(":")[2])), 5) as s:
        s.sendall(b"\x00\xff garbage\r\n\r\n")
        s.settimeout(5)
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert http.get("/api/overview")["node"] == "n1"


def test_health_checks_and_aliveness(http: Api) -> None:
    assert http.get("/api/health/checks/alarms") == {"status": "ok"}
    assert http.get("/api/health/checks/local-alarms") == {"status": "ok"}
    assert http.get("/api/health/checks/node-is-quorum-critical")["status"] == "ok"
    assert http.get("/api/aliveness-test/%2F") == {"status": "ok"}
    assert http("GET", "/api/aliveness-test/nope").status_code == 404


def test_keep_alive_serves_many_requests_on_one_socket(http: Api) -> None:
    for _ in range(20):
        assert http.get("/api/whoami")["name"] == "guest"


def test_definitions_from_rabbitmq_import_and_come_back_equal(http: Api) -> None:
    """tests/data/rabbitmq-3.10-definitions.json was exported by a real
    RabbitMQ 3.10.8 (management plugin): users with RabbitMQ's own password
    hashes, vhosts, permissions, quorum/priority/limited queues, topic, fanout,
    headers exchanges, exchange-to-exchange and headers bindings."""
    src = json.loads((DATA / "rabbitmq-3.10-definitions.json").read_text())
    r = http("POST", "/api/definitions", json=src)
    assert r.status_code == 204, r.text
    out = http.get("/api/definitions")

    def norm(items: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(i, sort_keys=True) for i in items)
    for v in out["vhosts"]:  # RabbitMQ 4.x exports `limits` and `metadata` on every
        if v.get("limits") == {}:  # vhost, 3.10 did not
            del v["limits"]
        v.pop("metadata", None)
    for section in ("users", "vhosts", "permissions"):
        assert set(norm(src[section])) <= set(norm(out[section])), section
    for section in ("queues", "exchanges", "bindings"):
        mine = [i for i in out[section]
                if (i["vhost"], i.get("name", i.get("source"))) in
                {(s["vhost"], s.get("name", s.get("source"))) for s in src[section]}]
        assert norm(mine) == norm(src[section]), section
    # RabbitMQ's password hashes carry over: alice logs in with her RabbitMQ password
    alice = Api(int(http.base.rpartition(":")[2]), ("alice", "alice-pw"))
    assert alice.get("/api/whoami")["tags"] == ["management"]


# ------------------------------------------------------------------ rabbitmqadmin

@pytest.fixture(scope="module")
def rabbitmqadmin() -> Path:
    from tests import rabbitmqadmin as fetcher
    try:
        return fetcher.find()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"rabbitmqadmin unavailable: {exc}")


def test_rabbitmqadmin(rabbitmqadmin: Path, node: NodeProcess, tmp_path: Path) -> None:
    def adm(*args: str) -> str:
        res = subprocess.run([sys.executable, str(rabbitmqadmin), "-H", "127.0.0.1", "-P",
                              str(node.http_port), "-u", "guest", "-p", "guest",  # type: ignore
                              *args], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        return res.stdout
    q = uniq("adm")
    assert "queue declared" in adm("declare", "queue", f"name={q}", "durable=true")
    assert q in adm("list", "queues", "name", "messages")
    assert "Message published" in adm("publish", "exchange=amq.default", f"routing_key={q}",
                                      "payload=hello-admin")
    listing = adm("-f", "tsv", "list", "queues", "name", "messages")
    assert f"{q}\t1" in listing, listing
    out = adm("get", f"queue={q}", "ackmode=ack_requeue_false")
    assert "hello-admin" in out
    exported = tmp_path / "defs.json"
    adm("export", str(exported))
    defs = json.loads(exported.read_text())
    assert any(x["name"] == q for x in defs["queues"])
    # import into the same node after deleting the queue: it comes back
    assert http_delete(node, f"/api/queues/%2F/{q}") == 204
    adm("import", str(exported))
    assert q in adm("list", "queues", "name")
    http_delete(node, f"/api/queues/%2F/{q}")


def http_delete(node: NodeProcess, path: str) -> int:
    return int(requests.delete(f"http://127.0.0.1:{node.http_port}{path}",  # type: ignore
                               auth=GUEST, timeout=T).status_code)


def test_https_with_http_tls_config(tmp_path: Path) -> None:
    """[http] tls_cert/tls_key: the API speaks HTTPS only."""
    from node.app.pki import make_ca, make_member
    tls = tmp_path / "tls"
    make_ca(tls)
    cert, key = make_member(tls, "http", ["127.0.0.1"])
    port = free_port()
    n = NodeProcess(tmp_path / "n1", extra_args=("--http-port", str(port)),
                    config=f'[http]\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    n.start()
    try:
        def https() -> Any:
            try:
                return requests.get(f"https://127.0.0.1:{port}/api/whoami", auth=GUEST,
                                    verify=str(tls / "ca.pem"), timeout=5)
            except requests.ConnectionError:
                return None
        r = wait_for(https, timeout=20, what="the HTTPS API")
        assert r.status_code == 200 and r.json()["name"] == "guest"
        with pytest.raises(requests.RequestException):
            requests.get(f"http://127.0.0.1:{port}/api/whoami", auth=GUEST, timeout=5)
    finally:
        n.stop()


def test_get_from_a_quorum_queue_counts_reject_requeue_not_ack_requeue(
        http: Api, node: NodeProcess) -> None:
    """RabbitMQ 4.3's rabbit_mgmt_wm_queue_get: ack_requeue_true returns by
    basic.nack (an acquisition), reject_requeue_true by basic.reject (a
    failed delivery of a quorum queue, S27), after every get."""
    wait_for(lambda: http.get("/api/overview")["mirrorq"]["machine_version"] == MACHINE_VERSION,
             10, what="the overview's machine_version")
    q = uniq("mgmt-qq")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
        for i in range(2):
            ch.basic_publish("", q, f"m{i}".encode())
        seen = []
        for mode in ("ack_requeue_true", "reject_requeue_true", "reject_requeue_true",
                     "ack_requeue_true"):
            got = http("POST", f"/api/queues/%2F/{q}/get",
                       json={"count": 2, "ackmode": mode, "encoding": "auto"}).json()
            assert [m["payload"] for m in got] == ["m0", "m1"]
            props = got[0]["properties"]  # [] without any, as RabbitMQ's
            h = (props.get("headers") if isinstance(props, dict) else None) or {}
            seen.append((h.get("x-delivery-count"), h.get("x-acquired-count")))
        assert seen == [(None, None), (None, 1), (1, 2), (2, 3)]
        ch.queue_delete(q)
    finally:
        conn.close()
