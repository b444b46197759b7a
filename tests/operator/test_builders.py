"""Pure tests of the manifest builders' key fields."""
from __future__ import annotations

import base64

from mirrorq_operator.builders import (
    build_all,
    build_client_service,
    build_configmap,
    build_headless_service,
    build_network_policy,
    build_pdb,
    build_raft_secret,
    build_statefulset,
    raft_secret_name,
)
from mirrorq_operator.model import Spec

SPEC = Spec.from_cr({"replicas": 3, "image": "mirrorq:1.2.3",
                     "resources": {"requests": {"cpu": "500m"}},
                     "persistence": {"storageClassName": "fast", "size": "20Gi"},
                     "service": {"type": "LoadBalancer"}, "tls": {"secretName": "mq-tls"},
                     "config": {"frame_max": 131072, "heartbeat": 30}})


def ports(container_or_spec: dict) -> dict[str, int]:
    return {p["name"]: p.get("containerPort", p.get("port")) for p in container_or_spec["ports"]}


def test_statefulset():
    sts = build_statefulset(SPEC, "mq", "ns1")
    assert sts["kind"] == "StatefulSet" and sts["metadata"]["namespace"] == "ns1"
    s = sts["spec"]
    assert s["replicas"] == 3 and s["serviceName"] == "mq-headless"
    assert s["podManagementPolicy"] == "Parallel"
    assert s["selector"]["matchLabels"] == s["template"]["metadata"]["labels"]
    pod = s["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert "podAntiAffinity" in pod["affinity"]
    (c,) = pod["containers"]
    assert c["image"] == "mirrorq:1.2.3"
    assert ports(c) == {"amqp": 5672, "raft": 25672, "admin": 15672, "metrics": 15692}
    assert c["resources"] == {"requests": {"cpu": "500m"}}
    assert c["readinessProbe"] and c["livenessProbe"]
    assert {"name": "tls", "secret": {"secretName": "mq-tls"}} in pod["volumes"]
    (claim,) = s["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert build_statefulset(SPEC, "mq", "ns1", replicas=4)["spec"]["replicas"] == 4


def test_services():
    h = build_headless_service(SPEC, "mq", "ns1")
    assert h["metadata"]["name"] == "mq-headless"
    assert h["spec"]["clusterIP"] == "None" and h["spec"]["publishNotReadyAddresses"] is True
    assert ports(h["spec"])["raft"] == 25672
    c = build_client_service(SPEC, "mq", "ns1")
    assert c["spec"]["type"] == "LoadBalancer"
    assert ports(c["spec"]) == {"amqp": 5672, "metrics": 15692}
    sel = build_statefulset(SPEC, "mq", "ns1")["spec"]["selector"]["matchLabels"]
    assert h["spec"]["selector"] == sel == c["spec"]["selector"]


def test_pdb_and_network_policy():
    pdb = build_pdb(SPEC, "mq", "ns1")
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 1
    np = build_network_policy(SPEC, "mq", "ns1")
    raft_rules = [r for r in np["spec"]["ingress"]
                  if any(p["port"] == 25672 for p in r.get("ports", []))]
    assert len(raft_rules) == 1
    assert raft_rules[0]["from"] == [{"podSelector": {"matchLabels": np["spec"]["podSelector"]
                                                      ["matchLabels"]}}]


def test_configmap():
    cm = build_configmap(SPEC, "mq", "ns1")
    assert cm["data"]["members"].split() == ["mq-0", "mq-1", "mq-2"]
    assert cm["data"]["formed"] == "false"
    assert "frame_max = 131072" in cm["data"]["mirrorq.toml"]
    assert "--join" in cm["data"]["start.sh"]
    assert build_configmap(SPEC, "mq", "ns1", ["mq-0"], True)["data"]["formed"] == "true"


def test_build_all_is_pure_and_complete():
    kinds = [m["kind"] for m in build_all(SPEC, "mq", "ns1")]
    assert sorted(kinds) == sorted(["ConfigMap", "Service", "Service", "PodDisruptionBudget",
                                    "NetworkPolicy", "StatefulSet"])
    assert build_all(SPEC, "mq", "ns1") == build_all(SPEC, "mq", "ns1")


def test_raft_password_comes_from_a_secret_never_the_configmap():
    sec = build_raft_secret("mq", "ns1", "s3cret")
    assert sec["kind"] == "Secret" and sec["metadata"]["name"] == raft_secret_name("mq") == "mq-raft"
    assert base64.b64decode(sec["data"]["raft-password"]) == b"s3cret"
    (c,) = build_statefulset(SPEC, "mq", "ns1")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MIRRORQ_RAFT_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "mq-raft", "key": "raft-password"}
    cm = build_configmap(SPEC, "mq", "ns1")
    assert "password" not in cm["data"]["mirrorq.toml"] and "s3cret" not in str(build_all(SPEC, "mq", "ns1"))
