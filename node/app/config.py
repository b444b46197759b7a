"""Node configuration: CLI flags over a TOML file over defaults.

Validation is strict and every problem is a ConfigError with a one-line
message (the CLI prints it and exits 2).
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from node.amqp.config import WireConfig
from node.replication.raft_node import RaftConfig


class ConfigError(Exception):
    pass


@dataclass
class NodeConfig:
    node_id: str
    data_dir: str
    amqp_host: str = "127.0.0.1"
    amqp_port: int = 5672
    admin_port: int | None = None
    metrics_port: int | None = None
    wire: WireConfig = field(default_factory=WireConfig)
    raft: RaftConfig = field(default_factory=RaftConfig)


_WIRE_KEYS = {"frame_max", "channel_max", "heartbeat", "memory_high_watermark", "consumer_credit",
              "max_message_size", "inflight_publish_bytes", "login_failure_limit",
              "max_connections", "disk_free_limit"}
_RAFT_KEYS = {"password", "batch_max_commands", "batch_max_bytes", "max_inflight_batches",
              "max_inflight_bytes", "election_min", "election_max", "leader_fallback",
              "compaction_min_entries", "compaction_min_time", "tick_interval",
              "out_of_sync_after", "nack_after", "block_after"}


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
        elif key == "login_failure_window":
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError("login_failure_window must be a positive number of seconds")
            cfg.wire.login_failure_window = float(value)
        elif key == "loopback_users":
            if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
                raise ConfigError("loopback_users must be a list of user names ([] = none)")
            cfg.wire.loopback_users = list(value)
        elif key in _WIRE_KEYS:
            setattr(cfg.wire, key, _int(key, value, 0, 2**40))
        elif key == "raft" and isinstance(value, dict):
            for rkey, rvalue in value.items():
                if rkey not in _RAFT_KEYS:
                    raise ConfigError(f"unknown key raft.{rkey} in {path}")
                if rkey == "password":
                    if not isinstance(rvalue, str):
                        raise ConfigError("raft.password must be a string")
                    cfg.raft.password = rvalue
                elif isinstance(getattr(cfg.raft, rkey), float):
                    if not isinstance(rvalue, int | float) or rvalue <= 0:
                        raise ConfigError(f"raft.{rkey} must be a positive number")
                    setattr(cfg.raft, rkey, float(rvalue))
                else:
                    setattr(cfg.raft, rkey, _int(f"raft.{rkey}", rvalue, 1, 2**40))
        elif key in ("amqp_host",):
            if not isinstance(value, str):
                raise ConfigError(f"{key} must be a string")
            cfg.amqp_host = value
        else:
            raise ConfigError(f"unknown key {key!r} in {path}")
    validate(cfg)


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


def check_data_dir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-probe")
        with open(probe, "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"data dir {path} is not writable: {exc.strerror}") from exc
