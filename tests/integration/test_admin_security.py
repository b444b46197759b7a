"""Admin API security (issue 7): a bearer token checked on every RPC, TLS on
the admin port (mutual with a client CA), and one-line exit-2 errors for a bad
[admin] config. Real node processes; certificates are made at test time."""
from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from node.admin.client import call_add_member, call_status, call_user_list
from tests.broker_proc import REPO, NodeProcess
from tests.support.cli import assert_usage_error, serve_args

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own admin API")

TOKEN = "t0ken-for-tests_only"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MIRRORQ_ADMIN_")}
    return subprocess.run([sys.executable, "-m", "node.app", *args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                          env={**clean, **(env or {})})


@pytest.fixture(autouse=True)
def _no_admin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MIRRORQ_ADMIN_TOKEN", "MIRRORQ_ADMIN_CA", "MIRRORQ_ADMIN_CERT",
                 "MIRRORQ_ADMIN_KEY"):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------ certificates

def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
          issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False,
          server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (x509.CertificateBuilder().subject_name(name)
         .issuer_name(issuer.subject if issuer is not None else name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


class Pki:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate,
    as PEM files; plus a second, unrelated CA."""

    def __init__(self, d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        ca_key, other_key = _key(), _key()
        ca = _cert("mirrorq test CA", ca_key, None, ca_key, ca=True)
        other = _cert("unrelated CA", other_key, None, other_key, ca=True)
        server_key, client_key = _key(), _key()
        server = _cert("127.0.0.1", server_key, ca, ca_key, server=True)
        client = _cert("admin client", client_key, ca, ca_key)

        def write(name: str, obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> str:
            path = d / name
            if isinstance(obj, x509.Certificate):
                path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
            else:
                path.write_bytes(obj.private_bytes(serialization.Encoding.PEM,
                                                   serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
                path.chmod(0o600)
            return str(path)

        self.ca, self.other_ca = write("ca.pem", ca), write("other-ca.pem", other)
        self.server_cert, self.server_key = write("server.pem", server), write("server.key", server_key)
        self.client_cert, self.client_key = write("client.pem", client), write("client.key", client_key)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def start(nodes: list[NodeProcess], tmp_path: Path, config: str) -> NodeProcess:
    node = NodeProcess(tmp_path / f"data{len(nodes)}", config=config)
    nodes.append(node)
    node.start()
    return node


def code_of(fn: object, *args: object, **kw: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kw)  # type: ignore[operator]
    return err.value.code()  # type: ignore[no-any-return,attr-defined,unused-ignore]


# ------------------------------------------------------------------ tests

def test_token_required_on_every_rpc(tmp_path: Path, nodes: list[NodeProcess]) -> None:
    node = start(nodes, tmp_path, f'[admin]\ntoken = "{TOKEN}"\n')
    port = node.admin_port
    assert code_of(call_status, "127.0.0.1", port) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(call_status, "127.0.0.1", port, token="wrong") == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(call_status, "127.0.0.1", port, token=TOKEN + "x") \
        == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(call_add_member, "127.0.0.1", port, "n9", "127.0.0.1:1") \
        == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(call_user_list, "127.0.0.1", port) == grpc.StatusCode.UNAUTHENTICATED
    st = call_status("127.0.0.1", port, token=TOKEN)
    assert st["node_id"] == node.node_id and st["members"] == [node.node_id]
    assert call_user_list("127.0.0.1", port, token=TOKEN)["users"][0]["name"] == "guest"

    # the CLI: --token-file, $MIRRORQ_ADMIN_TOKEN; without it one line and exit 2
    admin = f"127.0.0.1:{port}"
    proc = run_cli("status", "--admin", admin, "--json", env={"MIRRORQ_ADMIN_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    assert '"node_id": "n1"' in proc.stdout
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = run_cli("users", "--admin", admin, "list", "--token-file", str(token_file))
    assert proc.returncode == 0 and "guest" in proc.stdout, proc.stderr
    proc = run_cli("queues", "--admin", admin, env={"MIRRORQ_ADMIN_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    assert_usage_error(run_cli("status", "--admin", admin), "UNAUTHENTICATED")
    wrong = tmp_path / "wrong-token"
    wrong.write_text("nope\n")
    assert_usage_error(run_cli("status", "--admin", admin, "--token-file", str(wrong)),
                       "UNAUTHENTICATED")
    # issue 26: no token on the command line (ps shows it to every local user)
    assert_usage_error(run_cli("status", "--admin", admin, "--token", TOKEN), "--token-file")
    assert_usage_error(run_cli("drain", "--admin", admin), "UNAUTHENTICATED")
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    assert_usage_error(run_cli("status", "--admin", admin, "--token-file", str(empty)), "empty")


def test_tls_admin_port(tmp_path: Path, nodes: list[NodeProcess], pki: Pki) -> None:
    node = start(nodes, tmp_path, f'[admin]\ntls_cert = "{pki.server_cert}"\n'
                                  f'tls_key = "{pki.server_key}"\ntoken = "{TOKEN}"\n')
    port = node.admin_port
    st = call_status("127.0.0.1", port, token=TOKEN, tls_ca=pki.ca)
    assert st["node_id"] == node.node_id
    # plaintext to a TLS port, or a server certificate from another CA: no connection
    assert code_of(call_status, "127.0.0.1", port, token=TOKEN, timeout=3) \
        == grpc.StatusCode.UNAVAILABLE
    assert code_of(call_status, "127.0.0.1", port, token=TOKEN, tls_ca=pki.other_ca, timeout=3) \
        == grpc.StatusCode.UNAVAILABLE
    # TLS does not replace the token
    assert code_of(call_status, "127.0.0.1", port, tls_ca=pki.ca) == grpc.StatusCode.UNAUTHENTICATED
    admin = f"127.0.0.1:{port}"
    proc = run_cli("status", "--admin", admin, "--ca", pki.ca, env={"MIRRORQ_ADMIN_TOKEN": TOKEN})
    assert proc.returncode == 0 and "node_id" in proc.stdout, proc.stderr
    proc = run_cli("status", "--admin", admin, "--json",
                   env={"MIRRORQ_ADMIN_TOKEN": TOKEN, "MIRRORQ_ADMIN_CA": pki.ca})
    assert proc.returncode == 0, proc.stderr
    assert_usage_error(run_cli("status", "--admin", admin, env={"MIRRORQ_ADMIN_TOKEN": TOKEN}),
                       "UNAVAILABLE")
    assert_usage_error(run_cli("status", "--admin", admin, "--ca", str(tmp_path / "nope.pem")),
                       "no such file")


def test_mutual_tls(tmp_path: Path, nodes: list[NodeProcess], pki: Pki) -> None:
    node = start(nodes, tmp_path, f'[admin]\ntls_cert = "{pki.server_cert}"\n'
                                  f'tls_key = "{pki.server_key}"\ntls_client_ca = "{pki.ca}"\n')
    port = node.admin_port
    assert code_of(call_status, "127.0.0.1", port, tls_ca=pki.ca, timeout=3) \
        == grpc.StatusCode.UNAVAILABLE
    st = call_status("127.0.0.1", port, tls_ca=pki.ca, tls_cert=pki.client_cert,
                     tls_key=pki.client_key)
    assert st["node_id"] == node.node_id
    proc = run_cli("status", "--admin", f"127.0.0.1:{port}", "--ca", pki.ca, "--cert",
                   pki.client_cert, "--key", pki.client_key, "--json")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("admin_table,needle", [
    ('token = ""', "admin token"),
    ("token = 5", "admin.token must be a string"),
    ('token = "a b"', "admin token"),
    ('token_file = "{d}/missing-token"', "cannot read admin.token_file"),
    ('token_file = "{d}/empty-token"', "admin token"),
    ('token = "x"\ntoken_file = "{d}/empty-token"', "not both"),
    ('tls_cert = "{d}/missing.pem"\ntls_key = "{d}/missing.key"', "cannot read admin.tls_cert"),
    ('tls_cert = "{d}/empty-token"\ntls_key = "{d}/empty-token"', "not a PEM file"),
    ('tls_cert = "{d}/x.pem"', "go together"),
    ('tls_client_ca = "{d}/x.pem"', "needs admin.tls_cert"),
    ("bogus = 1", "unknown key admin.bogus"),
])
def test_bad_admin_config_exit_2(tmp_path: Path, admin_table: str, needle: str) -> None:
    (tmp_path / "empty-token").write_text("  \n")
    cfg = tmp_path / "node.toml"
    cfg.write_text("[admin]\n" + admin_table.format(d=tmp_path) + "\n")
    assert_usage_error(run_cli(*serve_args(tmp_path, "--config", str(cfg))), needle)
