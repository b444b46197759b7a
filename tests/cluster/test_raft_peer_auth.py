"""Issue 11: the Raft port takes only peers that prove themselves, and nothing a
stranger sends changes the cluster.

- Garbage bytes, an oversized frame before authentication, a wrong Raft
  password in the challenge-response, a client that never finishes the
  handshake: each connection is closed, the refusal is logged and counted
  (status peer_rejects), and every member keeps its leader, term and members.
- With mutual TLS ([raft] tls_cert/tls_key/tls_ca from one cluster CA): a
  client without a certificate, and a member whose certificate comes from
  another CA, are refused; the cluster forms, confirms and keeps its leader.
"""
from __future__ import annotations

import os
import socket
import ssl
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.client import declare, publish_confirmed, uniq_queue
from harness.process import Cluster, ClusterNode, free_port, wait_for
from node.app.pki import make_ca, make_member
from node.replication.codec import encode
from node.replication.raft.link.frame import K_HELLO, K_PROOF
from node.replication.raft.link.handshake import PROTOCOL, _proof
from node.replication.raft.link.security import link_key


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack("<IB", 1 + len(payload), kind) + payload


def _closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True once the peer closed (EOF or reset) within `timeout`; whatever it
    sent first (a challenge) is read and ignored."""
    sock.settimeout(0.5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError, OSError):
            return True
    return False


def _view(c: Cluster) -> dict[str, tuple[Any, ...]]:
    out = {}
    for n in c.nodes:
        st = n.status()
        out[n.node_id] = (st["leader"], st["term"], tuple(sorted(st["members"])))
    return out


def _rejects(c: Cluster) -> int:
    return sum(int(n.status()["peer_rejects"]) for n in c.nodes)


def test_garbage_wrong_password_and_stalled_handshakes_are_refused_and_change_nothing(
        shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    leader = cluster.leader()
    queue = uniq_queue("auth")
    declare(leader, queue)
    before = _view(cluster)
    rejects0 = _rejects(cluster)
    target = cluster.followers()[0]
    mark = target.log_mark()
    addr = (target.host, target.raft_port)

    # 1. random bytes: not a frame any member would send
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(os.urandom(4096))
        assert _closed_by_peer(s), "garbage did not get the connection closed"

    # 2. a frame larger than any handshake frame, before authentication
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(struct.pack("<IB", 64 * 1024 * 1024, K_HELLO) + b"x" * 1024)
        assert _closed_by_peer(s), "an oversized pre-auth frame was accepted"

    # 3. a well-formed hello claiming to be a member, then a proof made with the wrong password
    nonce = os.urandom(32)
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(_frame(K_HELLO, encode({"protocol": PROTOCOL, "address": leader.raft_address,
                                          "nonce": nonce})))
        s.settimeout(5)
        head = s.recv(5)
        assert len(head) == 5, "no challenge came back"
        (n,) = struct.unpack_from("<I", head)
        rest = b""
        while len(rest) < n - 1:
            rest += s.recv(n - 1 - len(rest))
        from node.replication.codec import decode
        challenge = decode(rest)
        wrong = _proof(link_key(b"not-the-password"), b"client-proof", nonce, challenge["nonce"],
                       leader.raft_address.encode(), target.raft_address.encode())
        s.sendall(_frame(K_PROOF, encode({"proof": wrong})))
        assert _closed_by_peer(s), "a wrong password proof was accepted"

    # 4. a peer that connects and says nothing is dropped after connectionTimeout
    with socket.create_connection(addr, timeout=5) as s:
        assert _closed_by_peer(s, timeout=15), "a silent connection was kept open"

    wait_for(lambda: _rejects(cluster) >= rejects0 + 4, timeout=10, what="4 refusals counted")
    assert "raft peer" in target.log_since(mark) and "refused" in target.log_since(mark)
    assert _view(cluster) == before
    publish_confirmed(cluster.followers()[0], queue)
    assert _view(cluster) == before


def _tls_args(tls: Path, node: ClusterNode) -> list[str]:
    cert, key = make_member(tls, node.node_id, [node.host])
    return ["--raft-tls-cert", str(cert), "--raft-tls-key", str(key), "--raft-tls-ca", str(tls / "ca.pem")]


def test_mutual_tls_cluster_refuses_peers_without_a_cluster_certificate(
        cluster_factory: Callable[..., Cluster], tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    make_ca(tls)
    c = cluster_factory(3)
    c.config_path.write_text('loopback_users = ["guest"]\n')  # TLS alone authenticates: no password
    for n in c.nodes:
        n.extra_args = _tls_args(tls, n)
    c.start()
    assert all(n.status()["peer_tls"] for n in c.nodes)
    leader = c.leader()
    queue = uniq_queue("tls")
    declare(leader, queue)
    publish_confirmed(c.followers()[0], queue)
    before = _view(c)
    rejects0 = _rejects(c)
    target = c.followers()[0]
    addr = (target.host, target.raft_port)

    # a TLS client with no certificate: the handshake fails
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(addr, timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                s.sendall(_frame(K_HELLO, encode({"protocol": PROTOCOL, "address": leader.raft_address,
                                                  "nonce": os.urandom(32)})))
                assert _closed_by_peer(s), "a client without a certificate was served"
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            pass  # refused during the handshake: what we want

    # plain text to a TLS port
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(_frame(K_HELLO, encode({"protocol": PROTOCOL, "address": leader.raft_address,
                                          "nonce": os.urandom(32)})))
        assert _closed_by_peer(s), "plain text was accepted on a TLS Raft port"

    # a member certificate from another CA, on a real node that lists the cluster as peers
    other = tmp_path / "other-ca"
    make_ca(other, cn="some other CA")
    intruder = ClusterNode("n4", c.base_dir / "n4" / "data", config_path=c.config_path)
    # pysyncobj's rule: the member with the greater address dials. The members do not
    # know n4, so n4 must be the one to dial them for its certificate to be tried.
    while intruder.raft_address <= max(n.raft_address for n in c.nodes):
        intruder.raft_port = free_port()
    intruder.peers = {n.node_id: n.raft_address for n in c.nodes}
    intruder.extra_args = _tls_args(other, intruder)
    c.removed.append(intruder)  # killed by the fixture
    intruder.start(wait=False)
    wait_for(intruder.try_status, timeout=30, what="the intruder's admin API")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        st = intruder.status()
        assert st["leader"] is None and st["commit_index"] <= 1, st  # 1: pysyncobj's initial entry
        assert _view(c) == before
        time.sleep(0.2)
    wait_for(lambda: _rejects(c) >= rejects0 + 3, timeout=10, what="the refusals counted")
    publish_confirmed(c.followers()[0], queue)
    assert _view(c) == before
