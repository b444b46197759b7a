"""Issue 26 (items 9, 11), against a real node process: a node started with the
operator's rendered [admin] config and the certificates pki.py makes serves
admin over mutual TLS. The operator's way (CA and client certificate as bytes
from the Secret) and the pod's way (the mounted files through
$MIRRORQ_ADMIN_CA/_CERT/_KEY, as the readiness probe and in-pod CLI use them)
both get Status; plaintext, no client certificate, or another cluster's
certificates get nothing; the server certificate verifies for the pods' DNS
names (what the operator dials in the cluster) and for no other."""
from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from mirrorq_operator import kube, pki
from mirrorq_operator.builders import ADMIN_TLS_DIR, ADMIN_TLS_ENV, ADMIN_TLS_KEYS, build_configmap
from mirrorq_operator.model import Spec

from node.admin.client import call_status
from tests.broker_proc import NodeProcess

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="own node")

TOKEN = "t0ken-for-admin-tls-tests"


@pytest.fixture(autouse=True)
def _no_admin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MIRRORQ_ADMIN_TOKEN", *ADMIN_TLS_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def made() -> pki.AdminPki:
    return pki.generate("mq", "ns1")


@pytest.fixture
def node(tmp_path: Path, made: pki.AdminPki) -> Iterator[NodeProcess]:
    secret_dir = tmp_path / "admin-tls"  # the pod's mount: the three files it gets
    secret_dir.mkdir()
    for field, file in ADMIN_TLS_KEYS.items():
        if file in ("ca.crt", "tls.crt", "tls.key"):
            (secret_dir / file).write_bytes(getattr(made, field))
    text = build_configmap(Spec(), "mq", "ns1")["data"]["mirrorq.toml"]
    config = text.replace(ADMIN_TLS_DIR, str(secret_dir)) + f'admin.token = "{TOKEN}"\n'
    n = NodeProcess(tmp_path / "data", node_id="mq-0", config=config, admin_token=False)
    try:
        n.start()
        yield n
    finally:
        n.kill9()


def _code(**kw: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call_status(timeout=3, **kw)  # type: ignore[arg-type]
    return err.value.code()  # type: ignore[no-any-return,attr-defined,unused-ignore]


def test_operator_and_pod_get_status_over_tls_and_plaintext_fails(
        node: NodeProcess, made: pki.AdminPki, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    where = {"host": "127.0.0.1", "port": node.admin_port}
    # the operator: bytes read from NAME-admin-tls
    tls = kube._tls_kwargs((made.ca_cert, made.client_cert, made.client_key))
    assert call_status(**where, token=TOKEN, **tls)["node_id"] == "mq-0"  # type: ignore[arg-type]
    # plaintext (what the operator sent before), and TLS without a client certificate
    assert _code(**where, token=TOKEN) == grpc.StatusCode.UNAVAILABLE
    assert _code(**where, token=TOKEN, tls_ca=made.ca_cert) == grpc.StatusCode.UNAVAILABLE
    # another cluster's CA and operator certificate
    other = pki.generate("other", "ns1")
    assert _code(**where, token=TOKEN, tls_ca=other.ca_cert, tls_cert=other.client_cert,
                 tls_key=other.client_key) == grpc.StatusCode.UNAVAILABLE
    assert _code(**where, token=TOKEN, tls_ca=made.ca_cert, tls_cert=other.client_cert,
                 tls_key=other.client_key) == grpc.StatusCode.UNAVAILABLE
    # the certificate does not replace the token
    assert _code(**where, **tls) == grpc.StatusCode.UNAUTHENTICATED
    # the pod: the mounted files through the environment the StatefulSet sets
    mount = tmp_path / "admin-tls"
    for env, file in ADMIN_TLS_ENV.items():
        monkeypatch.setenv(env, str(mount / file))
    monkeypatch.setenv("MIRRORQ_ADMIN_TOKEN", TOKEN)
    assert call_status(**where)["node_id"] == "mq-0"  # type: ignore[arg-type]
    # spec.adminTls false: the operator passes b"" and sends plaintext, whatever its env says
    assert _code(**where, **kube._tls_kwargs(None)) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("name,ok", [("mq-1.mq-headless.ns1.svc", True),
                                     ("mq-0.mq-headless.ns1.svc.cluster.local", True),
                                     ("localhost", True),
                                     ("mq-1.other-headless.ns1.svc", False),
                                     ("mq-headless.ns1.svc", False)])
def test_server_certificate_verifies_for_the_pods_names_only(
        node: NodeProcess, made: pki.AdminPki, tmp_path: Path, name: str, ok: bool) -> None:
    """A real handshake with the node's admin port, checking the name the
    operator dials in the cluster (the node is on 127.0.0.1 here)."""
    cert, key = tmp_path / "c.crt", tmp_path / "c.key"
    cert.write_bytes(made.client_cert)
    key.write_bytes(made.client_key)
    ctx = ssl.create_default_context(cadata=made.ca_cert.decode())
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", node.admin_port), timeout=5) as raw:
        if ok:
            with ctx.wrap_socket(raw, server_hostname=name) as tls:
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
        else:
            with pytest.raises(ssl.SSLCertVerificationError):
                ctx.wrap_socket(raw, server_hostname=name)
