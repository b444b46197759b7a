"""The management routes that needed replicated cluster metadata (issue 28,
machine version 6), against a real node over HTTP: PUT /api/cluster-name,
PUT/DELETE /api/global-parameters/{name}, a vhost's deletion protection
(/api/vhosts/{vhost}/deletion/protection: a protected vhost refuses DELETE
with RabbitMQ's 412), the definitions export/import of both, DELETE
/api/reset[/{node}], the state after a snapshot and kill -9, and a node
held at machine version 5 refusing the new changes (503)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.replication.machine.version import CLUSTER_METADATA, MACHINE_VERSION
from tests.broker_proc import NodeProcess, node_metric, start_http_node, uniq, wait_for
from tests.support.http_api import T, api, user

pytestmark = pytest.mark.own_node


def _at_version(n: NodeProcess, version: int) -> None:
    wait_for(lambda: api(n, "GET", "/api/overview").json()["mirrorq"]["machine_version"]
             == version, timeout=T, what=f"machine version {version}")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("cluster-metadata") / "n1",
                        config="[raft]\ncompaction_min_entries = 40\n")
    try:
        _at_version(n, MACHINE_VERSION)
        yield n
    finally:
        n.stop()


def _derived(node: NodeProcess) -> str:
    return f"mirrorq@{api(node, 'GET', '/api/overview').json()['node']}"


def test_put_cluster_name_sets_the_replicated_name_for_administrators(
        node: NodeProcess) -> None:
    derived = _derived(node)
    assert api(node, "GET", "/api/cluster-name").json() == {"name": derived}
    mgmt = user(node, "management")
    assert api(node, "PUT", "/api/cluster-name", auth=mgmt,
               json={"name": "x"}).status_code == 403
    r = api(node, "PUT", "/api/cluster-name", json={})
    assert r.status_code == 400 and "key_missing" in r.json()["reason"]
    assert api(node, "PUT", "/api/cluster-name", json={"name": 7}).status_code == 400
    r = api(node, "PUT", "/api/cluster-name", json={"name": "prod-eu"})
    assert r.status_code == 204, r.text
    assert api(node, "GET", "/api/cluster-name").json() == {"name": "prod-eu"}
    assert api(node, "GET", "/api/overview").json()["cluster_name"] == "prod-eu"
    assert {"name": "cluster_name", "value": "prod-eu"} in \
        api(node, "GET", "/api/global-parameters").json()
    # the name is the global parameter "cluster_name": clearing it brings the derived name back
    assert api(node, "DELETE", "/api/global-parameters/cluster_name").status_code == 204
    assert api(node, "GET", "/api/cluster-name").json() == {"name": derived}
    assert api(node, "DELETE", "/api/global-parameters/cluster_name").status_code == 404


def test_global_parameters_are_created_201_replaced_204_and_deleted(node: NodeProcess) -> None:
    name = uniq("gp")
    value = {"nested": {"list": [1, 2.5, "s", True, None]}, "n": 2 ** 62}
    r = api(node, "PUT", f"/api/global-parameters/{name}", json={"value": value})
    assert r.status_code == 201, r.text
    assert api(node, "GET", f"/api/global-parameters/{name}").json() == {
        "name": name, "value": value}
    assert api(node, "PUT", f"/api/global-parameters/{name}",
               json={"value": None}).status_code == 204
    assert api(node, "GET", f"/api/global-parameters/{name}").json()["value"] is None
    r = api(node, "PUT", f"/api/global-parameters/{name}", json={"other": 1})
    assert r.status_code == 400 and r.json()["reason"] == "key_missing: value"
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    r = api(node, "PUT", f"/api/global-parameters/{name}", json={"value": deep})
    assert r.status_code == 400 and "nested" in r.json()["reason"]
    # RabbitMQ's is_authorized_global_parameters: policymakers
    mgmt = user(node, "management")
    assert api(node, "PUT", f"/api/global-parameters/{name}", auth=mgmt,
               json={"value": 1}).status_code == 403
    assert api(node, "DELETE", f"/api/global-parameters/{name}", auth=mgmt).status_code == 403
    pm = user(node, "policymaker")
    assert api(node, "PUT", f"/api/global-parameters/{name}", auth=pm,
               json={"value": "pm"}).status_code == 204
    assert api(node, "DELETE", f"/api/global-parameters/{name}").status_code == 204
    assert api(node, "GET", f"/api/global-parameters/{name}").status_code == 404
    assert api(node, "DELETE", f"/api/global-parameters/{name}").status_code == 404


def test_a_protected_vhost_refuses_delete_with_412_until_the_protection_is_lifted(
        node: NodeProcess) -> None:
    v = uniq("v")
    path = f"/api/vhosts/{v}/deletion/protection"
    assert api(node, "PUT", f"/api/vhosts/{v}").status_code == 201
    assert api(node, "GET", f"/api/vhosts/{v}").json()["protected_from_deletion"] is False
    assert api(node, "POST", path, auth=user(node, "policymaker")).status_code == 403
    assert api(node, "POST", path).status_code == 204
    assert api(node, "POST", path).status_code == 204  # again: no error
    assert api(node, "GET", path).json() == {"name": v, "protected_from_deletion": True}
    row = api(node, "GET", f"/api/vhosts/{v}").json()
    assert row["protected_from_deletion"] is True
    assert row["metadata"]["protected_from_deletion"] is True
    r = api(node, "DELETE", f"/api/vhosts/{v}")
    assert r.status_code == 412, r.text
    assert r.json() == {"error": "precondition_failed",
                        "reason": f"Refusing to delete virtual host '{v}' because it is "
                                  "protected from deletion"}
    assert api(node, "GET", f"/api/vhosts/{v}").status_code == 200  # still there
    assert api(node, "DELETE", path).status_code == 204
    assert api(node, "GET", path).json()["protected_from_deletion"] is False
    assert api(node, "DELETE", f"/api/vhosts/{v}").status_code == 204
    # an unknown vhost: 404, POST with RabbitMQ's text
    r = api(node, "POST", path)
    assert r.status_code == 404 and r.json()["reason"] == (
        f"Cannot enable deletion protection of virtual host '{v}' because it does not exist")
    assert api(node, "DELETE", path).status_code == 404
    assert api(node, "GET", path).status_code == 404


def test_definitions_carry_global_parameters_and_protection_and_import_restores_them(
        node: NodeProcess) -> None:
    v, name = uniq("v"), uniq("gp")
    assert api(node, "PUT", f"/api/vhosts/{v}").status_code == 201
    assert api(node, "POST", f"/api/vhosts/{v}/deletion/protection").status_code == 204
    assert api(node, "PUT", f"/api/global-parameters/{name}",
               json={"value": {"k": [1]}}).status_code == 201
    assert api(node, "PUT", "/api/global-parameters/internal_x",
               json={"value": 1}).status_code in (201, 204)
    d = api(node, "GET", "/api/definitions").json()
    assert {"name": name, "value": {"k": [1]}} in d["global_parameters"]
    assert not any(p["name"].startswith("internal") for p in d["global_parameters"])
    by_name = {x["name"]: x for x in d["vhosts"]}
    assert by_name[v]["metadata"]["protected_from_deletion"] is True
    assert "protected_from_deletion" not in by_name["/"]["metadata"]
    # forget both, import the export: back as they were
    assert api(node, "DELETE", f"/api/global-parameters/{name}").status_code == 204
    assert api(node, "DELETE", f"/api/vhosts/{v}/deletion/protection").status_code == 204
    assert api(node, "DELETE", f"/api/vhosts/{v}").status_code == 204
    r = api(node, "POST", "/api/definitions", json=d)
    assert r.status_code == 204, r.text
    assert api(node, "GET", f"/api/global-parameters/{name}").json()["value"] == {"k": [1]}
    assert api(node, "GET", f"/api/vhosts/{v}").json()["protected_from_deletion"] is True
    assert api(node, "DELETE", f"/api/vhosts/{v}").status_code == 412


def _published(node: NodeProcess, q: str) -> int:
    stats = api(node, "GET", f"/api/queues/%2F/{q}").json().get("message_stats") or {}
    return int(stats.get("publish", 0))


def test_reset_makes_the_statistics_start_over(node: NodeProcess) -> None:
    q = uniq("q")
    assert api(node, "PUT", f"/api/queues/%2F/{q}", json={"durable": True}).status_code == 201

    def publish(n: int) -> None:
        for _ in range(n):
            r = api(node, "POST", "/api/exchanges/%2F/amq.default/publish",
                     json={"properties": {}, "routing_key": q, "payload": "x",
                           "payload_encoding": "string"})
            assert r.json() == {"routed": True}
    publish(3)
    assert _published(node, q) == 3
    assert api(node, "DELETE", "/api/reset", auth=user(node, "monitoring")).status_code == 403
    assert api(node, "DELETE", "/api/reset").status_code == 204
    assert _published(node, q) == 0
    publish(2)
    assert _published(node, q) == 2
    me = api(node, "GET", "/api/overview").json()["node"]
    assert api(node, "DELETE", f"/api/reset/{me}").status_code == 204
    assert _published(node, q) == 0
    assert api(node, "DELETE", "/api/reset/no-such-node").status_code == 404
    assert api(node, "GET", "/api/reset").status_code == 405


def test_cluster_metadata_survives_a_snapshot_and_kill9(node: NodeProcess) -> None:
    v = uniq("v")
    assert api(node, "PUT", "/api/cluster-name", json={"name": "kept"}).status_code == 204
    assert api(node, "PUT", f"/api/vhosts/{v}").status_code == 201
    assert api(node, "POST", f"/api/vhosts/{v}/deletion/protection").status_code == 204
    before = node_metric(node, "snapshots_total") or 0
    name = uniq("gp")
    i = 0

    def snapshot_taken() -> bool:
        nonlocal i
        i += 1  # one Raft entry each
        assert api(node, "PUT", f"/api/global-parameters/{name}",
                   json={"value": i}).status_code in (201, 204)
        return (node_metric(node, "snapshots_total") or 0) > before
    wait_for(snapshot_taken, timeout=T, what="a snapshot")
    node.kill9()
    node.start()
    wait_for(lambda: api(node, "GET", "/api/cluster-name").status_code == 200, timeout=T,
             what="the HTTP API after the restart")
    assert api(node, "GET", "/api/cluster-name").json() == {"name": "kept"}
    assert api(node, "GET", f"/api/global-parameters/{name}").json()["value"] == i
    assert api(node, "DELETE", f"/api/vhosts/{v}").status_code == 412
    assert api(node, "DELETE", "/api/global-parameters/cluster_name").status_code == 204


def test_reached_target_cluster_size_is_ok_with_the_default_hint_of_one(
        node: NodeProcess) -> None:
    assert api(node, "GET", "/api/health/checks/reached-target-cluster-size").json() == {
        "status": "ok"}


def test_at_machine_version_5_the_changes_are_refused_with_503(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node running as a version-5 build (the rolling upgrade's test hook)
    proposes no record a version-5 member cannot decode."""
    monkeypatch.setenv("MIRRORQ_MACHINE_VERSION", str(CLUSTER_METADATA - 1))
    n = start_http_node(tmp_path / "n1")
    try:
        _at_version(n, CLUSTER_METADATA - 1)
        r = api(n, "PUT", "/api/cluster-name", json={"name": "x"})
        assert r.status_code == 503 and f"machine version {CLUSTER_METADATA}" in \
            r.json()["reason"], r.text
        assert api(n, "PUT", "/api/global-parameters/p", json={"value": 1}).status_code == 503
        assert api(n, "POST", "/api/vhosts/%2F/deletion/protection").status_code == 503
        # lifting a protection that is not there asks nothing of the log
        assert api(n, "DELETE", "/api/vhosts/%2F/deletion/protection").status_code == 204
        assert api(n, "GET", "/api/cluster-name").json()["name"].startswith("mirrorq@")
    finally:
        n.stop()
