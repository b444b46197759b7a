"""Where AMQP listens: by default every address of both families, as RabbitMQ
(so `amqp://[::1]` works, and clients that resolve `localhost` to ::1 first);
`--listen` / `[amqp] listen` pick addresses instead. `--host` stays this node's
advertised address (Raft, admin, metrics)."""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from node.amqp.config import ipv6_available
from tests.broker_proc import NodeProcess, free_port, uniq
from tests.support.cli import assert_usage_error, run_cli, serve_args
from tests.support.pki import Pki, client_context, make_pki, tls_config

pytestmark = [
    pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                       reason="starts mirrorq nodes with their own listen addresses"),
    pytest.mark.skipif(not ipv6_available("::1"),
                       reason="IPv6 is unavailable on this machine (no ::1 on loopback)"),
]


def _connect(host: str, port: int, **kw: object) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=host, port=port, heartbeat=0, socket_timeout=10, connection_attempts=1,
        credentials=pika.PlainCredentials("guest", "guest"), **kw))


def _round_trip(conn: pika.BlockingConnection) -> None:
    """A confirmed publish and its basic.get: the connection really works."""
    ch = conn.channel()
    q = ch.queue_declare(uniq("v6"), exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"over ipv6")
    m, _p, body = ch.basic_get(q, auto_ack=True)
    assert m is not None and body == b"over ipv6"
    conn.close()


def _refused(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(5)
        return s.connect_ex((host, port)) != 0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki6"))


@pytest.fixture(scope="module")
def default_node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """No listen address configured (plain and amqps)."""
    node = NodeProcess(tmp_path_factory.mktemp("v6") / "data", config=tls_config(pki), amqps=True)
    node.start()
    try:
        yield node
    finally:
        node.stop()


def test_amqp_listens_on_ipv6_and_ipv4_by_default(default_node: NodeProcess) -> None:
    _round_trip(_connect("::1", default_node.amqp_port))
    _round_trip(pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@[::1]:{default_node.amqp_port}/%2F?heartbeat=0")))
    _round_trip(_connect("127.0.0.1", default_node.amqp_port))


def test_amqps_listens_on_ipv6_by_default(default_node: NodeProcess, pki: Pki) -> None:
    assert default_node.amqps_port is not None
    _round_trip(_connect("::1", default_node.amqps_port,
                         ssl_options=pika.SSLOptions(client_context(pki), "localhost")))


def test_a_configured_listen_address_is_the_only_one(tmp_path: Path) -> None:
    """--listen 127.0.0.1 keeps AMQP off ::1 (and off every other address)."""
    node = NodeProcess(tmp_path / "data", extra_args=("--listen", "127.0.0.1"))
    node.start()
    try:
        _round_trip(_connect("127.0.0.1", node.amqp_port))
        assert _refused("::1", node.amqp_port)
    finally:
        node.stop()


def test_listen_from_the_config_file_ipv6_only(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", config='[amqp]\nlisten = ["::1"]\n')
    node.ready_host = "::1"
    node.start()
    try:
        _round_trip(_connect("::1", node.amqp_port))
        assert _refused("127.0.0.1", node.amqp_port)
    finally:
        node.stop()


def test_bad_listen_settings_exit_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[amqp]\nlisten = []\n")
    assert_usage_error(run_cli(*serve_args(tmp_path, "--config", str(bad))), "amqp.listen")
    bad.write_text('[amqp]\nlisten = ["::1"]\nport = 1\n')
    assert_usage_error(run_cli(*serve_args(tmp_path, "--config", str(bad))), "amqp.port")
    # an address this machine does not have (TEST-NET-3)
    assert_usage_error(run_cli(*serve_args(tmp_path, "--listen", "203.0.113.7")),
                       "cannot listen on 203.0.113.7")
    # the AMQP port taken on ::1 only: the default (every address) cannot bind it
    port = free_port()
    with socket.socket(socket.AF_INET6) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(("::1", port))
        s.listen(1)
        args = serve_args(tmp_path)
        args[args.index("--amqp-port") + 1] = str(port)
        assert_usage_error(run_cli(*args), f"cannot listen on [::]:{port}")
