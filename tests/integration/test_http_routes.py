"""RabbitMQ 4.3 management routes mirrorq lacked (issue 28; the full list is
docs/management-api.md), against a real node over HTTP: /api/version, the
read-only parameters, global parameters, feature flags and deprecated
features, /api/queues/detailed, /api/all-configuration,
/api/connections/username/{user}, the fine-grained health checks and the
no-op /api/rebalance/queues. Before: each answered 404."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pytest

from node.broker.password import check_password
from tests.broker_proc import NodeProcess, start_http_node, uniq, wait_for
from tests.support.http_api import T, amqp, api, user

MAX_CONNECTIONS = 2
TARGET_SIZE = 3  # [http] target_cluster_size_hint: one node of three is online


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("http-routes") / "n1",
                        config=f"max_connections = {MAX_CONNECTIONS}\n"
                               f"[http]\ntarget_cluster_size_hint = {TARGET_SIZE}\n")
    try:
        yield n
    finally:
        n.stop()


def test_version_is_the_rabbitmq_version_as_a_json_string(node: NodeProcess) -> None:
    r = api(node, "GET", "/api/version")
    assert r.status_code == 200
    assert r.json() == api(node, "GET", "/api/overview").json()["rabbitmq_version"]
    assert api(node, "GET", "/api/version", auth=None).status_code == 401


def test_parameters_are_empty_and_global_parameters_hold_the_cluster_name(
        node: NodeProcess) -> None:
    for path in ("/api/parameters", "/api/parameters/federation-upstream",
                 "/api/parameters/shovel/%2F"):
        r = api(node, "GET", path)
        assert r.status_code == 200 and r.json() == [], path
    assert api(node, "GET", "/api/parameters/shovel/no-such-vhost").status_code == 404
    assert api(node, "GET", "/api/parameters/shovel/%2F/s1").status_code == 404
    name = api(node, "GET", "/api/cluster-name").json()["name"]
    assert api(node, "GET", "/api/global-parameters").json() == [
        {"name": "cluster_name", "value": name}]
    assert api(node, "GET", "/api/global-parameters/cluster_name").json() == {
        "name": "cluster_name", "value": name}
    assert api(node, "GET", "/api/global-parameters/nope").status_code == 404
    # writes (machine version 6): tests/integration/test_http_cluster_metadata.py;
    # global parameters are for policymakers
    assert api(node, "PUT", "/api/global-parameters/cluster_name", auth=user(node, "management"),
               json={"value": "x"}).status_code == 403
    # RabbitMQ: parameters are for policymakers
    mgmt = user(node, "management")
    assert api(node, "GET", "/api/parameters", auth=mgmt).status_code == 403
    assert api(node, "GET", "/api/global-parameters", auth=mgmt).status_code == 403
    assert api(node, "GET", "/api/parameters", auth=user(node, "policymaker")).status_code == 200


def test_feature_flags_list_the_machine_versions_enabled(node: NodeProcess) -> None:
    flags = api(node, "GET", "/api/feature-flags").json()
    by_name = {f["name"]: f for f in flags}
    assert by_name["mirrorq_machine_version_1"]["state"] == "enabled"
    newest = by_name[f"mirrorq_machine_version_{len(flags)}"]

    # a new single-node cluster raises its version to the build's: all enabled
    def all_enabled() -> bool:
        return all(f["state"] == "enabled" for f in api(node, "GET", "/api/feature-flags").json())
    wait_for(all_enabled, timeout=T, what="every machine version enabled")
    assert newest["provided_by"] == "mirrorq"
    assert api(node, "GET", "/api/deprecated-features").json() == []
    assert api(node, "GET", "/api/deprecated-features/used").json() == []


def test_queues_detailed_and_all_configuration_are_aliases(node: NodeProcess) -> None:
    q = uniq("q")
    assert api(node, "PUT", f"/api/queues/%2F/{q}", json={"durable": True}).status_code == 201
    names = [x["name"] for x in api(node, "GET", "/api/queues/detailed").json()]
    assert q in names
    assert any(x["name"] == q for x in api(node, "GET", "/api/all-configuration").json()["queues"])


def test_connections_by_username(node: NodeProcess) -> None:
    who = user(node, "management")
    other = user(node, "management")
    conn = amqp(node, who)
    try:
        def listed() -> Any:
            rows = api(node, "GET", f"/api/connections/username/{who[0]}").json()
            return rows or None
        rows = wait_for(listed, timeout=T, what="the user's connection listed")
        assert [r["user"] for r in rows] == [who[0]]
        # the user itself may list its own, another non-administrator may not
        assert len(api(node, "GET", f"/api/connections/username/{who[0]}", auth=who).json()) == 1
        assert api(node, "GET", f"/api/connections/username/{who[0]}",
                   auth=other).status_code == 403
        assert api(node, "GET", f"/api/connections/username/{other[0]}").json() == []
    finally:
        conn.close()


def test_deleting_a_users_connections_closes_those_only(node: NodeProcess) -> None:
    who = user(node, "management")
    other = user(node, "management")
    mine, theirs = amqp(node, who), amqp(node, other)
    try:
        wait_for(lambda: api(node, "GET", f"/api/connections/username/{who[0]}").json() or None,
                 timeout=T, what="the user's connection listed")
        # another non-administrator may not; the user itself or an administrator may
        assert api(node, "DELETE", f"/api/connections/username/{who[0]}", auth=other).status_code == 403
        r = api(node, "DELETE", f"/api/connections/username/{who[0]}", headers={"X-Reason": "bye"})
        assert r.status_code == 204

        why: list[str] = []

        def closed() -> bool:
            try:
                mine.process_data_events(0)
            except pika.exceptions.ConnectionClosedByBroker as exc:  # the broker's close
                why.append(str(exc))
            return mine.is_closed
        wait_for(closed, timeout=T, what="the user's connection closed by the broker")
        assert why and "320" in why[0] and "bye" in why[0], why
        assert api(node, "GET", f"/api/connections/username/{who[0]}").json() == []
        theirs.process_data_events(0)
        assert theirs.is_open  # another user's connection stays
        assert api(node, "DELETE", f"/api/connections/username/{who[0]}").status_code == 204  # none: still 204
    finally:
        for c in (mine, theirs):
            if c.is_open:
                c.close()


def test_listener_and_service_health_checks(node: NodeProcess) -> None:
    ok = {"status": "ok"}
    r = api(node, "GET", f"/api/health/checks/port-listener/{node.amqp_port}")
    assert r.status_code == 200 and r.json() == {"status": "ok", "port": node.amqp_port}
    r = api(node, "GET", "/api/health/checks/port-listener/1")
    assert r.status_code == 503 and r.json()["missing"] == 1
    assert node.amqp_port in r.json()["ports"]
    assert api(node, "GET", "/api/health/checks/port-listener/abc").status_code == 400
    r = api(node, "GET", "/api/health/checks/protocol-listener/amqp091,http")
    assert r.status_code == 200 and "amqp" in r.json()["protocols"]
    r = api(node, "GET", "/api/health/checks/protocol-listener/amqp,mqtt")
    assert r.status_code == 503 and r.json()["missing"] == ["mqtt"]
    for check in ("is-in-service", "metadata-store/initialized",
                  "metadata-store/initialized/with-data"):
        r = api(node, "GET", f"/api/health/checks/{check}")
        assert (r.status_code, r.json()) == (200, ok), check
    assert api(node, "GET", "/api/health/checks/is-in-service", auth=None).status_code == 401


def test_reached_target_cluster_size_fails_while_fewer_members_are_online(
        node: NodeProcess) -> None:
    r = api(node, "GET", "/api/health/checks/reached-target-cluster-size")
    assert r.status_code == 503
    assert r.json() == {"status": "failed", "reason": "target cluster size not reached: 1 of "
                        f"{TARGET_SIZE} nodes are online", "online": 1, "target": TARGET_SIZE}


def test_connection_limit_health_checks_fail_at_max_connections(node: NodeProcess) -> None:
    def answer(check: str) -> tuple[int, str]:
        r = api(node, "GET", f"/api/health/checks/{check}")
        return r.status_code, r.json()["status"]
    assert answer("below-node-connection-limit") == (200, "ok")
    assert answer("ready-to-serve-clients") == (200, "ok")
    conns = [amqp(node) for _ in range(MAX_CONNECTIONS)]
    try:
        assert answer("below-node-connection-limit") == (503, "failed")
        r = api(node, "GET", "/api/health/checks/ready-to-serve-clients")
        assert r.status_code == 503 and r.json() == {
            "status": "failed", "reason": "node connection limit is reached",
            "connections": MAX_CONNECTIONS}
    finally:
        for c in conns:
            c.close()
    wait_for(lambda: answer("below-node-connection-limit") == (200, "ok"), timeout=T,
             what="the closed connections no longer counted")


def test_rebalance_queues_is_an_accepted_no_op_for_administrators(node: NodeProcess) -> None:
    assert api(node, "POST", "/api/rebalance/queues").status_code == 204
    assert api(node, "POST", "/api/rebalance/queues",
               auth=user(node, "monitoring")).status_code == 403
    assert api(node, "GET", "/api/rebalance/queues").status_code == 405


def test_hash_password_answers_a_rabbitmq_sha256_hash_a_user_can_log_in_with(
        node: NodeProcess) -> None:
    r = api(node, "GET", "/api/auth/hash_password/s3cret")
    assert r.status_code == 200 and set(r.json()) == {"ok"}
    digest = r.json()["ok"]
    assert check_password(digest, "s3cret") and not check_password(digest, "other")
    assert api(node, "GET", "/api/auth/hash_password/s3cret").json()["ok"] != digest  # salted
    name = uniq("hashed")
    assert api(node, "PUT", f"/api/users/{name}",
               json={"password_hash": digest, "tags": "management"}).status_code == 201
    assert api(node, "GET", "/api/whoami", auth=(name, "s3cret")).json()["name"] == name
    assert api(node, "GET", "/api/auth/hash_password/x",
               auth=user(node, "monitoring")).status_code == 403


def test_quorum_queues_without_elected_leaders_ok_while_a_leader_serves(
        node: NodeProcess) -> None:
    q = uniq("qq")
    assert api(node, "PUT", f"/api/queues/%2F/{q}",
               json={"durable": True, "arguments": {"x-queue-type": "quorum"}}).status_code == 201
    base = "/api/health/checks/quorum-queues-without-elected-leaders"
    for path in (f"{base}/all-vhosts/", f"{base}/vhost/%2F/", f"{base}/all-vhosts/pattern/^qq",
                 f"{base}/vhost/%2F/pattern/{q}"):
        r = api(node, "GET", path)
        assert (r.status_code, r.json()) == (200, {"status": "ok"}), path
    assert api(node, "GET", f"{base}/vhost/no-such-vhost/").status_code == 404
    assert api(node, "GET", f"{base}/all-vhosts/pattern/(").status_code == 400
