"""Issue 26 items 5 and 10: a stranger on the Raft port cannot hold sockets,
and a node whose Raft links are not authenticated is not reachable.

- A ping before authentication closes the link at once (pings used to
  refresh the silence timer, so a pinging stranger kept its socket forever).
- A handshake trickled a byte at a time is closed HANDSHAKE_DEADLINE after
  accept (each byte used to refresh the silence timer too).
- Past MAX_UNAUTHENTICATED held sockets the oldest are closed at once, and
  meanwhile AMQP logins work and a restarted member rejoins through the flood.
- No Raft password and no TLS: the Raft port listens on loopback only, and
  AddMember (HTTP and gRPC) refuses an address that is not loopback.
"""
from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pika
import pytest

from harness.client import pika_conn
from harness.process import Cluster, wait_for
from node.admin.client import call_add_member
from node.app.pki import make_ca, make_member
from node.replication.codec import encode
from node.replication.raft.link.frame import K_HELLO, K_PING
from node.replication.raft.link.handshake import HANDSHAKE_DEADLINE, MAX_UNAUTHENTICATED, PROTOCOL
from tests.broker_proc import NodeProcess, start_http_node
from tests.support.net import connects, non_loopback_ipv4


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack("<IB", 1 + len(payload), kind) + payload


def _is_closed(sock: socket.socket) -> bool:
    """Non-blocking: has the peer closed (EOF or reset)?"""
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (ConnectionResetError, BrokenPipeError, ssl.SSLError, OSError):
        return True


def _feed_until_closed(sock: socket.socket, chunks: list[bytes], every: float, timeout: float) -> float | None:
    """Send one chunk every `every` seconds; seconds until the peer closed, or None."""
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < timeout:
        if _is_closed(sock):
            return time.monotonic() - t0
        try:
            sock.sendall(chunks[i % len(chunks)])
        except OSError:
            return time.monotonic() - t0
        i += 1
        time.sleep(every)
    return None


def test_pings_before_authentication_close_the_link(shared_cluster: Cluster) -> None:
    target = shared_cluster.followers()[0]
    with socket.create_connection((target.host, target.raft_port), timeout=5) as s:
        took = _feed_until_closed(s, [_frame(K_PING, b"\x00")], every=0.3, timeout=HANDSHAKE_DEADLINE + 3)
    assert took is not None, "a stranger that only pings kept its Raft socket"
    assert took < 3, f"a pre-auth ping closed the link only after {took:.1f}s"


def test_a_trickled_handshake_is_closed_at_the_deadline(shared_cluster: Cluster) -> None:
    target = shared_cluster.followers()[0]
    mark = target.log_mark()
    hello = _frame(K_HELLO, encode({"protocol": PROTOCOL, "address": "127.0.0.1:1", "nonce": b"n" * 32}))
    bytewise = [hello[i:i + 1] for i in range(len(hello))]
    with socket.create_connection((target.host, target.raft_port), timeout=5) as s:
        took = _feed_until_closed(s, bytewise, every=0.5, timeout=HANDSHAKE_DEADLINE + 5)
    assert took is not None, "a handshake trickled a byte at a time kept its socket"
    assert took >= HANDSHAKE_DEADLINE - 1, took
    assert "no handshake within" in target.log_since(mark)


def _client_hello() -> bytes:
    """The first flight of a TLS client: what a stranger would trickle."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(inc, out)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return out.read()


def test_a_trickled_tls_handshake_is_closed_at_the_deadline(
        cluster_factory: Callable[..., Cluster], tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    make_ca(tls)
    c = cluster_factory(1)
    c.config_path.write_text('loopback_users = ["guest"]\n')
    node = c.nodes[0]
    cert, key = make_member(tls, node.node_id, [node.host])
    node.extra_args = ["--raft-tls-cert", str(cert), "--raft-tls-key", str(key),
                       "--raft-tls-ca", str(tls / "ca.pem")]
    c.start()
    hello = _client_hello()
    bytewise = [hello[i:i + 1] for i in range(len(hello))]
    with socket.create_connection((node.host, node.raft_port), timeout=5) as s:
        took = _feed_until_closed(s, bytewise, every=0.5, timeout=HANDSHAKE_DEADLINE + 5)
    assert took is not None, "a TLS handshake trickled a byte at a time kept its socket"
    assert took >= HANDSHAKE_DEADLINE - 1, took


def test_a_flood_of_unauthenticated_sockets_locks_out_no_member_and_no_client(cluster: Cluster) -> None:
    leader = cluster.leader()
    member = cluster.followers()[0]
    addr = (leader.host, leader.raft_port)
    flood = 2 * MAX_UNAUTHENTICATED + 20
    held = [socket.create_connection(addr, timeout=5) for _ in range(flood)]
    stop = threading.Event()
    extra: list[socket.socket] = []

    def keep_flooding() -> None:  # new strangers all along the member's restart
        while not stop.is_set():
            with contextlib.suppress(OSError):
                extra.append(socket.create_connection(addr, timeout=5))
            time.sleep(0.02)

    flooder = threading.Thread(target=keep_flooding, daemon=True)
    try:
        # the oldest are evicted as soon as the cap is passed, before the 3.5 s silence timeout
        wait_for(lambda: sum(map(_is_closed, held)) >= flood - MAX_UNAUTHENTICATED, timeout=2.5,
                 what=f"{flood - MAX_UNAUTHENTICATED} of {flood} held sockets closed")
        flooder.start()
        conn = pika_conn(leader)  # AMQP logins still work
        conn.close()
        member.stop()
        wait_for(lambda: member.node_id not in (leader.status()["in_sync"] or ()), timeout=20,
                 what=f"{member.node_id} out of sync")
        member.start(wait=False)
        wait_for(lambda: member.node_id in (leader.status()["in_sync"] or ()), timeout=30,
                 what=f"{member.node_id} back in sync through the flood")
        conn = pika_conn(leader)
        conn.close()
    finally:
        stop.set()
        if flooder.is_alive():
            flooder.join(timeout=5)
        for s in held + extra:
            s.close()


# ---------------------------------------------- item 10: no password, no TLS

@pytest.mark.parametrize("own_host", ["loopback", "routable"])
def test_without_password_or_tls_raft_listens_on_loopback_only(tmp_path: Path, own_host: str) -> None:
    ip = non_loopback_ipv4()
    if ip is None:
        pytest.skip("this machine has no non-loopback address to probe")
    extra: tuple[str, ...] = ("--host", ip) if own_host == "routable" else ()
    n = NodeProcess(tmp_path / "n1", extra_args=extra)
    n.start()
    try:
        wait_for(lambda: connects("127.0.0.1", n.raft_port), timeout=15, what="Raft port on loopback")
        assert not connects(ip, n.raft_port), f"an unauthenticated Raft port answers on {ip}"
    finally:
        n.stop()


def test_without_password_or_tls_add_member_of_a_routable_address_is_refused(tmp_path: Path) -> None:
    n = start_http_node(tmp_path / "n1")
    try:
        http_port = n.http_port  # type: ignore[attr-defined]
        req = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/api/mirrorq/members/n9", method="PUT",
            data=json.dumps({"address": "192.0.2.9:25672"}).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=20)
        assert err.value.code == 409, err.value.code
        assert "not authenticated" in err.value.read().decode()
        with pytest.raises(grpc.RpcError) as rpc:
            call_add_member("127.0.0.1", n.admin_port, "n9", "192.0.2.9:25672", timeout=20,
                            token=n.admin_token)
        assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, rpc.value
        assert "not authenticated" in (rpc.value.details() or "")
        conn = pika.BlockingConnection(pika.URLParameters(n.url))  # still serves, alone
        conn.close()
    finally:
        n.stop()
