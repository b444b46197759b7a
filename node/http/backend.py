"""What the management API needs of the node: the Backend protocol
(node/app/management.py's NodeBackend is the real one) and LocalConnection,
what only this node knows of one of its client connections."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from node.replication.read_model import Management
    from node.replication.status import NodeStatus


@dataclass
class LocalConnection:
    """What only this node knows of one of its client connections."""

    peer_host: str = ""
    peer_port: int = 0
    host: str = ""
    port: int = 0
    user: str = ""
    vhost: str = "/"
    client_properties: dict[str, Any] = field(default_factory=dict)
    heartbeat: int = 0
    frame_max: int = 0
    channel_max: int = 0
    tls: bool = False
    numbers: dict[int, int] = field(default_factory=dict)  # channel serial -> AMQP number
    connected_at: float = 0.0
    held_bytes: int = 0  # unfinished bodies and open transactions (memory watermark)
    blocked: bool = False  # not read past its next publish (an alarm or its own buffer)
    opened: bool = True  # past connection.open: listed even before the log knows it (no channel yet)


class Backend(Protocol):
    """What the API needs of the node (main.py wires the real one)."""

    node_id: str
    product_version: str

    def read_model(self) -> Any: ...
    async def management_rows(self) -> Management: ...
    def status(self) -> NodeStatus: ...
    def local_connections(self) -> dict[tuple[str, int], LocalConnection]: ...
    def session(self, user: str, vhost: str, full_access: bool) -> Any: ...
    async def close_connection(self, serial: int, reason: str) -> bool: ...
    @property
    def administrator(self) -> Any: ...
    @property
    def configured_users(self) -> Mapping[str, str]: ...
    @property
    def loopback_users(self) -> list[str]: ...
    @property
    def token(self) -> str | None: ...
    def listeners(self) -> list[dict[str, Any]]: ...
    def alarms(self) -> list[str]: ...
    def connection_use(self) -> tuple[int, int]: ...  # (opened client connections, limit; 0: none)
    def member_urls(self) -> Mapping[str, str]: ...
    def target_cluster_size(self) -> int: ...  # [http] target_cluster_size_hint
    # (first, last) index of this node's Raft log (first: the last snapshot's index)
    def log_bounds(self) -> tuple[int, int]: ...
    # the TLS listeners' PEM files: node, protocol, ip_address, port, certfile, cacertfile,
    # and per file the validity of its PEM entries at `now` (certfile_validity,
    # cacertfile_validity: notAfter in seconds since the epoch, or why an entry cannot
    # count; None: no such file configured)
    def certificate_validity(self, now: float) -> list[dict[str, Any]]: ...
