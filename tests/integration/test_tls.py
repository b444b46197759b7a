"""AMQP over TLS (amqps): a real node process with a [tls] listener, certificates
made at test time (a CA, a server certificate for 127.0.0.1/localhost, client
certificates from that CA and from another one; no private key lives in the repo).

Covers: pika over TLS with confirms and a consumer; verify = "required" (no
certificate, a foreign CA's certificate: refused; our CA's: accepted);
TLS-only mode (the plain port has no listener); a plaintext client on the
amqps port fails alone; max_connections and drain apply to amqps too; bad
[tls] config is one line and exit 2.
"""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.broker_proc import NodeProcess, free_port, uniq, wait_for
from tests.support.cli import assert_usage_error, run_cli, serve_args
from tests.support.pki import Pki, client_context, make_pki, tls_config

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="starts mirrorq nodes with their own TLS config")

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
IO_TIMEOUT = 10.0


# ---------------------------------------------------------------- certificates

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def start_node(tmp_path: Path, config: str, tls_only: bool = False) -> NodeProcess:
    node = NodeProcess(tmp_path / uniq("data"), config=config, amqps=True, tls_only=tls_only)
    node.start()
    return node


@pytest.fixture(scope="module")
def optional_node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """Plain AMQP and amqps; a client certificate is verified when one is sent."""
    node = start_node(tmp_path_factory.mktemp("optional"), tls_config(pki, "optional"))
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def required_node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    node = start_node(tmp_path_factory.mktemp("required"), tls_config(pki, "required"))
    try:
        yield node
    finally:
        node.stop()


# ---------------------------------------------------------------- clients

def pika_tls(node: NodeProcess, ctx: ssl.SSLContext, server_hostname: str = "localhost",
             ) -> pika.BlockingConnection:
    assert node.amqps_port is not None
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=node.amqps_port, heartbeat=0, socket_timeout=IO_TIMEOUT,
        connection_attempts=1, blocked_connection_timeout=30,
        credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(ctx, server_hostname=server_hostname)))


def amqp_start_over_tls(node: NodeProcess, ctx: ssl.SSLContext) -> str:
    """Handshake, send the AMQP header: 'start' when connection.start comes back,
    else what went wrong (the TLS alert or EOF). With TLS 1.3 a refused client
    certificate shows up on the first read, not in the client's handshake."""
    assert node.amqps_port is not None
    raw = socket.create_connection(("127.0.0.1", node.amqps_port), timeout=IO_TIMEOUT)
    try:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(AMQP_HEADER)
            head = s.recv(7)
            if len(head) == 7 and head[0] == 1:
                ftype, channel, _size = struct.unpack(">BHI", head)
                return "start" if (ftype, channel) == (1, 0) else f"frame {head!r}"
            return f"eof {head!r}"
    except (ssl.SSLError, OSError) as exc:
        return f"refused: {exc}"
    finally:
        raw.close()


def publish_confirm_consume(conn: pika.BlockingConnection, n: int = 20) -> None:
    ch = conn.channel()
    q = ch.queue_declare(uniq("tls"), exclusive=True).method.queue
    ch.confirm_delivery()
    for i in range(n):  # each basic_publish returns once acked (raises on nack)
        ch.basic_publish("", q, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2),
                         mandatory=True)
    got: list[bytes] = []

    def on_msg(chan: object, method: pika.spec.Basic.Deliver, _p: object, body: bytes) -> None:
        got.append(body)
        ch.basic_ack(method.delivery_tag)

    ch.basic_consume(q, on_msg)
    deadline = time.monotonic() + IO_TIMEOUT
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert got == [f"m{i}".encode() for i in range(n)]


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# ---------------------------------------------------------------- tests

def test_pika_over_tls_publishes_with_confirms_and_consumes(optional_node: NodeProcess,
                                                            pki: Pki) -> None:
    conn = pika_tls(optional_node, client_context(pki))  # no client certificate: optional
    try:
        publish_confirm_consume(conn)
    finally:
        conn.close()
    # the same node still serves plain AMQP: both listeners are one broker
    plain = pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=optional_node.amqp_port, heartbeat=0, socket_timeout=IO_TIMEOUT))
    try:
        publish_confirm_consume(plain, 3)
    finally:
        plain.close()


def test_tls_1_2_is_the_minimum(optional_node: NodeProcess, pki: Pki) -> None:
    from node.amqp.config import TlsConfig
    from node.amqp.tls import server_context
    ctx = server_context(TlsConfig(port=1, cert=str(pki.server.cert), key=str(pki.server.key)))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    only12 = client_context(pki)
    only12.maximum_version = ssl.TLSVersion.TLSv1_2
    assert amqp_start_over_tls(optional_node, only12) == "start"
    assert amqp_start_over_tls(optional_node, client_context(pki)) == "start"  # TLS 1.3


def test_optional_verify_checks_a_certificate_that_is_sent(optional_node: NodeProcess,
                                                           pki: Pki) -> None:
    assert amqp_start_over_tls(optional_node, client_context(pki, pki.client)) == "start"
    assert amqp_start_over_tls(optional_node, client_context(pki, pki.foreign_client)) \
        .startswith(("refused", "eof"))


def test_verify_required(required_node: NodeProcess, pki: Pki) -> None:
    # no client certificate: refused
    assert amqp_start_over_tls(required_node, client_context(pki)).startswith(("refused", "eof"))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika_tls(required_node, client_context(pki)).close()
    # a certificate from another CA: refused
    assert amqp_start_over_tls(required_node, client_context(pki, pki.foreign_client)) \
        .startswith(("refused", "eof"))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika_tls(required_node, client_context(pki, pki.foreign_client)).close()
    # one signed by our CA: accepted, and the broker works over it
    conn = pika_tls(required_node, client_context(pki, pki.client))
    try:
        publish_confirm_consume(conn, 5)
    finally:
        conn.close()


def test_plaintext_on_the_amqps_port_fails_alone(required_node: NodeProcess, pki: Pki) -> None:
    assert required_node.amqps_port is not None
    # an established TLS connection that must not notice anything
    keep = pika_tls(required_node, client_context(pki, pki.client))
    try:
        with socket.create_connection(("127.0.0.1", required_node.amqps_port),
                                      timeout=IO_TIMEOUT) as s:
            s.sendall(AMQP_HEADER)
            data = b""
            while chunk := s.recv(4096):  # a TLS alert at most, then EOF: never connection.start
                data += chunk
            assert not data.startswith(b"\x01\x00\x00"), data
        # a plain socket that connects and says nothing, held open meanwhile
        idle = socket.create_connection(("127.0.0.1", required_node.amqps_port), timeout=IO_TIMEOUT)
        try:
            second = pika_tls(required_node, client_context(pki, pki.client))
            try:
                publish_confirm_consume(second, 3)
            finally:
                second.close()
        finally:
            idle.close()
        publish_confirm_consume(keep, 3)
    finally:
        keep.close()


def test_tls_only_mode_has_no_plain_listener(pki: Pki, tmp_path: Path) -> None:
    node = start_node(tmp_path, tls_config(pki, "none", only=True), tls_only=True)
    try:
        assert refused(node.amqp_port), "TLS-only: nothing may listen on --amqp-port"
        conn = pika_tls(node, client_context(pki))
        try:
            publish_confirm_consume(conn, 5)
        finally:
            conn.close()
        st = status(node)
        assert st["amqps_port"] == node.amqps_port and not st.get("amqp_port")
    finally:
        node.stop()


def status(node: NodeProcess) -> dict[str, object]:
    from node.admin.client import call_status
    return call_status("127.0.0.1", node.admin_port, timeout=5, token=node.admin_token)


def test_max_connections_and_drain_apply_to_amqps(pki: Pki, tmp_path: Path) -> None:
    from node.admin.client import call_drain, call_revive
    node = start_node(tmp_path, tls_config(pki, "none", extra="max_connections = 1\n"))
    assert node.amqps_port is not None
    try:
        first = pika_tls(node, client_context(pki))
        try:
            # the limit counts plain and TLS connections together
            with pytest.raises(pika.exceptions.AMQPConnectionError) as err:
                pika.BlockingConnection(pika.ConnectionParameters(
                    host="127.0.0.1", port=node.amqp_port, heartbeat=0,
                    socket_timeout=IO_TIMEOUT, connection_attempts=1))
            assert "530" in repr(err.value) or "connection limit" in repr(err.value)
            with pytest.raises(pika.exceptions.AMQPConnectionError) as err:
                pika_tls(node, client_context(pki))
            assert "530" in repr(err.value) or "connection limit" in repr(err.value)
        finally:
            first.close()
        wait_for(lambda: status(node)["connections"] == 0, timeout=10, what="the connection to go")
        call_drain("127.0.0.1", node.admin_port, timeout=20, token=node.admin_token)
        wait_for(lambda: refused(node.amqps_port) and refused(node.amqp_port),  # type: ignore[arg-type]
                 timeout=10, what="drain to close both listeners")
        call_revive("127.0.0.1", node.admin_port, timeout=20, token=node.admin_token)
        wait_for(lambda: not refused(node.amqps_port), timeout=10,  # type: ignore[arg-type]
                 what="revive to reopen the amqps listener")
        conn = pika_tls(node, client_context(pki))
        conn.close()
    finally:
        node.stop()


def test_many_failed_handshakes_leave_the_node_serving(optional_node: NodeProcess,
                                                       pki: Pki) -> None:
    """Garbage, foreign certificates and abrupt closes in parallel with a working client."""
    assert optional_node.amqps_port is not None
    port = optional_node.amqps_port
    errors: list[str] = []

    def noise() -> None:
        try:
            for i in range(10):
                with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT) as s:
                    s.sendall(b"\x16\x03\x01\x00\x05hello" if i % 2 else b"GET / HTTP/1.0\r\n\r\n")
                amqp_start_over_tls(optional_node, client_context(pki, pki.foreign_client))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=noise) for _ in range(3)]
    for t in threads:
        t.start()
    conn = pika_tls(optional_node, client_context(pki, pki.client))
    try:
        publish_confirm_consume(conn, 10)
    finally:
        conn.close()
    for t in threads:
        t.join(30)
    assert not errors
    assert amqp_start_over_tls(optional_node, client_context(pki)) == "start"


@pytest.mark.skipif(shutil.which("amqp-publish") is None, reason="amqp-tools missing")
def test_rabbitmq_c_tools_over_tls_with_a_client_certificate(required_node: NodeProcess,
                                                              pki: Pki) -> None:
    """rabbitmq-c (OpenSSL underneath, another TLS stack's defaults than Python's)."""
    url = f"amqps://guest:guest@localhost:{required_node.amqps_port}"
    tls = ["--ssl", "--cacert", str(pki.ca), "--cert", str(pki.client.cert),
           "--key", str(pki.client.key)]

    def tool(*args: str) -> bytes:
        res = subprocess.run([args[0], "--url", url, *tls, *args[1:]], capture_output=True,
                             timeout=20, check=False)
        assert res.returncode == 0, f"{args[0]} exited {res.returncode}: {res.stderr!r}"
        return res.stdout

    q = tool("amqp-declare-queue", "-q", uniq("tools-tls")).decode().strip()
    tool("amqp-publish", "-r", q, "-b", "over tls")
    assert tool("amqp-get", "-q", q) == b"over tls"
    tool("amqp-publish", "-r", q, "-b", "still there")
    res = subprocess.run(["amqp-get", "--url", url, "--ssl", "--cacert", str(pki.ca), "-q", q],
                         capture_output=True, timeout=20, check=False)
    assert res.returncode != 0  # no client certificate: refused under verify = "required"
    assert tool("amqp-get", "-q", q) == b"still there"  # so it was the certificate, not the queue
    tool("amqp-delete-queue", "-q", q)


# ---------------------------------------------------------------- bad config: exit 2

@pytest.mark.parametrize("case,needle", [
    ("missing-cert", "cannot read tls.cert"),
    ("mismatch", "does not match tls.cert"),
    ("verify", "tls.verify must be one of"),
    ("no-ca", "needs tls.ca"),
    ("no-port", "no amqps port"),
    ("only-no-port", "tls.only needs an amqps port"),
    ("not-pem", "holds no PEM certificate"),
])
def test_bad_tls_config_exit_2(pki: Pki, tmp_path: Path, case: str, needle: str) -> None:
    port = ["--amqps-port", str(free_port())]
    lines = {
        "missing-cert": (f'cert = "{tmp_path / "nope.crt"}"\nkey = "{pki.server.key}"\n', port),
        "mismatch": (f'cert = "{pki.server.cert}"\nkey = "{pki.other.key}"\n', port),
        "verify": (f'cert = "{pki.server.cert}"\nkey = "{pki.server.key}"\nverify = "peer"\n', port),
        "no-ca": (f'cert = "{pki.server.cert}"\nkey = "{pki.server.key}"\nverify = "required"\n',
                  port),
        "no-port": (f'cert = "{pki.server.cert}"\nkey = "{pki.server.key}"\n', []),
        "only-no-port": ("only = true\n", []),
        "not-pem": (f'cert = "{pki.server.key}"\nkey = "{pki.server.key}"\n', port),
    }
    body, flags = lines[case]
    cfg = tmp_path / "node.toml"
    cfg.write_text("[tls]\n" + body)
    assert_usage_error(run_cli(*serve_args(tmp_path, "--config", str(cfg), *flags)), needle)


def test_amqps_port_without_cert_exit_2(tmp_path: Path) -> None:
    assert_usage_error(run_cli(*serve_args(tmp_path, "--amqps-port", str(free_port()))),
                       "needs tls.cert")


def test_amqp_port_required_unless_tls_only(tmp_path: Path) -> None:
    args = serve_args(tmp_path)
    i = args.index("--amqp-port")
    del args[i:i + 2]
    assert_usage_error(run_cli(*args), "--amqp-port")
