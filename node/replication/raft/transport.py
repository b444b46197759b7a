"""Peer links for pysyncobj: our own connections under its TCPTransport.

pysyncobj's own TcpConnection pickles, zlib-compresses and Fernet-encrypts
every message once per follower, on the Raft thread, and unpickles whatever
arrives. Here instead:
- messages are encoded with node.replication.codec (no pickle, no zlib);
  an AppendEntries batch is encoded once and the same bytes go to every
  follower (sendmsg scatter-gather: no copy per follower in Python);
- a link is authenticated once when it opens: mutual TLS from one cluster CA
  when configured, and/or an HMAC challenge-response over a key derived from
  the Raft password with scrypt (once per process, link_key) in which the
  dialing side proves first and the accepting side answers with its own proof
  only after checking it (a stranger who connects learns nothing it could
  test a guess against); nothing but the handshake is read from a peer until
  it has proved itself (pre-auth frames are at most 4 KiB, no ping), and a
  peer that fails gets its connection closed and a log line;
- without TLS every frame after the handshake carries an HMAC-SHA256 tag
  under a per-direction session key (from the link key and both nonces) over
  a per-direction sequence number: an injected, altered, replayed, reordered
  or dropped frame closes the link (TLS links rely on TLS's own integrity);
- an inbound link has HANDSHAKE_DEADLINE
  from accept to prove itself, and at most MAX_UNAUTHENTICATED of them are
  open at once (a new one evicts the oldest, so strangers cannot lock a
  member out by holding sockets);
- writes are bounded (a peer that stops reading is dropped past
  MAX_UNSENT), reads are bounded per poll event (the Raft thread returns to
  its tick), and a link that has been silent for connectionTimeout is
  closed (each side sends a ping after a second of its own silence).

This package (node/replication/raft/) is the only one that imports pysyncobj.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac
import logging
import os
import socket
import ssl
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pysyncobj.monotonic import monotonic as clock
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.poller import createPoller as createPoller  # re-export: tests' own poller
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from node.replication.codec import CodecError, decode, decode_from, encode

log = logging.getLogger(__name__)

# 02: the dialer proves first, scrypt-derived key, a MAC on every frame.
# A member speaking 01 is refused with a log line naming both versions.
PROTOCOL = b"MQRAFT02"
K_HELLO, K_CHALLENGE, K_PROOF, K_WELCOME = 1, 2, 3, 4
K_MSG, K_APPEND, K_PING = 16, 17, 32
PRE_AUTH_MAX = 4096  # bytes of a handshake frame
MAX_FRAME = 1 << 30  # an entry holds at most one batch; bodies are bounded far below
MAX_UNSENT = 256 * 1024 * 1024  # a peer this far behind on reading is dropped
READ_CHUNK = 256 * 1024
READ_PER_EVENT = 4 * 1024 * 1024  # then back to the tick: heartbeats never starve
PING_AFTER = 1.0
# An inbound link must finish the handshake this long after accept; until then
# nothing it sends (not even a ping) keeps it open. Authenticated links only
# ever time out on silence (connectionTimeout): a slow follower is never cut.
HANDSHAKE_DEADLINE = 10.0
MAX_UNAUTHENTICATED = 64  # inbound links still in their handshake; past it the oldest goes
TAG = 32  # HMAC-SHA256 tag after every authenticated frame of a link without TLS
# scrypt (memory-hard) of the Raft password: ~75 ms and 16 MiB once per
# process, and the same for every guess of someone who saw a handshake. The
# salt is a fixed label: every member must derive the same key before it
# knows anything about the cluster; a long random password (local-cluster and
# the operator generate them) makes precomputation pointless.
KDF_SALT = b"mirrorq raft link key v2"
KDF_N, KDF_R, KDF_P = 1 << 14, 8, 1
LOST_REASONS = ("eof", "error", "refused")  # PeerLink.close_reason: the peer's end is gone
_LEN = struct.Struct("<I")
_HDR = struct.Struct("<IB")
_SEQ = struct.Struct("<Q")


def link_key(password: bytes | None) -> bytes:
    """The HMAC key of the challenge-response, from the Raft password (slow on
    purpose: each offline guess costs the same). No password: an empty key
    (--insecure-dev or TLS alone), which authenticates nothing."""
    if not password:
        return b""
    return hashlib.scrypt(password, salt=KDF_SALT, n=KDF_N, r=KDF_R, p=KDF_P,
                          maxmem=64 * 1024 * 1024, dklen=32)


@dataclass(frozen=True)
class PeerSecurity:
    """How links prove who they are. key: link_key(password), computed once
    (empty only with --insecure-dev or TLS); tls: client and server contexts
    that require a certificate from the cluster CA."""

    key: bytes = b""
    client_tls: ssl.SSLContext | None = None
    server_tls: ssl.SSLContext | None = None

    @classmethod
    def from_password(cls, password: bytes | None, client_tls: ssl.SSLContext | None = None,
                      server_tls: ssl.SSLContext | None = None) -> PeerSecurity:
        return cls(link_key(password), client_tls, server_tls)

    @property
    def tls(self) -> bool:
        return self.client_tls is not None


def tls_contexts(cert: str, key: str, ca: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Mutual TLS between members: each side presents its certificate and
    requires one signed by the cluster CA. Names are not checked (members are
    addressed by IP, and pod IPs change): the CA is the cluster's own."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_REQUIRED
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.verify_mode = ssl.CERT_REQUIRED
    for ctx in (client, server):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(ca)
    return client, server


def _proof(key: bytes, role: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under `key` of a role label and length-prefixed parts. With
    the link key: the proofs (role client-proof / server-proof) and the session
    key (role session) over the transcript (both nonces, both addresses)."""
    mac = hmac.new(key, b"mirrorq-raft-" + role, hashlib.sha256)
    for p in parts:
        mac.update(_LEN.pack(len(p)) + p)
    return mac.digest()


def session_keys(key: bytes, transcript: tuple[bytes, ...]) -> tuple[bytes, bytes]:
    """(client->server, server->client) frame MAC keys of one link: fresh per
    link (both nonces), one per direction (a frame cannot be reflected)."""
    session = _proof(key, b"session", *transcript)
    return _proof(session, b"client-to-server"), _proof(session, b"server-to-client")


def frame_mac(key: bytes) -> Any:
    """A keyed HMAC-SHA256 to copy per frame (a copy skips the key set-up:
    ~2.5 us a frame instead of ~4)."""
    return hmac.new(key, digestmod=hashlib.sha256)


def entries_digest(entries_blob: bytes | memoryview) -> bytes:
    """SHA-256 of an AppendEntries' encoded entries: the frame MAC covers this
    digest, so the leader hashes a batch once, not once per follower."""
    return hashlib.sha256(entries_blob).digest()


def mac_parts(kind: int, payload: bytes) -> list[bytes | memoryview] | None:
    """What a received frame's MAC covers after its header: the payload, or for
    K_APPEND its header part and the digest of its entries (None: an append
    whose header length overruns it, which no sender's MAC can cover)."""
    if kind != K_APPEND:
        return [payload]
    if len(payload) < 4:
        return None
    split = 4 + _LEN.unpack_from(payload, 0)[0]
    if split > len(payload):
        return None
    return [memoryview(payload)[:split], entries_digest(memoryview(payload)[split:])]


def frame_tag(keyed: Any, seq: int, header: bytes, parts: Sequence[bytes | memoryview]) -> bytes:
    """The MAC of one frame under `keyed` (frame_mac): its sequence number in
    its direction (implicit, never sent), its header (length and kind) and
    its payload (mac_parts)."""
    mac = keyed.copy()
    mac.update(_SEQ.pack(seq))
    mac.update(header)
    for p in parts:
        mac.update(p)
    return mac.digest()


class PeerLink:
    """One TCP (optionally TLS) link to a peer, driven by pysyncobj's poller.
    Offers what TCPTransport uses of a TcpConnection: connect, send,
    disconnect, state, the three callbacks."""

    def __init__(self, poller: Any, security: PeerSecurity, self_address: str | None,
                 timeout: float, sock: socket.socket | None = None,
                 peer_label: str = "?", on_reject: Any = None, on_bad_mac: Any = None,
                 peer_address: str | None = None) -> None:
        self._poller = poller
        self._security = security
        self._self_address = self_address  # sent in HELLO (client side)
        self._timeout = timeout
        self._server_side = sock is not None
        self._sock: socket.socket | None = None
        self._fileno: int | None = None
        self._state = CONNECTION_STATE.DISCONNECTED
        self._authed = False
        self._tcp_up = False
        self._tls_handshaken = False
        self._tls: ssl.SSLObject | None = None
        self._tls_in: ssl.MemoryBIO | None = None
        self._tls_out: ssl.MemoryBIO | None = None
        self._rbuf = bytearray()
        self._consumed = 0  # bytes of _rbuf checked and handed on by the parse under way
        self._wq: deque[bytes | memoryview] = deque()
        self._unsent = 0
        self._nonce = b""
        self._peer_nonce = b""
        # server side: what the peer said it is; client side: the member we dial
        # (the peer must name itself so, and both proofs cover it)
        self.peer_address = peer_address
        self._send_key: Any = None  # frame_mac()s: set once authenticated without TLS
        self._recv_key: Any = None
        self._send_seq = self._recv_seq = 0
        self.lost_in_handshake = False  # a dialed link the peer closed before we were in
        self.peer_label = peer_label
        self.last_read = clock()
        self.last_write = clock()
        self.opened_at = clock()  # accept (server side) or dial: the handshake deadline's start
        self.sent_bytes = 0
        self._on_connected: Any = None
        self._on_message: Any = None
        self._on_disconnected: Any = None
        self.close_reason = ""  # why the link last closed (see disconnect)
        self._on_reject = on_reject
        self._on_bad_mac = on_bad_mac
        if sock is not None:
            self._adopt(sock)

    # ------------------------------------------------ TcpConnection's face
    def setOnConnectedCallback(self, cb: Any) -> None:  # noqa: N802 - pysyncobj's names
        self._on_connected = cb

    def setOnMessageReceivedCallback(self, cb: Any) -> None:  # noqa: N802
        self._on_message = cb

    def setOnDisconnectedCallback(self, cb: Any) -> None:  # noqa: N802
        self._on_disconnected = cb

    @property
    def state(self) -> int:
        return self._state

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:  # noqa: N802
        return self._unsent

    def connect(self, host: str, port: int) -> bool:
        self.disconnect()
        self._server_side = False  # TCPTransport may redial through a link that was accepted
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect((host, port))
        except OSError as e:
            if e.errno not in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                sock.close()
                self.close_reason = "refused" if e.errno == errno.ECONNREFUSED else "error"
                return False
        self.peer_label = f"{host}:{port}"
        self._adopt(sock)
        return True

    def send(self, message: Any) -> None:
        """A pysyncobj message (a dict), once the link is authenticated."""
        if not self._authed:
            return
        self._send_frame(K_MSG, encode(message))

    def send_append(self, header: dict[str, Any], entries_blob: bytes, digest: bytes | None = None) -> None:
        """AppendEntries whose (shared, already encoded) entries are sent as is;
        `digest`: their entries_digest if the caller has it (shared too)."""
        if not self._authed:
            return
        head = encode(header)
        prefix = _LEN.pack(len(head)) + head
        covered = None
        if self._send_key is not None:
            covered = [prefix, digest if digest is not None else entries_digest(entries_blob)]
        self._write_frame(K_APPEND, [prefix, entries_blob], covered)

    def disconnect(self, reason: str = "local") -> None:
        """`reason` (kept in close_reason): "eof" or "error" (the peer's end
        went away), "refused" (nobody listens there), "timeout" (silence),
        "rejected" (failed authentication), "local" (our own choice)."""
        self.close_reason = reason
        was = self._state != CONNECTION_STATE.DISCONNECTED
        self.lost_in_handshake = was and not self._server_side and self._tcp_up and not self._authed \
            and reason in ("eof", "error")
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._state = CONNECTION_STATE.DISCONNECTED
        self._authed = False
        self._tcp_up = self._tls_handshaken = False
        self._nonce = self._peer_nonce = b""
        self._send_key = self._recv_key = None
        self._send_seq = self._recv_seq = 0
        self._tls = self._tls_in = self._tls_out = None
        self._rbuf = bytearray()
        self._wq.clear()
        self._unsent = 0
        if was and self._on_disconnected is not None:
            self._on_disconnected()

    # ------------------------------------------------------------ set-up
    def _adopt(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        self._sock = sock
        self._fileno = sock.fileno()
        self._state = CONNECTION_STATE.CONNECTING
        self.last_read = self.last_write = self.opened_at = clock()
        events = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        if not self._server_side:
            events |= POLL_EVENT_TYPE.WRITE  # writable = connected
        self._poller.subscribe(self._fileno, self._on_event, events)
        if self._server_side:
            self._start_secure()

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
                                          "nonce": self._nonce}))

    def _reject(self, why: str) -> None:
        if self._on_reject is not None:
            self._on_reject(self.peer_label, why)
        self.disconnect("rejected")

    # ------------------------------------------------------------- I/O
    def _on_event(self, descr: int, events: int) -> None:
        if descr != self._fileno or self._sock is None:
            self._poller.unsubscribe(descr)
            return
        if events & POLL_EVENT_TYPE.ERROR:
            err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            self.disconnect("refused" if err == errno.ECONNREFUSED else "error")
            return
        if not self._tcp_up:
            err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.disconnect("refused" if err == errno.ECONNREFUSED else "error")
                return
            self._start_secure()
            if self._sock is None:
                return
        if events & POLL_EVENT_TYPE.WRITE:
            self._flush()
            if self._sock is None:
                return
        if events & POLL_EVENT_TYPE.READ:
            self._read()

    def _read(self) -> None:
        got = 0
        sock = self._sock
        while sock is not None and got < READ_PER_EVENT:
            try:
                data = sock.recv(READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.disconnect("error")
                return
            if not data:
                self.disconnect("eof")
                return
            got += len(data)
            if self._tls is not None:
                assert self._tls_in is not None
                self._tls_in.write(data)
                if not self._tls_handshaken:
                    self._tls_step()
                    if self._sock is None:
                        return
                if self._tls_handshaken:
                    try:
                        while True:
                            self._rbuf += self._tls.read(READ_CHUNK)
                    except ssl.SSLWantReadError:
                        pass
                    except (ssl.SSLError, OSError) as e:
                        self._reject(f"TLS error: {e}")
                        return
            else:
                self._rbuf += data
            if len(data) < READ_CHUNK:
                break
        if got:
            self.last_read = clock()
        self._parse()

    def _parse(self) -> None:
        buf = self._rbuf
        try:
            self._parse_frames(buf)
        finally:
            # what was checked is consumed even if its handler raised (a failing
            # raft tick): left in the buffer, it was checked again under the next
            # sequence number ('bad MAC on frame 1') and the link closed
            if self._sock is not None and buf is self._rbuf:
                del buf[:self._consumed]

    def _parse_frames(self, buf: bytearray) -> None:
        off = self._consumed = 0
        while self._sock is not None and len(buf) - off >= 5:
            n, kind = _HDR.unpack_from(buf, off)
            limit = MAX_FRAME if self._authed else PRE_AUTH_MAX
            if n == 0 or n > limit:
                self._reject(f"bad frame length {n}" + ("" if self._authed else " before authentication"))
                return
            if len(buf) - off < 4 + n:
                break
            end = off + 4 + n
            key = self._recv_key
            if key is not None:
                if n <= TAG:
                    self._bad_mac(f"bad MAC: a frame of {n} bytes has no room for one")
                    return
                end -= TAG
            payload = bytes(buf[off + 5:end])
            if key is not None:
                covered = mac_parts(kind, payload)
                tag = b"" if covered is None else frame_tag(key, self._recv_seq, bytes(buf[off:off + 5]),
                                                            covered)
                if not hmac.compare_digest(tag, bytes(buf[end:end + TAG])):
                    self._bad_mac(f"bad MAC on frame {self._recv_seq} (kind {kind}, {n} bytes)")
                    return
                self._recv_seq += 1
            off += 4 + n
            self._consumed = off
            try:
                self._on_frame(kind, payload)
            except CodecError as e:
                self._reject(f"undecodable frame: {e}")
                return

    @property
    def server_side(self) -> bool:
        return self._server_side

    @property
    def authenticated(self) -> bool:
        return self._authed

    def _on_frame(self, kind: int, payload: bytes) -> None:
        if kind == K_PING and self._authed:
            return
        if not self._authed:  # a ping here too: it would only keep a stranger's socket open
            self._on_handshake(kind, payload)
            return
        if kind == K_MSG:
            message = decode(payload)
        elif kind == K_APPEND:
            (hlen,) = _LEN.unpack_from(payload, 0)
            if hlen > len(payload) - 4:
                raise CodecError("append header overruns its frame")
            message, pos = decode_from(payload, 4)
            if pos != 4 + hlen:
                raise CodecError("append header length mismatch")
            entries = decode(payload, pos) if pos < len(payload) else []  # no copy of the entries
            if not isinstance(message, dict) or not isinstance(entries, list):
                raise CodecError("malformed append")
            message["entries"] = entries
        else:
            raise CodecError(f"unknown frame kind {kind}")
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise CodecError("a message is a table with a type")
        if self._on_message is not None:
            self._on_message(message)

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
            self._peer_nonce = nonce
            self.peer_address = address
            self._nonce = os.urandom(32)
            self._send_frame(K_CHALLENGE, encode({"nonce": self._nonce,
                                                  "address": self._self_address or ""}))
        elif not self._server_side and kind == K_CHALLENGE and self._nonce and not self._peer_nonce:
            nonce, address = msg.get("nonce"), msg.get("address")
            if not isinstance(nonce, bytes) or len(nonce) != 32 or not isinstance(address, str):
                self._reject("not a mirrorq raft peer (bad challenge)")
                return
            if self.peer_address is not None and address != self.peer_address:
                # a relay to another member would otherwise pass for the one we dialed
                self._reject(f"the peer says it is {address!r}, not the member {self.peer_address!r} we dialed")
                return
            self._peer_nonce = nonce
            self.peer_address = address
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
            c2s, s2c = session_keys(self._security.key, self._transcript())
            send, recv = (s2c, c2s) if self._server_side else (c2s, s2c)
            self._send_key, self._recv_key = frame_mac(send), frame_mac(recv)
            self._send_seq = self._recv_seq = 0
        if self._on_connected is not None:
            self._on_connected()

    def _bad_mac(self, why: str) -> None:
        if self._on_bad_mac is not None:
            self._on_bad_mac(self.peer_label, why)
        self._reject(why)

    def ping_if_idle(self, now: float) -> None:
        if self._authed and now - self.last_write > PING_AFTER:
            self._send_frame(K_PING, b"\x00")

    # ------------------------------------------------------------ writes
    def _send_frame(self, kind: int, payload: bytes) -> None:
        self._write_frame(kind, [payload])

    def _write_frame(self, kind: int, parts: list[bytes], covered: list[bytes] | None = None) -> None:
        """`covered`: what the MAC covers after the header, if not `parts` (mac_parts)."""
        size = 1 + sum(len(p) for p in parts)
        key = self._send_key
        if key is None:
            self._write([_HDR.pack(size, kind), *parts])
            return
        header = _HDR.pack(size + TAG, kind)
        tag = frame_tag(key, self._send_seq, header, covered if covered is not None else parts)
        self._send_seq += 1
        self._write([header, *parts, tag])

    def _write(self, parts: list[bytes]) -> None:
        if self._sock is None:
            return
        self.last_write = clock()
        if self._tls is not None:
            tls = self._tls
            try:
                tls.write(b"".join(parts))  # one write: fewer, fuller TLS records
            except ssl.SSLError as e:
                self._reject(f"TLS error: {e}")
                return
            self._flush_tls()
            return
        for p in parts:
            if p:
                self._wq.append(p)
                self._unsent += len(p)
        self._flush()

    def _flush_tls(self) -> None:
        out = self._tls_out
        if out is None or self._sock is None:
            return
        data = out.read()
        if data:
            self._wq.append(data)
            self._unsent += len(data)
        self._flush()

    def _flush(self) -> None:
        sock = self._sock
        wq = self._wq
        while sock is not None and wq:
            try:
                sent = sock.sendmsg(list(_first(wq, 64)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.disconnect("error")
                return
            self.sent_bytes += sent
            self._unsent -= sent
            while sent:
                head = wq[0]
                if len(head) <= sent:
                    sent -= len(head)
                    wq.popleft()
                else:
                    wq[0] = memoryview(head)[sent:]
                    sent = 0
        if self._sock is None:
            return
        if self._unsent > MAX_UNSENT:
            self._reject(f"peer stopped reading ({self._unsent} bytes unsent)")
            return
        events = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        if wq or not self._tcp_up:
            events |= POLL_EVENT_TYPE.WRITE
        assert self._fileno is not None
        self._poller.subscribe(self._fileno, self._on_event, events)


def handshake_overdue(server_side: bool, authenticated: bool, opened_at: float, now: float,
                      deadline: float) -> bool:
    """An inbound link that has not proved itself `deadline` after accept.
    Outbound links are bounded by connectionTimeout; authenticated ones never by this."""
    return server_side and not authenticated and now - opened_at > deadline


def evictions(strangers: list[Any], keep: int) -> list[Any]:
    """Which of `strangers` (oldest first) to close so that at most `keep` remain."""
    return strangers[:max(0, len(strangers) - keep)]


def _first(q: deque[bytes | memoryview], n: int) -> list[bytes | memoryview]:
    out = []
    for item in q:
        out.append(item)
        if len(out) >= n:
            break
    return out


class _PeerServer:
    """The Raft port: accepts links; each proves itself before it is a peer."""

    def __init__(self, transport: PeerTransport, host: str, port: int) -> None:
        self._transport = transport
        self._host, self._port = host, port
        self._sock: socket.socket | None = None

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setblocking(False)
        try:
            sock.bind((self._host, self._port))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._transport._poller().subscribe(sock.fileno(), self._on_accept,
                                            POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def unbind(self) -> None:
        if self._sock is not None:
            self._transport._poller().unsubscribe(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def _on_accept(self, _descr: int, events: int) -> None:
        if self._sock is None:
            return
        for _ in range(16):
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._transport._make_room_for_stranger()
            self._transport._onNewIncomingConnection(self._transport._new_link(
                sock=sock, peer_label=f"{addr[0]}:{addr[1]}"))


class PeerTransport(TCPTransport):  # type: ignore[misc]
    """TCPTransport's node bookkeeping (who connects to whom, reconnects,
    membership changes) over PeerLinks. Utility messages and read-only nodes
    of pysyncobj are not offered."""

    security = PeerSecurity()

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803
        self.peer_rejects = 0
        self.peer_mac_failures = 0
        self._last_reject_log = 0.0
        self._last_handshake_loss_log = 0.0
        self._last_digest: tuple[bytes, bytes] | None = None  # (entries blob, its entries_digest)
        super().__init__(syncObj, selfNode, otherNodes)

    def _poller(self) -> Any:
        return self._syncObj._poller

    def _new_link(self, sock: socket.socket | None = None, peer_label: str = "?",
                  peer_address: str | None = None) -> PeerLink:
        conf = self._syncObj.conf
        address = None if self._selfNode is None else self._selfNode.address
        return PeerLink(self._poller(), self.security, address, conf.connectionTimeout,
                        sock=sock, peer_label=peer_label, on_reject=self._on_reject,
                        on_bad_mac=self._on_bad_mac, peer_address=peer_address)

    def _on_bad_mac(self, _peer: str, _why: str) -> None:
        self.peer_mac_failures += 1  # then _on_reject: logged (at most once a second) and counted

    def _onDisconnected(self, conn: PeerLink) -> None:  # noqa: N802
        if conn.lost_in_handshake:
            now = clock()
            if now - self._last_handshake_loss_log > 1.0:
                self._last_handshake_loss_log = now
                log.warning("raft peer %s closed the link during the handshake (if it repeats: a wrong "
                            "raft password, or a member on another link protocol than %s; members "
                            "are upgraded together)", conn.peer_label, PROTOCOL.decode())
        super()._onDisconnected(conn)

    def _on_reject(self, peer: str, why: str) -> None:
        self.peer_rejects += 1
        now = clock()
        if now - self._last_reject_log > 1.0:  # a flood must not flood the log
            self._last_reject_log = now
            log.warning("raft peer %s refused: %s (%d refused so far)", peer, why, self.peer_rejects)

    def _strangers(self) -> list[PeerLink]:
        """Inbound links still in their handshake, oldest first."""
        links = [c for c in self._unknownConnections if c.server_side and not c.authenticated
                 and c.state != CONNECTION_STATE.DISCONNECTED]
        return sorted(links, key=lambda c: c.opened_at)

    def _make_room_for_stranger(self) -> None:
        """Called before a new inbound link is adopted: keep at most
        MAX_UNAUTHENTICATED - 1 strangers, dropping the oldest. A member's
        handshake takes one round trip, so it outruns a flood of held sockets."""
        for conn in evictions(self._strangers(), MAX_UNAUTHENTICATED - 1):
            self._on_reject(conn.peer_label, f"too many unauthenticated links (cap {MAX_UNAUTHENTICATED})")
            conn.disconnect("rejected")

    # ---------------------------------------------------- TCPTransport's hooks
    def _createServer(self) -> None:  # noqa: N802
        conf = self._syncObj.conf
        addr = conf.bindAddress or self._selfNode.address
        host, port = addr.rsplit(":", 1)
        if conf.bindAddress is None:
            host = "::" if ":" in host else "0.0.0.0"
        self._server = _PeerServer(self, host.strip("[]"), int(port))

    def _onNewIncomingConnection(self, conn: PeerLink) -> None:  # noqa: N802
        self._unknownConnections.add(conn)
        conn.setOnConnectedCallback(functools.partial(self._on_incoming_authenticated, conn))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))

    def _on_incoming_authenticated(self, conn: PeerLink) -> None:
        node = self._nodeAddrToNode.get(conn.peer_address or "")
        self._unknownConnections.discard(conn)
        if node is None:
            self._on_reject(conn.peer_label, f"unknown member address {conn.peer_address!r}")
            conn.setOnDisconnectedCallback(None)
            conn.disconnect()
            return
        old = self._connections.get(node)
        if old is not None and old is not conn:
            old.setOnDisconnectedCallback(None)
            old.disconnect()
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
        self._onNodeConnected(node)

    def _onOutgoingConnected(self, conn: PeerLink) -> None:  # noqa: N802
        node = self._connToNode(conn)
        if node is not None:
            self._onNodeConnected(node)

    def addNode(self, node: Any) -> None:  # noqa: N802
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if self._shouldConnect(node):
            conn = self._new_link(peer_address=node.address)
            conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
            self._connections[node] = conn

    def _onTick(self) -> None:  # noqa: N802
        super()._onTick()
        now = clock()
        timeout = self._syncObj.conf.connectionTimeout
        for conn in list(self._connections.values()) + list(self._unknownConnections):
            if conn.state == CONNECTION_STATE.DISCONNECTED:
                continue
            if handshake_overdue(conn.server_side, conn.authenticated, conn.opened_at, now,
                                 HANDSHAKE_DEADLINE):
                self._on_reject(conn.peer_label, f"no handshake within {HANDSHAKE_DEADLINE:g}s of accept")
                conn.disconnect("timeout")
            elif now - conn.last_read > timeout:
                if conn.state == CONNECTION_STATE.CONNECTING and conn in self._unknownConnections:
                    self._on_reject(conn.peer_label, "no handshake in time")
                conn.disconnect("timeout")
            else:
                conn.ping_if_idle(now)

    def link(self, node: Any) -> PeerLink | None:
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return None
        return conn  # type: ignore[no-any-return]

    def send_append(self, node: Any, header: dict[str, Any], entries_blob: bytes) -> bool:
        conn = self.link(node)
        if conn is None:
            return False
        digest = None
        if not self.security.tls:  # the same blob goes to every follower: hash it once
            last = self._last_digest
            if last is None or last[0] is not entries_blob:
                last = self._last_digest = (entries_blob, entries_digest(entries_blob))
            digest = last[1]
        conn.send_append(header, entries_blob, digest)
        return conn.state == CONNECTION_STATE.CONNECTED

    def unsent_bytes(self, node: Any) -> int:
        conn = self._connections.get(node)
        return 0 if conn is None else conn.getSendBufferSize()
