"""RabbitMQ 4.x's fine-grained health checks as pure decisions: each takes
what the node reports (its listeners, status figures, connection counts)
and returns the HTTP status and body RabbitMQ answers (200 {"status": "ok"}
or 503 {"status": "failed", "reason": ...}); resources/health.py serves them."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Check = tuple[int, dict[str, Any]]
FAILED = 503  # RabbitMQ's ?HEALTH_CHECK_FAILURE_STATUS
OK: Check = (200, {"status": "ok"})

# RabbitMQ's protocol-listener aliases (rabbit_mgmt_wm_health_check_protocol_listener)
# for the protocols a mirrorq node listens on; others are asked as written
PROTOCOL_ALIASES = {
    "amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqp0_9_1": "amqp",
    "amqp10": "amqp", "amqp1.0": "amqp", "amqp1-0": "amqp", "amqp1_0": "amqp",
    "amqps": "amqp/ssl", "management": "http", "management/ssl": "https",
    "http/management": "http", "https/management": "https", "http/prometheus": "http",
}


def failed(reason: str, **extra: Any) -> Check:
    return FAILED, {"status": "failed", "reason": reason, **extra}


def port_listener(port: int, listeners: Sequence[Mapping[str, Any]]) -> Check:
    """Is something of this node listening on `port`? (any protocol)"""
    ports = sorted({int(x["port"]) for x in listeners})
    if port in ports:
        return 200, {"status": "ok", "port": port}
    return failed("No active listener", missing=port, ports=ports)


def normalize_protocol(name: str) -> str:
    low = name.strip().lower()
    return PROTOCOL_ALIASES.get(low, low)


def protocol_listener(asked: str, listeners: Sequence[Mapping[str, Any]]) -> Check:
    """Does this node listen on every protocol of the comma-separated list?"""
    active = sorted({str(x["protocol"]) for x in listeners})
    missing = sorted({normalize_protocol(p) for p in asked.split(",") if p.strip()} - set(active))
    if missing:
        return failed("No active listener", missing=missing, protocols=active)
    return 200, {"status": "ok", "protocols": active}


def serving(has_quorum: bool, leader: str | None) -> bool:
    """A node serves clients while it sees a leader in a majority: cut off in
    a minority it refuses declares and publishes (docs/operations.md)."""
    return has_quorum and leader is not None


def is_in_service(has_quorum: bool, leader: str | None) -> Check:
    if serving(has_quorum, leader):
        return OK
    return failed("this rabbit node is not currently available to serve")


def below_connection_limit(opened: int, limit: int) -> Check:
    """limit 0: none (RabbitMQ's connection_max infinity)."""
    if limit and opened >= limit:
        return failed("node connection limit is reached")
    return OK


def ready_to_serve_clients(has_quorum: bool, leader: str | None,
                           listeners: Sequence[Mapping[str, Any]],
                           opened: int, limit: int) -> Check:
    """In service, an AMQP(S) listener, and room for one more connection."""
    if not serving(has_quorum, leader):
        return failed("the rabbit node is not currently available to serve")
    if not any(x["protocol"] in ("amqp", "amqp/ssl") for x in listeners):
        return failed("no active listeners for AMQP/AMQPS")
    if limit and opened >= limit:
        return failed("node connection limit is reached", connections=opened)
    return OK


def metadata_store_initialized(last_applied: int | None) -> Check:
    """The replicated state is the metadata store: initialized once this node
    applied the log's first entry (its own start or a leader's snapshot)."""
    if last_applied:
        return OK
    return failed("Metadata store has not yet reported as initialized")


def metadata_store_with_data(last_applied: int | None, vhosts: int) -> Check:
    """Initialized and holding at least one vhost (a cluster has one)."""
    if last_applied and vhosts > 0:
        return OK
    return failed("Metadata store has not yet been initialized: it reports to have no "
                  "virtual hosts")


def quorum_queues_without_leader(is_serving: bool,
                                 queues: Sequence[tuple[str, str]]) -> Check:
    """RabbitMQ asks each matching quorum queue's Raft leader; every mirrorq
    queue lives in the one Raft group, so they all have this node's view of
    its leader: none of `queues` (vhost, name) has one unless it is serving."""
    if is_serving or not queues:
        return OK
    return failed("Detected quorum queues without an elected leader", queues=[
        {"readable_name": f"queue '{name}' in vhost '{vhost}'", "name": name,
         "virtual_host": vhost, "type": "rabbit_quorum_queue"} for vhost, name in queues])
