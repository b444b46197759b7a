"""Pure tests of the manifest builders' key fields."""
from __future__ import annotations

import base64
import tomllib

from mirrorq_operator.builders import (
    CONFIG_DIR,
    RAFT_TLS_DIR,
    RAFT_TLS_VOLUME,
    build_all,
    build_client_service,
    build_configmap,
    build_headless_service,
    build_network_policy,
    build_pdb,
    build_raft_secret,
    build_statefulset,
    pdb_api_version,
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


RAFT_TLS_SPEC = Spec.from_cr({"replicas": 3, "image": "mirrorq:1.2.3",
                              "raftTls": {"secretName": "mq-raft-tls"},
                              "config": {"heartbeat": 30}})


def _pod(spec: Spec) -> dict:
    return build_statefulset(spec, "mq", "ns1")["spec"]["template"]["spec"]


def _raft_table(spec: Spec) -> dict:
    return tomllib.loads(build_configmap(spec, "mq", "ns1")["data"]["mirrorq.toml"]).get("raft", {})


def test_raft_tls_secret_is_mounted_and_configured_only_when_set():
    # off (the default): no volume, no mount, no [raft] tls_* keys
    for spec in (SPEC, Spec.from_cr({"replicas": 3})):
        pod = _pod(spec)
        assert RAFT_TLS_VOLUME not in {v["name"] for v in pod["volumes"]}
        assert RAFT_TLS_VOLUME not in {m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert not any(k.startswith("tls_") for k in _raft_table(spec))
        assert "tls_" not in build_configmap(spec, "mq", "ns1")["data"]["mirrorq.toml"]
    # on: the Secret's three keys, read-only, and [raft] names them
    pod = _pod(RAFT_TLS_SPEC)
    (vol,) = [v for v in pod["volumes"] if v["name"] == RAFT_TLS_VOLUME]
    assert vol["secret"]["secretName"] == "mq-raft-tls"
    assert {i["key"]: i["path"] for i in vol["secret"]["items"]} == {
        "tls.crt": "tls.crt", "tls.key": "tls.key", "ca.crt": "ca.crt"}
    assert vol["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"]
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == RAFT_TLS_VOLUME]
    assert mount == {"name": RAFT_TLS_VOLUME, "mountPath": "/etc/mirrorq-raft-tls", "readOnly": True}
    # not under the ConfigMap's mount (a mount point cannot be made inside it)
    assert not mount["mountPath"].startswith(CONFIG_DIR + "/")
    assert _raft_table(RAFT_TLS_SPEC) == {"tls_cert": "/etc/mirrorq-raft-tls/tls.crt",
                                          "tls_key": "/etc/mirrorq-raft-tls/tls.key",
                                          "tls_ca": "/etc/mirrorq-raft-tls/ca.crt"}
    toml = tomllib.loads(build_configmap(RAFT_TLS_SPEC, "mq", "ns1")["data"]["mirrorq.toml"])
    assert toml["heartbeat"] == 30  # the rest of the config is kept
    # the password still comes from the operator's Secret (it authenticates the link too)
    env = {e["name"]: e for e in c["env"]}
    assert env["MIRRORQ_RAFT_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "mq-raft"
    # the AMQPS `tls` Secret and the Raft one are separate volumes
    both = _pod(Spec.from_cr({"tls": {"secretName": "mq-tls"}, "raftTls": {"secretName": "mq-raft-tls"}}))
    assert {"tls", RAFT_TLS_VOLUME} <= {v["name"] for v in both["volumes"]}
    assert build_all(RAFT_TLS_SPEC, "mq", "ns1") == build_all(RAFT_TLS_SPEC, "mq", "ns1")


def test_raft_tls_config_loads_in_the_node_with_cert_manager_file_names(tmp_path):
    """The node reads the rendered mirrorq.toml, and the files named there, laid out
    as a kubernetes.io/tls Secret with ca.crt, make working TLS contexts."""
    from node.app.config import NodeConfig, apply_file, check_cluster_password
    from node.app.pki import make_ca, make_member

    make_ca(tmp_path / "ca")
    cert, key = make_member(tmp_path / "ca", "member", ["127.0.0.1"])
    secret_dir = tmp_path / "raft-tls"
    secret_dir.mkdir()
    for src, name in ((cert, "tls.crt"), (key, "tls.key"), (tmp_path / "ca" / "ca.pem", "ca.crt")):
        (secret_dir / name).write_bytes(src.read_bytes())
    text = build_configmap(RAFT_TLS_SPEC, "mq", "ns1")["data"]["mirrorq.toml"]
    path = tmp_path / "mirrorq.toml"
    path.write_text(text.replace(RAFT_TLS_DIR, str(secret_dir)))
    cfg = NodeConfig(node_id="mq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    assert (cfg.raft.tls_cert, cfg.raft.tls_key, cfg.raft.tls_ca) == (
        str(secret_dir / "tls.crt"), str(secret_dir / "tls.key"), str(secret_dir / "ca.crt"))
    cfg.raft.peers = {"mq-1": "127.0.0.1:25673"}
    check_cluster_password(cfg)  # TLS alone satisfies it, and the files load


def test_pdb_api_version_follows_discovery():
    """Issue 13: policy/v1 exists from Kubernetes 1.21; 1.20 serves only v1beta1."""
    assert pdb_api_version(["v1", "apps/v1", "policy/v1", "policy/v1beta1"]) == "policy/v1"
    assert pdb_api_version(["v1", "apps/v1", "policy/v1beta1"]) == "policy/v1beta1"
    assert pdb_api_version(["v1", "apps/v1"]) is None
    old = build_all(SPEC, "mq", "ns1", "policy/v1beta1")
    assert [m["apiVersion"] for m in old if m["kind"] == "PodDisruptionBudget"] == ["policy/v1beta1"]
    none = build_all(SPEC, "mq", "ns1", None)
    assert "PodDisruptionBudget" not in [m["kind"] for m in none]
    assert none[-1]["kind"] == "StatefulSet"  # still made, and last


def test_string_config_values_become_the_numbers_the_node_reads(tmp_path):
    """The CRD types spec.config values as strings ("30"); the node refuses a
    quoted number, so keys it reads as numbers are written as TOML numbers
    (issue 13's known bug), and the node's own config code loads the result."""
    from node.app.config import NodeConfig, apply_file, validate

    spec = Spec.from_cr({"replicas": 3, "config": {
        "heartbeat": "30", "frame_max": "131072", "raft.election_min": "1.5",
        "raft.election_max": "3", "raft.out_of_sync_after": "6.0"}})
    text = build_configmap(spec, "mq", "ns1")["data"]["mirrorq.toml"]
    assert tomllib.loads(text)["raft"]["election_min"] == 1.5
    path = tmp_path / "mirrorq.toml"
    path.write_text(text)
    cfg = NodeConfig(node_id="mq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    validate(cfg)
    assert (cfg.wire.heartbeat, cfg.wire.frame_max) == (30, 131072)
    assert (cfg.raft.election_min, cfg.raft.election_max, cfg.raft.out_of_sync_after) == (1.5, 3, 6.0)
    # not a number where the node wants one: left quoted, so the node names the key
    bad = build_configmap(Spec.from_cr({"replicas": 3, "config": {"heartbeat": "often"}}), "mq", "ns1")
    assert 'heartbeat = "often"' in bad["data"]["mirrorq.toml"]
