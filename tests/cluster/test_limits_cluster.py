"""Limits counted cluster-wide on 3 nodes (issue 28), as RabbitMQ's
connection and channel tracking counts them: connections and channels held
on other members count against a vhost's or a user's limit, a connection
that leaves (closed, or its node declared down) makes room again, and a
topic permission set through one node refuses a publish on another."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest
import requests
from pamqp import commands as spec

from harness.process import Cluster, ClusterNode
from tests.broker_proc import uniq, wait_for
from tests.support.amqp_open import open_conn, refusal
from tests.support.shared_cluster import with_http

AUTH = ("guest", "guest")
T = 20.0


def url(node: ClusterNode, path: str) -> str:
    return f"http://{node.host}:{node.http_port}{path}"  # type: ignore[attr-defined]


def put(node: ClusterNode, path: str, body: dict[str, Any]) -> None:
    r = requests.put(url(node, path), auth=AUTH, json=body, timeout=T)
    assert r.status_code in (201, 204), (path, r.status_code, r.text)


def test_connections_and_channels_on_other_members_count_against_limits(
        shared_http_cluster: Cluster) -> None:
    c = shared_http_cluster
    n1, n2, n3 = c.nodes
    v = uniq("v")
    put(n1, f"/api/vhosts/{v}", {})
    put(n1, f"/api/permissions/{v}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    put(n1, f"/api/vhost-limits/{v}/max-connections", {"value": 2})
    held = []
    for n in (n1, n2):
        cl, answer = open_conn(n.host, n.amqp_port, v)
        assert isinstance(answer, spec.Connection.OpenOk), answer
        held.append(cl)
    want = (530, f"NOT_ALLOWED - access to vhost '{v}' refused for user 'guest': connection "
                 "limit (2) is reached", 10, 40)
    wait_for(lambda: refusal(n3.host, n3.amqp_port, v) == want, T,
             what="n3 to count the connections held on n1 and n2")
    held[0].close()  # one leaves: room on every member once its close is applied
    wait_for(lambda: refusal(n3.host, n3.amqp_port, v) is None, T, what="room on n3")

    # a user's channels across members: 2 on n1, the third on n2 is refused
    u = uniq("u")
    put(n1, f"/api/users/{u}", {"password": "pw", "tags": ""})
    put(n1, f"/api/permissions/%2F/{u}", {"configure": ".*", "write": ".*", "read": ".*"})
    put(n1, f"/api/user-limits/{u}/max-channels", {"value": 2})
    creds = pika.PlainCredentials(u, "pw")
    a = pika.BlockingConnection(pika.ConnectionParameters(n1.host, n1.amqp_port,
                                                          credentials=creds, heartbeat=0))
    try:
        a.channel()
        a.channel()

        def refused_on_n2() -> bool:
            b = pika.BlockingConnection(pika.ConnectionParameters(n2.host, n2.amqp_port,
                                                                  credentials=creds, heartbeat=0))
            try:
                b.channel()
            except pika.exceptions.ConnectionClosedByBroker as exc:
                assert (exc.reply_code, exc.reply_text) == (
                    530, f"NOT_ALLOWED - number of channels opened for user '{u}' has reached "
                         "the maximum allowed user limit of 2")
                return True
            b.close()
            return False
        wait_for(refused_on_n2, T, what="n2 to count the user's channels on n1")
    finally:
        a.close()
    for cl in held[1:]:
        cl.close()


def test_a_node_declared_down_frees_its_connections_and_topic_permissions_reach_others(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = with_http(cluster_factory(3), member_urls=False).start()
    leader = c.leader()
    others = [n for n in c.nodes if n is not leader]
    victim, survivor = others
    put(leader, "/api/user-limits/guest/max-connections", {"value": 1})
    cl, answer = open_conn(victim.host, victim.amqp_port)  # no channel: counted all the same
    assert isinstance(answer, spec.Connection.OpenOk), answer
    want = (530, "NOT_ALLOWED - connection refused for user 'guest': user connection limit (1) "
                 "is reached", 10, 40)
    wait_for(lambda: refusal(survivor.host, survivor.amqp_port) == want, T,
             what="the survivor to count the victim's connection")
    victim.kill9()  # NodeDown forgets its connections
    wait_for(lambda: refusal(survivor.host, survivor.amqp_port) is None, 30,
             what="room once the victim is declared down")
    cl.close()

    put(leader, "/api/user-limits/guest/max-connections", {"value": -1})
    put(leader, "/api/topic-permissions/%2F/guest",
        {"exchange": "amq.topic", "write": "^allowed\\.", "read": ".*"})
    with pika.BlockingConnection(pika.URLParameters(survivor.url + "?heartbeat=0")) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "allowed.x", b"ok")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.basic_publish("amq.topic", "denied.x", b"no")
        assert (info.value.reply_code, info.value.reply_text) == (
            403, "ACCESS_REFUSED - write access to topic 'denied.x' in exchange 'amq.topic' in "
                 "vhost '/' refused for user 'guest'")


def test_connections_opened_before_machine_version_4_count_after_the_switch(
        cluster_factory: Callable[..., Cluster]) -> None:
    """A rolling upgrade: while n3 runs as a version-3 build nothing new is
    logged; a connection opened on n1 then enters the connection table when
    the version switches, so a user limit set after it counts it on n2."""
    c = with_http(cluster_factory(3, node_env=lambda nid: {"MIRRORQ_MACHINE_VERSION": "3"}
                                  if nid == "n3" else {}), member_urls=False)
    c.start()
    n1, n2, n3 = c.nodes
    early, answer = open_conn(n1.host, n1.amqp_port)
    assert isinstance(answer, spec.Connection.OpenOk), answer
    r = requests.put(url(n1, "/api/user-limits/guest/max-connections"), auth=AUTH,
                     json={"value": 1}, timeout=T)
    assert r.status_code == 503, r.text  # held at version 3 by n3
    n3.env.pop("MIRRORQ_MACHINE_VERSION")
    n3.restart()

    def limit_set() -> bool:
        r = requests.put(url(n1, "/api/user-limits/guest/max-connections"), auth=AUTH,
                         json={"value": 1}, timeout=T)
        return r.status_code == 204
    wait_for(limit_set, 40, what="machine version 4 (the limit accepted)")
    want = (530, "NOT_ALLOWED - connection refused for user 'guest': user connection limit (1) "
                 "is reached", 10, 40)
    wait_for(lambda: refusal(n2.host, n2.amqp_port) == want, T,
             what="n2 to count the connection n1 held from before the switch")
    early.close()
    wait_for(lambda: refusal(n2.host, n2.amqp_port) is None, T, what="room once it left")


def test_an_http_session_on_another_member_counts_against_max_connections(
        shared_http_cluster: Cluster) -> None:
    """Issue 42 item 10: the management API's in-process session is a
    connection of its user on its node; with the user's one allowed
    connection held on n1, an HTTP publish through n2 is refused (403) once
    n2 has applied n1's ConnectionOpen, and allowed again once it closed.
    Before: HTTP sessions were never checked against the limits."""
    n1, n2, _n3 = shared_http_cluster.nodes
    u, q = uniq("u"), uniq("q")
    put(n1, f"/api/users/{u}", {"password": "pw", "tags": "management"})
    put(n1, f"/api/permissions/%2F/{u}", {"configure": ".*", "write": ".*", "read": ".*"})
    put(n1, f"/api/queues/%2F/{q}", {"durable": True})
    put(n1, f"/api/user-limits/{u}/max-connections", {"value": 1})

    def publish_status() -> int:
        return requests.post(url(n2, "/api/exchanges/%2F/amq.default/publish"), auth=(u, "pw"),
                             json={"properties": {}, "routing_key": q, "payload": "x",
                                   "payload_encoding": "string"}, timeout=T).status_code

    held, answer = open_conn(n1.host, n1.amqp_port, "/", u, "pw")
    assert isinstance(answer, spec.Connection.OpenOk), answer
    try:
        wait_for(lambda: publish_status() == 403, T,
                 what="n2 to count n1's connection against the HTTP session")
    finally:
        held.close()
    wait_for(lambda: publish_status() == 200, T, what="room on n2 once n1's connection closed")
