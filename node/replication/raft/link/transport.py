"""PeerTransport: pysyncobj's TCPTransport over our PeerLinks, and the Raft port.

TCPTransport keeps its node bookkeeping (who connects to whom, reconnects,
membership changes); the links are ours (connection.py). Inbound links that
have not proved themselves are bounded in time and number (handshake.py:
HANDSHAKE_DEADLINE, MAX_UNAUTHENTICATED), every refusal is counted and
logged at most once a second, and an AppendEntries' entries are hashed once
for all followers (frame.entries_digest).
"""
from __future__ import annotations

import functools
import logging
import socket
from typing import Any

from pysyncobj.monotonic import monotonic as clock
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from node.replication.raft.link.connection import PeerLink
from node.replication.raft.link.frame import entries_digest
from node.replication.raft.link.handshake import (
    HANDSHAKE_DEADLINE,
    MAX_UNAUTHENTICATED,
    PROTOCOL,
    evictions,
    handshake_overdue,
)
from node.replication.raft.link.security import PeerSecurity

log = logging.getLogger(__name__)


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
