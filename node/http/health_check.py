"""RabbitMQ 4.x's fine-grained health checks as pure decisions: each takes
what the node reports (its listeners, status figures, connection counts)
and returns the HTTP status and body RabbitMQ answers (200 {"status": "ok"}
or 503 {"status": "failed", "reason": ...}); resources/health.py serves them."""
from __future__ import annotations

import re
import time
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


# rabbit_mgmt_wm_health_check_certificate_expiration: a month is 365/12 days
DAY = 86400
PERIOD_UNITS = {"days": DAY, "weeks": 7 * DAY, "months": DAY * 365 / 12, "years": 365 * DAY}
BAD_WITHIN = "Invalid expiration value."
BAD_UNIT = "Time unit not recognised. Supported units: days, weeks, months, years."


def period_seconds(within: str, unit: str) -> float:
    """`{within}/{unit}` as seconds, or ValueError with RabbitMQ's 400 reason
    (Erlang's binary_to_integer first: a bad value wins over a bad unit)."""
    if re.fullmatch(r"[+-]?[0-9]+", within) is None:
        raise ValueError(BAD_WITHIN)
    seconds = PERIOD_UNITS.get(unit.lower())
    if seconds is None:
        raise ValueError(BAD_UNIT)
    return int(within) * seconds


def expiry_text(when: float) -> str:
    """Seconds since the epoch as RabbitMQ writes a date (UTC; its hour is not
    zero-padded: "~w-~2.2.0w-~2.2.0w ~w:~2.2.0w:~2.2.0w")."""
    t = time.gmtime(when)
    return f"{t.tm_year}-{t.tm_mon:02}-{t.tm_mday:02} {t.tm_hour}:{t.tm_min:02}:{t.tm_sec:02}"


def expiring(validity: Sequence[float | str] | None, deadline: float) -> list[str]:
    """A file's entries that fail the check: expiring before `deadline`
    (each as its date) or unusable (the reason); None: no such file."""
    if validity is None:
        return []
    return [v if isinstance(v, str) else expiry_text(v)
            for v in validity if isinstance(v, str) or v < deadline]


def certificate_expiration(listeners: Sequence[Mapping[str, Any]], now: float,
                           within: float) -> Check:
    """Every TLS listener's certificate file and CA file (each listener with
    `certfile_validity` / `cacertfile_validity`: per PEM entry its notAfter in
    seconds since the epoch or why it is unusable; None: no such file). A
    listener fails if an entry expires within `within` seconds from `now`."""
    deadline = now + within
    out = []
    for x in listeners:
        cert = expiring(x.get("certfile_validity"), deadline)
        ca = expiring(x.get("cacertfile_validity"), deadline)
        if cert or ca:
            out.append({"node": x.get("node"), "protocol": x["protocol"],
                        "interface": x["ip_address"], "port": x["port"],
                        "certfile": x.get("certfile"), "cacertfile": x.get("cacertfile"),
                        "certfile_expires_on": cert, "cacertfile_expires_on": ca})
    if out:
        return failed("Certificates expiring", expired=out)
    return OK


def reached_target_cluster_size(online: int, target: int) -> Check:
    """RabbitMQ's rabbit_mgmt_wm_health_check_reached_target_cluster_size:
    are at least `target` members ([http] target_cluster_size_hint) online
    (this node and the members it is linked to)?"""
    if online >= target:
        return OK
    return failed(f"target cluster size not reached: {online} of {target} nodes are online",
                  online=online, target=target)
