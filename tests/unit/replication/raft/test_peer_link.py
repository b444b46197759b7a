"""Peer links of the Raft transport, in one process over real sockets: the
challenge-response (same password: connected both ways; other password: both
closed, nothing delivered), the frame MACs (a replayed, reordered, dropped or
altered frame closes the link, nothing delivered past it), a member on the
old link protocol refused with a line naming both, mutual TLS, a large
AppendEntries delivered whole and the per-follower byte window (_Flow).
(Snapshots: test_snapshot_format.py.)"""
from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE

from node.app.pki import make_ca, make_member
from node.replication.codec import decode, encode
from node.replication.raft.link.connection import PeerLink
from node.replication.raft.link.frame import (
    HTAG,
    K_APPEND,
    K_CHALLENGE,
    K_HELLO,
    K_MSG,
    K_PROOF,
    K_WELCOME,
    TAG,
    entries_digest,
    frame_mac,
    frame_tag,
    header_tag,
)
from node.replication.raft.link.handshake import _proof, session_keys
from node.replication.raft.link.security import PeerSecurity, tls_contexts
from node.replication.raft.replicator import _Flow


class _Pair:
    """A client link and the server link it reaches, on one poller."""

    def __init__(self, client_sec: PeerSecurity, server_sec: PeerSecurity) -> None:
        self.poller = createPoller("auto")
        self.rejects: list[str] = []
        self.got: list[Any] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        port = self.listener.getsockname()[1]
        self.client = PeerLink(self.poller, client_sec, "127.0.0.1:1", 5.0,
                               on_reject=lambda peer, why: self.rejects.append(why))
        self.client.setOnMessageReceivedCallback(self.got.append)
        assert self.client.connect("127.0.0.1", port)
        sock, _ = self.listener.accept()
        self.server = PeerLink(self.poller, server_sec, "127.0.0.1:2", 5.0, sock=sock,
                               on_reject=lambda peer, why: self.rejects.append(why))
        self.server.setOnMessageReceivedCallback(self.got.append)

    def run_until(self, cond: Callable[[], bool], rounds: int = 400) -> bool:
        for _ in range(rounds):
            if cond():
                return True
            self.poller.poll(0.01)
        return cond()

    def close(self) -> None:
        self.client.disconnect()
        self.server.disconnect()
        self.listener.close()


def _connected(p: _Pair) -> bool:
    return p.client.state == CONNECTION_STATE.CONNECTED and p.server.state == CONNECTION_STATE.CONNECTED


def test_same_password_connects_and_carries_messages_and_large_appends() -> None:
    sec = PeerSecurity.from_password(b"s3cret")
    p = _Pair(sec, sec)
    try:
        assert p.run_until(lambda: _connected(p)), p.rejects
        assert p.server.peer_address == "127.0.0.1:1"
        p.client.send({"type": "request_vote", "term": 3})
        entries = [(os.urandom(300_000), i, 2) for i in range(1, 9)]  # 2.4 MB of random bytes
        p.server.send_append({"type": "append_entries", "term": 2, "prevLogIdx": 0}, encode(entries))
        assert p.run_until(lambda: len(p.got) == 2)
        assert p.got[0] == {"type": "request_vote", "term": 3}
        assert p.got[1]["entries"] == entries and p.got[1]["prevLogIdx"] == 0
        assert not p.rejects
    finally:
        p.close()


def test_other_password_is_refused_before_any_message() -> None:
    p = _Pair(PeerSecurity.from_password(b"right"), PeerSecurity.from_password(b"wrong"))
    try:
        p.client.send({"type": "request_vote", "term": 99})  # not authenticated: dropped
        assert p.run_until(lambda: p.client.state == CONNECTION_STATE.DISCONNECTED
                           and p.server.state == CONNECTION_STATE.DISCONNECTED)
        assert p.got == []
        assert any("password" in why for why in p.rejects), p.rejects
    finally:
        p.close()


class _RawServer:
    """A member's acceptor written out by hand over a real socket: it runs the
    handshake with the password, then sends frames as the test builds them."""

    def __init__(self, password: bytes, frames: int = 2) -> None:
        self.frames = frames  # 2: the previous release's acceptor (no "frames" in CHALLENGE)
        self.poller = createPoller("auto")
        self.sec = PeerSecurity.from_password(password)
        self.rejects: list[str] = []
        self.got: list[Any] = []
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.client = PeerLink(self.poller, self.sec, "127.0.0.1:1", 5.0,
                               on_reject=lambda peer, why: self.rejects.append(why),
                               peer_address="127.0.0.1:2")
        self.client.setOnMessageReceivedCallback(self.got.append)
        assert self.client.connect("127.0.0.1", listener.getsockname()[1])
        self.sock, _ = listener.accept()
        listener.close()
        self.sock.settimeout(5)
        kind, hello = self._read()
        assert kind == K_HELLO
        nonce = os.urandom(32)
        assert decode(hello)["frames"] == 3  # this build offers version 3
        challenge: dict[str, Any] = {"nonce": nonce, "address": "127.0.0.1:2"}
        if frames == 3:
            challenge["frames"] = 3
        self.sock.sendall(self._plain(K_CHALLENGE, encode(challenge)))
        kind, proof = self._read()
        assert kind == K_PROOF
        transcript = (decode(hello)["nonce"], nonce, b"127.0.0.1:1", b"127.0.0.1:2")
        assert decode(proof)["proof"] == _proof(self.sec.key, b"client-proof", *transcript)
        self.sock.sendall(self._plain(K_WELCOME, encode({"proof": _proof(self.sec.key, b"server-proof",
                                                                         *transcript)})))
        _, s2c = session_keys(self.sec.key, transcript + ((b"frames-3",) if frames == 3 else ()))
        self.keyed = frame_mac(s2c)
        self.hkeyed = frame_mac(_proof(s2c, b"frame-header")) if frames == 3 else None
        assert self.run_until(lambda: self.client.state == CONNECTION_STATE.CONNECTED), self.rejects

    def _poll_read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            self.poller.poll(0.01)  # the client link writes from the poller
            self.sock.settimeout(0.01)
            try:
                out += self.sock.recv(n - len(out))
            except TimeoutError:
                continue
        return out

    def _read(self) -> tuple[int, bytes]:
        n, kind = struct.unpack("<IB", self._poll_read(5))
        return kind, self._poll_read(n - 1)

    @staticmethod
    def _plain(kind: int, payload: bytes) -> bytes:
        return struct.pack("<IB", 1 + len(payload), kind) + payload

    def framed(self, seq: int, message: dict[str, Any]) -> bytes:
        """A K_MSG frame as the acceptor's seq-th frame would be, with its MAC."""
        payload = encode(message)
        if self.hkeyed is not None:
            header = struct.pack("<IB", 1 + HTAG + len(payload) + TAG, K_MSG)
            return header + header_tag(self.hkeyed, seq, header) + payload + \
                frame_tag(self.keyed, seq, header, [payload])
        header = struct.pack("<IB", 1 + len(payload) + TAG, K_MSG)
        return header + payload + frame_tag(self.keyed, seq, header, [payload])

    def framed_append(self, seq: int, header: dict[str, Any], entries: list[Any]) -> bytearray:
        """A K_APPEND frame as the leader sends it: the MAC covers the header
        part and the digest of the entries."""
        head = encode(header)
        prefix, blob = struct.pack("<I", len(head)) + head, encode(entries)
        frame_header = struct.pack("<IB", 1 + len(prefix) + len(blob) + TAG, K_APPEND)
        tag = frame_tag(self.keyed, seq, frame_header, [prefix, entries_digest(blob)])
        return bytearray(frame_header + prefix + blob + tag)

    def run_until(self, cond: Callable[[], bool], rounds: int = 300) -> bool:
        for _ in range(rounds):
            if cond():
                return True
            self.poller.poll(0.01)
        return cond()

    def close(self) -> None:
        self.client.disconnect()
        self.sock.close()


@pytest.mark.parametrize("case", ["in order", "replayed", "reordered", "dropped", "altered", "unsigned"])
def test_frames_carry_a_mac_over_a_sequence_number(case: str) -> None:
    srv = _RawServer(b"a long enough raft password")
    try:
        f0, f1 = srv.framed(0, {"type": "m", "n": 0}), srv.framed(1, {"type": "m", "n": 1})
        unsigned = _RawServer._plain(K_MSG, encode({"type": "m", "n": 9}))
        altered = bytearray(f1)
        altered[8] ^= 1
        stream = {"in order": f0 + f1, "replayed": f0 + f0 + f1, "reordered": f1 + f0,
                  "dropped": f1, "altered": f0 + bytes(altered), "unsigned": f0 + unsigned}[case]
        srv.sock.sendall(stream)
        if case == "in order":
            assert srv.run_until(lambda: len(srv.got) == 2)
            assert [m["n"] for m in srv.got] == [0, 1] and not srv.rejects
            return
        assert srv.run_until(lambda: srv.client.state == CONNECTION_STATE.DISCONNECTED), case
        assert any("bad MAC" in why for why in srv.rejects), srv.rejects
        assert [m["n"] for m in srv.got] == ([] if case in ("reordered", "dropped") else [0])
    finally:
        srv.close()


@pytest.mark.parametrize("case", ["intact", "entry altered", "header length overrun"])
def test_an_append_mac_covers_its_entries_through_their_digest(case: str) -> None:
    srv = _RawServer(b"a long enough raft password")
    try:
        entries = [(os.urandom(2000), i, 2) for i in range(1, 4)]
        frame = srv.framed_append(0, {"type": "append_entries", "term": 2, "prevLogIdx": 0}, entries)
        if case == "entry altered":
            frame[-TAG - 100] ^= 1  # a byte of the last entry's body
        elif case == "header length overrun":
            frame[5:9] = struct.pack("<I", 1 << 20)
        srv.sock.sendall(bytes(frame))
        if case == "intact":
            assert srv.run_until(lambda: len(srv.got) == 1), srv.rejects
            assert srv.got[0]["entries"] == entries
            return
        assert srv.run_until(lambda: srv.client.state == CONNECTION_STATE.DISCONNECTED)
        assert srv.got == [] and any("bad MAC" in why for why in srv.rejects), srv.rejects
    finally:
        srv.close()


@pytest.mark.parametrize("case", ["in order", "length forged", "header tag altered", "replayed"])
def test_a_version_3_link_checks_each_header_before_its_body(case: str) -> None:
    # issue 42 item 10: a forged length is refused from the header, not after the body it announces
    srv = _RawServer(b"a long enough raft password", frames=3)
    try:
        assert srv.client._frames == 3
        f0, f1 = srv.framed(0, {"type": "m", "n": 0}), srv.framed(1, {"type": "m", "n": 1})
        forged = bytearray(f1)
        if case == "length forged":
            forged[0:4] = struct.pack("<I", 60 << 20)  # under max_frame: only the header MAC stops it
        elif case == "header tag altered":
            forged[5] ^= 1
        stream = {"in order": f0 + f1, "length forged": f0 + bytes(forged[:64]),
                  "header tag altered": f0 + bytes(forged), "replayed": f0 + f0}[case]
        srv.sock.sendall(stream)
        if case == "in order":
            assert srv.run_until(lambda: len(srv.got) == 2)
            assert [m["n"] for m in srv.got] == [0, 1] and not srv.rejects
            return
        # refused with 64 bytes of the 60 MiB announced in hand: the header alone decided
        assert srv.run_until(lambda: srv.client.state == CONNECTION_STATE.DISCONNECTED), case
        assert any("bad MAC on the header of frame 1" in why for why in srv.rejects), srv.rejects
        assert [m["n"] for m in srv.got] == [0]
    finally:
        srv.close()


def test_two_members_of_this_build_agree_on_version_3_and_carry_appends() -> None:
    sec = PeerSecurity.from_password(b"s3cret")
    p = _Pair(sec, sec)
    try:
        assert p.run_until(lambda: _connected(p)), p.rejects
        assert p.client._frames == p.server._frames == 3
        entries = [(os.urandom(3000), i, 2) for i in range(1, 4)]
        p.server.send_append({"type": "append_entries", "term": 2, "prevLogIdx": 0}, encode(entries))
        p.client.send({"type": "request_vote", "term": 3})
        assert p.run_until(lambda: len(p.got) == 2)
        assert p.got[0]["entries"] == entries and not p.rejects
    finally:
        p.close()


def test_a_member_on_the_old_link_protocol_is_refused_with_both_versions_named() -> None:
    poller = createPoller("auto")
    rejects: list[str] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    old = socket.create_connection(listener.getsockname(), timeout=5)
    sock, _ = listener.accept()
    server = PeerLink(poller, PeerSecurity.from_password(b"pw"), "127.0.0.1:2", 5.0, sock=sock,
                      on_reject=lambda peer, why: rejects.append(why))
    try:
        hello = encode({"protocol": b"MQRAFT01", "address": "127.0.0.1:1", "nonce": os.urandom(32)})
        old.sendall(struct.pack("<IB", 1 + len(hello), K_HELLO) + hello)
        for _ in range(200):
            if server.state == CONNECTION_STATE.DISCONNECTED:
                break
            poller.poll(0.01)
        assert server.state == CONNECTION_STATE.DISCONNECTED
        assert rejects and "MQRAFT01" in rejects[0] and "MQRAFT02" in rejects[0], rejects
        old.settimeout(5)
        assert old.recv(100) == b""  # closed, nothing sent back
    finally:
        old.close()
        listener.close()


def _tls(tmp: Path, name: str, ca_dir: Path, hosts: tuple[str, ...] = ("127.0.0.1",),
         verify_names: bool = True) -> PeerSecurity:
    cert, key = make_member(ca_dir, name, list(hosts))
    client, server = tls_contexts(str(cert), str(key), str(ca_dir / "ca.pem"))
    return PeerSecurity(client_tls=client, server_tls=server, verify_names=verify_names)


@pytest.mark.parametrize("side", ["dialer", "acceptor"])
def test_a_certificate_of_the_ca_for_another_name_is_refused(tmp_path: Path, side: str) -> None:
    # issue 42 item 10: any certificate of the cluster CA passed for any member
    ca = tmp_path / "ca"
    make_ca(ca)
    good, bad = _tls(tmp_path, "a", ca), _tls(tmp_path, "evil", ca, hosts=("10.9.9.9", "evil.example"))
    p = _Pair(bad, good) if side == "dialer" else _Pair(good, bad)
    try:
        assert p.run_until(lambda: p.client.state == CONNECTION_STATE.DISCONNECTED
                           and p.server.state == CONNECTION_STATE.DISCONNECTED)
        assert any("does not name '127.0.0.1'" in why for why in p.rejects), p.rejects
        assert p.got == [] and not p.client.authenticated and not p.server.authenticated
    finally:
        p.close()
    # raft.tls_verify_names = false: the CA alone, as before
    q = _Pair(_tls(tmp_path, "e", ca, hosts=("10.9.9.9",), verify_names=False),
              _tls(tmp_path, "f", ca, hosts=("10.9.9.8",), verify_names=False))
    try:
        assert q.run_until(lambda: _connected(q)), q.rejects
    finally:
        q.close()


def test_a_frame_longer_than_max_frame_is_refused_from_its_header() -> None:
    sec = PeerSecurity.from_password(b"s3cret", max_frame=1 << 20)
    p = _Pair(PeerSecurity.from_password(b"s3cret"), sec)
    try:
        assert p.run_until(lambda: _connected(p)), p.rejects
        p.client.send({"type": "x", "blob": b"\0" * 900_000})  # under the bound: carried
        assert p.run_until(lambda: len(p.got) == 1)
        p.client.send({"type": "x", "blob": b"\0" * (2 << 20)})  # over it: the link goes
        assert p.run_until(lambda: p.server.state == CONNECTION_STATE.DISCONNECTED)
        assert any(why.startswith("bad frame length") and "at most 1048576" in why for why in p.rejects)
        assert len(p.got) == 1
    finally:
        p.close()


def test_mutual_tls_from_one_ca_connects_and_another_ca_is_refused(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    make_ca(ca)
    p = _Pair(_tls(tmp_path, "a", ca), _tls(tmp_path, "b", ca))
    try:
        assert p.run_until(lambda: _connected(p)), p.rejects
        p.client.send({"type": "x", "blob": os.urandom(100_000)})
        assert p.run_until(lambda: len(p.got) == 1)
    finally:
        p.close()
    other = tmp_path / "other"
    make_ca(other, cn="another CA")
    q = _Pair(_tls(tmp_path, "c", other), _tls(tmp_path, "d", ca))
    try:
        assert q.run_until(lambda: q.client.state == CONNECTION_STATE.DISCONNECTED
                           and q.server.state == CONNECTION_STATE.DISCONNECTED)
        assert any("TLS" in why for why in q.rejects), q.rejects
        assert q.got == []
    finally:
        q.close()


def test_flow_window_counts_unacknowledged_bytes_and_forgets_on_reset() -> None:
    f = _Flow()
    f.sent(10, 300)
    f.sent(20, 500)
    f.sent(30, 400)
    f.settle(match=0, next_index=31)
    assert f.inflight == 1200
    f.settle(match=20, next_index=31)  # acks up to 20: two chunks done
    assert f.inflight == 400 and list(f.chunks) == [(30, 400)]
    f.settle(match=20, next_index=21)  # the follower reset us back to 21: resend from there
    assert f.inflight == 0 and not f.chunks


def test_a_message_whose_handling_raises_is_consumed_and_the_link_keeps_its_mac_sequence() -> None:
    """A handler that raised (a failing raft tick: the exception leaves the poll)
    left its frame in the read buffer after the MAC check had counted it: the
    next read checked it again under the next sequence number, 'bad MAC on
    frame 1', and the link closed, again on every new link while the failure
    lasted. The frame is consumed before it is handled."""
    sec = PeerSecurity.from_password(b"s3cret")
    p = _Pair(sec, sec)
    failures = [1]

    def handle(message: Any) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError(9, "Bad file descriptor")  # what a segment read raised (slowfs, issue 29)
        p.got.append(message)

    try:
        assert p.run_until(lambda: _connected(p)), p.rejects
        p.server.setOnMessageReceivedCallback(handle)
        p.client.send({"type": "append_entries", "n": 0})
        with pytest.raises(OSError):
            p.run_until(lambda: False, rounds=50)
        for i in range(1, 4):
            p.client.send({"type": "append_entries", "n": i})
        assert p.run_until(lambda: len(p.got) == 3), p.rejects
        assert [m["n"] for m in p.got] == [1, 2, 3]
        assert not p.rejects and _connected(p)
    finally:
        p.close()
