"""Wire-level settings of one node's AMQP listener."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field


def _default_users() -> dict[str, str]:
    return {"guest": "guest"}


def _default_loopback_users() -> list[str]:
    return ["guest"]


@dataclass
class WireConfig:
    users: dict[str, str] = field(default_factory=_default_users)
    # users who may connect only from loopback (RabbitMQ's loopback_users)
    loopback_users: list[str] = field(default_factory=_default_loopback_users)
    # opened connections per node (0 = unlimited): connection.open beyond it gets 530;
    # sockets still in the handshake count against max_handshakes instead
    max_connections: int = 0
    # sockets between accept and connection.open: beyond max_handshakes the oldest is
    # closed, beyond max_handshakes_per_address a new one from that address is refused
    max_handshakes: int = 1024
    max_handshakes_per_address: int = 64
    # login throttle (node/amqp/throttle.py), shared with HTTP basic auth: failed logins
    # per (client address, user name) free within the window (0 = off), then each answer
    # for that name from there is withheld login_failure_delay seconds, doubling per
    # failure up to login_failure_max_delay; past login_failure_address_limit failures
    # from an address (any names; 0 = no such bound) every login from it is held alike
    login_failure_limit: int = 10
    login_failure_address_limit: int = 100
    login_failure_window: float = 60.0
    login_failure_delay: float = 1.0
    login_failure_max_delay: float = 10.0
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    # the node's memory (its resident set, as RabbitMQ 4.x measures it) above which
    # publishers are blocked (connection.blocked; nothing is nacked); 0 = off. The
    # node's config resolves a relative watermark (the default) into bytes.
    memory_high_watermark: int = 0
    # bytes one connection may hold in unfinished bodies and open transactions
    # before it is not read past its next publish (connection.blocked); 0 = a
    # quarter of memory_high_watermark (none when that is off): a few connections
    # that each stop mid-message cannot take the node's memory between two reads
    max_connection_buffer: int = 0
    # free bytes on the data dir's filesystem below which publishers are blocked
    # (RabbitMQ's disk_free_limit default is 50 MB); 0 = off
    disk_free_limit: int = 50 * 1000 * 1000
    data_dir: str = ""  # set by the node (the filesystem disk_free_limit watches)
    consumer_credit: int = 256  # initial BasicConsume.credit
    # RabbitMQ's consumer_timeout (ms; 0: none): a quorum queue's consumer
    # timeout unless the consumer or the queue sets one (S29)
    consumer_timeout: int = 1_800_000
    max_message_size: int = 16 * 1024 * 1024  # RabbitMQ 4.x's default (3.x: 128 MiB)
    # per connection unconfirmed-in-log bound before pausing reads (optional)
    inflight_publish_bytes: int = 64 * 1024 * 1024
    handshake_timeout: float = 10.0  # seconds from TCP accept to Connection.Open
    # issue 42: a topic binding key's words, bindings per exchange and per vhost
    # (0 = no limit; node/broker/binding_limit.py). Checked in the replicated
    # apply, so every member must have the same values
    max_binding_key_words: int = 32
    max_bindings_per_exchange: int = 20_000
    max_bindings_per_vhost: int = 100_000
    max_topic_wildcard_nodes: int = 32_768  # per vhost: bounds a publish's routing cost
    close_timeout: float = 3.0  # wait for Connection.CloseOk after we sent Close

    def connection_buffer_limit(self) -> int:
        """The bytes one connection may hold (0: no limit)."""
        if self.max_connection_buffer > 0:
            return self.max_connection_buffer
        return self.memory_high_watermark // 4


VERIFY_MODES = ("none", "optional", "required")


@dataclass
class TlsConfig:
    """The amqps listener ([tls] table). Off unless a port is set."""
    port: int | None = None
    cert: str = ""  # PEM: server certificate (chain)
    key: str = ""  # PEM: its private key (unencrypted)
    ca: str = ""  # PEM: CAs that sign client certificates (verify optional/required)
    # none: no client certificate asked; optional: verified if sent (RabbitMQ's
    # verify_peer); required: must be sent (verify_peer + fail_if_no_peer_cert)
    verify: str = "none"
    only: bool = False  # TLS-only: the plain AMQP listener is not opened at all


def ipv6_available(address: str = "::") -> bool:
    """An IPv6 socket can be bound to `address` here (the kernel may have IPv6
    off, or no ::1 on loopback)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def default_listen() -> list[str]:
    """Where AMQP listens when no address is configured: every address of both
    families, as RabbitMQ does (so `amqp://[::1]` and clients that resolve
    `localhost` to ::1 first connect); IPv4 only where IPv6 is unavailable."""
    return ["0.0.0.0", "::"] if ipv6_available() else ["0.0.0.0"]
