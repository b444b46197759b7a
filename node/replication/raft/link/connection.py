"""One Raft peer link: PeerLink, what pysyncobj's TCPTransport drives in
place of its own TcpConnection.

pysyncobj's TcpConnection pickles, zlib-compresses and Fernet-encrypts
every message once per follower, on the Raft thread, and unpickles whatever
arrives. Here instead messages are encoded with node.replication.codec (no
pickle, no zlib); an AppendEntries batch is encoded once and the same bytes
go to every follower (sendmsg scatter-gather: no copy per follower in
Python). The link is authenticated when it opens (handshake.py, a mixin of
PeerLink), then its frames carry MACs unless TLS protects them (frame.py).
Writes are bounded (a peer that stops reading is dropped past MAX_UNSENT),
reads are bounded per poll event (the Raft thread returns to its tick), and
a link that has been silent for connectionTimeout is closed (each side sends
a ping after a second of its own silence).
"""
from __future__ import annotations

import contextlib
import errno
import hmac
import socket
import ssl
from collections import deque
from typing import Any

from pysyncobj.monotonic import monotonic as clock
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

from node.replication.codec import CodecError, decode, decode_from, encode
from node.replication.raft.link.frame import (
    HDR,
    HTAG,
    K_APPEND,
    K_MSG,
    K_PING,
    LEN,
    TAG,
    entries_digest,
    frame_refused,
    frame_tag,
    header_tag,
    mac_parts,
)
from node.replication.raft.link.handshake import HandshakeMixin
from node.replication.raft.link.security import PeerSecurity

MAX_UNSENT = 256 * 1024 * 1024  # a peer this far behind on reading is dropped
READ_CHUNK = 256 * 1024
READ_PER_EVENT = 4 * 1024 * 1024  # then back to the tick: heartbeats never starve
PING_AFTER = 1.0
LOST_REASONS = ("eof", "error", "refused")  # PeerLink.close_reason: the peer's end is gone


class PeerLink(HandshakeMixin):
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
        self._send_hkey: Any = None  # header keys (frame_mac()s): link version 3 only
        self._recv_hkey: Any = None
        self._frames = 2  # the link version agreed in the handshake (3: headers MAC'd)
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
        prefix = LEN.pack(len(head)) + head
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
        self._send_hkey = self._recv_hkey = None
        self._frames = 2
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
            n, kind = HDR.unpack_from(buf, off)
            hkey = self._recv_hkey
            start = off + 5
            if hkey is not None:  # version 3: the header's MAC first, before its length counts
                if len(buf) - off < 5 + HTAG:
                    break
                start += HTAG
                if not hmac.compare_digest(header_tag(hkey, self._recv_seq, bytes(buf[off:off + 5])),
                                           bytes(buf[off + 5:start])):
                    self._bad_mac(f"bad MAC on the header of frame {self._recv_seq} (announcing {n} bytes)")
                    return
            refused = frame_refused(n, self._authed, self._security.max_frame)
            if refused is not None:
                self._reject(refused)
                return
            if len(buf) - off < 4 + n:
                break
            end = off + 4 + n
            key = self._recv_key
            if key is not None:
                if n <= TAG + start - off - 5:
                    self._bad_mac(f"bad MAC: a frame of {n} bytes has no room for one")
                    return
                end -= TAG
            payload = bytes(buf[start:end])
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
            (hlen,) = LEN.unpack_from(payload, 0)
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
            self._write([HDR.pack(size, kind), *parts])
            return
        hkey = self._send_hkey
        header = HDR.pack(size + TAG + (HTAG if hkey is not None else 0), kind)
        tag = frame_tag(key, self._send_seq, header, covered if covered is not None else parts)
        htag = [header_tag(hkey, self._send_seq, header)] if hkey is not None else []
        self._send_seq += 1
        self._write([header, *htag, *parts, tag])

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



def _first(q: deque[bytes | memoryview], n: int) -> list[bytes | memoryview]:
    out = []
    for item in q:
        out.append(item)
        if len(out) >= n:
            break
    return out
