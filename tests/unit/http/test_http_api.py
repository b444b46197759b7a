"""The management HTTP API's pure parts: router, auth rules, JSON builders,
the management rows folded from a real BrokerState, rates (issue 15)."""
from __future__ import annotations

import asyncio
import base64
from dataclasses import replace
from typing import Any

import pytest

from node.broker.password import hash_password
from node.http.app import ManagementApi
from node.http.auth import authenticate, parse_tags, require_vhost, visible_vhosts
from node.http.format import (
    all_bindings,
    binding_json,
    definitions,
    message_json,
    properties_key,
    queue_json,
)
from node.http.server import HttpError, Request, Response, Router
from node.http.stats import (
    LatencyWindow,
    RateSampler,
    cluster_json,
    interpolated_percentile,
    latency_percentile,
    quorum_critical,
)
from node.replication.read_model import management_rows
from tests.support.machine import (
    Harness,
    ack,
    chan,
    consume,
    pub,
    qbind,
    qdecl,
    xdecl,
)
from tests.support.snapshot import snapshot_copy
from tests.support.status import node_status

# ------------------------------------------------------------------ router


async def _ok(_req: Request, params: dict[str, str]) -> Response:
    return Response(200, repr(sorted(params.items())).encode())


def test_router_decodes_percent_2f_inside_a_segment() -> None:
    r = Router()
    r.add("GET", "/api/queues/{vhost}/{name}", _ok)
    handler, params = r.resolve("GET", "/api/queues/%2F/my%20q")
    assert params == {"vhost": "/", "name": "my q"}
    _, params = r.resolve("GET", "/api/queues/a%2Fb/x%2Fy")
    assert params == {"vhost": "a/b", "name": "x/y"}


def test_router_404_and_405_with_allow() -> None:
    r = Router()
    r.add("GET", "/api/queues/{vhost}", _ok)
    r.add("PUT", "/api/queues/{vhost}/{name}", _ok)
    with pytest.raises(HttpError) as e:
        r.resolve("GET", "/api/nothing")
    assert e.value.status == 404
    with pytest.raises(HttpError) as e:
        r.resolve("PATCH", "/api/queues/%2F/q")
    assert e.value.status == 405 and e.value.headers["Allow"] == "PUT"
    handler, _ = r.resolve("HEAD", "/api/queues/%2F")  # HEAD falls back to GET
    assert handler is _ok


def test_request_json_errors_are_400() -> None:
    req = Request("PUT", "/", "/", {}, {}, b"{bad")
    with pytest.raises(HttpError) as e:
        req.json()
    assert e.value.status == 400 and e.value.error == "bad_request"
    assert Request("PUT", "/", "/", {}, {}, b"").json() == {}


# ------------------------------------------------------------------ auth

USERS = {
    "admin": (hash_password("a"), ("administrator",)),
    "mon": (hash_password("m"), ("monitoring",)),
    "alice": (hash_password("x"), ("management",)),
    "plain": (hash_password("p"), ()),
    "guest": (hash_password("guest"), ("administrator",)),
}
PERMS = {("alice", "staging"): (".*", ".*", ".*")}
VHOSTS = {"/": None, "staging": None}


def basic(user: str, pw: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()


def auth(header: str | None, peer: str = "127.0.0.1", token: str | None = None) -> Any:
    return authenticate(header, peer, USERS, {}, ["guest"], token)


def test_auth_401_carries_rabbitmqs_realm() -> None:
    for header in (None, basic("admin", "wrong"), basic("nobody", "a"), "Basic !!!",
                   "Bearer nope", "Digest x"):
        with pytest.raises(HttpError) as e:
            auth(header)
        assert e.value.status == 401, header
        assert e.value.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_auth_tags() -> None:
    assert auth(basic("admin", "a")).administrator
    mon = auth(basic("mon", "m"))
    assert mon.monitor and not mon.administrator
    alice = auth(basic("alice", "x"))
    assert not alice.monitor
    with pytest.raises(HttpError) as e:
        auth(basic("plain", "p"))  # no management tag at all
    assert e.value.status == 403
    assert visible_vhosts(alice, VHOSTS, PERMS) == ["staging"]
    assert visible_vhosts(mon, VHOSTS, PERMS) == ["/", "staging"]
    with pytest.raises(HttpError) as e:
        require_vhost(alice, "/", VHOSTS, PERMS)
    assert e.value.status == 403
    with pytest.raises(HttpError) as e:
        require_vhost(alice, "nope", VHOSTS, PERMS)
    assert e.value.status == 404


def test_auth_loopback_users_and_token() -> None:
    assert auth(basic("guest", "guest"), "::1").name == "guest"
    with pytest.raises(HttpError) as e:
        auth(basic("guest", "guest"), "10.0.0.5")
    assert e.value.status == 401 and "localhost" in e.value.reason
    p = auth("Bearer s3cret", "10.0.0.5", token="s3cret")
    assert p.administrator and p.token
    with pytest.raises(HttpError):
        auth("Bearer s3cret", token=None)  # no token configured: bearer never works


def test_parse_tags_string_or_list() -> None:
    assert parse_tags("administrator, monitoring") == ("administrator", "monitoring")
    assert parse_tags(["management"]) == ("management",)
    assert parse_tags("") == ()
    with pytest.raises(HttpError):
        parse_tags(5)


# ------------------------------------------------------------------ rows and builders

def _state() -> Harness:
    h = Harness()
    c = h.open(chan(1))
    h.run(qdecl(c, "orders", durable=True, arguments={"x-queue-type": "quorum"}),
          xdecl(c, "ev", "topic", durable=True), qbind(c, "orders", "ev", "order.*"))
    h.run(pub(c, "orders", b"abc"), pub(c, "orders", b"defg"))
    c2 = h.open(chan(2))
    h.run(consume(c2, "orders", tag="ct", credit=1))
    h.run(ack(c2, 1))  # the first delivery acked; the second waits for credit
    return h


def test_management_rows_from_state() -> None:
    h = _state()
    m = management_rows(h.state)
    q = next(q for q in m.queues if q.name == "orders")
    assert (q.vhost, q.durable, q.node, q.ready, q.unacked, q.consumers) == \
        ("/", True, "n1", 1, 0, 1)
    assert q.stats == (2, 1, 0, 1)  # published, delivered, redelivered, acked
    assert q.ready_bytes == 4
    assert q.arguments["x-queue-type"] == "quorum"
    b = next(b for b in m.bindings if b.source == "ev")
    assert (b.destination, b.destination_type, b.routing_key) == ("orders", "queue", "order.*")
    assert {c.tag for c in m.consumers} == {"ct"}
    assert len(m.channels) == 2 and len(m.connections) == 1
    assert m.connections[0].channels == 2


def test_queue_counters_survive_a_snapshot() -> None:
    h = _state()
    state = snapshot_copy(h.state)
    assert management_rows(state).queues[0].stats == (2, 1, 0, 1)


def test_queue_json_shape() -> None:
    m = management_rows(_state().state)
    q = next(q for q in m.queues if q.name == "orders")
    j = queue_json(q, (1.0, 2.0, 0.0, 0.5))
    for key, kind in (("messages", int), ("messages_ready", int), ("messages_unacknowledged", int),
                      ("consumers", int), ("durable", bool), ("arguments", dict), ("node", str),
                      ("vhost", str), ("name", str), ("type", str)):
        assert isinstance(j[key], kind), key
    assert j["type"] == "quorum"
    assert j["message_stats"]["publish"] == 2
    assert j["message_stats"]["publish_details"] == {"rate": 1.0}
    assert j["message_stats"]["deliver_get_details"] == {"rate": 2.0}
    assert j["messages_details"] == {"rate": 0.0}


def test_bindings_include_the_default_exchange_and_properties_keys() -> None:
    m = management_rows(_state().state)
    rows = [binding_json(b) for b in all_bindings(m)]
    default = next(b for b in rows if b["source"] == "")
    assert default["routing_key"] == "orders" and default["properties_key"] == "orders"
    assert properties_key("", {}) == "~"
    with_args = properties_key("k", {"x-match": "any"})
    assert with_args.startswith("k~") and with_args != properties_key("k", {"x-match": "all"})


def test_definitions_export_shape() -> None:
    m = management_rows(_state().state)
    d = definitions({"u": ("h", ("administrator",))}, ["/"], {("u", "/"): (".*", ".*", ".*")},
                        m, "0.1.0")
    assert d["users"] == [{"name": "u", "password_hash": "h",
                           "hashing_algorithm": "rabbit_password_hashing_sha256",
                           "tags": ["administrator"], "limits": {}}]
    assert [x["name"] for x in d["exchanges"]] == ["ev"]  # no amq.* nor the default exchange
    assert d["queues"] == [{"name": "orders", "vhost": "/", "durable": True, "auto_delete": False,
                            "arguments": {"x-queue-type": "quorum"}}]
    assert d["bindings"] == [{"source": "ev", "vhost": "/", "destination": "orders",
                              "destination_type": "queue", "routing_key": "order.*",
                              "arguments": {}}]


def test_quorum_critical() -> None:
    st = node_status(node_id="n1", members=["n1", "n2", "n3"], in_sync=["n1", "n2", "n3"])
    assert quorum_critical(st) is None
    st = replace(st, in_sync=["n1", "n2"])
    why = quorum_critical(st)
    assert why is not None and "majority" in why
    assert quorum_critical(node_status(node_id="n3", members=["n1", "n2", "n3"],
                                       in_sync=["n1", "n2"])) is None
    assert quorum_critical(node_status(node_id="n1", members=["n1"], in_sync=["n1"])) is None


def test_cluster_json_and_latency() -> None:
    hist = {"le": [0.001, 0.005, 0.01], "cumulative": [50, 99, 100, 100], "count": 100}
    assert latency_percentile(hist, 0.5) == 1.0
    assert latency_percentile(hist, 0.99) == 5.0
    st = node_status(node_id="n1", leader="n2", term=3, members=["n1", "n2", "n3"],
                     in_sync=["n1", "n2"], draining=[], commit_index=10, last_applied=10,
                     mirrored_index=9, member_addresses={"n1": "h:1", "n2": "h:2", "n3": "h:3"},
                     peers=[{"member": "n2", "connected": True, "match_index": 10},
                            {"member": "n3", "connected": False, "match_index": 4}],
                     confirm_latency=hist)
    c = cluster_json(replace(st, machine_version=1, runs_machine_version=2))
    assert c["leader"] == "n2" and c["term"] == 3 and c["mirrored_index"] == 9
    assert (c["machine_version"], c["runs_machine_version"]) == (1, 2)
    by = {m["name"]: m for m in c["members"]}
    assert by["n1"]["reachable"] and by["n2"]["leader"] and not by["n3"]["reachable"]
    assert not by["n3"]["in_sync"]
    # n1 follows: it does not know the others' match index (null, not 0 or stale)
    assert by["n2"]["match_index"] is None and by["n3"]["match_index"] is None
    assert by["n1"]["match_index"] == 10
    assert c["confirm_latency"]["since_start"]["p99_ms"] == 5.0
    # the leader knows them; http_url where configured, else null
    c = cluster_json(replace(st, role="leader", leader="n1"),
                         http_urls={"n2": "http://h:15673/"})
    by = {m["name"]: m for m in c["members"]}
    assert by["n2"]["match_index"] == 10 and by["n3"]["match_index"] == 4
    assert by["n2"]["http_url"] == "http://h:15673/" and by["n3"]["http_url"] is None


def test_interpolated_percentile() -> None:
    bounds = [0.001, 0.005, 0.01]
    # 100 in (1, 5] ms: p50 is halfway through the bucket, not its upper edge
    assert interpolated_percentile(bounds, [0, 100, 0, 0], 0.5) == pytest.approx(3.0)
    assert interpolated_percentile(bounds, [50, 50, 0, 0], 0.99) == pytest.approx(4.92)
    assert interpolated_percentile(bounds, [0, 0, 0, 10], 0.5) == pytest.approx(10.0)
    assert interpolated_percentile(bounds, [0, 0, 0, 0], 0.5) is None


def test_latency_window_forgets_old_confirms() -> None:
    le = [0.001, 0.005, 0.01, "+Inf"]

    def hist(*counts: int) -> dict[str, Any]:
        cum, t = [], 0
        for n in counts:
            t += n
            cum.append(t)
        return {"le": le, "cumulative": cum, "count": t}

    w = LatencyWindow(window=30.0)
    w.add(0.0, hist(0, 0, 0, 0))
    w.add(1.0, hist(0, 0, 100, 0))  # 100 slow confirms (5..10 ms) at t=1
    slow = w.summary(2.0, hist(0, 0, 100, 0))
    assert slow["count"] == 100 and 5.0 < slow["p50_ms"] < 10.0
    for t in range(2, 40):
        w.add(float(t), hist(0, 0, 100, 0))
    w.add(40.0, hist(100, 0, 100, 0))  # 100 fast ones (< 1 ms) at t=40
    fast = w.summary(41.0, hist(100, 0, 100, 0))
    assert fast["count"] == 100 and fast["p50_ms"] < 1.0 and fast["p99_ms"] < 1.0
    assert len(w.samples) <= 33  # bounded: one sample per second of the window
    # nothing in the window: no figure (the since-start one is elsewhere)
    assert w.summary(80.0, hist(100, 0, 100, 0))["p50_ms"] is None


def test_rate_sampler() -> None:
    h = _state()
    s = RateSampler()
    s.add(0.0, management_rows(h.state))
    c = chan(1)
    h.run(*[pub(c, "orders", b"x") for _ in range(10)])
    s.add(5.0, management_rows(h.state))
    assert s.rates(("/", "orders"))[0] == pytest.approx(2.0)
    assert s.totals()[0] == pytest.approx(2.0)
    assert s.totals(["other"])[0] == 0.0  # a user sees the rates of its vhosts only
    s = RateSampler()
    s.add(0.0, management_rows(h.state), confirmed=100)
    s.add(5.0, management_rows(h.state), confirmed=150)
    assert s.confirm_rate() == pytest.approx(10.0)


def test_a_reset_restarts_the_rates_and_counts_the_counters_from_then() -> None:
    h = _state()
    c = chan(1)
    h.run(*[pub(c, "orders", b"x") for _ in range(10)])
    s = RateSampler()
    s.add(0.0, management_rows(h.state), confirmed=10)
    h.run(*[pub(c, "orders", b"x") for _ in range(10)])
    s.add(5.0, management_rows(h.state), confirmed=20)
    key = ("/", "orders")
    publishes = next(q for q in management_rows(h.state).queues if q.name == "orders").stats
    assert s.rates(key)[0] == pytest.approx(2.0) and s.counted(key, publishes) == publishes
    s.reset(management_rows(h.state), confirmed=20)
    assert s.rates(key)[0] == 0.0 and s.confirm_rate() == 0.0 and s.totals()[0] == 0.0
    assert s.counted(key, publishes)[0] == 0 and s.confirmed(20) == 0
    h.run(*[pub(c, "orders", b"x") for _ in range(3)])
    now = next(q for q in management_rows(h.state).queues if q.name == "orders").stats
    assert s.counted(key, now)[0] == 3 and s.confirmed(23) == 3
    # a counter below its baseline: the queue was declared again since; its own figures
    assert s.counted(key, (1, 0, 0, 0)) == (1, 0, 0, 0)
    assert s.counted(("/", "new"), (4, 0, 0, 0)) == (4, 0, 0, 0)


def test_message_json_encodings() -> None:
    class M:
        delivery_tag, redelivered, exchange, routing_key, message_count = 1, False, "", "q", 3

    class C:
        method = M()
        props: dict[str, Any] = {}
        body = bytearray(b"\xff\x00binary")
    j = message_json(C(), "auto", None)
    assert j["payload_encoding"] == "base64" and j["properties"] == []
    C.body = bytearray(b"hello world")
    C.props = {"content_type": "text/plain"}
    j = message_json(C(), "auto", 5)
    assert j["payload"] == "hello" and j["payload_bytes"] == 11
    assert j["properties"] == {"content_type": "text/plain"}


def test_static_files_no_traversal(tmp_path: Any) -> None:
    (tmp_path / "index.html").write_text("<html>hi</html>")
    (tmp_path / "app.js").write_text("x=1")
    secret = tmp_path.parent / "secret.txt"
    secret.write_text("no")
    a = ManagementApi.__new__(ManagementApi)
    a.static_dir = tmp_path

    def get(path: str) -> Response:
        return asyncio.run(a(Request("GET", path, path, {}, {})))
    r = get("/")
    assert r.status == 200 and r.content_type.startswith("text/html")
    assert get("/static/app.js").content_type.startswith(("application/javascript",
                                                          "text/javascript"))
    for bad in ("/static/../secret.txt", "/static/%2E%2E/secret.txt", "/static/nope.js",
                "/etc/passwd"):
        with pytest.raises(HttpError) as e:
            get(bad)
        assert e.value.status == 404


def test_http_config_table(tmp_path: Any) -> None:
    from node.app.config import ConfigError, NodeConfig
    from node.app.config_file import apply_file
    from node.app.main import build_parser, config_from_args
    path = tmp_path / "n.toml"
    path.write_text("[http]\nport = 15999\n")
    cfg = NodeConfig(node_id="n1", data_dir=str(tmp_path / "d"))
    apply_file(cfg, str(path))
    assert cfg.http.port == 15999 and cfg.http.ssl_context() is None
    for bad in ("[http]\nport = 0\n", "[http]\nnope = 1\n", "[http]\ntls_cert = \"x.pem\"\n",
                "[http]\ntls_cert = \"missing.pem\"\ntls_key = \"missing.key\"\n", "http = 5\n"):
        path.write_text(bad)
        with pytest.raises(ConfigError):
            apply_file(NodeConfig(node_id="n1", data_dir=str(tmp_path / "d")), str(path))
    args = build_parser().parse_args(["serve", "--node-id", "n1", "--amqp-port", "1", "--data-dir",
                                      str(tmp_path / "d"), "--http-port", "1"])
    with pytest.raises(ConfigError, match="ports must differ"):
        config_from_args(args)


def test_credentials_are_checked_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's admit hook authenticates on the headers before the body; the
    handler takes that principal instead of hashing the password a second time."""
    from types import SimpleNamespace

    import node.http.app as app_module

    class Backend:
        node_id, product_version, token = "n1", "0", "tok"
        configured_users: dict[str, str] = {}
        loopback_users: list[str] = []

        def read_model(self) -> Any:
            return SimpleNamespace(users={})

    checks: list[str | None] = []
    real = app_module.authenticate

    def counting(header: str | None, *rest: Any) -> Any:
        checks.append(header)
        return real(header, *rest)
    monkeypatch.setattr(app_module, "authenticate", counting)
    api = ManagementApi(Backend(), None)  # type: ignore[arg-type]
    req = Request("GET", "/api/whoami", "/api/whoami", {}, {"authorization": "Bearer tok"})
    api.admit(req)
    resp = asyncio.run(api(req))
    assert resp.status == 200 and checks == ["Bearer tok"]
    # without the admit hook (HttpServer built without one) the handler still checks
    asyncio.run(api(Request("GET", "/api/whoami", "/api/whoami", {},
                            {"authorization": "Bearer tok"})))
    assert checks == ["Bearer tok"] * 2


def test_admit_asks_the_shared_login_throttle() -> None:
    """Every request with credentials is a login: a 401 is a failure, a right
    password (even one without management tags: 403) is not; past the free
    failures the answer is held (req.hold, the server sleeps it); a full queue
    is 429 unchecked; credentials already proven on the connection are not held."""
    import time
    from types import SimpleNamespace

    from node.amqp.throttle import LoginThrottle

    class Backend:
        node_id, product_version, token = "n1", "0", None
        configured_users: dict[str, str] = {}
        loopback_users: list[str] = []

        def read_model(self) -> Any:
            return SimpleNamespace(users={"app": (hash_password("pw"), ()),
                                          "ops": (hash_password("pw"), ("administrator",))})

    t = LoginThrottle(limit=2, window=600.0, delay=5.0, max_delay=5.0, max_wait=12.0)
    api = ManagementApi(Backend(), None, throttle=t)  # type: ignore[arg-type]

    def req(user: str, pw: str, session: dict[str, Any] | None = None) -> Request:
        auth = "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()
        r = Request("GET", "/api/whoami", "/api/whoami", {}, {"authorization": auth},
                    peer_host="10.0.0.9")
        if session is not None:
            r.session = session
        return r

    with pytest.raises(HttpError) as err:
        api.admit(req("app", "pw"))
    assert err.value.status == 403  # right password, no management tag: not a failure
    for _ in range(2):
        r = req("ops", "nope")
        with pytest.raises(HttpError):
            api.admit(r)
        assert r.hold == 0.0
    session: dict[str, Any] = {}
    r = req("ops", "pw", session)
    api.admit(r)
    assert 4.0 < r.hold <= 5.0 and r.principal.name == "ops"
    r = req("ops", "pw", session)  # same connection, same credentials: no new guess
    api.admit(r)
    assert r.hold == 0.0
    api.admit(req("ops", "pw"))  # another connection: held again (next slot)
    with pytest.raises(HttpError) as err:
        api.admit(req("ops", "pw"))  # would wait past max_wait
    assert err.value.status == 429
    assert t.failures("10.0.0.9", time.monotonic()) == 2  # only the two 401s counted
