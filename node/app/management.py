"""Wires the management HTTP API (node/http) to a running node: the raft
node's read model and management rows, the AMQP server's local connections
and in-process sessions, the Administrator."""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from node.amqp.endpoint import RUNNING
from node.amqp.handshake import VERSION
from node.amqp.internal import AmqpSession
from node.amqp.server import AmqpServer
from node.app.administrator import Administrator
from node.app.pki import file_validity
from node.http.backend import LocalConnection
from node.replication.raft_node import RaftNode
from node.replication.read_model import Management, ReadModel
from node.replication.status import NodeStatus


class NodeBackend:
    product_version = VERSION

    def __init__(self, node_id: str, raft: RaftNode, amqp: AmqpServer,
                 administrator: Administrator, status: Callable[[], NodeStatus],
                 configured_users: Mapping[str, str], loopback_users: list[str],
                 token: str | None, listeners: list[dict[str, Any]],
                 member_urls: Mapping[str, str] | None = None,
                 tls_files: list[dict[str, Any]] | None = None,
                 target_cluster_size: int = 1) -> None:
        self.node_id = node_id
        self.raft = raft
        self.amqp = amqp
        self._administrator = administrator
        self._status = status
        self._configured = configured_users
        self._loopback = loopback_users
        self._token = token
        self._listeners = listeners
        self._member_urls = dict(member_urls or {})
        self._tls_files = list(tls_files or [])
        self._target_cluster_size = target_cluster_size

    @property
    def administrator(self) -> Administrator:
        return self._administrator

    @property
    def configured_users(self) -> Mapping[str, str]:
        return self._configured

    @property
    def loopback_users(self) -> list[str]:
        return self._loopback

    @property
    def token(self) -> str | None:
        return self._token

    def read_model(self) -> ReadModel:
        return self.raft.read_model()

    async def management_rows(self) -> Management:
        return await self.raft.management_rows()

    def status(self) -> NodeStatus:
        return replace(self._status(), member_addresses=dict(self.raft.read_model().members))

    def target_cluster_size(self) -> int:
        """[http] target_cluster_size_hint (RabbitMQ's cluster_formation one)."""
        return self._target_cluster_size

    def member_urls(self) -> dict[str, str]:
        """Members' management URLs where known (its own; others configured)."""
        return dict(self._member_urls)

    def listeners(self) -> list[dict[str, Any]]:
        return [dict(x, node=self.node_id) for x in self._listeners]

    def certificate_validity(self, now: float) -> list[dict[str, Any]]:
        """The TLS listeners' PEM files, each with its entries' validity at `now`."""
        return [dict(x, node=self.node_id, certfile_validity=file_validity(x.get("certfile"), now),
                     cacertfile_validity=file_validity(x.get("cacertfile"), now))
                for x in self._tls_files]

    def log_bounds(self) -> tuple[int, int]:
        return self.raft.shim.log_bounds()

    def alarms(self) -> list[str]:
        alarm = self.amqp.alarm
        return [alarm] if alarm else []

    def connection_use(self) -> tuple[int, int]:
        return len(self.amqp.opened), self.amqp.config.max_connections

    def local_connections(self) -> dict[tuple[str, int], LocalConnection]:
        out: dict[tuple[str, int], LocalConnection] = {}
        now_wall, now_mono = time.time(), time.monotonic()
        for serial, proto in list(self.amqp.conns.items()):
            conn = proto.conn
            if conn is None:
                continue
            transport = proto.transport
            peer = transport.get_extra_info("peername") if transport is not None else None
            sock = transport.get_extra_info("sockname") if transport is not None else None
            tls = transport is not None and transport.get_extra_info("sslcontext") is not None
            out[(self.node_id, serial)] = LocalConnection(
                peer_host=str(peer[0]) if peer else "127.0.0.1",
                peer_port=int(peer[1]) if peer else 0,
                host=str(sock[0]) if sock else "", port=int(sock[1]) if sock else 0,
                user=conn.user, vhost=conn.vhost,
                client_properties=dict(conn.client_properties or {}),
                heartbeat=conn.heartbeat, frame_max=conn.frame_max,
                channel_max=conn.channel_max, tls=tls,
                numbers={ch.id.serial: ch.number for ch in conn.channels.values()},
                connected_at=now_wall - (now_mono - conn.created),
                held_bytes=conn.held_bytes, blocked=proto.reading_paused or conn.input_held,
                opened=transport is not None and conn.phase == RUNNING)
        return out

    def session(self, user: str, vhost: str, full_access: bool) -> AmqpSession:
        return AmqpSession(self.amqp, user, vhost, full_access)

    async def close_connection(self, serial: int, reason: str) -> bool:
        proto = self.amqp.conns.get(serial)
        if proto is None or proto.conn is None or proto.transport is None:
            return False
        proto.conn.force_close(320, f"CONNECTION_FORCED - {reason}")
        proto.flush()
        return True
