"""RabbitMQ 4.x's fine-grained health checks as decisions (node/http/health_check.py)
and the machine versions listed as feature flags."""
from __future__ import annotations

from node.http import health_check as hc
from node.http.resources.feature_flags import flag_rows

LISTENERS = [{"protocol": "amqp", "ip_address": "127.0.0.1", "port": 5672},
             {"protocol": "clustering", "ip_address": "::", "port": 4400},
             {"protocol": "http", "ip_address": "127.0.0.1", "port": 15672}]


def test_port_listener_ok_for_any_protocol_and_503_with_the_ports_otherwise() -> None:
    assert hc.port_listener(4400, LISTENERS) == (200, {"status": "ok", "port": 4400})
    assert hc.port_listener(5671, LISTENERS) == (503, {
        "status": "failed", "reason": "No active listener", "missing": 5671,
        "ports": [4400, 5672, 15672]})


def test_protocol_listener_normalizes_rabbitmq_aliases_and_lists_the_missing() -> None:
    status, body = hc.protocol_listener("AMQP0-9-1,http", LISTENERS)
    assert status == 200 and body["protocols"] == ["amqp", "clustering", "http"]
    status, body = hc.protocol_listener("amqp091,amqps,mqtt", LISTENERS)
    assert status == 503 and body["missing"] == ["amqp/ssl", "mqtt"]


def test_in_service_needs_a_leader_seen_in_a_majority() -> None:
    assert hc.is_in_service(True, "n1") == hc.OK
    assert hc.is_in_service(False, "n1")[0] == 503
    assert hc.is_in_service(True, None)[0] == 503


def test_connection_limit_zero_is_none() -> None:
    assert hc.below_connection_limit(10_000, 0) == hc.OK
    assert hc.below_connection_limit(4, 5) == hc.OK
    assert hc.below_connection_limit(5, 5) == (503, {
        "status": "failed", "reason": "node connection limit is reached"})


def test_ready_to_serve_clients_in_rabbitmq_order() -> None:
    assert hc.ready_to_serve_clients(True, "n1", LISTENERS, 0, 5) == hc.OK
    assert hc.ready_to_serve_clients(False, None, LISTENERS, 0, 5)[1]["reason"] == \
        "the rabbit node is not currently available to serve"
    assert hc.ready_to_serve_clients(True, "n1", LISTENERS[1:], 0, 5)[1]["reason"] == \
        "no active listeners for AMQP/AMQPS"
    tls_only = [{"protocol": "amqp/ssl", "ip_address": "::", "port": 5671}]
    assert hc.ready_to_serve_clients(True, "n1", tls_only, 0, 0) == hc.OK
    assert hc.ready_to_serve_clients(True, "n1", LISTENERS, 5, 5) == (503, {
        "status": "failed", "reason": "node connection limit is reached", "connections": 5})


def test_metadata_store_initialized_once_an_entry_is_applied() -> None:
    assert hc.metadata_store_initialized(None)[0] == 503
    assert hc.metadata_store_initialized(0)[0] == 503
    assert hc.metadata_store_initialized(3) == hc.OK
    assert hc.metadata_store_with_data(3, 1) == hc.OK
    assert hc.metadata_store_with_data(3, 0)[0] == 503


def test_target_cluster_size_is_reached_once_enough_members_are_online() -> None:
    assert hc.reached_target_cluster_size(1, 1) == hc.OK
    assert hc.reached_target_cluster_size(3, 2) == hc.OK
    assert hc.reached_target_cluster_size(1, 3) == (503, {
        "status": "failed", "reason": "target cluster size not reached: 1 of 3 nodes are online",
        "online": 1, "target": 3})


def test_machine_versions_listed_as_flags_enabled_up_to_the_clusters() -> None:
    rows = flag_rows(cluster_version=3, runs_version=4)
    assert [r["name"] for r in rows] == [f"mirrorq_machine_version_{v}" for v in (1, 2, 3, 4)]
    assert [r["state"] for r in rows] == ["enabled", "enabled", "enabled", "disabled"]
    assert set(rows[0]) == {"name", "desc", "doc_url", "stability", "provided_by", "state"}


def test_quorum_queues_lack_a_leader_only_while_the_node_is_not_serving() -> None:
    assert hc.quorum_queues_without_leader(True, [("/", "qq")]) == hc.OK
    assert hc.quorum_queues_without_leader(False, []) == hc.OK
    assert hc.quorum_queues_without_leader(False, [("/", "qq")]) == (503, {
        "status": "failed", "reason": "Detected quorum queues without an elected leader",
        "queues": [{"readable_name": "queue 'qq' in vhost '/'", "name": "qq",
                    "virtual_host": "/", "type": "rabbit_quorum_queue"}]})
