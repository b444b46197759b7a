"""Issue 26 (items 9, 11): the operator's per-cluster admin CA. Pure tests of
pki.py's certificates and of what the builders make of them (the Secret, the
pods' volume, environment and [admin] keys); the node reading that config."""
from __future__ import annotations

import base64
import datetime
import ipaddress
import tomllib
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from mirrorq_operator import pki
from mirrorq_operator.builders import (
    ADMIN_TLS_DIR,
    ADMIN_TLS_KEYS,
    ADMIN_TLS_VOLUME,
    build_admin_tls_secret,
    build_all,
    build_configmap,
    build_statefulset,
    config_hash,
)
from mirrorq_operator.model import IN_CLUSTER, Spec, SpecError

NAME, NS = "mq", "ns1"


@pytest.fixture(scope="module")
def made() -> pki.AdminPki:
    return pki.generate(NAME, NS)


def _pems(made: pki.AdminPki) -> dict[str, bytes]:
    return {f: getattr(made, f) for f in ADMIN_TLS_KEYS}


def _pod(spec: Spec) -> dict[str, Any]:
    return build_statefulset(spec, NAME, NS)["spec"]["template"]["spec"]


def test_server_certificate_names_every_pod_and_loopback(made: pki.AdminPki) -> None:
    cert = x509.load_pem_x509_certificate(made.server_cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "*.mq-headless.ns1.svc", "*.mq-headless.ns1.svc.cluster.local", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"),
                                                        ipaddress.ip_address("::1")]
    # what the operator dials and the start script calls the pod (--host) match the wildcard
    host = IN_CLUSTER.host(NAME, NS, 2)
    assert host == "mq-2.mq-headless.ns1.svc" and host.split(".", 1)[1] == "mq-headless.ns1.svc"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_ca_signs_both_leaves_with_p256_and_the_documented_lifetimes(made: pki.AdminPki) -> None:
    ca = x509.load_pem_x509_certificate(made.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for pem in (made.server_cert, made.client_cert):
        leaf = x509.load_pem_x509_certificate(pem)
        leaf.verify_directly_issued_by(ca)
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        key = leaf.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
        days = (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days
        assert days == pki.LEAF_DAYS  # (+5 minutes of clock skew)
    assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days == pki.CA_DAYS
    client = x509.load_pem_x509_certificate(made.client_cert)
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    now = datetime.datetime.now(datetime.UTC)
    assert client.not_valid_before_utc < now < client.not_valid_after_utc
    # a second cluster gets another CA: one cluster's operator client cert is no
    # key to another's admin port
    assert pki.generate("other", NS).ca_cert != made.ca_cert


def test_secret_shape(made: pki.AdminPki) -> None:
    secret = build_admin_tls_secret(NAME, NS, _pems(made))
    assert secret["metadata"]["name"] == "mq-admin-tls" and secret["kind"] == "Secret"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert data == {"ca.crt": made.ca_cert, "ca.key": made.ca_key, "tls.crt": made.server_cert,
                    "tls.key": made.server_key, "client.crt": made.client_cert,
                    "client.key": made.client_key}
    # not owned by the cluster (as the other Secrets): a reinstall finds the same CA
    from mirrorq_operator.builders import owned
    assert "ownerReferences" not in owned([secret], NAME, "uid-1")[0]["metadata"]


def test_pods_mount_only_the_ca_and_their_own_certificate() -> None:
    pod = _pod(Spec())
    (vol,) = [v for v in pod["volumes"] if v["name"] == ADMIN_TLS_VOLUME]
    assert vol["secret"]["secretName"] == "mq-admin-tls"
    # never ca.key (it could mint certificates) nor the operator's client key
    assert [i["key"] for i in vol["secret"]["items"]] == ["ca.crt", "tls.crt", "tls.key"]
    assert vol["secret"]["defaultMode"] == 0o440
    (c,) = pod["containers"]
    assert {"name": ADMIN_TLS_VOLUME, "mountPath": ADMIN_TLS_DIR, "readOnly": True} \
        in c["volumeMounts"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MIRRORQ_ADMIN_CA"] == f"{ADMIN_TLS_DIR}/ca.crt"
    assert env["MIRRORQ_ADMIN_CERT"] == f"{ADMIN_TLS_DIR}/tls.crt"
    assert env["MIRRORQ_ADMIN_KEY"] == f"{ADMIN_TLS_DIR}/tls.key"


def test_admin_config_keys_and_the_off_switch() -> None:
    on = tomllib.loads(build_configmap(Spec(), NAME, NS)["data"]["mirrorq.toml"])
    assert on["admin"] == {"tls_cert": f"{ADMIN_TLS_DIR}/tls.crt",
                           "tls_key": f"{ADMIN_TLS_DIR}/tls.key",
                           "tls_client_ca": f"{ADMIN_TLS_DIR}/ca.crt"}
    off = Spec.from_cr({"adminTls": False})
    assert "admin" not in tomllib.loads(build_configmap(off, NAME, NS)["data"]["mirrorq.toml"])
    pod = _pod(off)
    assert ADMIN_TLS_VOLUME not in {v["name"] for v in pod["volumes"]}
    assert not {e["name"] for e in pod["containers"][0]["env"]} & {
        "MIRRORQ_ADMIN_CA", "MIRRORQ_ADMIN_CERT", "MIRRORQ_ADMIN_KEY"}
    # turning it on or off rolls the pods (the config hash changes)
    assert config_hash(build_statefulset(off, NAME, NS)) != config_hash(
        build_statefulset(Spec(), NAME, NS))
    assert Spec.from_cr({}).admin_tls is True
    assert build_all(Spec(), NAME, NS) == build_all(Spec(), NAME, NS)


def test_spec_checks() -> None:
    with pytest.raises(SpecError, match="adminTls must be true or false"):
        Spec.from_cr({"adminTls": "no"})
    with pytest.raises(SpecError, match="admin.tls_cert cannot be set"):
        Spec.from_cr({"config": {"admin.tls_cert": "/x"}})
    # with adminTls off the user may bring their own
    assert Spec.from_cr({"adminTls": False, "config": {"admin.tls_cert": "/x"}}).config


def test_the_node_loads_the_rendered_admin_config(tmp_path: Path, made: pki.AdminPki) -> None:
    """The node reads the rendered mirrorq.toml and the Secret's files laid out as
    the pod mounts them: admin TLS with client certificates required."""
    from node.app.config import NodeConfig, admin_authenticated
    from node.app.config_file import apply_file

    d = tmp_path / "admin-tls"
    d.mkdir()
    for field, file in ADMIN_TLS_KEYS.items():
        (d / file).write_bytes(getattr(made, field))
    text = build_configmap(Spec(), NAME, NS)["data"]["mirrorq.toml"]
    path = tmp_path / "mirrorq.toml"
    path.write_text(text.replace(ADMIN_TLS_DIR, str(d)))
    cfg = NodeConfig(node_id="mq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    assert cfg.admin.tls() == (made.server_cert, made.server_key, made.ca_cert)
    assert admin_authenticated(cfg)
