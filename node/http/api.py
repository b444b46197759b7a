"""The management HTTP API: RabbitMQ 3.10's paths and JSON shapes (issue 15).

Two halves:
- pure builders (`queue_json`, `exchange_json`, `definitions`, ...) that turn
  the immutable management rows (node/replication/read_model.py, built on
  the raft thread from the replicated state, so every node answers the same)
  and the node's status into RabbitMQ's JSON; unit-testable without sockets;
- `ManagementApi`, the handlers: authentication (auth.py), reads from the
  read model and the rows, writes through the same paths a client takes:
  queues, exchanges, bindings, publish, get and purge as AMQP methods on an
  in-process session (node/amqp/internal.py: the channel code's permission
  checks and apply's validation and error texts), users, vhosts,
  permissions and membership through the Administrator, as the gRPC admin.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import mimetypes
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from node.http.auth import (
    Principal,
    authenticate,
    parse_tags,
    require_admin,
    require_monitor,
    require_vhost,
    visible_vhosts,
)
from node.http.server import HttpError, Request, Response, Router, json_response
from node.replication.read_model import (
    Management,
    MBinding,
    MChannel,
    MConnection,
    MConsumer,
    MExchange,
    MQueue,
)

RABBIT_VERSION = "3.10.8"  # the management API version whose shapes these are
HASHING = "rabbit_password_hashing_sha256"
SAMPLE_INTERVAL = 5.0  # seconds between rate samples (RabbitMQ's default)
EXCHANGE_TYPES = [
    {"name": "direct", "description": "AMQP direct exchange, as per the AMQP specification",
     "enabled": True},
    {"name": "fanout", "description": "AMQP fanout exchange, as per the AMQP specification",
     "enabled": True},
    {"name": "headers", "description": "AMQP headers exchange, as per the AMQP specification",
     "enabled": True},
    {"name": "topic", "description": "AMQP topic exchange, as per the AMQP specification",
     "enabled": True},
]
STATIC_DIR = Path(__file__).with_name("static")
# AMQP reply code -> HTTP status (RabbitMQ's management API answers the same way)
AMQP_TO_HTTP = {404: 404, 406: 400, 403: 403, 405: 409, 530: 403, 503: 400, 540: 400, 502: 400,
                320: 503, 541: 500}


def not_found() -> HttpError:
    return HttpError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> HttpError:
    return HttpError(400, "bad_request", reason)


# ------------------------------------------------------------------ pure builders

def rate(value: float) -> dict[str, float]:
    return {"rate": round(float(value), 1)}


def pick_columns(r: Mapping[str, Any], columns: str) -> dict[str, Any]:
    """RabbitMQ's `columns=a,b.c`: only those fields (dotted: nested)."""
    out: dict[str, Any] = {}
    for c in (c.strip() for c in columns.split(",")):
        if not c:
            continue
        v: Any = r
        for part in c.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None or c in r:
            cur = out
            parts = c.split(".")
            for part in parts[:-1]:
                cur = cur.setdefault(part, {})
            cur[parts[-1]] = v
    return out


def conn_name(node: str, serial: int) -> str:
    """A connection's name, the same on every node (the replicated state
    knows connections by node and serial only)."""
    return f"{node}.{serial}"


def chan_name(node: str, conn: int, number: int) -> str:
    return f"{conn_name(node, conn)} ({number})"


STAT_NAMES = ("publish", "deliver_get", "redeliver", "ack")


def message_stats(totals: Iterable[int], rates: Iterable[float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, total, r in zip(STAT_NAMES, totals, rates, strict=True):
        out[name] = int(total)
        out[f"{name}_details"] = rate(r)
    return out


def queue_json(q: MQueue, rates: tuple[float, ...] | None = None) -> dict[str, Any]:
    """A queue as RabbitMQ 3.10 shows it (the figures it has; no memory/GC
    internals)."""
    qtype = q.arguments.get("x-queue-type", "classic")
    out: dict[str, Any] = {
        "arguments": dict(q.arguments),
        "auto_delete": q.auto_delete,
        "consumers": q.consumers,
        "consumer_capacity": 1.0 if q.consumers else 0,
        "consumer_utilisation": 1.0 if q.consumers else 0,
        "durable": q.durable,
        "effective_policy_definition": {},
        "exclusive": q.exclusive,
        "exclusive_consumer_tag": None,
        "head_message_timestamp": None,
        "idle_since": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(q.idle_since)),
        "message_bytes": q.ready_bytes + q.unacked_bytes,
        "message_bytes_ready": q.ready_bytes,
        "message_bytes_unacknowledged": q.unacked_bytes,
        "messages": q.ready + q.unacked,
        "messages_details": rate(0),
        "messages_ready": q.ready,
        "messages_ready_details": rate(0),
        "messages_unacknowledged": q.unacked,
        "messages_unacknowledged_details": rate(0),
        "name": q.name,
        "node": q.node,
        "operator_policy": None,
        "policy": None,
        "recoverable_slaves": None,
        "single_active_consumer_tag": None,
        "state": "running",
        "type": qtype if qtype in ("classic", "quorum") else "classic",
        "vhost": q.vhost,
    }
    if q.owner is not None:
        out["owner_pid_details"] = {"name": conn_name(*q.owner)}
    if any(q.stats):
        out["message_stats"] = message_stats(q.stats, rates or (0.0,) * 4)
    return out


def exchange_json(x: MExchange) -> dict[str, Any]:
    return {"arguments": dict(x.arguments), "auto_delete": x.auto_delete, "durable": x.durable,
            "internal": x.internal, "name": x.name, "type": x.type,
            "user_who_performed_action": "rmq-internal", "vhost": x.vhost, "policy": None}


def _plain_json(value: Any) -> Any:
    """A field-table value as JSON can carry it (bytes as text)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_json(v) for v in value]
    return value


def properties_key(routing_key: str, arguments: Mapping[str, Any]) -> str:
    """RabbitMQ's binding identity in URLs: the routing key, "~" when empty;
    with arguments, key "~" and a hash of them."""
    base = quote(routing_key, safe="") if routing_key else "~"
    if not arguments:
        return base
    digest = hashlib.sha256(json.dumps(_plain_json(arguments), sort_keys=True).encode()).digest()
    return f"{quote(routing_key, safe='')}~{base64.urlsafe_b64encode(digest[:9]).decode()}"


def binding_json(b: MBinding) -> dict[str, Any]:
    return {"source": b.source, "vhost": b.vhost, "destination": b.destination,
            "destination_type": b.destination_type, "routing_key": b.routing_key,
            "arguments": _plain_json(b.arguments),
            "properties_key": properties_key(b.routing_key, b.arguments)}


def all_bindings(m: Management) -> list[MBinding]:
    """Explicit bindings plus the default exchange's implicit one per queue
    (RabbitMQ lists them)."""
    out = [MBinding(q.vhost, "", q.name, "queue", q.name, {}) for q in m.queues]
    out.extend(m.bindings)
    return out


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


def connection_json(c: MConnection, local: LocalConnection | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": conn_name(c.node, c.serial), "node": c.node, "vhost": c.vhost,
        "channels": c.channels, "state": "running", "type": "network",
        "protocol": "AMQP 0-9-1", "auth_mechanism": "PLAIN",
        "user": None, "peer_host": None, "peer_port": None, "host": None, "port": None,
        "client_properties": {}, "ssl": False, "timeout": 0, "frame_max": 0, "channel_max": 0,
        "connected_at": None, "recv_oct": 0, "send_oct": 0,
    }
    if local is not None:
        out.update({"user": local.user, "vhost": local.vhost, "peer_host": local.peer_host,
                    "peer_port": local.peer_port, "host": local.host, "port": local.port,
                    "client_properties": _plain_json(local.client_properties),
                    "ssl": local.tls, "timeout": local.heartbeat, "frame_max": local.frame_max,
                    "channel_max": local.channel_max,
                    "connected_at": int(local.connected_at * 1000)})
    return out


def channel_json(ch: MChannel, local: LocalConnection | None) -> dict[str, Any]:
    number = ch.number
    if local is not None:
        number = local.numbers.get(ch.serial, number)
    return {
        "name": chan_name(ch.node, ch.conn, number), "node": ch.node, "number": number,
        "vhost": ch.vhost, "user": local.user if local else None,
        "connection_details": {"name": conn_name(ch.node, ch.conn),
                               "peer_host": local.peer_host if local else None,
                               "peer_port": local.peer_port if local else None},
        "prefetch_count": ch.prefetch, "global_prefetch_count": ch.global_prefetch,
        "messages_unacknowledged": ch.unacked, "messages_unconfirmed": 0,
        "messages_uncommitted": 0, "acks_uncommitted": 0, "consumer_count": ch.consumers,
        "confirm": False, "transactional": False, "state": "running",
    }


def consumer_json(c: MConsumer, number: int, local: LocalConnection | None) -> dict[str, Any]:
    return {
        "arguments": {"x-priority": c.priority} if c.priority else {},
        "ack_required": c.ack_required, "active": True, "activity_status": "up",
        "channel_details": {"connection_name": conn_name(c.node, c.conn),
                            "name": chan_name(c.node, c.conn, number), "node": c.node,
                            "number": number,
                            "peer_host": local.peer_host if local else None,
                            "peer_port": local.peer_port if local else None,
                            "user": local.user if local else None},
        "consumer_tag": c.tag, "exclusive": c.exclusive, "prefetch_count": c.prefetch,
        "queue": {"name": c.queue, "vhost": c.vhost},
    }


def user_json(name: str, entry: tuple[str, tuple[str, ...]]) -> dict[str, Any]:
    return {"name": name, "password_hash": entry[0], "hashing_algorithm": HASHING,
            "tags": list(entry[1]), "limits": {}}


def permission_json(user: str, vhost: str, p: tuple[str, str, str]) -> dict[str, Any]:
    return {"user": user, "vhost": vhost, "configure": p[0], "write": p[1], "read": p[2]}


def vhost_json(name: str, queues: Iterable[MQueue], nodes: Iterable[str]) -> dict[str, Any]:
    ready = unacked = 0
    for q in queues:
        if q.vhost == name:
            ready += q.ready
            unacked += q.unacked
    description = "Default virtual host" if name == "/" else ""
    return {"name": name, "description": description, "tags": [], "tracing": False,
            "default_queue_type": "undefined",
            "metadata": {"description": description, "tags": []},
            "cluster_state": {n: "running" for n in nodes},
            "messages": ready + unacked, "messages_details": rate(0),
            "messages_ready": ready, "messages_ready_details": rate(0),
            "messages_unacknowledged": unacked, "messages_unacknowledged_details": rate(0)}


def definitions(users: Mapping[str, tuple[str, tuple[str, ...]]], vhosts: Iterable[str],
                permissions: Mapping[tuple[str, str], tuple[str, str, str]], m: Management,
                product_version: str) -> dict[str, Any]:
    """RabbitMQ's definitions export: no amq.* or default exchanges, no
    exclusive queues, no implicit default-exchange bindings."""
    return {
        "rabbit_version": RABBIT_VERSION, "rabbitmq_version": RABBIT_VERSION,
        "product_name": "mirrorq", "product_version": product_version,
        "users": [{"name": n, "password_hash": e[0], "hashing_algorithm": HASHING,
                   "tags": list(e[1]), "limits": {}} for n, e in users.items()],
        "vhosts": [{"name": v} for v in vhosts],
        "permissions": [permission_json(u, v, p) for (u, v), p in permissions.items()],
        "topic_permissions": [], "parameters": [], "global_parameters": [], "policies": [],
        "queues": [{"name": q.name, "vhost": q.vhost, "durable": q.durable,
                    "auto_delete": q.auto_delete, "arguments": _plain_json(q.arguments)}
                   for q in m.queues if not q.exclusive],
        "exchanges": [{"name": x.name, "vhost": x.vhost, "type": x.type, "durable": x.durable,
                       "auto_delete": x.auto_delete, "internal": x.internal,
                       "arguments": _plain_json(x.arguments)}
                      for x in m.exchanges if x.name and not x.name.startswith("amq.")],
        "bindings": [{"source": b.source, "vhost": b.vhost, "destination": b.destination,
                      "destination_type": b.destination_type, "routing_key": b.routing_key,
                      "arguments": _plain_json(b.arguments)} for b in m.bindings],
    }


def quorum_critical(status: Mapping[str, Any]) -> str | None:
    """Why losing this node would leave fewer than a majority of the members
    in sync (None: it would not). What a rolling upgrade asks before stopping
    a node."""
    members = list(status.get("members") or [])
    in_sync = list(status.get("in_sync") or members)
    me = status.get("node_id")
    majority = len(members) // 2 + 1
    if len(members) <= 1:
        return None  # RabbitMQ: a single node cluster is never quorum critical
    left = [m for m in in_sync if m != me]
    if len(left) < majority:
        return (f"losing node {me} leaves {len(left)} in-sync member(s) of {len(members)}, "
                f"fewer than a majority ({majority})")
    return None


def latency_percentile(hist: Mapping[str, Any], q: float) -> float | None:
    """The q-quantile (0..1) in ms from a cumulative histogram snapshot
    (upper bound of the bucket that holds it). Since node start: a figure
    that moves in steps; cluster_json reports the windowed one."""
    count = int(hist.get("count") or 0)
    if not count:
        return None
    want = q * count
    for le, cum in zip(hist.get("le") or [], hist.get("cumulative") or [], strict=False):
        if cum >= want:
            return None if le == "+Inf" else round(float(le) * 1000, 3)
    return None


def interpolated_percentile(bounds: Sequence[float], counts: Sequence[int],
                            q: float) -> float | None:
    """The q-quantile (0..1) in ms of per-bucket counts (`counts[i]` in
    (bounds[i-1], bounds[i]], the last one +Inf), interpolated linearly
    within its bucket as Prometheus' histogram_quantile does; the +Inf
    bucket answers its lower bound."""
    total = sum(counts)
    if total <= 0:
        return None
    want = q * total
    below = 0
    for i, c in enumerate(counts):
        if c > 0 and below + c >= want:
            lower = float(bounds[i - 1]) if i > 0 else 0.0
            if i >= len(bounds):
                return round(lower * 1000, 3)
            upper = float(bounds[i])
            return round((lower + (upper - lower) * (want - below) / c) * 1000, 3)
        below += c
    return None


LATENCY_WINDOW = 30.0  # seconds of confirms the cluster view's p50/p99 cover
LATENCY_SAMPLE = 1.0  # seconds between snapshots of the confirm-latency histogram


class LatencyWindow:
    """Snapshots of this node's cumulative confirm-latency histogram; the
    percentiles of the last `window` seconds come from the difference between
    the newest snapshot and the latest one at least `window` old (or the
    oldest kept, while the node is younger than that)."""

    def __init__(self, window: float = LATENCY_WINDOW) -> None:
        self.window = window
        self.samples: deque[tuple[float, tuple[int, ...]]] = deque()

    @staticmethod
    def _cum(hist: Mapping[str, Any]) -> tuple[int, ...]:
        return tuple(int(c) for c in hist.get("cumulative") or ())

    def add(self, now: float, hist: Mapping[str, Any]) -> None:
        cum = self._cum(hist)
        if self.samples and len(self.samples[-1][1]) != len(cum):
            self.samples.clear()
        self.samples.append((now, cum))
        # keep one sample at or before the window's start
        while len(self.samples) >= 2 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()

    def summary(self, now: float, hist: Mapping[str, Any]) -> dict[str, Any]:
        """p50/p99 (ms) and count of the confirms of the last `window`
        seconds, with `hist` the histogram now."""
        cum = self._cum(hist)
        kept = [(t, c) for t, c in self.samples if len(c) == len(cum)]
        old = [c for t, c in kept if t <= now - self.window]
        base = old[-1] if old else kept[0][1] if kept else (0,) * len(cum)
        counts = [max(0, (a - (cum[i - 1] if i else 0)) - (b - (base[i - 1] if i else 0)))
                  for i, (a, b) in enumerate(zip(cum, base, strict=True))]
        bounds = [float(x) for x in (hist.get("le") or [])[:-1]]
        return {"p50_ms": interpolated_percentile(bounds, counts, 0.5),
                "p99_ms": interpolated_percentile(bounds, counts, 0.99),
                "count": sum(counts), "window_seconds": self.window}


def cluster_json(status: Mapping[str, Any], latency: LatencyWindow | None = None,
                 now: float | None = None,
                 http_urls: Mapping[str, str] | None = None) -> dict[str, Any]:
    """/api/mirrorq/cluster: the Raft members as this node sees them.

    `match_index` of another member is known to the leader only (a follower
    answers null); `http_url` is a member's management URL where this node
    knows it ([http] member_urls). `confirm_latency` is this node's (a
    confirm leaves the node its publisher is connected to): p50/p99 of the
    last LATENCY_WINDOW seconds, interpolated within the histogram bucket,
    and the since-start bucket edges under `since_start`."""
    me = status.get("node_id")
    leader = status.get("leader")
    leading = status.get("role") == "leader"
    in_sync = list(status.get("in_sync") or [])
    draining = list(status.get("draining") or [])
    addresses = dict(status.get("member_addresses") or {})
    urls = dict(http_urls or {})
    peers = {p.get("member"): p for p in status.get("peers") or []}
    members = []
    for name in status.get("members") or []:
        peer = peers.get(name)
        mine = name == me
        if mine:
            match = status.get("last_applied")
        elif leading and peer is not None:
            match = peer.get("match_index")
        else:
            match = None  # only the leader tracks its followers' match index
        members.append({
            "name": name, "address": addresses.get(name),
            "in_sync": name in in_sync, "draining": name in draining,
            "leader": name == leader, "self": mine,
            "reachable": True if mine else bool(peer and peer.get("connected")),
            "match_index": match,
            "http_url": urls.get(name),
        })
    hist = status.get("confirm_latency") or {}
    since_start = {"p50_ms": latency_percentile(hist, 0.5),
                   "p99_ms": latency_percentile(hist, 0.99),
                   "count": hist.get("count", 0)}
    if latency is not None and hist:
        recent = latency.summary(time.monotonic() if now is None else now, hist)
    else:
        recent = dict(since_start, window_seconds=None)
    return {"node": me, "members": members, "leader": leader, "term": status.get("term"),
            "role": status.get("role"), "in_sync": in_sync, "draining": draining,
            "commit_index": status.get("commit_index"),
            "last_applied": status.get("last_applied"),
            "mirrored_index": status.get("mirrored_index"),
            "has_quorum": status.get("has_quorum"),
            "confirm_latency": {**recent, "since_start": since_start}}


# ------------------------------------------------------------------ rates

class RateSampler:
    """Samples the replicated per-queue counters every SAMPLE_INTERVAL
    seconds on this node; a rate is the change between the last two samples
    per second (RabbitMQ's basic rates mode). The per-queue counters are
    applied from the log, so their rates are cluster-wide (every node counts
    every publish, delivery and ack). Confirms are not in the log (a confirm
    leaves the node its publisher is connected to): `confirmed` is this
    node's own counter, sampled alongside, so the confirm rate is this
    node's."""

    def __init__(self) -> None:
        self.prev: tuple[float, dict[tuple[str, str], tuple[int, ...]], int] | None = None
        self.cur: tuple[float, dict[tuple[str, str], tuple[int, ...]], int] | None = None

    def add(self, now: float, m: Management, confirmed: int = 0) -> None:
        self.prev = self.cur
        self.cur = (now, {(q.vhost, q.name): q.stats for q in m.queues}, int(confirmed))

    def rates(self, key: tuple[str, str]) -> tuple[float, ...]:
        if self.prev is None or self.cur is None:
            return (0.0,) * 4
        (t0, a, _), (t1, b, _) = self.prev, self.cur
        dt = t1 - t0
        new, old = b.get(key), a.get(key)
        if dt <= 0 or new is None:
            return (0.0,) * 4
        old = old or (0,) * 4
        return tuple(max(0, n - o) / dt for n, o in zip(new, old, strict=True))

    def totals(self, vhosts: Iterable[str] | None = None) -> tuple[float, ...]:
        """Sum of the queues' rates (of those in `vhosts`, None: all)."""
        if self.cur is None:
            return (0.0,) * 4
        keep = None if vhosts is None else set(vhosts)
        out = [0.0] * 4
        for key in self.cur[1]:
            if keep is not None and key[0] not in keep:
                continue
            for i, r in enumerate(self.rates(key)):
                out[i] += r
        return tuple(out)

    def confirm_rate(self) -> float:
        """This node's confirms per second between the last two samples."""
        if self.prev is None or self.cur is None:
            return 0.0
        dt = self.cur[0] - self.prev[0]
        return max(0, self.cur[2] - self.prev[2]) / dt if dt > 0 else 0.0


# ------------------------------------------------------------------ handlers

class Backend(Protocol):
    """What the API needs of the node (main.py wires the real one)."""

    node_id: str
    product_version: str

    def read_model(self) -> Any: ...
    async def management_rows(self) -> Management: ...
    def status(self) -> dict[str, Any]: ...
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
    def member_urls(self) -> Mapping[str, str]: ...


Route = Callable[[Request, dict[str, str], Principal], Awaitable[Response]]


def _bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise bad_request(f"{key} must be a boolean")
    if not isinstance(value, bool):
        raise bad_request(f"{key} must be a boolean")
    return value


def _args(body: Mapping[str, Any]) -> dict[str, Any]:
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise bad_request("arguments must be an object")
    return args


def _obj(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


class ManagementApi:
    def __init__(self, backend: Backend, static_dir: Path | None = STATIC_DIR) -> None:
        self.b = backend
        self.static_dir = static_dir
        self.sampler = RateSampler()
        self.latency = LatencyWindow()
        self.router = Router()
        self._sampling: asyncio.Task[None] | None = None
        self._routes()

    # ------------------------------------------------------------- plumbing
    def start_sampling(self) -> None:
        self._sampling = asyncio.get_running_loop().create_task(self._sample_loop())

    async def stop(self) -> None:
        if self._sampling is not None:
            self._sampling.cancel()
            try:
                await self._sampling
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass

    async def _sample_loop(self) -> None:
        next_rates = time.monotonic()
        while True:
            now = time.monotonic()
            try:
                st = self.b.status()
                self.latency.add(now, st.get("confirm_latency") or {})
                if now >= next_rates:
                    next_rates = now + SAMPLE_INTERVAL
                    rows = await self.b.management_rows()
                    self.sampler.add(time.monotonic(), rows, int(st.get("confirmed") or 0))
            except Exception:  # noqa: BLE001 - no leader yet, raft busy: sample next time
                pass
            await asyncio.sleep(LATENCY_SAMPLE)

    def _on(self, method: str, pattern: str, fn: Route, public: bool = False) -> None:
        async def handler(req: Request, params: dict[str, str]) -> Response:
            if public:
                return await fn(req, params, Principal("", ()))
            return await fn(req, params, self._auth(req))
        self.router.add(method, pattern, handler)

    def _auth(self, req: Request) -> Principal:
        model = self.b.read_model()
        return authenticate(req.headers.get("authorization"), req.peer_host, model.users,
                            self.b.configured_users, self.b.loopback_users, self.b.token)

    async def __call__(self, req: Request) -> Response:
        path = req.path
        if not path.startswith("/api/") and path != "/api":
            return self._static(path)
        handler, params = self.router.resolve(req.method, path)
        resp = await handler(req, params)
        cols = req.query.get("columns")
        if cols and req.method == "GET" and resp.status == 200 and resp.body[:1] == b"{":
            # one object (a queue, the overview...): RabbitMQ applies columns to it too;
            # lists went through _filter already
            value = json.loads(resp.body)
            if not ("items" in value and "page" in value):
                resp = json_response(pick_columns(value, cols))
        return resp

    def _static(self, path: str) -> Response:
        root = self.static_dir
        if root is None or not root.is_dir():
            raise not_found()
        rel = "index.html" if path in ("/", "/index.html") else None
        if rel is None and path.startswith("/static/"):
            rel = path[len("/static/"):]
        if rel is None:
            raise not_found()
        from urllib.parse import unquote
        rel = unquote(rel)
        base = root.resolve()
        target = (base / rel).resolve()
        if base != target and base not in target.parents:
            raise not_found()
        if not target.is_file():
            raise not_found()
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype in ("application/javascript", "application/json"):
            ctype += "; charset=utf-8"
        return Response(200, target.read_bytes(), ctype)

    # ------------------------------------------------------------- data
    def _model(self) -> Any:
        return self.b.read_model()

    async def _rows(self) -> Management:
        try:
            return await self.b.management_rows()
        except TimeoutError:
            raise HttpError(503, "service_unavailable", "the replicated state did not answer "
                                                        "in time") from None

    def _vhosts_for(self, p: Principal) -> set[str]:
        m = self._model()
        return set(visible_vhosts(p, m.vhosts, m.permissions))

    def _need_vhost(self, p: Principal, vhost: str) -> None:
        m = self._model()
        require_vhost(p, vhost, m.vhosts, m.permissions)

    def _nodes(self) -> list[str]:
        st = self.b.status()
        return list(st.get("members") or [self.b.node_id])

    async def _session_do(self, p: Principal, vhost: str,
                          fn: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run `fn(session)` on an in-process AMQP session as `p`; AMQP
        errors become RabbitMQ's HTTP answers."""
        from node.amqp.internal import AmqpReplyError
        try:
            async with self.b.session(p.name, vhost, p.token) as s:
                return await fn(s)
        except AmqpReplyError as err:
            status = AMQP_TO_HTTP.get(err.code, 500)
            text = err.text
            for prefix in ("PRECONDITION_FAILED - ", "NOT_FOUND - ", "ACCESS_REFUSED - ",
                           "RESOURCE_LOCKED - ", "NOT_ALLOWED - ", "INTERNAL_ERROR - ",
                           "COMMAND_INVALID - ", "NOT_IMPLEMENTED - ", "SYNTAX_ERROR - "):
                if text.startswith(prefix):
                    text = text[len(prefix):]
            word = {400: "bad_request", 404: "not_found", 403: "not_authorised",
                    409: "resource_locked"}.get(status, "internal_server_error")
            raise HttpError(status, word, text) from None
        except TimeoutError:
            raise HttpError(503, "service_unavailable",
                            "the cluster did not answer in time (no leader?)") from None

    def _filter(self, req: Request, rows: list[dict[str, Any]]) -> Response:
        """RabbitMQ's `name` + `use_regex` filter, `columns` selection and
        sorting (`sort`, `sort_reverse`); pagination (`page`) as RabbitMQ."""
        name = req.query.get("name")
        if name:
            if req.query.get("use_regex") == "true":
                import re
                try:
                    rx = re.compile(name)
                except re.error as exc:
                    raise bad_request(f"bad regex: {exc}") from None
                rows = [r for r in rows if rx.search(str(r.get("name", "")))]
            else:
                rows = [r for r in rows if name in str(r.get("name", ""))]
        sort = req.query.get("sort")
        if sort:
            def key(r: dict[str, Any]) -> Any:
                v: Any = r
                for part in sort.split("."):
                    v = v.get(part) if isinstance(v, dict) else None
                return (v is None, str(v) if not isinstance(v, int | float) else v)
            rows = sorted(rows, key=key, reverse=req.query.get("sort_reverse") == "true")
        cols = req.query.get("columns")
        if cols:
            rows = [pick_columns(r, cols) for r in rows]
        page = req.query.get("page")
        if page:
            if not page.isdigit() or int(page) < 1:
                raise bad_request("page must be a positive integer")
            size_text = req.query.get("page_size", "100")
            if not size_text.isdigit() or not 1 <= int(size_text) <= 500:
                raise bad_request("page_size must be 1..500")
            n, size = int(page), int(size_text)
            total = len(rows)
            items = rows[(n - 1) * size:n * size]
            return json_response({"filtered_count": total, "item_count": len(items),
                                  "items": items, "page": n,
                                  "page_count": max(1, -(-total // size)), "page_size": size,
                                  "total_count": total})
        return json_response(rows)

    # ------------------------------------------------------------- routes
    def _routes(self) -> None:
        on = self._on
        on("GET", "/api/overview", self.overview)
        on("GET", "/api/cluster-name", self.cluster_name)
        on("GET", "/api/nodes", self.nodes)
        on("GET", "/api/nodes/{node}", self.node)
        on("GET", "/api/whoami", self.whoami)
        on("GET", "/api/extensions", self.extensions)
        on("GET", "/api/queues", self.queues)
        on("GET", "/api/queues/{vhost}", self.queues)
        on("GET", "/api/queues/{vhost}/{name}", self.queue)
        on("PUT", "/api/queues/{vhost}/{name}", self.queue_put)
        on("DELETE", "/api/queues/{vhost}/{name}", self.queue_delete)
        on("DELETE", "/api/queues/{vhost}/{name}/contents", self.queue_purge)
        on("POST", "/api/queues/{vhost}/{name}/get", self.queue_get)
        on("GET", "/api/queues/{vhost}/{name}/bindings", self.queue_bindings)
        on("GET", "/api/exchanges", self.exchanges)
        on("GET", "/api/exchanges/{vhost}", self.exchanges)
        on("GET", "/api/exchanges/{vhost}/{name}", self.exchange)
        on("PUT", "/api/exchanges/{vhost}/{name}", self.exchange_put)
        on("DELETE", "/api/exchanges/{vhost}/{name}", self.exchange_delete)
        on("POST", "/api/exchanges/{vhost}/{name}/publish", self.publish)
        on("GET", "/api/exchanges/{vhost}/{name}/bindings/source", self.exchange_source)
        on("GET", "/api/exchanges/{vhost}/{name}/bindings/destination", self.exchange_dest)
        on("GET", "/api/bindings", self.bindings)
        on("GET", "/api/bindings/{vhost}", self.bindings)
        for kind in ("q", "e"):
            on("GET", f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}",
               self._binding_list(kind))
            on("POST", f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}",
               self._binding_post(kind))
            on("GET", f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}/{{props}}",
               self._binding_get(kind))
            on("DELETE", f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}/{{props}}",
               self._binding_delete(kind))
        on("GET", "/api/connections", self.connections)
        on("GET", "/api/connections/{name}", self.connection)
        on("DELETE", "/api/connections/{name}", self.connection_delete)
        on("GET", "/api/connections/{name}/channels", self.connection_channels)
        on("GET", "/api/vhosts/{vhost}/connections", self.vhost_connections)
        on("GET", "/api/channels", self.channels)
        on("GET", "/api/vhosts/{vhost}/channels", self.vhost_channels)
        on("GET", "/api/consumers", self.consumers)
        on("GET", "/api/consumers/{vhost}", self.consumers)
        on("GET", "/api/vhosts", self.vhosts)
        on("GET", "/api/vhosts/{vhost}", self.vhost)
        on("PUT", "/api/vhosts/{vhost}", self.vhost_put)
        on("DELETE", "/api/vhosts/{vhost}", self.vhost_delete)
        on("GET", "/api/vhosts/{vhost}/permissions", self.vhost_permissions)
        on("GET", "/api/users", self.users)
        on("GET", "/api/users/without-permissions", self.users_without_permissions)
        on("GET", "/api/users/{user}", self.user)
        on("PUT", "/api/users/{user}", self.user_put)
        on("DELETE", "/api/users/{user}", self.user_delete)
        on("GET", "/api/users/{user}/permissions", self.user_permissions)
        on("GET", "/api/permissions", self.permissions)
        on("GET", "/api/permissions/{vhost}/{user}", self.permission)
        on("PUT", "/api/permissions/{vhost}/{user}", self.permission_put)
        on("DELETE", "/api/permissions/{vhost}/{user}", self.permission_delete)
        on("GET", "/api/definitions", self.definitions_get)
        on("POST", "/api/definitions", self.definitions_post)
        on("GET", "/api/definitions/{vhost}", self.definitions_get)
        on("GET", "/api/health/checks/alarms", self.health_alarms)
        on("GET", "/api/health/checks/local-alarms", self.health_alarms)
        on("GET", "/api/health/checks/node-is-quorum-critical", self.health_quorum)
        on("GET", "/api/health/checks/node-is-mirror-sync-critical", self.health_quorum)
        on("GET", "/api/health/checks/virtual-hosts", self.health_vhosts)
        on("GET", "/api/aliveness-test/{vhost}", self.aliveness)
        on("GET", "/api/mirrorq/cluster", self.mirrorq_cluster)
        on("PUT", "/api/mirrorq/members/{name}", self.member_add)
        on("POST", "/api/mirrorq/members/{name}", self.member_add)
        on("DELETE", "/api/mirrorq/members/{name}", self.member_remove)

    # ------------------------------------------------------------- overview, nodes
    async def overview(self, req: Request, _p: dict[str, str], p: Principal) -> Response:
        rows = await self._rows()
        vis = self._vhosts_for(p)
        queues = [q for q in rows.queues if q.vhost in vis]
        ready = sum(q.ready for q in queues)
        unacked = sum(q.unacked for q in queues)
        st = self.b.status()
        totals = [sum(q.stats[i] for q in queues) for i in range(4)]
        # publish, deliver_get, redeliver, ack: cluster-wide, as RabbitMQ's overview
        # (the replicated per-queue counters summed over the visible queues; a message
        # routed to k queues counts k publishes, an unroutable one none)
        stats = message_stats(totals, self.sampler.totals(vis))
        # confirm: this node's (confirms are not replicated: one leaves the node
        # its publisher is connected to; sum the nodes' overviews for the cluster)
        hist_count = int((st.get("confirm_latency") or {}).get("count") or 0)
        stats["confirm"] = int(st.get("confirmed") or hist_count)
        stats["confirm_details"] = rate(self.sampler.confirm_rate())
        return json_response({
            "management_version": RABBIT_VERSION, "rabbitmq_version": RABBIT_VERSION,
            "product_name": "mirrorq", "product_version": self.b.product_version,
            "rates_mode": "basic", "erlang_version": "none (Python)",
            "erlang_full_version": "none (Python)",
            "cluster_name": self._cluster_name(), "node": self.b.node_id,
            "disable_stats": False, "enable_queue_totals": True,
            "sample_retention_policies": {"global": [600], "basic": [600], "detailed": [600]},
            "exchange_types": EXCHANGE_TYPES,
            "object_totals": {
                "channels": sum(1 for c in rows.channels if c.vhost in vis),
                "connections": sum(1 for c in rows.connections if c.vhost in vis),
                "consumers": sum(1 for c in rows.consumers if c.vhost in vis),
                "exchanges": sum(1 for x in rows.exchanges if x.vhost in vis),
                "queues": len(queues)},
            "queue_totals": {"messages": ready + unacked, "messages_details": rate(0),
                             "messages_ready": ready, "messages_ready_details": rate(0),
                             "messages_unacknowledged": unacked,
                             "messages_unacknowledged_details": rate(0)},
            "message_stats": stats,
            "listeners": self.b.listeners(),
            "contexts": [{"node": self.b.node_id, "description": "RabbitMQ Management",
                          "path": "/", "port": str(req.headers.get("host", "").rpartition(":")[2])}],
            "statistics_db_event_queue": 0,
            "churn_rates": {},
            "mirrorq": self._cluster(st),
        })

    def _cluster(self, st: Mapping[str, Any]) -> dict[str, Any]:
        return cluster_json(st, self.latency, time.monotonic(), self.b.member_urls())

    def _cluster_name(self) -> str:
        members = self._nodes()
        return f"mirrorq@{members[0]}" if members else "mirrorq"

    async def cluster_name(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        return json_response({"name": self._cluster_name()})

    async def extensions(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        return json_response([])

    def _node_json(self, name: str, st: Mapping[str, Any]) -> dict[str, Any]:
        cluster = self._cluster(st)
        member = next((m for m in cluster["members"] if m["name"] == name), None)
        mine = name == self.b.node_id
        alarms = self.b.alarms() if mine else []
        out: dict[str, Any] = {
            "name": name, "type": "disc", "running": bool(member and member["reachable"]),
            "being_drained": bool(member and member["draining"]),
            "mem_alarm": "low on memory" in alarms, "disk_free_alarm": "low on disk" in alarms,
            "partitions": [], "rates_mode": "basic", "exchange_types": EXCHANGE_TYPES,
            "mirrorq": member or {},
        }
        if mine:
            out.update({"os_pid": str(os.getpid()), "processors": os.cpu_count() or 1,
                        "uptime": int((time.monotonic() - _STARTED) * 1000),
                        **_process_stats(),
                        # RabbitMQ's mem_used is the node's memory: this process's RSS
                        # (above); the bytes of message bodies held (what the
                        # memory_high_watermark alarm compares) are message_bytes
                        "message_bytes": int(st.get("message_bytes") or 0),
                        "queues": st.get("queues"), "connections": st.get("connections"),
                        "role": st.get("role"), "term": st.get("term"),
                        "commit_index": st.get("commit_index")})
        return out

    async def nodes(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        require_monitor(p)
        st = self.b.status()
        return json_response([self._node_json(n, st) for n in st.get("members") or []])

    async def node(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        require_monitor(p)
        st = self.b.status()
        if params["node"] not in (st.get("members") or []):
            raise not_found()
        return json_response(self._node_json(params["node"], st))

    async def whoami(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        return json_response({"name": p.name, "tags": list(p.tags)})

    # ------------------------------------------------------------- queues
    async def queues(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost = params.get("vhost")
        if vhost is not None:
            self._need_vhost(p, vhost)
        vis = self._vhosts_for(p)
        rows = await self._rows()
        out = [queue_json(q, self.sampler.rates((q.vhost, q.name))) for q in rows.queues
               if q.vhost in vis and (vhost is None or q.vhost == vhost)]
        return self._filter(req, out)

    async def _find_queue(self, p: Principal, vhost: str, name: str) -> tuple[MQueue, Management]:
        self._need_vhost(p, vhost)
        rows = await self._rows()
        for q in rows.queues:
            if q.vhost == vhost and q.name == name:
                return q, rows
        raise not_found()

    async def queue(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        q, rows = await self._find_queue(p, params["vhost"], params["name"])
        out = queue_json(q, self.sampler.rates((q.vhost, q.name)))
        locals_ = self.b.local_connections()
        numbers = {(c.node, c.conn, c.serial): c.number for c in rows.channels}
        out["consumer_details"] = [
            consumer_json(c, numbers.get((c.node, c.conn, c.chan_serial), 0),
                          locals_.get((c.node, c.conn)))
            for c in rows.consumers if c.vhost == q.vhost and c.queue == q.name]
        out["incoming"] = []
        out["deliveries"] = []
        return json_response(out)

    async def queue_put(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost, name = params["vhost"], params["name"]
        body = _obj(req.json())
        if vhost not in self._model().vhosts:
            raise HttpError(404, "not_found", "vhost_not_found")
        self._need_vhost(p, vhost)
        durable = _bool(body, "durable", True)
        auto_delete = _bool(body, "auto_delete", False)
        args = _args(body)
        if "node" in body and not isinstance(body["node"], str):
            raise bad_request("node must be a string")
        rows = await self._rows()
        existed = any(q.vhost == vhost and q.name == name for q in rows.queues)
        if not name:
            raise bad_request("a queue needs a name")

        async def declare(s: Any) -> Any:
            return await s.call("Queue.Declare", {
                "queue": name, "durable": durable, "auto_delete": auto_delete,
                "exclusive": False, "passive": False, "nowait": False, "arguments": args},
                ("Queue.DeclareOk",))
        await self._session_do(p, vhost, declare)
        return Response(204 if existed else 201)

    async def queue_delete(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost, name = params["vhost"], params["name"]
        await self._find_queue(p, vhost, name)
        if_unused = req.query.get("if-unused") == "true"
        if_empty = req.query.get("if-empty") == "true"

        async def delete(s: Any) -> Any:
            return await s.call("Queue.Delete", {"queue": name, "if_unused": if_unused,
                                                 "if_empty": if_empty, "nowait": False},
                                ("Queue.DeleteOk",))
        await self._session_do(p, vhost, delete)
        return Response(204)

    async def queue_purge(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        vhost, name = params["vhost"], params["name"]
        await self._find_queue(p, vhost, name)

        async def purge(s: Any) -> Any:
            return await s.call("Queue.Purge", {"queue": name, "nowait": False},
                                ("Queue.PurgeOk",))
        await self._session_do(p, vhost, purge)
        return Response(204)

    async def queue_get(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost, name = params["vhost"], params["name"]
        body = _obj(req.json())
        await self._find_queue(p, vhost, name)
        count = body.get("count", 1)
        if isinstance(count, str) and count.isdigit():
            count = int(count)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise bad_request("count must be a positive integer")
        ackmode = body.get("ackmode") or ("ack_requeue_true" if body.get("requeue", True)
                                         else "ack_requeue_false")
        if ackmode not in ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
                           "reject_requeue_false"):
            raise bad_request(f"invalid ackmode {ackmode!r}")
        encoding = body.get("encoding", "auto")
        if encoding not in ("auto", "base64"):
            raise bad_request("encoding must be auto or base64")
        truncate = body.get("truncate")
        if truncate is not None and (not isinstance(truncate, int) or truncate < 0):
            raise bad_request("truncate must be a non-negative integer")

        async def get(s: Any) -> list[dict[str, Any]]:
            out = []
            no_ack = ackmode == "ack_requeue_false"
            for _ in range(min(count, 10_000)):
                msg = await s.get(name, no_ack)
                if msg is None:
                    break
                out.append(_message_json(msg, encoding, truncate))
                tag = msg.method.delivery_tag
                if ackmode == "reject_requeue_false":
                    s.send(_encode("Basic.Reject", {"delivery_tag": tag, "requeue": False}))
            if ackmode in ("ack_requeue_true", "reject_requeue_true") and out:
                # requeued at their places (redelivered) before the session closes
                await s.call("Basic.Recover", {"requeue": True}, ("Basic.RecoverOk",))
            elif ackmode == "reject_requeue_false" and out:
                await s.call("Basic.Qos", {"prefetch_count": 0}, ("Basic.QosOk",))  # a barrier
            return out
        return json_response(await self._session_do(p, vhost, get))

    async def queue_bindings(self, req: Request, params: dict[str, str],
                             p: Principal) -> Response:
        q, rows = await self._find_queue(p, params["vhost"], params["name"])
        out = [binding_json(b) for b in all_bindings(rows)
               if b.vhost == q.vhost and b.destination_type == "queue" and b.destination == q.name]
        return json_response(out)

    # ------------------------------------------------------------- exchanges
    async def exchanges(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost = params.get("vhost")
        if vhost is not None:
            self._need_vhost(p, vhost)
        vis = self._vhosts_for(p)
        rows = await self._rows()
        return self._filter(req, [exchange_json(x) for x in rows.exchanges
                                  if x.vhost in vis and (vhost is None or x.vhost == vhost)])

    async def _find_exchange(self, p: Principal, vhost: str,
                             name: str) -> tuple[MExchange, Management]:
        self._need_vhost(p, vhost)
        rows = await self._rows()
        key = "" if name == "amq.default" else name
        for x in rows.exchanges:
            if x.vhost == vhost and x.name == key:
                return x, rows
        raise not_found()

    async def exchange(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        x, rows = await self._find_exchange(p, params["vhost"], params["name"])
        out = exchange_json(x)
        out["incoming"] = []
        out["outgoing"] = []
        return json_response(out)

    async def exchange_put(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost, name = params["vhost"], params["name"]
        body = _obj(req.json())
        if vhost not in self._model().vhosts:
            raise HttpError(404, "not_found", "vhost_not_found")
        self._need_vhost(p, vhost)
        xtype = body.get("type")
        if not isinstance(xtype, str) or not xtype:
            raise bad_request("exchange type is required")
        durable = _bool(body, "durable", True)
        auto_delete = _bool(body, "auto_delete", False)
        internal = _bool(body, "internal", False)
        args = _args(body)
        rows = await self._rows()
        existed = any(x.vhost == vhost and x.name == name for x in rows.exchanges)

        async def declare(s: Any) -> Any:
            return await s.call("Exchange.Declare", {
                "exchange": name, "exchange_type": xtype, "durable": durable,
                "auto_delete": auto_delete, "internal": internal, "passive": False,
                "nowait": False, "arguments": args}, ("Exchange.DeclareOk",))
        await self._session_do(p, vhost, declare)
        return Response(204 if existed else 201)

    async def exchange_delete(self, req: Request, params: dict[str, str],
                              p: Principal) -> Response:
        vhost, name = params["vhost"], params["name"]
        await self._find_exchange(p, vhost, name)
        if_unused = req.query.get("if-unused") == "true"

        async def delete(s: Any) -> Any:
            return await s.call("Exchange.Delete", {"exchange": name, "if_unused": if_unused,
                                                    "nowait": False}, ("Exchange.DeleteOk",))
        await self._session_do(p, vhost, delete)
        return Response(204)

    async def publish(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost, name = params["vhost"], params["name"]
        body = _obj(req.json())
        await self._find_exchange(p, vhost, name)
        for key in ("routing_key", "payload", "payload_encoding"):
            if key not in body:
                raise bad_request(f"{key} is missing")
        props = body.get("properties") or {}
        if not isinstance(props, dict):
            raise bad_request("properties must be an object")
        payload = body["payload"]
        if not isinstance(payload, str) or not isinstance(body["routing_key"], str):
            raise bad_request("payload and routing_key must be strings")
        if body["payload_encoding"] == "string":
            data = payload.encode("utf-8")
        elif body["payload_encoding"] == "base64":
            try:
                data = base64.b64decode(payload, validate=True)
            except ValueError:
                raise bad_request("payload is not base64") from None
        else:
            raise bad_request("payload_encoding must be string or base64")
        amqp_props = _amqp_props(props)
        exchange = "" if name == "amq.default" else name
        rk = body["routing_key"]

        async def pub(s: Any) -> bool:
            return bool(await s.publish(exchange, rk, amqp_props, data))
        routed = await self._session_do(p, vhost, pub)
        return json_response({"routed": routed})

    async def exchange_source(self, _r: Request, params: dict[str, str],
                              p: Principal) -> Response:
        x, rows = await self._find_exchange(p, params["vhost"], params["name"])
        return json_response([binding_json(b) for b in all_bindings(rows)
                              if b.vhost == x.vhost and b.source == x.name])

    async def exchange_dest(self, _r: Request, params: dict[str, str],
                            p: Principal) -> Response:
        x, rows = await self._find_exchange(p, params["vhost"], params["name"])
        return json_response([binding_json(b) for b in rows.bindings
                              if b.vhost == x.vhost and b.destination_type == "exchange"
                              and b.destination == x.name])

    # ------------------------------------------------------------- bindings
    async def bindings(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost = params.get("vhost")
        if vhost is not None:
            self._need_vhost(p, vhost)
        vis = self._vhosts_for(p)
        rows = await self._rows()
        return self._filter(req, [binding_json(b) for b in all_bindings(rows)
                                  if b.vhost in vis and (vhost is None or b.vhost == vhost)])

    def _matching(self, rows: Management, vhost: str, source: str, kind: str,
                  dest: str) -> list[MBinding]:
        dtype = "queue" if kind == "q" else "exchange"
        return [b for b in all_bindings(rows) if b.vhost == vhost and b.source == source
                and b.destination_type == dtype and b.destination == dest]

    async def _binding_ends(self, p: Principal, params: dict[str, str], kind: str) -> Management:
        vhost = params["vhost"]
        self._need_vhost(p, vhost)
        rows = await self._rows()
        src = "" if params["source"] == "amq.default" else params["source"]
        if not any(x.vhost == vhost and x.name == src for x in rows.exchanges):
            raise not_found()
        if kind == "q":
            found = any(q.vhost == vhost and q.name == params["dest"] for q in rows.queues)
        else:
            found = any(x.vhost == vhost and x.name == params["dest"] for x in rows.exchanges)
        if not found:
            raise not_found()
        return rows

    def _binding_list(self, kind: str) -> Route:
        async def handler(_r: Request, params: dict[str, str], p: Principal) -> Response:
            rows = await self._binding_ends(p, params, kind)
            return json_response([binding_json(b) for b in self._matching(
                rows, params["vhost"], params["source"], kind, params["dest"])])
        return handler

    def _binding_get(self, kind: str) -> Route:
        async def handler(_r: Request, params: dict[str, str], p: Principal) -> Response:
            rows = await self._binding_ends(p, params, kind)
            for b in self._matching(rows, params["vhost"], params["source"], kind,
                                    params["dest"]):
                if properties_key(b.routing_key, b.arguments) == quote(params["props"], safe="~") \
                        or properties_key(b.routing_key, b.arguments) == params["props"]:
                    return json_response(binding_json(b))
            raise not_found()
        return handler

    def _binding_post(self, kind: str) -> Route:
        async def handler(req: Request, params: dict[str, str], p: Principal) -> Response:
            body = _obj(req.json())
            vhost, source, dest = params["vhost"], params["source"], params["dest"]
            if vhost not in self._model().vhosts:
                raise HttpError(404, "not_found", "vhost_not_found")
            self._need_vhost(p, vhost)
            rk = body.get("routing_key", "")
            if not isinstance(rk, str):
                raise bad_request("routing_key must be a string")
            args = _args(body)

            async def bind(s: Any) -> Any:
                if kind == "q":
                    return await s.call("Queue.Bind", {
                        "queue": dest, "exchange": source, "routing_key": rk, "nowait": False,
                        "arguments": args}, ("Queue.BindOk",))
                return await s.call("Exchange.Bind", {
                    "destination": dest, "source": source, "routing_key": rk, "nowait": False,
                    "arguments": args}, ("Exchange.BindOk",))
            await self._session_do(p, vhost, bind)
            resp = Response(201)
            resp.headers["Location"] = f"{quote(dest, safe='')}/{properties_key(rk, args)}"
            return resp
        return handler

    def _binding_delete(self, kind: str) -> Route:
        async def handler(_r: Request, params: dict[str, str], p: Principal) -> Response:
            rows = await self._binding_ends(p, params, kind)
            vhost, source, dest = params["vhost"], params["source"], params["dest"]
            found = None
            for b in self._matching(rows, vhost, source, kind, dest):
                key = properties_key(b.routing_key, b.arguments)
                if key in (params["props"], quote(params["props"], safe="~")):
                    found = b
            if found is None or not found.source:
                raise not_found()
            b = found

            async def unbind(s: Any) -> Any:
                if kind == "q":
                    return await s.call("Queue.Unbind", {
                        "queue": dest, "exchange": source, "routing_key": b.routing_key,
                        "arguments": dict(b.arguments)}, ("Queue.UnbindOk",))
                return await s.call("Exchange.Unbind", {
                    "destination": dest, "source": source, "routing_key": b.routing_key,
                    "nowait": False, "arguments": dict(b.arguments)}, ("Exchange.UnbindOk",))
            await self._session_do(p, vhost, unbind)
            return Response(204)
        return handler

    # ------------------------------------------------------------- connections, channels
    def _conn_rows(self, rows: Management, p: Principal,
                   vhost: str | None = None) -> list[dict[str, Any]]:
        locals_ = self.b.local_connections()
        vis = self._vhosts_for(p)
        out = []
        for c in rows.connections:
            local = locals_.get((c.node, c.serial))
            row = connection_json(c, local)
            if row["vhost"] not in vis or (vhost is not None and row["vhost"] != vhost):
                continue
            if not p.monitor and local is not None and local.user != p.name:
                continue
            out.append(row)
        return out

    async def connections(self, req: Request, _p: dict[str, str], p: Principal) -> Response:
        return self._filter(req, self._conn_rows(await self._rows(), p))

    async def vhost_connections(self, req: Request, params: dict[str, str],
                                p: Principal) -> Response:
        self._need_vhost(p, params["vhost"])
        return self._filter(req, self._conn_rows(await self._rows(), p, params["vhost"]))

    async def connection(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        for row in self._conn_rows(await self._rows(), p):
            if row["name"] == params["name"]:
                return json_response(row)
        raise not_found()

    async def connection_channels(self, req: Request, params: dict[str, str],
                                  p: Principal) -> Response:
        rows = await self._rows()
        if not any(r["name"] == params["name"] for r in self._conn_rows(rows, p)):
            raise not_found()
        return self._filter(req, [c for c in self._chan_rows(rows, p)
                                  if c["connection_details"]["name"] == params["name"]])

    async def connection_delete(self, req: Request, params: dict[str, str],
                                p: Principal) -> Response:
        rows = await self._rows()
        row = next((r for r in self._conn_rows(rows, p) if r["name"] == params["name"]), None)
        if row is None:
            raise not_found()
        if not p.administrator and row.get("user") != p.name:
            raise HttpError(403, "not_authorised", "Not administrator user")
        node = row["node"]
        if node != self.b.node_id:
            raise HttpError(400, "bad_request", f"connection {params['name']} is on node "
                                                f"{node}: ask that node's management API")
        reason = req.headers.get("x-reason", "Closed via management plugin")
        serial = int(params["name"].rpartition(".")[2])
        if not await self.b.close_connection(serial, reason):
            raise not_found()
        return Response(204)

    def _chan_rows(self, rows: Management, p: Principal,
                   vhost: str | None = None) -> list[dict[str, Any]]:
        locals_ = self.b.local_connections()
        vis = self._vhosts_for(p)
        out = []
        for ch in rows.channels:
            if ch.vhost not in vis or (vhost is not None and ch.vhost != vhost):
                continue
            local = locals_.get((ch.node, ch.conn))
            if not p.monitor and local is not None and local.user != p.name:
                continue
            out.append(channel_json(ch, local))
        return out

    async def channels(self, req: Request, _p: dict[str, str], p: Principal) -> Response:
        return self._filter(req, self._chan_rows(await self._rows(), p))

    async def vhost_channels(self, req: Request, params: dict[str, str],
                             p: Principal) -> Response:
        self._need_vhost(p, params["vhost"])
        return self._filter(req, self._chan_rows(await self._rows(), p, params["vhost"]))

    async def consumers(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost = params.get("vhost")
        if vhost is not None:
            self._need_vhost(p, vhost)
        vis = self._vhosts_for(p)
        rows = await self._rows()
        locals_ = self.b.local_connections()
        numbers = {(c.node, c.conn, c.serial): c.number for c in rows.channels}
        out = [consumer_json(c, numbers.get((c.node, c.conn, c.chan_serial), 0),
                             locals_.get((c.node, c.conn)))
               for c in rows.consumers if c.vhost in vis and (vhost is None or c.vhost == vhost)]
        return self._filter(req, out)

    # ------------------------------------------------------------- vhosts, users, permissions
    async def vhosts(self, req: Request, _p: dict[str, str], p: Principal) -> Response:
        rows = await self._rows()
        vis = self._vhosts_for(p)
        nodes = self._nodes()
        return self._filter(req, [vhost_json(v, rows.queues, nodes)
                                  for v in self._model().vhosts if v in vis])

    async def vhost(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        self._need_vhost(p, params["vhost"])
        rows = await self._rows()
        return json_response(vhost_json(params["vhost"], rows.queues, self._nodes()))

    async def vhost_put(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        _obj(req.json())
        name = params["vhost"]
        existed = name in self._model().vhosts
        try:
            await self.b.administrator.put_vhost(name)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        return Response(204 if existed else 201)

    async def vhost_delete(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        try:
            await self.b.administrator.delete_vhost(params["vhost"])
        except KeyError:
            raise not_found() from None
        return Response(204)

    async def vhost_permissions(self, _r: Request, params: dict[str, str],
                                p: Principal) -> Response:
        require_admin(p)
        m = self._model()
        if params["vhost"] not in m.vhosts:
            raise not_found()
        return json_response([permission_json(u, v, perm) for (u, v), perm
                              in m.permissions.items() if v == params["vhost"]])

    async def users(self, req: Request, _p: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        return self._filter(req, [user_json(n, e) for n, e in self._model().users.items()])

    async def users_without_permissions(self, _r: Request, _p: dict[str, str],
                                        p: Principal) -> Response:
        require_admin(p)
        m = self._model()
        having = {u for (u, _v) in m.permissions}
        return json_response([user_json(n, e) for n, e in m.users.items() if n not in having])

    async def user(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        entry = self._model().users.get(params["user"])
        if entry is None:
            raise not_found()
        return json_response(user_json(params["user"], entry))

    async def user_put(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        body = _obj(req.json())
        name = params["user"]
        existed = name in self._model().users
        tags = parse_tags(body.get("tags", ""))
        admin = self.b.administrator
        if "password" in body:
            if not isinstance(body["password"], str):
                raise bad_request("password must be a string")
            await admin.put_user(name, body["password"], tags)
        elif "password_hash" in body:
            algo = body.get("hashing_algorithm", HASHING)
            if algo != HASHING:
                raise bad_request(f"unsupported hashing_algorithm {algo!r} (only {HASHING})")
            if not isinstance(body["password_hash"], str):
                raise bad_request("password_hash must be a string")
            try:
                await admin.put_user_hash(name, body["password_hash"], tags)
            except ValueError as exc:
                raise bad_request(str(exc)) from None
        else:
            raise bad_request("password or password_hash is required")
        return Response(204 if existed else 201)

    async def user_delete(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        try:
            await self.b.administrator.delete_user(params["user"])
        except KeyError:
            raise not_found() from None
        return Response(204)

    async def user_permissions(self, _r: Request, params: dict[str, str],
                               p: Principal) -> Response:
        require_admin(p)
        m = self._model()
        if params["user"] not in m.users:
            raise not_found()
        return json_response([permission_json(u, v, perm) for (u, v), perm
                              in m.permissions.items() if u == params["user"]])

    async def permissions(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        return json_response([permission_json(u, v, perm) for (u, v), perm
                              in self._model().permissions.items()])

    async def permission(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        perm = self._model().permissions.get((params["user"], params["vhost"]))
        if perm is None:
            raise not_found()
        return json_response(permission_json(params["user"], params["vhost"], perm))

    async def permission_put(self, req: Request, params: dict[str, str],
                             p: Principal) -> Response:
        require_admin(p)
        body = _obj(req.json())
        user, vhost = params["user"], params["vhost"]
        m = self._model()
        if vhost not in m.vhosts:
            raise HttpError(404, "not_found", "vhost_not_found")
        if user not in m.users:
            raise HttpError(404, "not_found", "user_not_found")
        pats = []
        for key in ("configure", "write", "read"):
            value = body.get(key)
            if not isinstance(value, str):
                raise bad_request(f"{key} is required (a regular expression)")
            pats.append(value)
        existed = (user, vhost) in m.permissions
        try:
            await self.b.administrator.set_permissions(user, vhost, *pats)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        except KeyError:
            raise not_found() from None
        return Response(204 if existed else 201)

    async def permission_delete(self, _r: Request, params: dict[str, str],
                                p: Principal) -> Response:
        require_admin(p)
        try:
            await self.b.administrator.clear_permissions(params["user"], params["vhost"])
        except KeyError:
            raise not_found() from None
        return Response(204)

    # ------------------------------------------------------------- definitions
    async def definitions_get(self, _r: Request, params: dict[str, str],
                              p: Principal) -> Response:
        require_admin(p)
        m = self._model()
        rows = await self._rows()
        vhost = params.get("vhost")
        if vhost is not None:
            if vhost not in m.vhosts:
                raise not_found()
            rows = rows._replace(queues=tuple(q for q in rows.queues if q.vhost == vhost),
                                 exchanges=tuple(x for x in rows.exchanges if x.vhost == vhost),
                                 bindings=tuple(b for b in rows.bindings if b.vhost == vhost))
            d = definitions({}, [], {}, rows, self.b.product_version)
            for key in ("users", "vhosts", "permissions", "topic_permissions",
                        "global_parameters"):
                d.pop(key, None)
            for section in ("queues", "exchanges", "bindings"):
                for item in d[section]:
                    item.pop("vhost", None)
            return json_response(d)
        return json_response(definitions(m.users, list(m.vhosts), m.permissions, rows,
                                         self.b.product_version))

    async def definitions_post(self, req: Request, _p: dict[str, str],
                               p: Principal) -> Response:
        require_admin(p)
        body = req.json()
        if req.headers.get("content-type", "").startswith("multipart/form-data"):
            raise HttpError(415, "bad_request", "send the definitions as application/json")
        d = _obj(body)
        await self.import_definitions(d, p)
        return Response(204)

    async def import_definitions(self, d: dict[str, Any], p: Principal) -> None:
        """RabbitMQ's import order: users, vhosts, permissions, exchanges,
        queues, bindings. The first failure answers 400 with its reason."""
        admin = self.b.administrator

        def items(key: str) -> list[dict[str, Any]]:
            value = d.get(key) or []
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise bad_request(f"{key} must be a list of objects")
            return value
        for u in items("users"):
            name = u.get("name")
            if not isinstance(name, str) or not name:
                raise bad_request("a user needs a name")
            tags = parse_tags(u.get("tags", ""))
            algo = u.get("hashing_algorithm", HASHING)
            if "password_hash" in u:
                if algo != HASHING:
                    raise bad_request(f"user {name}: unsupported hashing_algorithm {algo!r}")
                try:
                    await admin.put_user_hash(name, str(u["password_hash"]), tags)
                except ValueError as exc:
                    raise bad_request(f"user {name}: {exc}") from None
            elif "password" in u:
                await admin.put_user(name, str(u["password"]), tags)
            else:
                raise bad_request(f"user {name}: password_hash or password is required")
        for v in items("vhosts"):
            name = v.get("name")
            if not isinstance(name, str):
                raise bad_request("a vhost needs a name")
            try:
                await admin.put_vhost(name)
            except ValueError as exc:
                raise bad_request(str(exc)) from None
        for perm in items("permissions"):
            try:
                await admin.set_permissions(str(perm["user"]), str(perm["vhost"]),
                                            str(perm["configure"]), str(perm["write"]),
                                            str(perm["read"]))
            except (KeyError, ValueError) as exc:
                raise bad_request(f"permission {perm}: {exc}") from None
        token_p = Principal(p.name, p.tags, token=True)  # an administrator imports everything
        by_vhost: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for kind in ("exchanges", "queues", "bindings"):
            for item in items(kind):
                vhost = item.get("vhost", "/")
                if vhost not in self._model().vhosts:
                    raise bad_request(f"{kind[:-1]} {item.get('name', '')}: vhost {vhost} "
                                      "does not exist")
                by_vhost.setdefault(str(vhost), []).append((kind, item))
        for vhost, todo in by_vhost.items():
            async def run(s: Any, todo: list[tuple[str, dict[str, Any]]] = todo) -> None:
                for kind, item in todo:
                    await _declare_item(s, kind, item)
            await self._session_do(token_p, vhost, run)

    # ------------------------------------------------------------- health
    async def health_alarms(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        alarms = self.b.alarms()
        if alarms:
            return Response(503, json.dumps({
                "status": "failed", "reason": "resource alarm(s) in effect",
                "alarms": [{"node": self.b.node_id, "resource": a} for a in alarms]}).encode())
        return json_response({"status": "ok"})

    async def health_quorum(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        st = self.b.status()
        why = quorum_critical(st)
        if why is not None:
            return Response(503, json.dumps({"status": "failed", "reason": why}).encode())
        if len(st.get("members") or []) <= 1:
            return json_response({"status": "ok", "reason": "single node cluster"})
        return json_response({"status": "ok"})

    async def health_vhosts(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        return json_response({"status": "ok"})

    async def aliveness(self, _r: Request, params: dict[str, str], p: Principal) -> Response:
        vhost = params["vhost"]
        self._need_vhost(p, vhost)

        async def check(s: Any) -> None:
            await s.call("Queue.Declare", {"queue": "aliveness-test", "durable": False,
                                           "exclusive": False, "auto_delete": False,
                                           "passive": False, "nowait": False, "arguments": {}},
                         ("Queue.DeclareOk",))
            await s.publish("", "aliveness-test", {}, b"test_message")
            msg = await s.get("aliveness-test", True)
            if msg is None:
                raise HttpError(503, "failed", "aliveness-test: message not received")
        await self._session_do(Principal(p.name, p.tags, token=p.monitor), vhost, check)
        return json_response({"status": "ok"})

    # ------------------------------------------------------------- mirrorq
    async def mirrorq_cluster(self, _r: Request, _p: dict[str, str], p: Principal) -> Response:
        return json_response(self._cluster(self.b.status()))

    async def member_add(self, req: Request, params: dict[str, str], p: Principal) -> Response:
        require_admin(p)
        body = _obj(req.json())
        address = body.get("address")
        if not isinstance(address, str) or ":" not in address:
            raise bad_request("address (HOST:RAFTPORT) is required")
        try:
            await self.b.administrator.add_member(params["name"], address)
        except (RuntimeError, ValueError) as exc:
            raise HttpError(409, "conflict", str(exc)) from None
        except TimeoutError as exc:
            raise HttpError(503, "service_unavailable", str(exc) or "timed out") from None
        return Response(201)

    async def member_remove(self, _r: Request, params: dict[str, str],
                            p: Principal) -> Response:
        require_admin(p)
        try:
            await self.b.administrator.remove_member(params["name"])
        except KeyError:
            raise not_found() from None
        except (RuntimeError, ValueError) as exc:
            raise HttpError(409, "conflict", str(exc)) from None
        except TimeoutError as exc:
            raise HttpError(503, "service_unavailable", str(exc) or "timed out") from None
        return Response(204)


_STARTED = time.monotonic()


def _process_stats() -> dict[str, int]:
    """This process as RabbitMQ reports its node (Linux /proc; what cannot be
    read is left out): mem_used (resident set size, bytes), fd_used/fd_total,
    sockets_used (the open fds that are sockets; sockets_total = fd_total, the
    only bound), proc_used/proc_total (OS threads here, Erlang processes in
    RabbitMQ; the bound is the kernel's threads-max)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/statm") as f:
            out["mem_used"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        fds = os.listdir("/proc/self/fd")
        sockets = 0
        for fd in fds:
            try:
                sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:  # closed meanwhile (the listing's own fd)
                pass
        total = int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        out.update({"fd_used": len(fds), "fd_total": total,
                    "sockets_used": sockets, "sockets_total": total})
    except (OSError, ImportError, ValueError):
        pass
    try:
        out["proc_used"] = len(os.listdir("/proc/self/task"))
        with open("/proc/sys/kernel/threads-max") as f:
            out["proc_total"] = int(f.read())
    except (OSError, ValueError):
        pass
    return out


def _encode(path: str, fields: dict[str, Any]) -> bytes:
    from node.amqp import frame
    return frame.encode_method(1, path, fields)


_PROP_KEYS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
              "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
              "user_id", "app_id")


def _amqp_props(props: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in props.items():
        if key not in _PROP_KEYS:
            raise bad_request(f"unknown property {key!r}")
        if key in ("delivery_mode", "priority", "timestamp"):
            if isinstance(value, str) and value.isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad_request(f"{key} must be an integer")
        elif key == "headers":
            if not isinstance(value, dict):
                raise bad_request("headers must be an object")
        elif not isinstance(value, str):
            raise bad_request(f"{key} must be a string")
        out[key] = value
    return out


def _message_json(msg: Any, encoding: str, truncate: int | None) -> dict[str, Any]:
    body = bytes(msg.body)
    size = len(body)
    if truncate is not None:
        body = body[:truncate]
    payload_encoding = "base64"
    if encoding == "auto":
        try:
            text = body.decode("utf-8")
            payload_encoding = "string"
        except UnicodeDecodeError:
            text = base64.b64encode(body).decode()
    else:
        text = base64.b64encode(body).decode()
    m = msg.method
    props = {k: _plain_json(v) for k, v in msg.props.items()}
    return {"payload_bytes": size, "redelivered": bool(m.redelivered), "exchange": m.exchange,
            "routing_key": m.routing_key, "message_count": int(m.message_count),
            "properties": props if props else [], "payload": text,
            "payload_encoding": payload_encoding}


async def _declare_item(s: Any, kind: str, item: Mapping[str, Any]) -> None:
    args = item.get("arguments") or {}
    if kind == "exchanges":
        await s.call("Exchange.Declare", {
            "exchange": str(item["name"]), "exchange_type": str(item.get("type", "direct")),
            "durable": bool(item.get("durable", True)),
            "auto_delete": bool(item.get("auto_delete", False)),
            "internal": bool(item.get("internal", False)), "passive": False, "nowait": False,
            "arguments": args}, ("Exchange.DeclareOk",))
    elif kind == "queues":
        await s.call("Queue.Declare", {
            "queue": str(item["name"]), "durable": bool(item.get("durable", True)),
            "auto_delete": bool(item.get("auto_delete", False)), "exclusive": False,
            "passive": False, "nowait": False, "arguments": args}, ("Queue.DeclareOk",))
    else:
        rk = str(item.get("routing_key", ""))
        if item.get("destination_type", "queue") == "queue":
            await s.call("Queue.Bind", {"queue": str(item["destination"]),
                                        "exchange": str(item["source"]), "routing_key": rk,
                                        "nowait": False, "arguments": args}, ("Queue.BindOk",))
        else:
            await s.call("Exchange.Bind", {"destination": str(item["destination"]),
                                           "source": str(item["source"]), "routing_key": rk,
                                           "nowait": False, "arguments": args},
                         ("Exchange.BindOk",))


def make_app(backend: Backend, static_dir: Path | None = STATIC_DIR) -> ManagementApi:
    return ManagementApi(backend, static_dir)
