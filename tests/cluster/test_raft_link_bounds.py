"""Issue 42 item 10: what a peer holding the Raft password, or a certificate
of the cluster CA, can still make a member do, against real node processes.

- A frame header announcing 1 GiB, after a handshake made with the right
  password, is refused from the header (raft.max_frame_bytes, 64 MiB by
  default): the member neither waits for nor buffers its body (before: the
  length was trusted up to 1 GiB and 256 MiB of body sat in the member's
  read buffer). Before authentication a 1 GiB header is refused too.
- A malformed snapshot chunk (its header announcing 2**62 bytes) from a peer
  that authenticated as the leader is refused with one log line; the member
  keeps running and catches up with the real leader afterwards (before: a
  MemoryError escaped the snapshot check into the Raft thread).
- With mutual TLS, a certificate of the cluster CA that does not name the
  address its holder claims is refused (before: any certificate of the CA
  passed for any member), while the members' own certificates (local-cluster's
  make_member: their IP in the SAN) still form the cluster.
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
from harness.process import CLUSTER_PASSWORD, Cluster, ClusterNode, wait_for
from node.app.pki import make_ca, make_member
from node.replication.codec import decode, encode
from node.replication.machine import BrokerState
from node.replication.raft.link.frame import (
    HDR,
    K_CHALLENGE,
    K_HELLO,
    K_MSG,
    K_PROOF,
    K_WELCOME,
    frame_mac,
    frame_tag,
)
from node.replication.raft.link.handshake import PROTOCOL, _proof, session_keys
from node.replication.raft.link.security import link_key
from node.replication.raft.snapshot import encode_snapshot
from tests.support.memory import rss
from tests.support.snapshot import META

MIB = 1 << 20


def _frame(kind: int, payload: bytes) -> bytes:
    return HDR.pack(1 + len(payload), kind) + payload


def _recv_exact(sock: Any, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError, OSError):
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


def _read_frame(sock: Any, timeout: float = 10.0) -> tuple[int, bytes] | None:
    sock.settimeout(timeout)
    head = _recv_exact(sock, 5)
    if head is None:
        return None
    n, kind = HDR.unpack(head)
    body = _recv_exact(sock, n - 1)
    return None if body is None else (kind, body)


class _Member:
    """A raw client that claims to be the member at `claim` and holds the Raft
    password: it sends MAC'd frames as that member would.

    Its first frames go out in the same write as its proof: the member it
    impersonates redials within connectionRetryTime (0.5 s) and its link
    replaces this one, so a frame sent after a round trip for the WELCOME
    could reach a link already closed (a race a loaded machine lost)."""

    def __init__(self, target: ClusterNode, claim: str, password: str = CLUSTER_PASSWORD) -> None:
        key = link_key(password.encode())
        self.sock = socket.create_connection((target.host, target.raft_port), timeout=10)
        nonce = os.urandom(32)
        self.sock.sendall(_frame(K_HELLO, encode({"protocol": PROTOCOL, "address": claim, "nonce": nonce})))
        got = _read_frame(self.sock)
        assert got is not None and got[0] == K_CHALLENGE, got
        challenge = decode(got[1])
        transcript = (nonce, challenge["nonce"], claim.encode(), challenge["address"].encode())
        self._proof = _frame(K_PROOF, encode({"proof": _proof(key, b"client-proof", *transcript)}))
        c2s, _s2c = session_keys(key, transcript)
        self.send_key = frame_mac(c2s)
        self.seq = 0

    def authenticate(self, *first: bytes) -> tuple[int, bytes] | None:
        """Send the proof and the `first` frames in one write; the WELCOME
        (None if the member closed the link before it reached us)."""
        self.sock.sendall(self._proof + b"".join(first))
        return _read_frame(self.sock)

    def message_frame(self, message: dict[str, Any]) -> bytes:
        payload = encode(message)
        header = HDR.pack(1 + len(payload) + 32, K_MSG)
        tag = frame_tag(self.send_key, self.seq, header, [payload])
        self.seq += 1
        return header + payload + tag

    def close(self) -> None:
        self.sock.close()


def _stream_until_closed(sock: socket.socket, total: int, timeout: float) -> int:
    """Send up to `total` bytes of body, 1 MiB at a time; the bytes sent
    before the peer closed the link (or all of them)."""
    sock.settimeout(timeout)
    block = b"\0" * MIB
    sent = 0
    deadline = time.monotonic() + timeout
    try:
        while sent < total and time.monotonic() < deadline:
            sock.sendall(block)
            sent += len(block)
    except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
        pass
    return sent


def _closed(sock: Any, timeout: float = 10.0) -> bool:
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


def test_a_gib_frame_header_is_refused_before_its_body_is_read(cluster: Cluster) -> None:
    target, other = cluster.followers()[:2]
    # after a handshake with the right password, as a member (the other follower:
    # an address the cluster does not know is dropped once authenticated)
    before = rss(target)
    peer = _Member(target, other.raft_address)
    try:
        peer.authenticate(HDR.pack(1 << 30, K_MSG))
        sent = _stream_until_closed(peer.sock, 256 * MIB, timeout=15)
        grown = rss(target) - before
    finally:
        peer.close()
    assert sent < 256 * MIB, f"the member read all {sent >> 20} MiB sent of a 1 GiB frame's body"
    assert grown < 48 * MIB, f"the member's RSS grew {grown >> 20} MiB for an announced 1 GiB frame"
    wait_for(lambda: "bad frame length 1073741824 (at most 67108864)" in target.tail_log(300), timeout=10,
             what="the refusal logged")
    # before authentication (no password): refused from the header too
    with socket.create_connection((target.host, target.raft_port), timeout=5) as s:
        s.sendall(HDR.pack(1 << 30, K_HELLO))
        assert _closed(s), "a 1 GiB pre-auth header kept the link open"
    queue = uniq_queue("bounds")
    declare(cluster.leader(), queue)
    publish_confirmed(target, queue)


def _snapshot_head_lying_about_its_length() -> bytes:
    data = bytearray(encode_snapshot(BrokerState(), META))
    struct.pack_into("<Q", data, 12, 1 << 62)  # the header's u64 body length (<8sHHQI)
    return bytes(data)


def test_a_malformed_snapshot_chunk_is_refused_and_the_follower_catches_up(cluster: Cluster) -> None:
    leader = cluster.leader()
    target = cluster.followers()[0]
    queue = uniq_queue("snap")
    declare(leader, queue)
    publish_confirmed(leader, queue)
    st = target.status()
    term = int(st["term"])
    # as the leader (its address, its term), a one-chunk snapshot whose header lies
    peer = _Member(target, leader.raft_address)
    try:
        welcome = peer.authenticate(peer.message_frame({
            "type": "append_entries", "term": term, "commit_index": int(st["commit_index"]),
            "serialized": [_snapshot_head_lying_about_its_length(), True, True],
            "snapshot_index": int(st["commit_index"]) + 1000}))
        assert welcome is not None and welcome[0] == K_WELCOME, welcome
        wait_for(lambda: "refusing the snapshot the leader sent" in target.tail_log(300), timeout=10,
                 what="the malformed snapshot refused")
    finally:
        peer.close()
    assert target.try_status(), "the member stopped answering"
    # the member keeps taking the real leader's entries
    for _ in range(5):
        publish_confirmed(leader, queue)
    goal = int(cluster.leader().status()["commit_index"])
    wait_for(lambda: int(target.status()["commit_index"]) >= goal, timeout=15,
             what="the member caught up after the malformed snapshot")
    assert "Traceback" not in target.tail_log(2000)


def _tls_args(tls: Path, name: str, hosts: list[str]) -> list[str]:
    cert, key = make_member(tls, name, hosts)
    return ["--raft-tls-cert", str(cert), "--raft-tls-key", str(key), "--raft-tls-ca", str(tls / "ca.pem")]


def test_a_certificate_of_the_ca_for_another_name_is_refused(
        cluster_factory: Callable[..., Cluster], tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    make_ca(tls)
    c = cluster_factory(3)
    c.config_path.write_text('loopback_users = ["guest"]\n')  # TLS alone authenticates: no password
    for n in c.nodes:
        n.extra_args = _tls_args(tls, n.node_id, [n.host])  # what local-cluster issues: the IP in the SAN
    c.start()
    leader = c.leader()
    target = c.followers()[0]
    cert, key = make_member(tls, "evil", ["10.9.9.9"])  # the cluster's CA, another member's name
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(str(cert), str(key))
    ctx.load_verify_locations(str(tls / "ca.pem"))
    with socket.create_connection((target.host, target.raft_port), timeout=5) as raw, \
            ctx.wrap_socket(raw) as s:
        s.sendall(_frame(K_HELLO, encode({"protocol": PROTOCOL, "address": leader.raft_address,
                                          "nonce": os.urandom(32)})))
        got = _read_frame(s, timeout=10)
        assert got is None, f"a certificate for 10.9.9.9 passed for {leader.raft_address}: got frame {got[0]}"
    wait_for(lambda: "does not name '127.0.0.1'" in target.tail_log(300), timeout=10,
             what="the refusal logged")
    queue = uniq_queue("tlsname")
    declare(leader, queue)
    publish_confirmed(target, queue)
