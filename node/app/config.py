"""Node configuration: CLI flags over a TOML file over defaults.

This module holds the model (NodeConfig and its [admin] and [http] tables;
the wire, [tls] and [raft] ones are node.amqp.config's and
node.replication.config's), the secrets from the environment (apply_env),
--peers, and the checks made at start-up (who may reach the Raft and admin
ports, TLS files that load, the data dir). node.app.config_file reads the
config file.

Validation is strict and every problem is a ConfigError with a one-line
message (the CLI prints it and exits 2).
"""
from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from node.amqp.config import TlsConfig, WireConfig
from node.broker.definition_limit import DefinitionLimits
from node.broker.loopback import is_loopback
from node.replication.config import RaftConfig


class ConfigError(Exception):
    pass


@dataclass
class AdminConfig:
    """[admin]: a bearer token for every admin RPC, the address the port binds,
    and TLS (PEM contents, read when the config is loaded so that a bad path
    fails at start). Issue 26: a node refuses an admin port without a token
    (unless --insecure-dev), and the port listens on loopback unless told."""
    token: str | None = None
    listen: str = "127.0.0.1"
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    tls_client_ca: bytes | None = None  # set: clients need a certificate it signed

    def tls(self) -> tuple[bytes, bytes, bytes | None] | None:
        if self.tls_cert is None or self.tls_key is None:
            return None
        return self.tls_cert, self.tls_key, self.tls_client_ca


@dataclass
class MetricsConfig:
    """[metrics]: the Prometheus port (issue 42). /metrics is aggregated per
    node unless return_per_object_metrics (RabbitMQ's
    prometheus.return_per_object_metrics); /metrics/per-object serves queue and
    vhost names only with per_object_endpoint; with a token every path needs
    `Authorization: Bearer TOKEN` (401 without); at most max_scrapes answered
    at once (429 beyond)."""
    return_per_object_metrics: bool = False
    per_object_endpoint: bool = False
    token: str | None = None
    max_scrapes: int = 4


@dataclass
class HttpConfig:
    """[http]: the management HTTP API (issue 15): its plain port, its HTTPS port
    (issue 26; RabbitMQ's management.ssl: 15671) and their TLS files (PEM paths,
    checked when the config is loaded; without any, the HTTPS port serves [tls]
    cert/key: one certificate for amqps and the console)."""
    port: int | None = None
    tls_port: int | None = None
    tls_only: bool = False  # no plain HTTP listener: `port` is not opened
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # set: clients need a certificate it signed
    # other members' management URLs (node -> http(s)://host:port/): the cluster view
    # and the console link to them; the node knows its own
    member_urls: dict[str, str] = field(default_factory=dict)
    # issue 26: seconds to get a request's line and headers (first request and
    # between keep-alive requests), connections open at once in all and per address
    idle_timeout: float = 10.0
    max_connections: int = 512
    max_connections_per_address: int = 64
    # issue 42: POST /api/queues/{v}/{q}/get takes at most this many messages,
    # and stops once the bodies it took reach get_max_bytes
    get_max_count: int = 10_000
    get_max_bytes: int = 64 << 20
    # how many members the cluster should have online
    # (/api/health/checks/reached-target-cluster-size; RabbitMQ's
    # cluster_formation.target_cluster_size_hint, default 1)
    target_cluster_size_hint: int = 1
    # issue 42: requests of one user in flight at once (429 beyond; 0: no limit), and
    # how often the shared management rows may be built again (row_cache.py): not
    # within rows_min_interval seconds of the last build, nor so often that builds
    # take more than rows_max_share of the raft thread
    max_requests_per_user: int = 8
    rows_min_interval: float = 0.05
    rows_max_share: float = 0.1

    def plain_port(self) -> int | None:
        """Where plain HTTP listens. Without tls_port, [http] tls_cert makes
        `port` itself HTTPS (as before the HTTPS port existed)."""
        if self.tls_only or (self.tls_cert and not self.tls_port):
            return None
        return self.port

    def https_port(self) -> int | None:
        """Where HTTPS listens (None: nowhere)."""
        if self.tls_port:
            return self.tls_port
        return self.port if self.tls_cert else None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The HTTPS context (node.amqp.tls owns the ssl set-up); TlsConfigError
        when the files do not load."""
        if not self.tls_cert or not self.tls_key:
            return None
        from node.amqp.tls import HTTPS_KEYS, server_context
        ca = self.tls_client_ca or ""
        return server_context(TlsConfig(cert=self.tls_cert, key=self.tls_key, ca=ca,
                                        verify="required" if ca else "none"), HTTPS_KEYS)


@dataclass
class NodeConfig:
    node_id: str
    data_dir: str
    # this node's address: the Raft address its peers dial (--host), where admin and
    # metrics listen, and the host of the URLs it logs
    amqp_host: str = "127.0.0.1"
    # where the AMQP (and amqps) listeners bind (--listen, [amqp] listen); None: every
    # address of both families (node.amqp.config.default_listen), as RabbitMQ
    amqp_listen: list[str] | None = None
    amqp_port: int | None = 5672  # None: TLS-only ([tls] only), no plain listener
    admin_port: int | None = None
    metrics_port: int | None = None
    wire: WireConfig = field(default_factory=WireConfig)
    # policies per vhost and the size of policies and global parameters
    # (node/broker/definition_limit.py; top-level keys of node.toml)
    definitions: DefinitionLimits = field(default_factory=DefinitionLimits)
    # memory_high_watermark as a fraction of the memory the node may use (the
    # cgroup limit or RAM; node.app.memory), resolved into wire.memory_high_watermark
    # at start; None: that absolute value (0 = off). Compared with the process's
    # resident set, as RabbitMQ 4.x does (default 0.6 there); 0.4 here because a
    # snapshot forks the node and its child's copy-on-write pages, outside this
    # figure, can grow towards the parent's size while it writes (docs/operations.md)
    memory_high_watermark_relative: float | None = 0.4
    raft: RaftConfig = field(default_factory=RaftConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    # --insecure-dev: a cluster whose Raft links are not authenticated
    insecure_dev: bool = False
    # settings read and ignored (config_file.DEPRECATED_KEYS): main logs one warning each
    deprecations: list[str] = field(default_factory=list)
    # built from `tls` by check_tls() at start-up (so a bad [tls] is exit 2, not a crash)
    amqps_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    # built by check_http_tls(): the management HTTPS listener's
    https_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)


def parse_peers(text: str) -> dict[str, str]:
    peers: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        node, sep, addr = item.partition("=")
        host, colon, port = addr.rpartition(":")
        if not sep or not node or not colon or not host or not port.isdigit():
            raise ConfigError(f"bad peer {item!r}: expected ID=HOST:PORT")
        peers[node] = f"{host}:{int(port)}"
    return peers


RAFT_PASSWORD_ENV = "MIRRORQ_RAFT_PASSWORD"
# the only AMQP user (replaces [users]) and the admin token, from a Kubernetes
# Secret (the operator's NAME-default-user); the admin CLI reads the same token
# variable as its client token
DEFAULT_USER_ENV = "MIRRORQ_DEFAULT_USER"
DEFAULT_PASS_ENV = "MIRRORQ_DEFAULT_PASS"
ADMIN_TOKEN_ENV = "MIRRORQ_ADMIN_TOKEN"
NO_CLUSTER_PASSWORD = ("cluster mode needs [raft] password in the config file (or "
                       f"{RAFT_PASSWORD_ENV}) or [raft] tls_cert/tls_key/tls_ca, or --insecure-dev "
                       "for a throwaway development cluster")


def apply_env(cfg: NodeConfig, environ: Mapping[str, str]) -> None:
    """Secrets from the environment (kept out of files and ps output) win over the file;
    an empty variable counts as unset:
    MIRRORQ_RAFT_PASSWORD: [raft] password.
    MIRRORQ_DEFAULT_USER and MIRRORQ_DEFAULT_PASS: together, the only AMQP user
    (replacing [users]); one without the other is a ConfigError.
    MIRRORQ_ADMIN_TOKEN: [admin] token (the same rule as in the file)."""
    password = environ.get(RAFT_PASSWORD_ENV)
    if password:
        cfg.raft.password = password
    user, user_password = environ.get(DEFAULT_USER_ENV), environ.get(DEFAULT_PASS_ENV)
    if user and user_password:
        cfg.wire.users = {user: user_password}
    elif user or user_password:
        have, missing = ((DEFAULT_USER_ENV, DEFAULT_PASS_ENV) if user
                         else (DEFAULT_PASS_ENV, DEFAULT_USER_ENV))
        raise ConfigError(f"{have} is set but {missing} is unset or empty: set both "
                          "(the default user and its password) or neither")
    token = environ.get(ADMIN_TOKEN_ENV)
    if token:
        cfg.admin.token = check_admin_token(token, ADMIN_TOKEN_ENV)


def check_cluster_password(cfg: NodeConfig) -> None:
    """With peers (or --join) the Raft links must be authenticated (mutual TLS
    from the cluster CA, or a challenge-response over the password) unless
    --insecure-dev says this is a throwaway cluster. A single node talks to
    nobody: nothing needed. TLS files must be given together and load."""
    r = cfg.raft
    tls = (r.tls_cert, r.tls_key, r.tls_ca)
    if any(tls) and not all(tls):
        raise ConfigError("raft TLS needs tls_cert, tls_key and tls_ca together")
    if all(tls):
        from node.replication.raft import tls_contexts
        try:
            tls_contexts(*tls)  # type: ignore[arg-type]
        except (OSError, ValueError) as e:
            raise ConfigError(f"raft TLS files do not load: {e}") from None
    if (r.peers or r.join) and not r.password and not all(tls) and not cfg.insecure_dev:
        raise ConfigError(NO_CLUSTER_PASSWORD)


def raft_bind_host(host: str, bind_host: str | None, authenticated: bool) -> str | None:
    """Where the Raft port listens. With authenticated links (password or
    TLS): where the operator said (--raft-listen), else every address (None).
    Without: a stranger must not be able to speak to it, so loopback only,
    the node's own --host if that is loopback (clusters on 127.0.0.x), unless
    --raft-listen says otherwise (main logs a warning then)."""
    if authenticated or bind_host:
        return bind_host
    if is_loopback(host, peer=False):
        return host.strip("[]")
    return "::1" if ":" in host else "127.0.0.1"


def raft_authenticated(cfg: NodeConfig) -> bool:
    """Raft links prove who they are: a password, or mutual TLS."""
    return bool(cfg.raft.password or cfg.raft.tls_ca)


def check_tls(cfg: NodeConfig) -> None:
    """[tls] is consistent and its files load; builds cfg.amqps_context."""
    from node.amqp.tls import TlsConfigError, server_context
    t = cfg.tls
    if t.port is None:
        if t.only:
            raise ConfigError("tls.only needs an amqps port ([tls] port or --amqps-port)")
        if t.cert or t.key or t.ca:
            raise ConfigError("[tls] cert/key are set but no amqps port: set [tls] port "
                              "or --amqps-port")
        return
    try:
        cfg.amqps_context = server_context(t)
    except TlsConfigError as exc:
        raise ConfigError(str(exc)) from exc


NO_ADMIN_TOKEN = ("the admin API (--admin-port) needs a token: --admin-token-file FILE, "
                  f"[admin] token_file (or token) in the config, or {ADMIN_TOKEN_ENV} (or "
                  "client certificates: [admin] tls_client_ca); or --insecure-dev for a "
                  "throwaway development node (anyone who reaches the port, any local user "
                  "included, could administer it)")


def read_admin_token_file(path: str, source: str) -> str:
    """The token in file `path` (surrounding whitespace dropped), checked;
    `source` names the option in errors."""
    try:
        with open(path, "rb") as f:
            token = f.read().decode().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {source} {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source} {path} must hold UTF-8 text") from exc
    return check_admin_token(token, f"the admin token in {path}")


def admin_authenticated(cfg: NodeConfig) -> bool:
    """Admin callers prove who they are: the token, or a client certificate."""
    return bool(cfg.admin.token or cfg.admin.tls_client_ca)


def check_admin(cfg: NodeConfig) -> None:
    """An admin port needs a credential unless --insecure-dev says this node is
    a throwaway: the API can do everything (users, membership)."""
    if cfg.admin_port and not admin_authenticated(cfg) and not cfg.insecure_dev:
        raise ConfigError(NO_ADMIN_TOKEN)


def check_admin_token(token: str, source: str) -> str:
    """The admin token travels as an HTTP/2 header value: non-empty printable
    ASCII without spaces. `source` names where it came from in the error."""
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ConfigError(f"{source} must be non-empty printable ASCII without spaces")
    return token


def check_http_tls(cfg: NodeConfig) -> None:
    """[http]'s HTTPS is consistent and loads (after check_tls, whose [tls]
    cert/key the HTTPS port falls back on); builds cfg.https_context."""
    from node.amqp.tls import TlsConfigError
    h = cfg.http
    if h.tls_only and not h.tls_port:
        raise ConfigError("http.tls_only needs an HTTPS port ([http] tls_port or --https-port)")
    if h.tls_port and not h.tls_cert:
        if not (cfg.tls.cert and cfg.tls.key):
            raise ConfigError("the HTTPS port ([http] tls_port / --https-port) needs "
                              "[http] tls_cert and tls_key, or [tls] cert and key")
        h.tls_cert, h.tls_key = cfg.tls.cert, cfg.tls.key
        source = " (from [tls] cert/key)"
    else:
        source = ""
    try:
        cfg.https_context = h.ssl_context()
    except TlsConfigError as exc:
        raise ConfigError(f"http TLS{source}: {exc}") from exc


def check_data_dir(path: str) -> None:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)  # private (the node tightens an old one)
        probe = os.path.join(path, ".write-probe")
        with os.fdopen(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"data dir {path} is not writable: {exc.strerror}") from exc
