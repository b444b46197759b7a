"""Node configuration: CLI flags over a TOML file over defaults.

Validation is strict and every problem is a ConfigError with a one-line
message (the CLI prints it and exits 2).
"""
from __future__ import annotations

import os
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from node.amqp.config import VERIFY_MODES, TlsConfig, WireConfig
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
    # how many members the cluster should have online
    # (/api/health/checks/reached-target-cluster-size; RabbitMQ's
    # cluster_formation.target_cluster_size_hint, default 1)
    target_cluster_size_hint: int = 1

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
    tls: TlsConfig = field(default_factory=TlsConfig)
    # --insecure-dev: a cluster whose Raft links are not authenticated
    insecure_dev: bool = False
    # settings read and ignored (DEPRECATED_KEYS): main logs one warning each
    deprecations: list[str] = field(default_factory=list)
    # built from `tls` by check_tls() at start-up (so a bad [tls] is exit 2, not a crash)
    amqps_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    # built by check_http_tls(): the management HTTPS listener's
    https_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)


_WIRE_KEYS = {"frame_max", "channel_max", "heartbeat", "consumer_credit", "consumer_timeout",
              "max_message_size", "inflight_publish_bytes", "login_failure_limit",
              "max_connections", "disk_free_limit",
              "max_handshakes", "max_handshakes_per_address", "max_connection_buffer"}
# seconds (positive numbers)
_WIRE_SECONDS = {"login_failure_window", "login_failure_delay", "login_failure_max_delay",
                 "handshake_timeout"}
_RAFT_KEYS = {"password", "password_file", "batch_max_commands", "batch_max_bytes", "max_inflight_batches",
              "max_inflight_bytes", "election_min", "election_max", "leader_fallback",
              "compaction_min_entries", "compaction_min_time", "tick_interval",
              "out_of_sync_after", "nack_after", "block_after", "tls_cert", "tls_key", "tls_ca",
              "follower_window_bytes", "append_chunk_bytes", "compaction_max_bytes", "catch_up_hold_bytes",
              "compaction_min_gap", "segment_bytes", "verify_at_open_bytes", "scrub_bytes_per_second"}


# keys that were once settings and are now accepted and ignored, with a warning
# (a rolling upgrade must not fail on an old node.toml or CR), and why
DEPRECATED_KEYS = {
    "default_queue_max_length": "queues are unbounded unless x-max-length or "
                                "x-max-length-bytes say otherwise (as in RabbitMQ); the memory "
                                "and disk alarms block publishers instead",
}

# node.toml keys (dotted) whose values are numbers: what a string-only source
# (a Kubernetes CR's spec.config) must write as TOML numbers
NUMERIC_KEYS = frozenset(_WIRE_KEYS | _WIRE_SECONDS | {"memory_high_watermark"} | DEPRECATED_KEYS.keys()
                         | {f"raft.{k}" for k in _RAFT_KEYS
                            if k not in ("password", "password_file", "tls_cert", "tls_key", "tls_ca")})


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def parse_peers(text: str) -> dict[str, str]:
    peers: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        node, sep, addr = item.partition("=")
        host, colon, port = addr.rpartition(":")
        if not sep or not node or not colon or not host or not port.isdigit():
            raise ConfigError(f"bad peer {item!r}: expected ID=HOST:PORT")
        peers[node] = f"{host}:{int(port)}"
    return peers


def apply_file(cfg: NodeConfig, path: str) -> None:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    for key, value in data.items():
        if key == "users":
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in value.items()) or not value:
                raise ConfigError("users must be a table of user = \"password\" strings")
            cfg.wire.users = dict(value)
        elif key in _WIRE_SECONDS:
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{key} must be a positive number of seconds")
            setattr(cfg.wire, key, float(value))
        elif key == "loopback_users":
            if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
                raise ConfigError("loopback_users must be a list of user names ([] = none)")
            cfg.wire.loopback_users = list(value)
        elif key == "memory_high_watermark":
            # RabbitMQ's two forms: a fraction of memory (0.4) or bytes (0 = off)
            if isinstance(value, float):
                if not 0 < value <= 1:
                    raise ConfigError("memory_high_watermark must be a fraction in (0, 1] "
                                      f"of the memory or a number of bytes, got {value!r}")
                cfg.memory_high_watermark_relative = value
            else:
                cfg.wire.memory_high_watermark = _int(key, value, 0, 2**50)
                cfg.memory_high_watermark_relative = None
        elif key in _WIRE_KEYS:
            setattr(cfg.wire, key, _int(key, value, 0, 2**40))
        elif key in DEPRECATED_KEYS:
            cfg.deprecations.append(f"{key} in {path} is ignored: {DEPRECATED_KEYS[key]}")
        elif key == "raft" and isinstance(value, dict):
            for rkey, rvalue in value.items():
                if rkey not in _RAFT_KEYS:
                    raise ConfigError(f"unknown key raft.{rkey} in {path}")
                if rkey == "password":
                    if not isinstance(rvalue, str) or not rvalue:
                        raise ConfigError("raft.password must be a non-empty string")
                    if "password_file" in value:
                        raise ConfigError("set raft.password or raft.password_file, not both")
                    cfg.raft.password = rvalue
                elif rkey in ("tls_cert", "tls_key", "tls_ca"):
                    if not isinstance(rvalue, str) or not rvalue:
                        raise ConfigError(f"raft.{rkey} must be a file path")
                    setattr(cfg.raft, rkey, _relative(path, rvalue, f"raft.{rkey}"))
                elif rkey == "password_file":
                    cfg.raft.password = _read_secret(_relative(path, rvalue, "raft.password_file"),
                                                     "raft.password_file")
                elif isinstance(getattr(cfg.raft, rkey), float):
                    if not isinstance(rvalue, int | float) or rvalue <= 0:
                        raise ConfigError(f"raft.{rkey} must be a positive number")
                    setattr(cfg.raft, rkey, float(rvalue))
                else:
                    setattr(cfg.raft, rkey, _int(f"raft.{rkey}", rvalue, 1, 2**40))
        elif key == "tls" and isinstance(value, dict):
            _apply_tls(cfg.tls, value, path)
        elif key == "admin":
            cfg.admin = _admin_config(value, path)
        elif key == "http":
            cfg.http = _http_config(value, path)
        elif key == "amqp":
            if not isinstance(value, dict):
                raise ConfigError("amqp must be a table ([amqp])")
            for akey, avalue in value.items():
                if akey != "listen":
                    raise ConfigError(f"unknown key amqp.{akey} in {path}")
                cfg.amqp_listen = check_listen(avalue, "amqp.listen")
        elif key in ("amqp_host",):
            if not isinstance(value, str):
                raise ConfigError(f"{key} must be a string")
            cfg.amqp_host = value
        else:
            raise ConfigError(f"unknown key {key!r} in {path}")
    validate(cfg)


def check_listen(value: Any, name: str) -> list[str]:
    """A non-empty list of addresses (IP literals or host names) to listen on."""
    if not isinstance(value, list) or not value \
            or not all(isinstance(a, str) and a.strip() for a in value):
        raise ConfigError(f"{name} must be a non-empty list of addresses, e.g. "
                          '["127.0.0.1", "::1"]')
    return [a.strip().removeprefix("[").removesuffix("]") for a in value]


def _relative(config_path: str, value: Any, name: str) -> str:
    """A path from the config file: relative ones are relative to the file's directory."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a non-empty path")
    return os.path.join(os.path.dirname(os.path.abspath(config_path)), value)


def _read_secret(path: str, name: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read().rstrip("\r\n")  # `echo secret > file` adds a newline
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read {name} {path}: {why}") from exc
    if not secret:
        raise ConfigError(f"{name} {path} is empty")
    return secret


def _apply_tls(tls: TlsConfig, table: dict[str, Any], path: str) -> None:
    for tkey, tvalue in table.items():
        if tkey == "port":
            tls.port = _int("tls.port", tvalue, 1, 65535)
        elif tkey in ("cert", "key", "ca"):
            setattr(tls, tkey, _relative(path, tvalue, f"tls.{tkey}"))
        elif tkey == "verify":
            if tvalue not in VERIFY_MODES:
                raise ConfigError(f"tls.verify must be one of {', '.join(VERIFY_MODES)}, "
                                  f"got {tvalue!r}")
            tls.verify = tvalue
        elif tkey == "only":
            if not isinstance(tvalue, bool):
                raise ConfigError("tls.only must be true or false")
            tls.only = tvalue
        else:
            raise ConfigError(f"unknown key tls.{tkey} in {path}")


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


_ADMIN_KEYS = {"token", "token_file", "listen", "tls_cert", "tls_key", "tls_client_ca"}
NO_ADMIN_TOKEN = ("the admin API (--admin-port) needs a token: --admin-token-file FILE, "
                  f"[admin] token_file (or token) in the config, or {ADMIN_TOKEN_ENV} (or "
                  "client certificates: [admin] tls_client_ca); or --insecure-dev for a "
                  "throwaway development node (anyone who reaches the port, any local user "
                  "included, could administer it)")


def _read_file(key: str, path: Any, pem: bool) -> bytes:
    if not isinstance(path, str) or not path:
        raise ConfigError(f"admin.{key} must be a file path")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read admin.{key} {path}: {exc.strerror}") from exc
    if pem and b"-----BEGIN " not in data:
        raise ConfigError(f"admin.{key} {path} is not a PEM file")
    return data


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


def _admin_config(table: Any, path: str) -> AdminConfig:
    if not isinstance(table, dict):
        raise ConfigError("admin must be a table ([admin])")
    unknown = sorted(set(table) - _ADMIN_KEYS)
    if unknown:
        raise ConfigError(f"unknown key admin.{unknown[0]} in {path}")
    admin = AdminConfig()
    if "token" in table and "token_file" in table:
        raise ConfigError("set admin.token or admin.token_file, not both")
    if "token" in table:
        token = table["token"]
        if not isinstance(token, str):
            raise ConfigError("admin.token must be a string")
    elif "token_file" in table:
        token = _read_file_token(table["token_file"], path)
    else:
        token = None
    if token is not None:
        admin.token = check_admin_token(token, "admin token")
    if "listen" in table:
        listen = table["listen"]
        if not isinstance(listen, str) or not listen.strip():
            raise ConfigError('admin.listen must be one address, e.g. "127.0.0.1"')
        admin.listen = listen.strip().removeprefix("[").removesuffix("]")
    if ("tls_cert" in table) != ("tls_key" in table):
        raise ConfigError("admin.tls_cert and admin.tls_key go together")
    if "tls_client_ca" in table and "tls_cert" not in table:
        raise ConfigError("admin.tls_client_ca needs admin.tls_cert and admin.tls_key")
    if "tls_cert" in table:
        admin.tls_cert = _read_file("tls_cert", table["tls_cert"], pem=True)
        admin.tls_key = _read_file("tls_key", table["tls_key"], pem=True)
    if "tls_client_ca" in table:
        admin.tls_client_ca = _read_file("tls_client_ca", table["tls_client_ca"], pem=True)
    return admin


def _read_file_token(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError("admin.token_file must be a file path")
    try:
        return _read_file("token_file", _relative(path, value, "admin.token_file"),
                          pem=False).decode().strip()
    except UnicodeDecodeError as exc:
        raise ConfigError("admin.token_file must hold UTF-8 text") from exc


_HTTP_KEYS = {"port", "tls_port", "tls_only", "tls_cert", "tls_key", "tls_client_ca", "member_urls", "idle_timeout",
              "max_connections", "max_connections_per_address", "target_cluster_size_hint"}


def _http_config(table: Any, path: str) -> HttpConfig:
    if not isinstance(table, dict):
        raise ConfigError("http must be a table ([http])")
    unknown = sorted(set(table) - _HTTP_KEYS)
    if unknown:
        raise ConfigError(f"unknown key http.{unknown[0]} in {path}")
    http = HttpConfig()
    if "port" in table:
        http.port = _int("http.port", table["port"], 1, 65535)
    if "tls_port" in table:
        http.tls_port = _int("http.tls_port", table["tls_port"], 1, 65535)
    if "tls_only" in table:
        if not isinstance(table["tls_only"], bool):
            raise ConfigError("http.tls_only must be true or false")
        http.tls_only = table["tls_only"]
    if "idle_timeout" in table:
        t = table["idle_timeout"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.1 <= t <= 3600:
            raise ConfigError(f"http.idle_timeout must be seconds in [0.1, 3600], got {t!r}")
        http.idle_timeout = float(t)
    for key in ("max_connections", "max_connections_per_address"):
        if key in table:
            setattr(http, key, _int(f"http.{key}", table[key], 1, 1_000_000))
    if "target_cluster_size_hint" in table:
        http.target_cluster_size_hint = _int("http.target_cluster_size_hint",
                                             table["target_cluster_size_hint"], 1, 1000)
    if "member_urls" in table:
        urls = table["member_urls"]
        if not isinstance(urls, dict) or not all(
                isinstance(v, str) and v.startswith(("http://", "https://")) for v in urls.values()):
            raise ConfigError("http.member_urls must be a table of node = \"http(s)://HOST:PORT/\"")
        http.member_urls = {str(k): v for k, v in urls.items()}
    if ("tls_cert" in table) != ("tls_key" in table):
        raise ConfigError("http.tls_cert and http.tls_key go together")
    if "tls_client_ca" in table and "tls_cert" not in table:
        raise ConfigError("http.tls_client_ca needs http.tls_cert and http.tls_key")
    for key in ("tls_cert", "tls_key", "tls_client_ca"):
        if key in table:
            value = table[key]
            if not isinstance(value, str) or not value:
                raise ConfigError(f"http.{key} must be a file path")
            full = _relative(path, value, f"http.{key}")
            try:
                with open(full, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise ConfigError(f"cannot read http.{key} {full}: {exc.strerror}") from exc
            if b"-----BEGIN " not in data:
                raise ConfigError(f"http.{key} {full} is not a PEM file")
            setattr(http, key, full)
    if http.tls_cert:
        from node.amqp.tls import TlsConfigError
        try:
            http.ssl_context()
        except TlsConfigError as exc:
            raise ConfigError(f"http TLS: {exc}") from exc
    return http


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


def validate(cfg: NodeConfig) -> None:
    w = cfg.wire
    if w.frame_max and w.frame_max < 4096:
        raise ConfigError("frame_max must be at least 4096 (AMQP frame-min-size) or 0")
    _int("channel_max", w.channel_max, 0, 65535)
    _int("heartbeat", w.heartbeat, 0, 65535)
    if not cfg.node_id or not all(c.isalnum() or c in "-_." for c in cfg.node_id):
        raise ConfigError(f"node id {cfg.node_id!r} must be non-empty and use only letters, digits, - _ .")
    r = cfg.raft
    if r.election_max <= r.election_min:
        raise ConfigError("raft.election_max must exceed raft.election_min")
    if r.out_of_sync_after <= r.election_max:
        raise ConfigError("raft.out_of_sync_after must exceed raft.election_max (a new leader "
                          "must be able to win before mirrors are dropped)")
    if r.nack_after <= r.block_after:
        raise ConfigError("raft.nack_after must exceed raft.block_after")
    if r.catch_up_hold_bytes < r.compaction_max_bytes:
        raise ConfigError("raft.catch_up_hold_bytes must be at least raft.compaction_max_bytes")


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
