"""The TLS listeners (amqps, management HTTPS) count and cap sockets at
accept, before the TLS handshake, with the plain listeners' limits (issue 42
item 5). A real node with both TLS listeners from a test CA, raw sockets.

Before: asyncio's listener did the handshake before the server saw the
socket, so 300 of 300 idle sockets from one address stayed open on each TLS
port (plain HTTP refused past 64)."""
from __future__ import annotations

import http.client
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_proc import NodeProcess, free_port, uniq, wait_for
from tests.support.pki import Pki, client_context, make_pki, tls_config

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="mirrorq's own listeners")

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
IDLE = 300
CAP = 64  # max_handshakes_per_address and [http] max_connections_per_address defaults


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def start(pki: Pki, tmp: Path, timeouts: float) -> NodeProcess:
    """amqps and HTTPS from the test CA; `timeouts`: the handshake deadlines."""
    https_port = free_port()
    extra = f"handshake_timeout = {timeouts}\n[http]\nidle_timeout = {timeouts}\n"
    n = NodeProcess(tmp / uniq("data"), amqps=True, config=tls_config(pki, extra=extra),
                    extra_args=("--https-port", str(https_port)))
    n.https_port = https_port  # type: ignore[attr-defined]
    n.start()

    def https_answers() -> bool:
        try:
            return https_status(n, pki, "127.0.0.1") == 401
        except OSError:
            return False
    try:
        wait_for(https_answers, timeout=20, what="the HTTPS listener")
    except BaseException:
        n.stop()
        raise
    return n


@pytest.fixture(scope="module")
def node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    # deadlines far past the test's waits: what closes sockets here is the caps
    n = start(pki, tmp_path_factory.mktemp("caps"), 60.0)
    try:
        yield n
    finally:
        n.stop()


def https_status(n: NodeProcess, pki: Pki, source: str) -> int:
    conn = http.client.HTTPSConnection("localhost", n.https_port,  # type: ignore[attr-defined]
                                       context=client_context(pki), timeout=10,
                                       source_address=(source, 0))
    try:
        conn.request("GET", "/api/overview")
        return conn.getresponse().status
    finally:
        conn.close()


def amqps_start(n: NodeProcess, pki: Pki, source: str) -> bytes:
    """A TLS handshake and the protocol header from `source`: the first frame's bytes."""
    assert n.amqps_port is not None
    raw = socket.socket()
    raw.bind((source, 0))
    raw.settimeout(10)
    raw.connect(("127.0.0.1", n.amqps_port))
    with client_context(pki).wrap_socket(raw, server_hostname="localhost") as s:
        s.sendall(AMQP_HEADER)
        return s.recv(7)


def idle_sockets(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setblocking(False)  # still_open peeks (a timeout would make recv wait first)
        socks.append(s)
    return socks


def still_open(socks: list[socket.socket]) -> int:
    """How many the node has not closed (nothing was sent on them: any byte or
    EOF is the node's doing)."""
    n = 0
    for s in socks:
        try:
            if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                n += 1  # not expected (the node never speaks first) but open
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


@pytest.mark.parametrize("listener", ["amqps", "https"])
def test_idle_sockets_before_tls_are_capped_per_address(node: NodeProcess, pki: Pki,
                                                        listener: str) -> None:
    """300 idle sockets from 127.0.0.1 (no ClientHello): at most the per-address
    cap (64) stay open, the rest are closed at accept; a client from another
    address (127.0.0.2) still completes TLS and is served."""
    port = node.amqps_port if listener == "amqps" else node.https_port  # type: ignore[attr-defined]
    assert port is not None
    socks = idle_sockets(port, IDLE)
    try:
        wait_for(lambda: still_open(socks) <= CAP, timeout=10, interval=0.1,
                 what=f"the node to close the idle {listener} sockets over the cap "
                      f"(open: {still_open(socks)} of {IDLE})")
        if listener == "amqps":
            assert amqps_start(node, pki, "127.0.0.2")[:1] == b"\x01"  # connection.start
        else:
            assert https_status(node, pki, "127.0.0.2") == 401
        assert still_open(socks) == CAP  # the admitted ones wait out their deadline
    finally:
        for s in socks:
            s.close()
    # their places are free again: the same address is served
    if listener == "amqps":
        wait_for(lambda: amqps_start(node, pki, "127.0.0.1")[:1] == b"\x01", timeout=10,
                 what="amqps from 127.0.0.1 once its sockets closed")
    else:
        wait_for(lambda: https_status(node, pki, "127.0.0.1") == 401, timeout=10,
                 what="HTTPS from 127.0.0.1 once its sockets closed")


def test_tls_handshake_has_a_deadline(pki: Pki, tmp_path: Path) -> None:
    """An admitted socket that never sends a ClientHello is closed after the
    handshake deadline (handshake_timeout for amqps, [http] idle_timeout for
    HTTPS), so a counted place is never held for long."""
    n = start(pki, tmp_path, 1.0)
    try:
        assert n.amqps_port is not None
        socks = idle_sockets(n.amqps_port, 3) + idle_sockets(n.https_port, 3)  # type: ignore[attr-defined]
        try:
            wait_for(lambda: still_open(socks) == 0, timeout=8, interval=0.1,
                     what="the handshake deadline to close idle TLS sockets")
        finally:
            for s in socks:
                s.close()
    finally:
        n.stop()
