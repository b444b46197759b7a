"""Vhost and user limits and topic permissions end to end (issue 28): a real
node, the management HTTP API (RabbitMQ's paths, bodies and 400 texts), raw
AMQP clients that see exactly what the node answers (RabbitMQ's reply codes,
texts and method ids, read from rabbit_reader.erl, rabbit_queue_type.erl,
rabbit_access_control.erl of rabbitmq-server) and pika. Definitions carry
limits and topic permissions in RabbitMQ's format."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import requests
from pamqp import commands as spec

from harness.amqp import RawClient
from harness.process import wait_for
from tests.broker_proc import NodeProcess, start_http_node, uniq
from tests.support import amqp_open
from tests.support.cli import run_cli

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="mirrorq's own node and admin API")
T = 15.0


class Api:
    def __init__(self, node: NodeProcess) -> None:
        self.base = f"http://127.0.0.1:{node.http_port}"  # type: ignore[attr-defined]
        self.s = requests.Session()
        self.s.headers["Authorization"] = f"Bearer {node.admin_token}"

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        kw.setdefault("timeout", T)
        return self.s.request(method, self.base + path, **kw)

    def get(self, path: str) -> Any:
        r = self("GET", path)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def ok(self, method: str, path: str, **kw: Any) -> None:
        r = self(method, path, **kw)
        assert r.status_code in (201, 204), (method, path, r.status_code, r.text)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("limits-api") / "n1")
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture()
def api(node: NodeProcess) -> Api:
    return Api(node)


def q(name: str) -> str:
    return requests.utils.quote(name, safe="")


def vhost(api: Api) -> str:
    """A fresh vhost guest may use."""
    v = uniq("v")
    api.ok("PUT", f"/api/vhosts/{q(v)}")
    api.ok("PUT", f"/api/permissions/{q(v)}/guest",
           json={"configure": ".*", "write": ".*", "read": ".*"})
    return v


def user(api: Api, vhosts: tuple[str, ...] = ("/",)) -> str:
    u = uniq("u")
    api.ok("PUT", f"/api/users/{u}", json={"password": "pw", "tags": ""})
    for v in vhosts:
        api.ok("PUT", f"/api/permissions/{q(v)}/{u}",
               json={"configure": ".*", "write": ".*", "read": ".*"})
    return u


def open_conn(node: NodeProcess, vhost: str = "/", name: str = "guest",
              password: str = "guest") -> tuple[RawClient, Any]:
    return amqp_open.open_conn("127.0.0.1", node.amqp_port, vhost, name, password)


def opened(node: NodeProcess, vhost: str = "/", name: str = "guest",
           password: str = "guest") -> RawClient:
    c, answer = open_conn(node, vhost, name, password)
    assert isinstance(answer, spec.Connection.OpenOk), answer
    return c


def refused(node: NodeProcess, vhost: str = "/", name: str = "guest",
            password: str = "guest") -> tuple[int, str, int, int]:
    c, answer = open_conn(node, vhost, name, password)
    try:
        assert isinstance(answer, spec.Connection.Close), answer
        return answer.reply_code, answer.reply_text, answer.class_id, answer.method_id
    finally:
        c.close()


def closed(c: RawClient) -> tuple[int, str, int, int]:
    """The Channel.Close or Connection.Close the node sends next."""
    while True:
        _, v = c.read_frame()
        if isinstance(v, spec.Channel.Close | spec.Connection.Close):
            return v.reply_code, v.reply_text, v.class_id, v.method_id


# ------------------------------------------------------------------ the API
def test_vhost_limits_are_set_listed_and_cleared_as_in_rabbitmq(api: Api) -> None:
    v = vhost(api)
    assert api.get(f"/api/vhost-limits/{q(v)}") == []
    api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-connections", json={"value": 10})
    api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-queues", json={"value": -1})
    assert api.get(f"/api/vhost-limits/{q(v)}") == [
        {"vhost": v, "value": {"max-connections": 10, "max-queues": -1}}]
    assert {"vhost": v, "value": {"max-connections": 10, "max-queues": -1}} in \
        api.get("/api/vhost-limits")
    api.ok("DELETE", f"/api/vhost-limits/{q(v)}/max-connections")
    assert api.get(f"/api/vhost-limits/{q(v)}") == [{"vhost": v, "value": {"max-queues": -1}}]
    api.ok("DELETE", f"/api/vhost-limits/{q(v)}/max-queues")
    assert api.get(f"/api/vhost-limits/{q(v)}") == []
    api.ok("DELETE", f"/api/vhost-limits/{q(v)}/max-queues")  # not set: no error (RabbitMQ)
    r = api("PUT", f"/api/vhost-limits/{q(v)}/max-connections", json={"value": "ten"})
    assert (r.status_code, r.json()["reason"]) == (
        400, 'Validation failed\n\nmax-connections should be a number, actually was <<"ten">>\n')
    r = api("PUT", f"/api/vhost-limits/{q(v)}/max-channels", json={"value": 1})
    assert (r.status_code, r.json()["reason"]) == (
        400, 'Validation failed\n\nUnrecognised terms [{<<"max-channels">>,1}] in limits\n')
    assert api("PUT", f"/api/vhost-limits/{q(v)}/max-queues", json={}).status_code == 400
    assert api("PUT", "/api/vhost-limits/nope/max-queues", json={"value": 1}).status_code == 404
    assert api("GET", "/api/vhost-limits/nope").status_code == 404


def test_user_limits_are_set_listed_and_cleared_as_in_rabbitmq(api: Api) -> None:
    u = user(api)
    assert api.get(f"/api/user-limits/{u}") == []
    api.ok("PUT", f"/api/user-limits/{u}/max-connections", json={"value": 3})
    api.ok("PUT", f"/api/user-limits/{u}/max-channels", json={"value": 7})
    assert api.get(f"/api/user-limits/{u}") == [
        {"user": u, "value": {"max-connections": 3, "max-channels": 7}}]
    assert {"user": u, "value": {"max-connections": 3, "max-channels": 7}} in \
        api.get("/api/user-limits")
    api.ok("DELETE", f"/api/user-limits/{u}/max-channels")
    assert api.get(f"/api/user-limits/{u}") == [{"user": u, "value": {"max-connections": 3}}]
    r = api("PUT", f"/api/user-limits/{u}/max-queues", json={"value": 1})
    assert (r.status_code, r.json()["reason"]) == (
        400, 'Unrecognised terms [{<<"max-queues">>,1}] in user-limits')
    r = api("PUT", f"/api/user-limits/{u}/max-channels", json={"value": 1.5})
    assert (r.status_code, r.json()["reason"]) == (
        400, "max-channels should be a number, actually was 1.5")
    assert api("GET", "/api/user-limits/nobody").status_code == 404
    api.ok("DELETE", f"/api/users/{u}")  # a deleted user's limits go with it
    assert all(row["user"] != u for row in api.get("/api/user-limits"))


# ------------------------------------------------------------ the refusals
def test_vhost_max_connections_refuses_the_next_open_with_530(node: NodeProcess, api: Api) -> None:
    v = vhost(api)
    api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-connections", json={"value": 2})
    first, second = opened(node, v), opened(node, v)
    assert refused(node, v) == (
        530, f"NOT_ALLOWED - access to vhost '{v}' refused for user 'guest': connection limit "
             "(2) is reached", 10, 40)
    opened(node, "/").close()  # other vhosts are not counted
    first.close()  # a connection gone makes room
    wait_for(lambda: isinstance(open_conn(node, v)[1], spec.Connection.OpenOk), T,
             what="room for a connection after one left")
    api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-connections", json={"value": 0})
    assert refused(node, v)[0] == 530  # 0: none at all
    api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-connections", json={"value": -1})
    opened(node, v).close()  # negative: no limit
    api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-connections", json={"value": 1})
    assert refused(node, v)[0] == 530
    api.ok("DELETE", f"/api/vhost-limits/{q(v)}/max-connections")
    opened(node, v).close()
    second.close()


def test_user_max_connections_refuses_with_530_across_vhosts(node: NodeProcess, api: Api) -> None:
    v = vhost(api)
    u = user(api, ("/", v))
    api.ok("PUT", f"/api/user-limits/{u}/max-connections", json={"value": 2})
    a, b = opened(node, "/", u, "pw"), opened(node, v, u, "pw")
    assert refused(node, "/", u, "pw") == (
        530, f"NOT_ALLOWED - connection refused for user '{u}': user connection limit (2) is "
             "reached", 10, 40)
    opened(node).close()  # guest is not counted
    api.ok("DELETE", f"/api/user-limits/{u}/max-connections")
    opened(node, "/", u, "pw").close()
    a.close()
    b.close()


def test_user_max_channels_counts_every_connection_of_the_user(node: NodeProcess,
                                                                api: Api) -> None:
    u = user(api)
    api.ok("PUT", f"/api/user-limits/{u}/max-channels", json={"value": 2})
    a, b = opened(node, "/", u, "pw"), opened(node, "/", u, "pw")
    a.open_channel(1)
    b.open_channel(1)
    b.send_frame(spec.Channel.Open(), 2)
    assert closed(b) == (
        530, f"NOT_ALLOWED - number of channels opened for user '{u}' has reached the maximum "
             "allowed user limit of 2", 0, 0)
    b.close()
    wait_for(lambda: _channel_opens(node, u), T,
             what="a channel once the refused connection is gone")
    a.close()


def _channel_opens(node: NodeProcess, name: str) -> bool:
    c = opened(node, "/", name, "pw")
    try:
        c.send_frame(spec.Channel.Open(), 1)
        _, v = c.read_frame()
        return isinstance(v, spec.Channel.OpenOk)
    finally:
        c.close()


def test_vhost_max_queues_refuses_a_new_queue_with_406(node: NodeProcess, api: Api) -> None:
    v = vhost(api)
    api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-queues", json={"value": 2})
    c = opened(node, v)
    c.open_channel(1)
    for name in ("q1", "q2", "q1"):  # a redeclare is no new queue
        c.call(spec.Queue.Declare(queue=name), spec.Queue.DeclareOk)
    c.send_frame(spec.Queue.Declare(queue="q3"), 1)
    assert closed(c) == (
        406, f"PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost '{v}' (2) "
             "is reached", 50, 10)
    c.send_frame(spec.Channel.CloseOk(), 1)
    c.open_channel(2)
    c.call(spec.Queue.Delete(queue="q1"), spec.Queue.DeleteOk, ch=2)
    c.call(spec.Queue.Declare(queue="q3"), spec.Queue.DeclareOk, ch=2)
    c.close()
    # the management API's declare says it as RabbitMQ's does (406 -> 400)
    r = api("PUT", f"/api/queues/{q(v)}/q4", json={"durable": True})
    assert (r.status_code, r.json()["reason"]) == (
        400, f"cannot declare queue 'q4': queue limit in vhost '{v}' (2) is reached")


# ------------------------------------------------------- topic permissions
def test_topic_permissions_are_set_listed_and_cleared_as_in_rabbitmq(api: Api) -> None:
    u = user(api)
    api.ok("PUT", f"/api/topic-permissions/%2F/{u}",
           json={"exchange": "amq.topic", "write": "^a", "read": "^b"})
    api.ok("PUT", f"/api/topic-permissions/%2F/{u}",
           json={"exchange": "logs", "write": ".*", "read": ""})
    row = {"user": u, "vhost": "/", "exchange": "amq.topic", "write": "^a", "read": "^b"}
    logs = {"user": u, "vhost": "/", "exchange": "logs", "write": ".*", "read": ""}
    assert api.get(f"/api/topic-permissions/%2F/{u}") == [row, logs]
    assert api.get(f"/api/users/{u}/topic-permissions") == [row, logs]
    assert row in api.get("/api/vhosts/%2F/topic-permissions")
    assert row in api.get("/api/topic-permissions")
    api.ok("DELETE", f"/api/topic-permissions/%2F/{u}/logs")
    assert api.get(f"/api/topic-permissions/%2F/{u}") == [row]
    api.ok("DELETE", f"/api/topic-permissions/%2F/{u}")
    assert api("GET", f"/api/topic-permissions/%2F/{u}").status_code == 404
    r = api("PUT", "/api/topic-permissions/%2F/nobody",
            json={"exchange": "amq.topic", "write": "", "read": ""})
    assert (r.status_code, r.json()["reason"]) == (400, "vhost_or_user_not_found")
    r = api("PUT", f"/api/topic-permissions/%2F/{u}", json={"exchange": "amq.topic",
                                                           "write": "(", "read": ""})
    assert r.status_code == 400
    r = api("PUT", f"/api/topic-permissions/%2F/{u}", json={"write": "", "read": ""})
    assert (r.status_code, r.json()["reason"]) == (400, "key_missing: exchange")


def test_topic_permissions_refuse_publishes_and_binds_with_403(node: NodeProcess,
                                                               api: Api) -> None:
    u = user(api)
    api.ok("PUT", f"/api/topic-permissions/%2F/{u}", json={
        "exchange": "amq.topic", "write": "^{username}\\.", "read": "^public\\."})
    c = opened(node, "/", u, "pw")
    c.open_channel(1)
    c.call(spec.Confirm.Select(), spec.Confirm.SelectOk)
    c.publish("amq.topic", f"{u}.orders", b"ok")
    c.expect(spec.Basic.Ack)
    c.publish("amq.direct", "anything", b"ok")  # other exchange types are not checked
    c.expect(spec.Basic.Ack)
    c.publish("amq.topic", "other.orders", b"no")
    assert closed(c) == (
        403, f"ACCESS_REFUSED - write access to topic 'other.orders' in exchange 'amq.topic' in "
             f"vhost '/' refused for user '{u}'", 60, 40)
    c.send_frame(spec.Channel.CloseOk(), 1)
    c.open_channel(2)
    qname = uniq("tq")
    c.call(spec.Queue.Declare(queue=qname, exclusive=True), spec.Queue.DeclareOk, ch=2)
    c.call(spec.Queue.Bind(queue=qname, exchange="amq.topic", routing_key="public.#"),
           spec.Queue.BindOk, ch=2)
    c.send_frame(spec.Queue.Bind(queue=qname, exchange="amq.topic", routing_key="private.#"), 2)
    assert closed(c) == (
        403, f"ACCESS_REFUSED - read access to topic 'private.#' in exchange 'amq.topic' in "
             f"vhost '/' refused for user '{u}'", 50, 20)
    c.send_frame(spec.Channel.CloseOk(), 2)
    c.open_channel(3)
    c.send_frame(spec.Queue.Unbind(queue=qname, exchange="amq.topic", routing_key="x"), 3)
    assert closed(c) == (
        403, f"ACCESS_REFUSED - read access to topic 'x' in exchange 'amq.topic' in vhost '/' "
             f"refused for user '{u}'", 50, 50)
    c.close()
    # pika sees the same channel error; guest (no topic permission) publishes anything
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.amqp_port, credentials=pika.PlainCredentials(u, "pw"), heartbeat=0,
        connection_attempts=1, socket_timeout=10))
    try:
        ch = conn.channel()
        ch.basic_publish("amq.topic", "elsewhere", b"x")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare(queue="", exclusive=True)  # the publish's error arrives first
        assert info.value.reply_code == 403
    finally:
        conn.close()
    with pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0")) as g:
        gch = g.channel()
        gch.confirm_delivery()
        gch.basic_publish("amq.topic", "elsewhere", b"x")


# ---------------------------------------------------------------- definitions
def test_definitions_carry_limits_and_topic_permissions_in_rabbitmqs_format(api: Api) -> None:
    v = vhost(api)
    u = user(api)
    api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-queues", json={"value": 4})
    api.ok("PUT", f"/api/user-limits/{u}/max-channels", json={"value": 5})
    api.ok("PUT", f"/api/topic-permissions/{q(v)}/{u}",
           json={"exchange": "amq.topic", "write": "^w", "read": "^r"})
    d = api.get("/api/definitions")
    assert {"name": v, "limits": {"max-queues": 4},
            "metadata": {"description": "", "tags": []}} in d["vhosts"]
    assert next(x for x in d["users"] if x["name"] == u)["limits"] == {"max-channels": 5}
    assert {"user": u, "vhost": v, "exchange": "amq.topic", "write": "^w",
            "read": "^r"} in d["topic_permissions"]
    api.ok("DELETE", f"/api/vhost-limits/{q(v)}/max-queues")
    api.ok("DELETE", f"/api/user-limits/{u}/max-channels")
    api.ok("DELETE", f"/api/topic-permissions/{q(v)}/{u}")
    r = api("POST", "/api/definitions", json=d)
    assert r.status_code == 204, r.text
    assert api.get(f"/api/vhost-limits/{q(v)}") == [{"vhost": v, "value": {"max-queues": 4}}]
    assert api.get(f"/api/user-limits/{u}") == [{"user": u, "value": {"max-channels": 5}}]
    assert api.get(f"/api/topic-permissions/{q(v)}/{u}") == [
        {"user": u, "vhost": v, "exchange": "amq.topic", "write": "^w", "read": "^r"}]


# ------------------------------------------------------------ a restart
def test_limits_and_topic_permissions_survive_a_snapshot_and_kill9(tmp_path: Any) -> None:
    """Set, then enough entries for snapshots after them (the access
    section), kill -9: they are back and enforced."""
    from tests.broker_proc import node_metric
    n = start_http_node(tmp_path / "n1", config="[raft]\ncompaction_min_entries = 40\n")
    try:
        api = Api(n)
        v = vhost(api)
        api.ok("PUT", f"/api/vhost-limits/{q(v)}/max-connections", json={"value": 1})
        api.ok("PUT", "/api/user-limits/guest/max-channels", json={"value": 50})
        api.ok("PUT", "/api/topic-permissions/%2F/guest",
               json={"exchange": "amq.topic", "write": "^ok$", "read": ".*"})
        before = node_metric(n, "snapshots_total") or 0
        with pika.BlockingConnection(pika.URLParameters(n.url + "?heartbeat=0")) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(200):  # one publish per batch: many Raft entries
                ch.basic_publish("amq.topic", "ok", b"m%d" % i)
        wait_for(lambda: (node_metric(n, "snapshots_total") or 0) >= before + 1, T,
                 what="a snapshot after the limits were set")
        n.kill9()
        n.start()
        assert api.get(f"/api/vhost-limits/{q(v)}") == [
            {"vhost": v, "value": {"max-connections": 1}}]
        assert api.get("/api/user-limits/guest") == [{"user": "guest",
                                                       "value": {"max-channels": 50}}]
        c = opened(n, v)
        assert refused(n, v)[0] == 530
        c.close()
        c = opened(n)
        c.open_channel(1)
        c.publish("amq.topic", "not-ok", b"x")
        assert closed(c)[:2] == (403, "ACCESS_REFUSED - write access to topic 'not-ok' in "
                                      "exchange 'amq.topic' in vhost '/' refused for user 'guest'")
        c.close()
    finally:
        n.kill9()


def test_topic_permissions_apply_to_the_management_apis_publish(node: NodeProcess,
                                                                 api: Api) -> None:
    u = uniq("u")
    api.ok("PUT", f"/api/users/{u}", json={"password": "pw", "tags": "management"})
    api.ok("PUT", f"/api/permissions/%2F/{u}", json={"configure": ".*", "write": ".*",
                                                     "read": ".*"})
    api.ok("PUT", f"/api/topic-permissions/%2F/{u}",
           json={"exchange": "amq.topic", "write": "^ok$", "read": ".*"})
    s = requests.Session()
    s.auth = (u, "pw")
    url = f"{api.base}/api/exchanges/%2F/amq.topic/publish"
    body = {"properties": {}, "payload": "x", "payload_encoding": "string"}
    r = s.post(url, json={**body, "routing_key": "ok"}, timeout=T)
    assert r.status_code == 200, r.text
    r = s.post(url, json={**body, "routing_key": "no"}, timeout=T)
    assert (r.status_code, r.json()["reason"]) == (
        403, f"write access to topic 'no' in exchange 'amq.topic' in vhost '/' refused for "
             f"user '{u}'")


def test_the_limits_cli_sets_lists_and_clears(node: NodeProcess, api: Api) -> None:
    v = vhost(api)

    def cli(*args: str) -> str:
        proc = run_cli("limits", *node.admin_cli, *args)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc.stdout
    cli("set", "max-queues", "3", "--vhost", v)
    cli("set", "max-channels", "8", "--user", "guest")
    listed = json.loads(cli("list", "--json"))["limits"]
    assert {"scope": "vhost", "owner": v, "name": "max-queues", "value": 3} in listed
    assert {"scope": "user", "owner": "guest", "name": "max-channels", "value": 8} in listed
    assert api.get(f"/api/vhost-limits/{q(v)}") == [{"vhost": v, "value": {"max-queues": 3}}]
    cli("clear", "max-queues", "--vhost", v)
    cli("clear", "max-channels", "--user", "guest")
    assert api.get(f"/api/vhost-limits/{q(v)}") == []
    assert api.get("/api/user-limits/guest") == []
    proc = run_cli("limits", *node.admin_cli, "set", "max-widgets", "1", "--vhost", v)
    assert proc.returncode == 2 and "Unrecognised terms" in proc.stderr, proc.stderr


def test_before_machine_version_4_changes_are_refused_and_nothing_new_is_logged(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node running as a version-2 build (the rolling upgrade's test hook)
    holds the cluster at version 2: no record a version-2 member cannot
    decode is proposed (limit changes answer 503, connections open as
    before); restarted at this build's version, limits work."""
    monkeypatch.setenv("MIRRORQ_MACHINE_VERSION", "3")
    n = start_http_node(tmp_path / "n1")
    try:
        api = Api(n)
        r = api("PUT", "/api/vhost-limits/%2F/max-connections", json={"value": 1})
        assert r.status_code == 503 and "machine version 4" in r.json()["reason"], r.text
        r = api("PUT", "/api/topic-permissions/%2F/guest",
                json={"exchange": "amq.topic", "write": "", "read": ""})
        assert r.status_code == 503, r.text
        for _ in range(2):
            opened(n).close()
        n.stop()
        monkeypatch.delenv("MIRRORQ_MACHINE_VERSION")
        n.start()
        wait_for(lambda: api("PUT", "/api/vhost-limits/%2F/max-connections",
                             json={"value": 1}).status_code == 204, T,
                 what="limits once the node runs machine version 4")
        c = opened(n)
        assert refused(n)[0] == 530
        c.close()
    finally:
        n.kill9()
