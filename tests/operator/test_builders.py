"""Pure tests of the manifest builders' key fields."""
from __future__ import annotations

import base64
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from mirrorq_operator.builders import (
    CONFIG_DIR,
    RAFT_TLS_DIR,
    RAFT_TLS_VOLUME,
    READY_PROBE,
    START_SCRIPT,
    TLS_DIR,
    auth_secret_name,
    build_all,
    build_client_service,
    build_configmap,
    build_default_user_secret,
    build_headless_service,
    build_metrics_service,
    build_network_policy,
    build_pdb,
    build_raft_secret,
    build_statefulset,
    pdb_api_version,
    raft_secret_name,
)
from mirrorq_operator.model import Spec, SpecError

from tests.support.admin_tls import with_admin_tls_files

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
    assert pod["terminationGracePeriodSeconds"] == 120  # the default
    (c,) = pod["containers"]
    assert c["image"] == "mirrorq:1.2.3"
    # spec.tls: management over HTTPS only (15671), no plain 15672
    assert ports(c) == {"amqp": 5672, "amqps": 5671, "raft": 25672, "admin": 15682,
                        "metrics": 15692, "management-tls": 15671}
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
    # no metrics on the client Service (issue 26): NAME-metrics carries it
    assert ports(c["spec"]) == {"amqp": 5672, "amqps": 5671, "management-tls": 15671}
    plain = Spec.from_cr({"replicas": 3})  # no spec.tls: no amqps anywhere
    assert ports(build_client_service(plain, "mq", "ns1")["spec"]) == {
        "amqp": 5672, "management": 15672}
    assert "amqps" not in ports(_pod(plain)["containers"][0])
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
    open_ports = {p["port"] for r in np["spec"]["ingress"] if "from" not in r for p in r["ports"]}
    assert open_ports == {5672, 5671, 15671}  # amqps and HTTPS with spec.tls; not metrics
    plain = build_network_policy(Spec.from_cr({}), "mq", "ns1")
    assert {p["port"] for r in plain["spec"]["ingress"] if "from" not in r
            for p in r["ports"]} == {5672, 15672}


def _rule(np: dict, port: int) -> dict:
    (rule,) = [r for r in np["spec"]["ingress"] if any(p["port"] == port for p in r["ports"])]
    return rule


def test_network_policy_limits_metrics_and_admin():
    """Issue 26 item 11: metrics only from Prometheus (default: its pods' label,
    any namespace), admin only from the members and the operator; both
    configurable, as is where clients may come from; off with enabled: false."""
    np = build_network_policy(SPEC, "mq", "ns1")
    members = {"podSelector": {"matchLabels": np["spec"]["podSelector"]["matchLabels"]}}
    assert np["spec"]["policyTypes"] == ["Ingress"]
    assert _rule(np, 15692)["from"] == [{"namespaceSelector": {}, "podSelector": {
        "matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    assert _rule(np, 15682)["from"] == [members, {"namespaceSelector": {}, "podSelector": {
        "matchLabels": {"app.kubernetes.io/name": "mirrorq-operator"}}}]
    assert _rule(np, 25672)["from"] == [members]
    # every port a container opens is in exactly one rule
    opened = set(ports(_pod(SPEC)["containers"][0]).values())
    ruled = [p["port"] for r in np["spec"]["ingress"] for p in r["ports"]]
    assert sorted(ruled) == sorted(opened)

    prom = {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}
    lan = {"ipBlock": {"cidr": "10.1.0.0/16"}}
    op = {"podSelector": {"matchLabels": {"app": "my-operator"}}}
    custom = Spec.from_cr({"networkPolicy": {"metricsFrom": [prom], "clientFrom": [lan],
                                             "adminFrom": [op]}})
    np = build_network_policy(custom, "mq", "ns1")
    assert _rule(np, 15692)["from"] == [prom]
    assert _rule(np, 15682)["from"] == [members, op]
    assert _rule(np, 5672)["from"] == [lan] and _rule(np, 15672)["from"] == [lan]
    assert _rule(np, 25672)["from"] == [members]  # never configurable

    off = Spec.from_cr({"networkPolicy": {"enabled": False}})
    assert "NetworkPolicy" not in [m["kind"] for m in build_all(off, "mq", "ns1")]
    for bad in ({"enabled": "no"}, {"metricsFrom": []}, {"metricsFrom": [{"pods": {}}]},
                {"clientFrom": "anywhere"}):
        with pytest.raises(SpecError, match="spec.networkPolicy"):
            Spec.from_cr({"networkPolicy": bad})


def test_metrics_service_is_separate_and_headless():
    m = build_metrics_service(Spec.from_cr({"service": {"type": "LoadBalancer"}}), "mq", "ns1")
    assert m["metadata"]["name"] == "mq-metrics"
    assert m["spec"]["clusterIP"] == "None" and "type" not in m["spec"]
    assert ports(m["spec"]) == {"metrics": 15692}
    # the ServiceMonitor's selector (the chart's): only this Service has the component label
    assert m["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
    assert m["spec"]["selector"] == build_client_service(SPEC, "mq", "ns1")["spec"]["selector"]
    for svc in (build_client_service(SPEC, "mq", "ns1"), build_headless_service(SPEC, "mq", "ns1")):
        assert "app.kubernetes.io/component" not in svc["metadata"]["labels"]
        assert 15692 not in ports(svc["spec"]).values()


def test_management_https_with_spec_tls():
    """spec.tls: [http] tls_port 15671 on the amqps Secret's files (the node falls
    back on [tls] cert/key), HTTPS only by default; managementTlsOnly: false keeps
    plain 15672 beside it; without spec.tls, plain HTTP as before."""
    toml = tomllib.loads(build_configmap(SPEC, "mq", "ns1")["data"]["mirrorq.toml"])
    assert toml["http"] == {"tls_port": 15671, "tls_only": True}
    both = Spec.from_cr({"tls": {"secretName": "mq-tls", "managementTlsOnly": False}})
    toml = tomllib.loads(build_configmap(both, "mq", "ns1")["data"]["mirrorq.toml"])
    assert toml["http"] == {"tls_port": 15671, "tls_only": False}
    assert {"management", "management-tls"} <= set(ports(_pod(both)["containers"][0]))
    assert {"management", "management-tls"} <= set(
        ports(build_client_service(both, "mq", "ns1")["spec"]))
    plain = Spec.from_cr({})
    assert "http" not in tomllib.loads(build_configmap(plain, "mq", "ns1")["data"]["mirrorq.toml"])
    assert "management-tls" not in ports(_pod(plain)["containers"][0])
    with pytest.raises(SpecError, match="managementTlsOnly"):
        Spec.from_cr({"tls": {"secretName": "x", "managementTlsOnly": "yes"}})
    with pytest.raises(SpecError, match="http.tls_port"):
        Spec.from_cr({"config": {"http.tls_port": "1"}})


def test_configmap():
    cm = build_configmap(SPEC, "mq", "ns1")
    assert cm["data"]["members"].split() == ["mq-0", "mq-1", "mq-2"]
    assert cm["data"]["formed"] == "false"
    assert "frame_max = 131072" in cm["data"]["mirrorq.toml"]
    assert "--join" in cm["data"]["start.sh"]
    assert build_configmap(SPEC, "mq", "ns1", ["mq-0"], True)["data"]["formed"] == "true"


def test_admin_listens_on_the_pod_ip_with_the_token_from_the_secret():
    """Issue 26 item 4: a node's admin port defaults to loopback, which the operator
    (and the probes) could not reach: the pod's own IP, from the downward API; the
    token comes from the environment (the auth Secret), never from argv."""
    script = build_configmap(SPEC, "mq", "ns1")["data"]["start.sh"]
    assert '--admin-port 15682 --admin-listen "${POD_IP:-0.0.0.0}"' in script
    assert "--admin-token" not in script and "--token" not in script
    env = _env(SPEC)
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["MIRRORQ_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "admin-token"


def test_build_all_is_pure_and_complete():
    kinds = [m["kind"] for m in build_all(SPEC, "mq", "ns1")]
    assert sorted(kinds) == sorted(["ConfigMap", "Service", "Service", "Service",
                                    "PodDisruptionBudget", "NetworkPolicy", "StatefulSet"])
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
        assert "raft.tls_" not in build_configmap(spec, "mq", "ns1")["data"]["mirrorq.toml"]
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
    from node.app.config import NodeConfig, check_cluster_password
    from node.app.config_file import apply_file
    from node.app.pki import make_ca, make_member

    make_ca(tmp_path / "ca")
    cert, key = make_member(tmp_path / "ca", "member", ["127.0.0.1"])
    secret_dir = tmp_path / "raft-tls"
    secret_dir.mkdir()
    for src, name in ((cert, "tls.crt"), (key, "tls.key"), (tmp_path / "ca" / "ca.pem", "ca.crt")):
        (secret_dir / name).write_bytes(src.read_bytes())
    text = build_configmap(RAFT_TLS_SPEC, "mq", "ns1")["data"]["mirrorq.toml"]
    path = tmp_path / "mirrorq.toml"
    path.write_text(with_admin_tls_files(text.replace(RAFT_TLS_DIR, str(secret_dir)), tmp_path))
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
    from node.app.config import NodeConfig
    from node.app.config_file import apply_file, validate

    spec = Spec.from_cr({"replicas": 3, "config": {
        "heartbeat": "30", "frame_max": "131072", "raft.election_min": "1.5",
        "raft.election_max": "3", "raft.out_of_sync_after": "6.0"}})
    text = build_configmap(spec, "mq", "ns1")["data"]["mirrorq.toml"]
    assert tomllib.loads(text)["raft"]["election_min"] == 1.5
    path = tmp_path / "mirrorq.toml"
    path.write_text(with_admin_tls_files(text, tmp_path))
    cfg = NodeConfig(node_id="mq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    validate(cfg)
    assert (cfg.wire.heartbeat, cfg.wire.frame_max) == (30, 131072)
    assert (cfg.raft.election_min, cfg.raft.election_max, cfg.raft.out_of_sync_after) == (1.5, 3, 6.0)
    # not a number where the node wants one: left quoted, so the node names the key
    bad = build_configmap(Spec.from_cr({"replicas": 3, "config": {"heartbeat": "often"}}), "mq", "ns1")
    assert 'heartbeat = "often"' in bad["data"]["mirrorq.toml"]


# -- credentials (spec.auth / NAME-default-user), grace period, AMQPS ----------

AUTH_SPEC = Spec.from_cr({"replicas": 3, "auth": {"secretName": "orders-creds"},
                          "terminationGracePeriodSeconds": 300})


def _env(spec: Spec) -> dict[str, dict]:
    (c,) = _pod(spec)["containers"]
    return {e["name"]: e for e in c["env"]}


def test_default_user_secret():
    sec = build_default_user_secret("mq", "ns1", "mirrorq", "pw" * 12, "ab" * 16)
    assert sec["kind"] == "Secret" and sec["type"] == "Opaque"
    assert sec["metadata"]["name"] == "mq-default-user" and sec["metadata"]["namespace"] == "ns1"
    assert {k: base64.b64decode(v).decode() for k, v in sec["data"].items()} == {
        "username": "mirrorq", "password": "pw" * 12, "admin-token": "ab" * 16}
    assert sec == build_default_user_secret("mq", "ns1", "mirrorq", "pw" * 12, "ab" * 16)  # pure
    assert "ownerReferences" not in sec["metadata"]  # kept like the raft Secret
    # not among what build_all makes: kube.py creates it (with random values) only without spec.auth
    assert "Secret" not in [m["kind"] for m in build_all(SPEC, "mq", "ns1")]


def test_auth_secret_name():
    assert auth_secret_name(SPEC, "mq") == "mq-default-user"
    assert auth_secret_name(AUTH_SPEC, "mq") == "orders-creds"


@pytest.mark.parametrize(("spec", "secret"), [(SPEC, "mq-default-user"),
                                              (AUTH_SPEC, "orders-creds")])
def test_credentials_come_from_the_auth_secret(spec, secret):
    env = _env(spec)
    refs = {n: env[n]["valueFrom"]["secretKeyRef"] for n in
            ("MIRRORQ_DEFAULT_USER", "MIRRORQ_DEFAULT_PASS", "MIRRORQ_ADMIN_TOKEN")}
    assert refs == {
        "MIRRORQ_DEFAULT_USER": {"name": secret, "key": "username"},
        "MIRRORQ_DEFAULT_PASS": {"name": secret, "key": "password"},
        "MIRRORQ_ADMIN_TOKEN": {"name": secret, "key": "admin-token", "optional": True}}
    assert env["MIRRORQ_RAFT_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "mq-raft"
    text = build_configmap(spec, "mq", "ns1")["data"]["mirrorq.toml"]
    assert "users" not in text and "token" not in text  # never in the ConfigMap


def test_grace_period_from_the_spec():
    assert _pod(AUTH_SPEC)["terminationGracePeriodSeconds"] == 300
    assert _pod(Spec.from_cr({}))["terminationGracePeriodSeconds"] == 120


def _self_signed(tmp_path: Path) -> tuple[bytes, bytes]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mq.ns1.svc")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("mq.ns1.svc")]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def test_amqps_config_loads_in_the_node_with_the_mounted_secret(tmp_path):
    """spec.tls: mirrorq.toml's [tls] names the mounted kubernetes.io/tls Secret's
    files on port 5671; the node's own config code loads it and the listener's
    TLS context builds from a real key pair."""
    from node.app.config import NodeConfig, check_http_tls, check_tls
    from node.app.config_file import apply_file

    toml = tomllib.loads(build_configmap(SPEC, "mq", "ns1")["data"]["mirrorq.toml"])
    assert toml["tls"] == {"port": 5671, "cert": "/etc/mirrorq-tls/tls.crt",
                           "key": "/etc/mirrorq-tls/tls.key"}
    assert toml["http"] == {"tls_port": 15671, "tls_only": True}
    assert toml["frame_max"] == 131072  # the rest of the config is kept
    (mount,) = [m for m in _pod(SPEC)["containers"][0]["volumeMounts"] if m["name"] == "tls"]
    assert mount["mountPath"] == TLS_DIR == "/etc/mirrorq-tls"
    # off without spec.tls
    assert "tls" not in tomllib.loads(
        build_configmap(RAFT_TLS_SPEC, "mq", "ns1")["data"]["mirrorq.toml"])

    cert, key = _self_signed(tmp_path)
    secret_dir = tmp_path / "tls"
    secret_dir.mkdir()
    (secret_dir / "tls.crt").write_bytes(cert)
    (secret_dir / "tls.key").write_bytes(key)
    text = build_configmap(SPEC, "mq", "ns1")["data"]["mirrorq.toml"]
    path = tmp_path / "mirrorq.toml"
    path.write_text(with_admin_tls_files(text.replace(TLS_DIR, str(secret_dir)), tmp_path))
    cfg = NodeConfig(node_id="mq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    assert (cfg.tls.port, cfg.tls.cert, cfg.tls.key) == (
        5671, str(secret_dir / "tls.crt"), str(secret_dir / "tls.key"))
    check_tls(cfg)
    assert cfg.amqps_context is not None
    # management HTTPS from the same files, and no plain HTTP port (the pod's
    # --http-port 15672 is passed, and ignored)
    cfg.http.port = 15672
    check_http_tls(cfg)
    assert cfg.https_context is not None
    assert (cfg.http.https_port(), cfg.http.plain_port()) == (15671, None)
    assert cfg.http.tls_cert == str(secret_dir / "tls.crt")


def test_ready_probe_passes_the_pods_admin_token(monkeypatch):
    """The probe program (as the pod runs it, one `python -c`) with call_status
    stubbed: it asks its own pod, with $MIRRORQ_ADMIN_TOKEN, and exits 0 when in sync."""
    import node.admin.client as admin

    calls: list[tuple] = []

    def status(host, port, timeout, *, token=None):
        calls.append((host, port, timeout, token))
        return {"in_sync": ["mq-0"], "blocked": False}

    monkeypatch.setattr(admin, "call_status", status)
    monkeypatch.setenv("POD_NAME", "mq-0")
    monkeypatch.setenv("HEADLESS", "mq-headless")
    monkeypatch.setenv("POD_NAMESPACE", "ns1")
    for token, expect in (("t0ken", "t0ken"), ("", None)):
        monkeypatch.setenv("MIRRORQ_ADMIN_TOKEN", token)
        with pytest.raises(SystemExit) as done:
            exec(compile(READY_PROBE, "<probe>", "exec"), {})
        assert done.value.code == 0
        assert calls.pop() == ("mq-0.mq-headless.ns1.svc", 15682, 2.0, expect)
    monkeypatch.delenv("MIRRORQ_ADMIN_TOKEN")
    with pytest.raises(SystemExit):
        exec(compile(READY_PROBE, "<probe>", "exec"), {})
    assert calls.pop()[3] is None


def test_ready_probe_runs_and_fails_against_nothing_listening():
    """`python -c READY_PROBE` for real: it gets as far as the admin call (so no
    syntax or name error can hide) and exits non-zero when nobody answers."""
    (c,) = _pod(SPEC)["containers"]
    assert c["readinessProbe"]["exec"]["command"] == ["python", "-c", READY_PROBE]
    assert "\n" not in READY_PROBE
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "POD_NAME": "mq-0", "HEADLESS": "mq-headless",
           "POD_NAMESPACE": "mirrorq-probe-test.invalid", "MIRRORQ_ADMIN_TOKEN": "t0ken"}
    proc = subprocess.run([sys.executable, "-c", READY_PROBE], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "RpcError" in proc.stderr, proc.stderr  # failed in the call, not before it
    assert "SyntaxError" not in proc.stderr and "NameError" not in proc.stderr


def test_config_hash_follows_the_pods_config_and_template_only():
    from mirrorq_operator.builders import build_statefulset, config_hash
    base = Spec(replicas=3, config={"heartbeat": "60"})
    h = config_hash(build_statefulset(base, "mq", "ns"))
    assert h and len(h) == 16
    # replicas are not the pods' config: scaling rolls nothing
    assert config_hash(build_statefulset(base, "mq", "ns", replicas=5)) == h
    # a config value, the image, the grace period: each is a new hash (a rollout)
    assert config_hash(build_statefulset(Spec(replicas=3, config={"heartbeat": "30"}),
                                         "mq", "ns")) != h
    assert config_hash(build_statefulset(Spec(replicas=3, config={"heartbeat": "60"},
                                              image="other:1"), "mq", "ns")) != h
    assert config_hash(build_statefulset(Spec(replicas=3, config={"heartbeat": "60"},
                                              grace_seconds=30), "mq", "ns")) != h


def test_built_objects_are_owned_by_the_cluster_but_secrets_are_not():
    from mirrorq_operator.builders import build_all, build_raft_secret, owned
    objs = build_all(Spec(replicas=3), "mq", "ns", "policy/v1beta1", owner_uid="u-1")
    assert {o["kind"] for o in objs} >= {"StatefulSet", "ConfigMap", "Service",
                                         "PodDisruptionBudget", "NetworkPolicy"}
    for o in objs:
        [ref] = o["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster",
                       "name": "mq", "uid": "u-1", "controller": True,
                       "blockOwnerDeletion": True}
    secret = owned([build_raft_secret("mq", "ns", "pw")], "mq", "u-1")[0]
    assert "ownerReferences" not in secret["metadata"]
    assert all("ownerReferences" not in o["metadata"]
               for o in build_all(Spec(replicas=3), "mq", "ns"))


def test_ready_probe_falls_back_to_an_older_images_admin_module(monkeypatch):
    """A broker image from before issue 25 has call_status in node.admin.server: the
    probe of a newer operator must still work against it (no module named client)."""
    import importlib.util
    import sys
    import types

    calls: list[str] = []
    old = types.ModuleType("node.admin.server")
    old.call_status = lambda host, port, timeout, *, token=None: (  # type: ignore[attr-defined]
        calls.append(host) or {"in_sync": ["mq-0"], "blocked": False})
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "node.admin.client"
                        else real_find_spec(name, *a))
    monkeypatch.setitem(sys.modules, "node.admin.server", old)
    monkeypatch.setenv("POD_NAME", "mq-0")
    monkeypatch.setenv("HEADLESS", "mq-headless")
    monkeypatch.setenv("POD_NAMESPACE", "ns1")
    with pytest.raises(SystemExit) as done:
        exec(compile(READY_PROBE, "<probe>", "exec"), {})
    assert done.value.code == 0 and calls == ["mq-0.mq-headless.ns1.svc"]


def test_broker_pods_run_hardened_without_a_service_account_token():
    """Issue 26 item 12: no capabilities, seccomp RuntimeDefault, the image's uid 10001
    (non-root), the volume the pod's group's, and no API token (the broker never calls
    the API server)."""
    pod = build_statefulset(SPEC, "mq", "ns1")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sec = {**pod["securityContext"], **c["securityContext"]}
    assert sec["capabilities"] == {"drop": ["ALL"]}
    assert sec["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sec["runAsNonRoot"] is True and sec["allowPrivilegeEscalation"] is False
    assert sec["runAsUser"] == sec["runAsGroup"] == pod["securityContext"]["fsGroup"] == 10001
    assert sec["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert "USER 10001:10001" in dockerfile  # the image's user is the one the pod names


@pytest.mark.parametrize("existing, joins", [((), True), (("log",), False), (("raft.journal",), False)])
def test_start_script_joins_only_with_an_empty_data_dir(tmp_path, existing, joins):
    """A member's data dir holds `log/` (segment log, issue 27) or an older image's
    `raft.journal`: it restarts as itself; an empty one after formation joins."""
    data, etc, bindir = tmp_path / "data", tmp_path / "etc", tmp_path / "bin"
    for d in (data, etc, bindir):
        d.mkdir()
    for name in existing:
        (data / name).mkdir() if name == "log" else (data / name).write_bytes(b"")
    (etc / "members").write_text("mq-0\nmq-1\n")
    (etc / "formed").write_text("true")
    (bindir / "mirrorq").write_text('#!/bin/sh\necho "$@"\n')
    (bindir / "mirrorq").chmod(0o755)
    script = START_SCRIPT.replace("/var/lib/mirrorq", str(data)).replace("/etc/mirrorq", str(etc))
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "POD_NAME": "mq-0", "HEADLESS": "h", "POD_NAMESPACE": "ns"}
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert ("--join" in out) == joins, out
