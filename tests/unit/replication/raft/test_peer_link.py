"""Peer links of the Raft transport, in one process over real sockets: the
challenge-response (same password: connected both ways; other password: both
closed, nothing delivered), mutual TLS, a large AppendEntries delivered whole,
the per-follower byte window (_Flow), and the snapshot unpickler's allowlist."""
from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node.app.pki import make_ca, make_member
from node.replication.codec import encode
from node.replication.machine import default_state
from node.replication.raft.shim import _Flow
from node.replication.raft.snapshot import load_snapshot
from node.replication.raft.transport import (
    CONNECTION_STATE,
    PeerLink,
    PeerSecurity,
    createPoller,
    tls_contexts,
)


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
        self.server = PeerLink(self.poller, server_sec, None, 5.0, sock=sock,
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
    sec = PeerSecurity(password=b"s3cret")
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
    p = _Pair(PeerSecurity(password=b"right"), PeerSecurity(password=b"wrong"))
    try:
        p.client.send({"type": "request_vote", "term": 99})  # not authenticated: dropped
        assert p.run_until(lambda: p.client.state == CONNECTION_STATE.DISCONNECTED
                           and p.server.state == CONNECTION_STATE.DISCONNECTED)
        assert p.got == []
        assert any("password" in why for why in p.rejects), p.rejects
    finally:
        p.close()


def _tls(tmp: Path, name: str, ca_dir: Path) -> PeerSecurity:
    cert, key = make_member(ca_dir, name, ["127.0.0.1"])
    client, server = tls_contexts(str(cert), str(key), str(ca_dir / "ca.pem"))
    return PeerSecurity(client_tls=client, server_tls=server)


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


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


def test_snapshot_unpickler_loads_broker_state_and_refuses_callables() -> None:
    state = default_state()
    assert type(load_snapshot(pickle.dumps((state, {"x": 1}), protocol=5))[0]) is type(state)
    with pytest.raises(pickle.UnpicklingError):
        load_snapshot(pickle.dumps(_Evil()))
    with pytest.raises(pickle.UnpicklingError):
        load_snapshot(pickle.dumps(print))
    from node.replication.config import RaftConfig  # a type of ours, but not of the state
    with pytest.raises(pickle.UnpicklingError):
        load_snapshot(pickle.dumps(RaftConfig()))
