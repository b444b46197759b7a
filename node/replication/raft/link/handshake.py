"""The handshake of a Raft peer link, and the limits on links still in it.

A link is authenticated once when it opens: mutual TLS from one cluster CA
when configured (security.py), and/or an HMAC challenge-response over a key
derived from the Raft password with scrypt (once per process, link_key) in
which the dialing side proves first and the accepting side answers with its
own proof only after checking it (a stranger who connects learns nothing it
could test a guess against); nothing but the handshake is read from a peer
until it has proved itself (pre-auth frames are at most 4 KiB, no ping), and
a peer that fails gets its connection closed and a log line. An inbound link
has HANDSHAKE_DEADLINE from accept to prove itself, and at most
MAX_UNAUTHENTICATED of them are open at once (a new one evicts the oldest,
so strangers cannot lock a member out by holding sockets).

HandshakeMixin is the handshake half of PeerLink (connection.py); once it
is done, without TLS, the frames carry MACs under session_keys (frame.py).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
from typing import TYPE_CHECKING, Any

from pysyncobj.tcp_connection import CONNECTION_STATE

from node.replication import format
from node.replication.codec import CodecError, decode, encode
from node.replication.raft.link.frame import (
    K_CHALLENGE,
    K_HELLO,
    K_PROOF,
    K_WELCOME,
    LEN,
    frame_mac,
)
from node.replication.raft.link.security import PeerSecurity, address_host, cert_names_host

# 02: the dialer proves first, scrypt-derived key, a MAC on every frame.
# A member speaking 01 is refused with a log line naming both versions.
PROTOCOL = format.PEER_LINK.magic
# The link version this build offers in HELLO ("frames") and agrees to in
# CHALLENGE: 3 MACs each frame's header before its body is read. A member of
# the previous release sends no "frames" and ignores ours: its links stay 2.
FRAMES = format.PEER_LINK.version
# An inbound link must finish the handshake this long after accept; until then
# nothing it sends (not even a ping) keeps it open. Authenticated links only
# ever time out on silence (connectionTimeout): a slow follower is never cut.
HANDSHAKE_DEADLINE = 10.0
MAX_UNAUTHENTICATED = 64  # inbound links still in their handshake; past it the oldest goes


def _proof(key: bytes, role: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under `key` of a role label and length-prefixed parts. With
    the link key: the proofs (role client-proof / server-proof) and the session
    key (role session) over the transcript (both nonces, both addresses)."""
    mac = hmac.new(key, b"mirrorq-raft-" + role, hashlib.sha256)
    for p in parts:
        mac.update(LEN.pack(len(p)) + p)
    return mac.digest()


def session_keys(key: bytes, transcript: tuple[bytes, ...]) -> tuple[bytes, bytes]:
    """(client->server, server->client) frame MAC keys of one link: fresh per
    link (both nonces), one per direction (a frame cannot be reflected)."""
    session = _proof(key, b"session", *transcript)
    return _proof(session, b"client-to-server"), _proof(session, b"server-to-client")


class HandshakeMixin:
    """PeerLink's handshake methods: TLS first if configured, then HELLO,
    CHALLENGE, PROOF, WELCOME; `_authenticated` when both sides have proved."""

    _security: PeerSecurity
    _self_address: str | None
    _server_side: bool
    _sock: socket.socket | None
    _state: int
    _authed: bool
    _tcp_up: bool
    _tls_handshaken: bool
    _tls: ssl.SSLObject | None
    _tls_in: ssl.MemoryBIO | None
    _tls_out: ssl.MemoryBIO | None
    _nonce: bytes
    _peer_nonce: bytes
    peer_address: str | None
    _send_key: Any
    _recv_key: Any
    _send_hkey: Any
    _recv_hkey: Any
    _frames: int
    _send_seq: int
    _recv_seq: int
    _on_connected: Any

    if TYPE_CHECKING:  # PeerLink's
        def _send_frame(self, kind: int, payload: bytes) -> None: ...
        def _flush_tls(self) -> None: ...
        def _reject(self, why: str) -> None: ...

    def _start_secure(self) -> None:
        self._tcp_up = True
        sec = self._security
        if sec.tls:
            ctx = sec.server_tls if self._server_side else sec.client_tls
            assert ctx is not None
            self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self._tls = ctx.wrap_bio(self._tls_in, self._tls_out, server_side=self._server_side)
            self._tls_step()
        elif not self._server_side:
            self._send_hello()

    def _tls_step(self) -> None:
        tls = self._tls
        assert tls is not None
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush_tls()
            return
        except (ssl.SSLError, OSError) as e:
            self._flush_tls()
            self._reject(f"TLS handshake failed: {e}")
            return
        self._tls_handshaken = True
        self._flush_tls()
        if not self._server_side and self._sock is not None and not self._nonce:
            self._send_hello()

    def _send_hello(self) -> None:
        self._nonce = os.urandom(32)
        self._send_frame(K_HELLO, encode({"protocol": PROTOCOL, "address": self._self_address or "",
                                          "nonce": self._nonce, "frames": FRAMES}))


    def _on_handshake(self, kind: int, payload: bytes) -> None:
        """HELLO (dialer: protocol, address, nonce) -> CHALLENGE (acceptor:
        address, nonce; nothing derived from the key) -> PROOF (dialer's proof
        over both nonces and addresses) -> WELCOME (acceptor's proof, sent only
        once the dialer's checked out). A stranger who connects gets a nonce;
        one a member dials gets the member's proof (the trade-off of any
        challenge-response without a PAKE: each guess costs the scrypt)."""
        key = self._security.key
        msg = decode(payload)
        if not isinstance(msg, dict):
            raise CodecError("handshake frame is not a table")
        if self._server_side and kind == K_HELLO and not self._peer_nonce:
            protocol, nonce, address = msg.get("protocol"), msg.get("nonce"), msg.get("address")
            if isinstance(protocol, bytes) and protocol.startswith(b"MQRAFT") and protocol != PROTOCOL:
                self._reject(f"the peer speaks raft link protocol {protocol.decode(errors='replace')}, "
                             f"this node {PROTOCOL.decode()}: upgrade every member to the same release")
                return
            if protocol != PROTOCOL or not isinstance(nonce, bytes) or len(nonce) != 32 \
                    or not isinstance(address, str):
                self._reject("not a mirrorq raft peer (bad hello)")
                return
            if not self._certificate_names(address):
                return
            self._peer_nonce = nonce
            self.peer_address = address
            self._nonce = os.urandom(32)
            self._frames = agreed_frames(msg.get("frames"))
            challenge: dict[str, Any] = {"nonce": self._nonce, "address": self._self_address or ""}
            if self._frames > 2:
                challenge["frames"] = self._frames
            self._send_frame(K_CHALLENGE, encode(challenge))
        elif not self._server_side and kind == K_CHALLENGE and self._nonce and not self._peer_nonce:
            nonce, address = msg.get("nonce"), msg.get("address")
            if not isinstance(nonce, bytes) or len(nonce) != 32 or not isinstance(address, str):
                self._reject("not a mirrorq raft peer (bad challenge)")
                return
            if self.peer_address is not None and address != self.peer_address:
                # a relay to another member would otherwise pass for the one we dialed
                self._reject(f"the peer says it is {address!r}, not the member {self.peer_address!r} we dialed")
                return
            if not self._certificate_names(address):
                return
            self._peer_nonce = nonce
            self.peer_address = address
            self._frames = agreed_frames(msg.get("frames"))
            self._send_frame(K_PROOF, encode({"proof": _proof(key, b"client-proof", *self._transcript())}))
        elif self._server_side and kind == K_PROOF and self._peer_nonce:
            proof = msg.get("proof")
            transcript = self._transcript()
            if not isinstance(proof, bytes) or \
                    not hmac.compare_digest(proof, _proof(key, b"client-proof", *transcript)):
                self._reject("wrong raft password")
                return
            self._send_frame(K_WELCOME, encode({"proof": _proof(key, b"server-proof", *transcript)}))
            self._authenticated()
        elif not self._server_side and kind == K_WELCOME and self._peer_nonce:
            proof = msg.get("proof")
            if not isinstance(proof, bytes) or \
                    not hmac.compare_digest(proof, _proof(key, b"server-proof", *self._transcript())):
                self._reject("the peer does not know the raft password")
                return
            self._authenticated()
        else:
            self._reject(f"unexpected handshake frame {kind}")

    def _certificate_names(self, address: str) -> bool:
        """With TLS (and raft.tls_verify_names): the peer's certificate must
        name the address it claims, or the link is refused (any certificate of
        the CA passed for any member: a member's key stolen was every member's)."""
        tls = self._tls
        if tls is None or not self._security.verify_names:
            return True
        host = address_host(address)
        if cert_names_host(tls.getpeercert(), host):
            return True
        self._reject(f"the peer's TLS certificate does not name {host!r}, the address it claims "
                     "(raft.tls_verify_names)")
        return False

    def _transcript(self) -> tuple[bytes, bytes, bytes, bytes]:
        """(dialer's nonce, acceptor's nonce, dialer's address, acceptor's address)."""
        mine = (self._self_address or "").encode()
        theirs = (self.peer_address or "").encode()
        if self._server_side:
            return self._peer_nonce, self._nonce, theirs, mine
        return self._nonce, self._peer_nonce, mine, theirs

    def _authenticated(self) -> None:
        self._authed = True
        self._state = CONNECTION_STATE.CONNECTED
        if self._tls is None:  # TLS already protects every record
            # version 3's keys differ from 2's: a CHALLENGE altered to change the
            # version leaves the two ends with different keys (the first frame fails)
            extra = (b"frames-%d" % self._frames,) if self._frames > 2 else ()
            c2s, s2c = session_keys(self._security.key, self._transcript() + extra)
            send, recv = (s2c, c2s) if self._server_side else (c2s, s2c)
            self._send_key, self._recv_key = frame_mac(send), frame_mac(recv)
            if self._frames > 2:
                self._send_hkey = frame_mac(_proof(send, b"frame-header"))
                self._recv_hkey = frame_mac(_proof(recv, b"frame-header"))
            self._send_seq = self._recv_seq = 0
        if self._on_connected is not None:
            self._on_connected()



def agreed_frames(offered: Any) -> int:
    """The link version both ends speak: this build's FRAMES if the peer
    offered at least that (HELLO) or agreed to it (CHALLENGE), else 2 (a
    member of the previous release, which says nothing)."""
    if type(offered) is int and offered >= FRAMES:
        return FRAMES
    return 2


def handshake_overdue(server_side: bool, authenticated: bool, opened_at: float, now: float,
                      deadline: float) -> bool:
    """An inbound link that has not proved itself `deadline` after accept.
    Outbound links are bounded by connectionTimeout; authenticated ones never by this."""
    return server_side and not authenticated and now - opened_at > deadline


def evictions(strangers: list[Any], keep: int) -> list[Any]:
    """Which of `strangers` (oldest first) to close so that at most `keep` remain."""
    return strangers[:max(0, len(strangers) - keep)]

