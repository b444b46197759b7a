"""A flood of refused sockets costs a few log lines, not one each (issue 42
item 10): a real node with small per-address caps, 60 sockets past them on
the HTTP and the AMQP port; the node's log holds at most one WARNING per
cause for them (the interval is 10 s), where the HTTP listener wrote one per
socket before."""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.process import wait_for
from tests.broker_proc import NodeProcess, start_http_node

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="mirrorq's own node and log")
CAP, FLOOD = 2, 60


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(Path(tmp_path_factory.mktemp("refusal-log")) / "n1",
                        config=f"max_handshakes_per_address = {CAP}\n"
                               f"[http]\nmax_connections_per_address = {CAP}\n")
    try:
        yield n
    finally:
        n.stop()


def refused_lines(log_path: Path, text: str) -> list[str]:
    return [line for line in log_path.read_text(errors="replace").splitlines()
            if "WARNING" in line and text in line]


def closed_by_node(s: socket.socket) -> bool:
    """The node closed the socket (after a 503 on HTTP) within the timeout."""
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def flood(port: int) -> None:
    """CAP idle sockets held open, then FLOOD more, each refused by the node."""
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CAP)]
    try:
        for _ in range(FLOOD):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                assert closed_by_node(s)
    finally:
        for s in held:
            s.close()


def test_refused_http_sockets_log_a_bounded_number_of_warnings(node: NodeProcess) -> None:
    flood(node.http_port)  # type: ignore[attr-defined]
    lines = wait_for(lambda: refused_lines(node.log_path, "HTTP connection from") or None,
                     timeout=10, what="the refusal's WARNING line")
    # before issue 42: 60 lines, one per refused socket
    assert len(lines) == 1, lines


def test_refused_amqp_sockets_log_a_bounded_number_of_warnings(node: NodeProcess) -> None:
    flood(node.amqp_port)
    lines = wait_for(lambda: refused_lines(node.log_path, "in the AMQP handshake") or None,
                     timeout=10, what="the refusal's WARNING line")
    assert len(lines) == 1, lines
