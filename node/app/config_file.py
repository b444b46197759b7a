"""The config file (node.toml, TOML): apply_file reads it over a NodeConfig,
table by table ([raft], [tls], [admin], [http], [metrics], [amqp] and the top-level wire
settings), and validate checks the values together. Its keys, the ones once
settings and now ignored (DEPRECATED_KEYS) and the numeric ones (NUMERIC_KEYS,
what a string-only source such as a Kubernetes CR must write as numbers).

Validation is strict and every problem is a ConfigError with a one-line
message (the CLI prints it and exits 2).
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from typing import Any

from node.amqp.config import VERIFY_MODES, TlsConfig
from node.app.config import (
    AdminConfig,
    ConfigError,
    HttpConfig,
    MetricsConfig,
    NodeConfig,
    check_admin_token,
)
from node.broker.definition_limit import SETTINGS as _DEFINITION_SETTINGS
from node.replication.config import MAX_FRAME_BYTES, min_frame_bytes

_WIRE_KEYS = {"frame_max", "channel_max", "heartbeat", "consumer_credit", "consumer_timeout",
              "max_message_size", "inflight_publish_bytes", "login_failure_limit",
              "login_failure_address_limit",
              "max_connections", "disk_free_limit",
              "max_handshakes", "max_handshakes_per_address", "max_connection_buffer",
              "max_binding_key_words", "max_bindings_per_exchange", "max_bindings_per_vhost",
              "max_topic_wildcard_nodes"}
# seconds (positive numbers)
_WIRE_SECONDS = {"login_failure_window", "login_failure_delay", "login_failure_max_delay",
                 "handshake_timeout"}
# policies per vhost, policy and global parameter sizes: (lower, upper) bounds
_DEFINITION_KEYS = {name: (lo, hi) for name, lo, hi in _DEFINITION_SETTINGS}
_RAFT_KEYS = {"password", "password_file", "batch_max_commands", "batch_max_bytes", "max_inflight_batches",
              "max_inflight_bytes", "election_min", "election_max", "leader_fallback",
              "compaction_min_entries", "compaction_min_time", "tick_interval",
              "out_of_sync_after", "nack_after", "block_after", "tls_cert", "tls_key", "tls_ca",
              "follower_window_bytes", "append_chunk_bytes", "compaction_max_bytes", "catch_up_hold_bytes",
              "compaction_min_gap", "segment_bytes", "verify_at_open_bytes", "scrub_bytes_per_second",
              "max_frame_bytes", "tls_verify_names"}


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
                         | _DEFINITION_KEYS.keys()
                         | {f"raft.{k}" for k in _RAFT_KEYS
                            if k not in ("password", "password_file", "tls_cert", "tls_key", "tls_ca",
                                      "tls_verify_names")})


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


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
        elif key in _DEFINITION_KEYS:
            lo, hi = _DEFINITION_KEYS[key]
            cfg.definitions = dataclasses.replace(cfg.definitions, **{key: _int(key, value, lo, hi)})
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
                elif rkey == "tls_verify_names":
                    if not isinstance(rvalue, bool):
                        raise ConfigError("raft.tls_verify_names must be true or false")
                    cfg.raft.tls_verify_names = rvalue
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
        elif key == "metrics":
            cfg.metrics = _metrics_config(value, path)
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


_ADMIN_KEYS = {"token", "token_file", "listen", "tls_cert", "tls_key", "tls_client_ca"}


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


def _check_table(table: Any, name: str, keys: set[str], path: str) -> None:
    """A `[name]` table whose keys are all among `keys`."""
    if not isinstance(table, dict):
        raise ConfigError(f"{name} must be a table ([{name}])")
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ConfigError(f"unknown key {name}.{unknown[0]} in {path}")


def _admin_config(table: Any, path: str) -> AdminConfig:
    _check_table(table, "admin", _ADMIN_KEYS, path)
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
              "max_connections", "max_connections_per_address", "target_cluster_size_hint",
              "max_requests_per_user", "rows_min_interval", "rows_max_share",
              "get_max_count", "get_max_bytes"}


def _http_config(table: Any, path: str) -> HttpConfig:
    _check_table(table, "http", _HTTP_KEYS, path)
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
    if "max_requests_per_user" in table:
        http.max_requests_per_user = _int("http.max_requests_per_user",
                                          table["max_requests_per_user"], 0, 1_000_000)
    if "rows_min_interval" in table:
        t = table["rows_min_interval"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= 60:
            raise ConfigError(f"http.rows_min_interval must be seconds in [0, 60], got {t!r}")
        http.rows_min_interval = float(t)
    if "rows_max_share" in table:
        t = table["rows_max_share"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.01 <= t <= 1:
            raise ConfigError(f"http.rows_max_share must be a fraction in [0.01, 1], got {t!r}")
        http.rows_max_share = float(t)
    if "get_max_count" in table:
        http.get_max_count = _int("http.get_max_count", table["get_max_count"], 1, 1_000_000)
    if "get_max_bytes" in table:
        http.get_max_bytes = _int("http.get_max_bytes", table["get_max_bytes"], 1, 1 << 40)
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


_METRICS_KEYS = {"return_per_object_metrics", "per_object_endpoint", "token", "token_file",
                 "max_scrapes"}


def _metrics_config(table: Any, path: str) -> MetricsConfig:
    _check_table(table, "metrics", _METRICS_KEYS, path)
    m = MetricsConfig()
    for key in ("return_per_object_metrics", "per_object_endpoint"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ConfigError(f"metrics.{key} must be true or false")
            setattr(m, key, table[key])
    if "token" in table and "token_file" in table:
        raise ConfigError("set metrics.token or metrics.token_file, not both")
    if "token" in table:
        if not isinstance(table["token"], str) or not table["token"].strip():
            raise ConfigError("metrics.token must be a non-empty string")
        m.token = table["token"].strip()
    elif "token_file" in table:
        m.token = _read_secret(_relative(path, table["token_file"], "metrics.token_file"),
                               "metrics.token_file").strip()
    if "max_scrapes" in table:
        m.max_scrapes = _int("metrics.max_scrapes", table["max_scrapes"], 1, 10_000)
    return m


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
    least = min_frame_bytes(w.max_message_size, r.append_chunk_bytes, r.batch_max_bytes)
    if r.max_frame_bytes is None:
        r.max_frame_bytes = max(MAX_FRAME_BYTES, least)
    elif r.max_frame_bytes < least:
        raise ConfigError(f"raft.max_frame_bytes must be at least {least} (max_message_size + "
                          "append_chunk_bytes + 1 MiB: the largest AppendEntries a member sends)")
