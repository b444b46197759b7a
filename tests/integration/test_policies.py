"""Policies and operator policies end to end (issue 28): a real node, the
management HTTP API, pika clients and the `mirrorq policies` CLI. A policy
applies at once to existing queues, x-arguments win as RabbitMQ resolves
them, operator policies merge conservatively, definitions carry policies."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import requests

from harness.process import wait_for
from tests.broker_proc import NodeProcess, start_http_node, uniq
from tests.support.cli import run_cli

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="mirrorq's own node and admin API")
T = 15.0


class Api:
    def __init__(self, node: NodeProcess, auth: tuple[str, str] | None = None) -> None:
        self.base = f"http://127.0.0.1:{node.http_port}"  # type: ignore[attr-defined]
        self.s = requests.Session()
        if auth is None:
            self.s.headers["Authorization"] = f"Bearer {node.admin_token}"
        else:
            self.s.auth = auth

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        kw.setdefault("timeout", T)
        return self.s.request(method, self.base + path, **kw)

    def get(self, path: str) -> Any:
        r = self("GET", path)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def put_policy(self, name: str, body: dict[str, Any], vhost: str = "%2F",
                   kind: str = "policies") -> None:
        r = self("PUT", f"/api/{kind}/{vhost}/{name}", json=body)
        assert r.status_code in (201, 204), (r.status_code, r.text)

    def queue(self, name: str) -> Any:
        return self.get(f"/api/queues/%2F/{name}")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("policies") / "n1")
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture()
def api(node: NodeProcess) -> Iterator[Api]:
    a = Api(node)
    yield a
    for kind in ("policies", "operator-policies"):  # each test starts without policies
        for p in a.get(f"/api/{kind}"):
            a("DELETE", f"/api/{kind}/{requests.utils.quote(p['vhost'], safe='')}/{p['name']}")


@pytest.fixture()
def ch(node: NodeProcess) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.amqp_port, heartbeat=0, connection_attempts=1, socket_timeout=10))
    c = conn.channel()
    c.confirm_delivery()
    try:
        yield c
    finally:
        conn.close()


def publish(ch: Any, queue: str, bodies: list[bytes]) -> None:
    for b in bodies:
        ch.basic_publish("", queue, b)  # confirmed: pika raises on a nack


def drain(ch: Any, queue: str) -> list[bytes]:
    out = []
    while True:
        _m, _p, body = ch.basic_get(queue, auto_ack=True)
        if body is None:
            return out
        out.append(body)


def test_a_max_length_policy_caps_an_existing_queue_at_once(api: Api, ch: Any) -> None:
    q = uniq("cap")
    ch.queue_declare(q, durable=True)
    publish(ch, q, [b"m%d" % i for i in range(10)])
    api.put_policy("cap", {"pattern": f"^{q}$", "definition": {"max-length": 3},
                           "apply-to": "queues"})
    row = wait_for(lambda: (r := api.queue(q))["messages"] == 3 and r, what="the cap")
    assert row["policy"] == "cap" and row["operator_policy"] is None
    assert row["effective_policy_definition"] == {"max-length": 3}
    assert drain(ch, q) == [b"m7", b"m8", b"m9"]  # drop-head kept the newest
    policy = api.get("/api/policies/%2F/cap")
    assert policy == {"vhost": "/", "name": "cap", "pattern": f"^{q}$", "apply-to": "queues",
                      "definition": {"max-length": 3}, "priority": 0}


def test_a_message_ttl_policy_expires_messages(api: Api, ch: Any) -> None:
    q = uniq("ttl")
    api.put_policy("ttl", {"pattern": f"^{q}$", "definition": {"message-ttl": 200}})
    ch.queue_declare(q, durable=True)
    publish(ch, q, [b"short-lived"] * 3)
    wait_for(lambda: api.queue(q)["messages"] == 0, timeout=10, what="expiry")
    assert drain(ch, q) == []


def test_a_dead_letter_exchange_from_a_policy(api: Api, ch: Any) -> None:
    q, dlq = uniq("work"), uniq("dlq")
    api.put_policy("dlx", {"pattern": f"^{q}$", "definition": {
        "dead-letter-exchange": "", "dead-letter-routing-key": dlq}})
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(q, durable=True)
    publish(ch, q, [b"poison"])
    m, _p, _b = ch.basic_get(q)
    ch.basic_reject(m.delivery_tag, requeue=False)
    got = wait_for(lambda: (r := ch.basic_get(dlq, auto_ack=True))[2] and r, what="dead letter")
    assert got[2] == b"poison"
    death = got[1].headers["x-death"][0]
    assert (death["queue"], death["reason"]) == (q, "rejected")


def test_an_operator_policy_wins_with_the_more_conservative_value(api: Api, ch: Any) -> None:
    q = uniq("op")
    api.put_policy("roomy", {"pattern": f"^{q}$", "definition": {"max-length": 100,
                                                                 "message-ttl": 60000}})
    api.put_policy("strict", {"pattern": ".*", "definition": {"max-length": 2,
                                                              "message-ttl": 3600000},
                              "apply-to": "queues"}, kind="operator-policies")
    ch.queue_declare(q, durable=True)
    publish(ch, q, [b"a", b"b", b"c", b"d"])
    row = wait_for(lambda: (r := api.queue(q))["messages"] == 2 and r, what="the merge")
    assert (row["policy"], row["operator_policy"]) == ("roomy", "strict")
    assert row["effective_policy_definition"] == {"max-length": 2, "message-ttl": 60000}
    assert [p["name"] for p in api.get("/api/operator-policies/%2F")] == ["strict"]


def test_x_arguments_win_over_a_policy(api: Api, ch: Any) -> None:
    q = uniq("args")
    ch.queue_declare(q, durable=True, arguments={"x-max-length": 2,
                                                 "x-overflow": "reject-publish"})
    api.put_policy("loose", {"pattern": f"^{q}$", "definition": {"max-length": 50,
                                                                 "overflow": "drop-head"}})
    wait_for(lambda: api.queue(q)["policy"] == "loose", what="the policy")
    publish(ch, q, [b"1", b"2"])
    with pytest.raises(pika.exceptions.NackError):  # the argument's reject-publish
        ch.basic_publish("", q, b"3")
    assert drain(ch, q) == [b"1", b"2"]


def test_an_alternate_exchange_from_a_policy(api: Api, ch: Any) -> None:
    x, ae, q = uniq("main"), uniq("ae"), uniq("lost")
    ch.exchange_declare(x, "direct", durable=True)
    ch.exchange_declare(ae, "fanout", durable=True)
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, ae)
    api.put_policy("ae", {"pattern": f"^{x}$", "definition": {"alternate-exchange": ae},
                          "apply-to": "exchanges"})
    wait_for(lambda: api.get(f"/api/exchanges/%2F/{x}")["policy"] == "ae", what="policy")
    ch.basic_publish(x, "nowhere", b"rescued")
    assert drain(ch, q) == [b"rescued"]


def test_definitions_export_and_import_carry_policies(api: Api) -> None:
    api.put_policy("exported", {"pattern": "^exp\\.", "definition": {"max-length": 7},
                                "priority": 3, "apply-to": "quorum_queues"})
    api.put_policy("op-not-exported", {"pattern": ".*", "definition": {"expires": 60000}},
                   kind="operator-policies")
    exported = api.get("/api/definitions")
    assert exported["policies"] == [{"vhost": "/", "name": "exported", "pattern": "^exp\\.",
                                     "apply-to": "quorum_queues", "priority": 3,
                                     "definition": {"max-length": 7}}]
    assert api("DELETE", "/api/policies/%2F/exported").status_code == 204
    # a RabbitMQ 4.3 export's policy section, keys mirrorq only stores included
    rabbit = {"policies": exported["policies"] + [{
        "vhost": "/", "name": "rmq", "pattern": "^rmq$", "apply-to": "queues",
        "definition": {"queue-version": 2, "max-length-bytes": 1048576,
                       "consumer-timeout": 900000, "queue-leader-locator": "balanced"},
        "priority": 0}]}
    r = api("POST", "/api/definitions", json=rabbit)
    assert r.status_code == 204, r.text
    names = [p["name"] for p in api.get("/api/policies/%2F")]
    assert names == ["rmq", "exported"]  # by priority, ascending, as RabbitMQ lists them
    assert api.get("/api/policies/%2F/exported")["definition"] == {"max-length": 7}


def test_policies_are_refused_with_rabbitmqs_reasons(api: Api) -> None:
    cases = [({"pattern": ".*", "definition": {"max-length": -1}},
              "Validation failed\n\n-1 is not a valid maximum length\n"),
             ({"pattern": ".*", "definition": {"foo": 1}},
              'Validation failed\n\n[{<<"foo">>,1}] are not recognised policy settings\n'),
             ({"pattern": ".*", "definition": {}}, "Validation failed\n\nno policy provided\n")]
    for body, reason in cases:
        r = api("PUT", "/api/policies/%2F/bad", json=body)
        assert (r.status_code, r.json()["reason"]) == (400, reason)
    r = api("PUT", "/api/operator-policies/%2F/bad",
            json={"pattern": ".*", "definition": {"dead-letter-exchange": "x"}})
    assert r.status_code == 400 and "are not recognised policy settings" in r.json()["reason"]
    r = api("PUT", "/api/policies/%2F/bad", json={"pattern": "(a)\\1", "definition": {
        "max-length": 1}})
    assert r.status_code == 400  # RE2 refuses backreferences
    assert api("PUT", "/api/policies/nope/p", json={
        "pattern": ".*", "definition": {"max-length": 1}}).status_code == 404
    assert api("DELETE", "/api/policies/%2F/missing").status_code == 404
    assert api("GET", "/api/policies/%2F/missing").status_code == 404


def test_policymakers_set_policies_and_only_administrators_operator_policies(
        api: Api, node: NodeProcess) -> None:
    for user, tags in (("pm", "policymaker"), ("mgmt", "management")):
        assert api("PUT", f"/api/users/{user}", json={"password": "pw", "tags": tags}
                   ).status_code in (201, 204)
        assert api("PUT", f"/api/permissions/%2F/{user}", json={
            "configure": ".*", "write": ".*", "read": ".*"}).status_code in (201, 204)
    body = {"pattern": "^pm$", "definition": {"max-length": 1}}
    pm, mgmt = Api(node, ("pm", "pw")), Api(node, ("mgmt", "pw"))
    assert pm("PUT", "/api/policies/%2F/by-pm", json=body).status_code == 201
    assert [p["name"] for p in pm.get("/api/policies")] == ["by-pm"]
    assert pm("PUT", "/api/operator-policies/%2F/x", json=body).status_code == 403
    assert mgmt("PUT", "/api/policies/%2F/by-mgmt", json=body).status_code == 403
    assert mgmt("GET", "/api/policies").status_code == 403


def test_the_cli_sets_lists_and_clears_policies(api: Api, node: NodeProcess) -> None:
    def cli(*args: str) -> str:
        proc = run_cli("policies", *node.admin_cli, *args)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc.stdout

    cli("set", "limit", "^cli-", '{"max-length": 9}', "--priority", "2", "--apply-to", "queues")
    cli("set", "guard", ".*", '{"delivery-limit": 5}', "--operator")
    listed = json.loads(cli("list", "--json"))["policies"]
    assert listed == [{"vhost": "/", "name": "limit", "pattern": "^cli-", "apply-to": "queues",
                       "definition": {"max-length": 9}, "priority": 2}]
    assert api.get("/api/operator-policies/%2F/guard")["definition"] == {"delivery-limit": 5}
    assert "limit" in cli("list")
    cli("clear", "limit")
    assert api.get("/api/policies") == []
    proc = run_cli("policies", *node.admin_cli, "set", "bad", ".*", '{"max-length": "x"}')
    assert proc.returncode == 2 and "is not a valid maximum length" in proc.stderr
