"""The management API's JSON: pure builders that turn the immutable
management rows (node/replication/read_model.py, built on the raft thread
from the replicated state, so every node answers the same) into RabbitMQ
3.10's shapes (the figures it has; no memory/GC internals). Unit-testable
without sockets."""
from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from node.broker.parameter import exported
from node.replication.read_model import (
    Management,
    MBinding,
    MChannel,
    MConnection,
    MConsumer,
    MExchange,
    MQueue,
)

if TYPE_CHECKING:
    from node.http.backend import LocalConnection


RABBIT_VERSION = "3.10.8"  # the management API version whose shapes these are
HASHING = "rabbit_password_hashing_sha256"
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


def rate(value: float) -> dict[str, float]:
    return {"rate": round(float(value), 1)}


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


def queue_json(q: MQueue, rates: tuple[float, ...] | None = None,
               counted: tuple[int, ...] | None = None) -> dict[str, Any]:
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
        "effective_policy_definition": plain_json(dict(q.effective_policy_definition)),
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
        "operator_policy": q.operator_policy,
        "policy": q.policy,
        "recoverable_slaves": None,
        "single_active_consumer_tag": None,
        "state": "running",
        "type": qtype if qtype in ("classic", "quorum") else "classic",
        "vhost": q.vhost,
    }
    if qtype == "quorum":
        # RabbitMQ 4.x: a quorum queue's dead-lettered messages not yet taken
        # by their targets (at-least-once) count in messages and message_bytes
        n, b = q.dlx or 0, q.dlx_bytes
        out["messages_dlx"] = n
        out["message_bytes_dlx"] = b
        out["messages"] += n
        out["message_bytes"] += b
    if q.owner is not None:
        out["owner_pid_details"] = {"name": conn_name(*q.owner)}
    stats = q.stats if counted is None else counted  # since a reset (RateSampler.counted)
    if any(stats):
        out["message_stats"] = message_stats(stats, rates or (0.0,) * 4)
    return out


def exchange_json(x: MExchange) -> dict[str, Any]:
    return {"arguments": dict(x.arguments), "auto_delete": x.auto_delete, "durable": x.durable,
            "internal": x.internal, "name": x.name, "type": x.type,
            "user_who_performed_action": "rmq-internal", "vhost": x.vhost, "policy": x.policy}


def plain_json(value: Any) -> Any:
    """A field-table value as JSON can carry it, as RabbitMQ renders it (bytes,
    `x` included, as text; numbers of every wire type, decimals and timestamps
    as numbers)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):  # an x-death time of an older build
        return int(value.timestamp())
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v) for v in value]
    return value


def properties_key(routing_key: str, arguments: Mapping[str, Any]) -> str:
    """RabbitMQ's binding identity in URLs: the routing key, "~" when empty;
    with arguments, key "~" and a hash of them."""
    base = quote(routing_key, safe="") if routing_key else "~"
    if not arguments:
        return base
    digest = hashlib.sha256(json.dumps(plain_json(arguments), sort_keys=True).encode()).digest()
    return f"{quote(routing_key, safe='')}~{base64.urlsafe_b64encode(digest[:9]).decode()}"


def binding_json(b: MBinding) -> dict[str, Any]:
    return {"source": b.source, "vhost": b.vhost, "destination": b.destination,
            "destination_type": b.destination_type, "routing_key": b.routing_key,
            "arguments": plain_json(b.arguments),
            "properties_key": properties_key(b.routing_key, b.arguments)}


def all_bindings(m: Management) -> list[MBinding]:
    """Explicit bindings plus the default exchange's implicit one per queue
    (RabbitMQ lists them)."""
    out = [MBinding(q.vhost, "", q.name, "queue", q.name, {}) for q in m.queues]
    out.extend(m.bindings)
    return out


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
                    "client_properties": plain_json(local.client_properties),
                    "ssl": local.tls, "timeout": local.heartbeat, "frame_max": local.frame_max,
                    "channel_max": local.channel_max,
                    "connected_at": int(local.connected_at * 1000),
                    "held_bytes": local.held_bytes,
                    "state": "blocked" if local.blocked else "running"})
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


def vhost_metadata(name: str, protected: bool) -> dict[str, Any]:
    """A vhost's `metadata` (RabbitMQ 4.x: protected_from_deletion is in it
    once protection was enabled)."""
    description = "Default virtual host" if name == "/" else ""
    out: dict[str, Any] = {"description": description, "tags": []}
    if protected:
        out["protected_from_deletion"] = True
    return out


def vhost_json(name: str, queues: Iterable[MQueue], nodes: Iterable[str],
               protected: bool = False) -> dict[str, Any]:
    ready = unacked = 0
    for q in queues:
        if q.vhost == name:
            ready += q.ready
            unacked += q.unacked
    metadata = vhost_metadata(name, protected)
    return {"name": name, "description": metadata["description"], "tags": [],
            "tracing": False, "default_queue_type": "undefined",
            "protected_from_deletion": protected, "metadata": metadata,
            "cluster_state": {n: "running" for n in nodes},
            "messages": ready + unacked, "messages_details": rate(0),
            "messages_ready": ready, "messages_ready_details": rate(0),
            "messages_unacknowledged": unacked, "messages_unacknowledged_details": rate(0)}


def definitions(users: Mapping[str, tuple[str, tuple[str, ...]]], vhosts: Iterable[str],
                permissions: Mapping[tuple[str, str], tuple[str, str, str]], m: Management,
                product_version: str, policies: Iterable[Any] = (),
                vhost_limits: Mapping[str, Mapping[str, int]] | None = None,
                user_limits: Mapping[str, Mapping[str, int]] | None = None,
                topic_permissions: Mapping[tuple[str, str, str], tuple[str, str]] | None = None,
                global_parameters: Mapping[str, Any] | None = None,
                protected_vhosts: Iterable[str] = (),
                ) -> dict[str, Any]:
    """RabbitMQ's definitions export: no amq.* or default exchanges, no
    exclusive queues, no implicit default-exchange bindings; `policies` (not
    operator policies: RabbitMQ exports only these); limits in the vhosts'
    and users' `limits`, topic permissions in `topic_permissions`; the set
    global parameters but internal ones (the cluster name once set: not the
    derived one), each vhost's `metadata` (protected_from_deletion in it)."""
    vl, ul, tp = vhost_limits or {}, user_limits or {}, topic_permissions or {}
    protected = set(protected_vhosts)
    return {
        "rabbit_version": RABBIT_VERSION, "rabbitmq_version": RABBIT_VERSION,
        "product_name": "mirrorq", "product_version": product_version,
        "users": [{"name": n, "password_hash": e[0], "hashing_algorithm": HASHING,
                   "tags": list(e[1]), "limits": dict(ul.get(n) or {})}
                  for n, e in users.items()],
        "vhosts": [{"name": v, "limits": dict(vl.get(v) or {}),
                    "metadata": vhost_metadata(v, v in protected)} for v in vhosts],
        "permissions": [permission_json(u, v, p) for (u, v), p in permissions.items()],
        "topic_permissions": [{"user": u, "vhost": v, "exchange": x, "write": p[0],
                               "read": p[1]} for (u, v, x), p in tp.items()],
        "parameters": [], "global_parameters": exported(global_parameters or {}),
        "policies": [{"vhost": p.vhost, "name": p.name, "pattern": p.pattern,
                      "apply-to": p.apply_to, "priority": p.priority,
                      "definition": dict(p.definition)} for p in policies],
        "queues": [{"name": q.name, "vhost": q.vhost, "durable": q.durable,
                    "auto_delete": q.auto_delete, "arguments": plain_json(q.arguments)}
                   for q in m.queues if not q.exclusive],
        "exchanges": [{"name": x.name, "vhost": x.vhost, "type": x.type, "durable": x.durable,
                       "auto_delete": x.auto_delete, "internal": x.internal,
                       "arguments": plain_json(x.arguments)}
                      for x in m.exchanges if x.name and not x.name.startswith("amq.")],
        "bindings": [{"source": b.source, "vhost": b.vhost, "destination": b.destination,
                      "destination_type": b.destination_type, "routing_key": b.routing_key,
                      "arguments": plain_json(b.arguments)} for b in m.bindings],
    }


def message_json(msg: Any, encoding: str, truncate: int | None) -> dict[str, Any]:
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
    props = {k: plain_json(v) for k, v in msg.props.items()}
    return {"payload_bytes": size, "redelivered": bool(m.redelivered), "exchange": m.exchange,
            "routing_key": m.routing_key, "message_count": int(m.message_count),
            "properties": props if props else [], "payload": text,
            "payload_encoding": payload_encoding}
