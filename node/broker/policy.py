"""Policies and operator policies as RabbitMQ has them (pure): validation of
a definition, which policy applies to a queue or exchange, the operator
policy merge and the effective queue settings (rabbit_policy,
rabbit_policies, rabbit_amqqueue_process / rabbit_quorum_queue's
args_policy_lookup).

A policy applies to the queues / exchanges of its vhost whose name its
pattern matches (anywhere: an unanchored search) and whose kind its
`apply-to` names; of those that match, the highest priority wins (ties: the
lower name, where RabbitMQ leaves the order to its table). A policy with a
key the queue's type does not support (delivery-limit on a classic queue)
does not apply to that queue at all, as in RabbitMQ's is_policy_applicable.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from node.broker.pattern import PatternError, compile_pattern, searches
from node.broker.vhost import split_key


class Policy(NamedTuple):
    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int | float
    definition: dict[str, Any]


APPLY_TO = ("all", "exchanges", "queues", "classic_queues", "quorum_queues", "streams")

# the keys an operator policy may set (rabbit_policies:register's operator validators)
OPERATOR_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes",
                 "max-in-memory-length", "max-in-memory-bytes", "delivery-limit",
                 "queue-version", "overflow")

# keys whose policy makes a queue of that type out of the policy's reach
# (the queue types' capabilities: unsupported_policies)
_UNSUPPORTED = {
    "classic": frozenset(("max-age", "stream-max-segment-size-bytes", "initial-cluster-size",
                          "delivery-limit", "dead-letter-strategy", "max-in-memory-length",
                          "max-in-memory-bytes", "target-group-size")),
    "quorum": frozenset(("max-priority", "queue-mode", "ha-mode", "ha-params", "ha-sync-mode",
                         "ha-promote-on-shutdown", "ha-promote-on-failure",
                         "queue-master-locator", "max-age", "stream-max-segment-size-bytes",
                         "initial-cluster-size")),
}


# ------------------------------------------------------------- validation
def erl(v: Any) -> str:
    """A JSON value as Erlang's ~tp prints the term RabbitMQ decoded it to."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return '<<"' + v.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(v, list):
        return "[" + ",".join(erl(x) for x in v) + "]"
    if isinstance(v, dict):
        return "#{" + ",".join(f"{erl(k)} => {erl(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _int(v: Any, low: int | None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low)


_ENUMS = {
    "dead-letter-strategy": (("at-most-once", "at-least-once"), "dead letter strategy"),
    "queue-mode": (("default", "lazy"), "queue-mode value"),
    "overflow": (("drop-head", "reject-publish", "reject-publish-dlx"), "overflow value"),
    "queue-leader-locator": (("client-local", "balanced", "random", "least-leaders"),
                             "queue leader locator value"),
}
_STRINGS = {"alternate-exchange": "alternate exchange name",
            "dead-letter-exchange": "dead letter exchange name",
            "dead-letter-routing-key": "dead letter routing key"}
_INTS = {"consumer-disconnected-timeout": (0, "consumer disconnected timeout"),
         "consumer-timeout": (0, "consumer timeout"),
         "message-ttl": (0, "message TTL"), "expires": (1, "queue expiry"),
         "max-length": (0, "maximum length"), "max-length-bytes": (0, "maximum length in bytes"),
         "max-in-memory-length": (0, "maximum memory in bytes"),
         "max-in-memory-bytes": (0, "maximum memory in bytes"),
         "delivery-limit": (None, "delivery limit"),
         "initial-cluster-size": (0, "cluster size")}


def _check_key(key: str, v: Any) -> str | None:
    """rabbit_policies:validate_policy0's answer for one known key, or None."""
    if key in _STRINGS:
        ok = isinstance(v, str) and (key == "alternate-exchange" or len(v.encode()) <= 255)
        return None if ok else f"{erl(v)} is not a valid {_STRINGS[key]}"
    if key in _INTS:
        low, what = _INTS[key]
        return None if _int(v, low) else f"{erl(v)} is not a valid {what}"
    if key in _ENUMS:
        allowed, what = _ENUMS[key]
        return None if isinstance(v, str) and v in allowed else f"{erl(v)} is not a valid {what}"
    if key == "queue-version":
        return None if _int(v, None) and v in (1, 2) else f"{erl(v)} is not a valid queue-version value"
    return None


_KNOWN = (*_STRINGS, *_INTS, *_ENUMS, "queue-version")


def definition_error(definition: Any, operator: bool) -> str | None:
    """Why RabbitMQ refuses this definition (its text, without the "Validation
    failed" frame), or None. Keys mirrorq has no use for (queue-mode,
    queue-version, ...) are accepted and stored, as RabbitMQ accepts them."""
    if not isinstance(definition, dict):
        return f"definition must be a dictionary: {erl(definition)}"
    if not definition:
        return "no policy provided"
    allowed = OPERATOR_KEYS if operator else _KNOWN
    unknown = [(k, v) for k, v in definition.items() if k not in allowed]
    for k, v in definition.items():
        if k in allowed:
            why = _check_key(k, v)
            if why is not None:
                return why
    if unknown:
        return ("[" + ",".join(f"{{{erl(k)},{erl(v)}}}" for k, v in unknown)
                + "] are not recognised policy settings")
    return None


def policy_error(pattern: Any, definition: Any, priority: Any, apply_to: Any,
                 operator: bool) -> str | None:
    """The whole policy's checks (rabbit_policy:policy_validation), or None."""
    if not isinstance(priority, int | float) or isinstance(priority, bool):
        return f"priority should be a number, actually was {erl(priority)}"
    if not isinstance(pattern, str):
        return f"pattern should be a binary but was {erl(pattern)}"
    try:
        compile_pattern(pattern)
    except PatternError as exc:
        return f"pattern should be regular expression but is invalid: {exc}"
    if apply_to not in APPLY_TO:
        return (f"apply-to '{apply_to}' unrecognised; should be one of: 'queues', "
                "'classic_queues',  'quorum_queues', 'streams', 'exchanges', or 'all'")
    return definition_error(definition, operator)


# ---------------------------------------------------------------- matching
def queue_type(arguments: Mapping[str, Any]) -> str:
    return "quorum" if arguments.get("x-queue-type") == "quorum" else "classic"


def applies(p: Policy, vhost: str, name: str, kind: str, qtype: str = "classic") -> bool:
    """Does `p` apply to the queue (kind "queue", of type qtype) or exchange
    (kind "exchange") `name` of `vhost`?"""
    return p.vhost == vhost and applies_to(p, kind, qtype) and searches(p.pattern, name)


def applies_to(p: Policy, kind: str, qtype: str = "classic") -> bool:
    """Does `p` apply to objects of this kind and queue type (its pattern aside)?"""
    if kind == "exchange":
        return p.apply_to in ("all", "exchanges")
    if p.apply_to not in ("all", "queues", f"{qtype}_queues"):
        return False
    unsupported = _UNSUPPORTED[qtype]
    return not any(k in unsupported for k in p.definition)


def best(policies: Iterable[Policy], vhost: str, name: str, kind: str,
         qtype: str = "classic") -> Policy | None:
    """The policy that applies: highest priority, then the lower name."""
    found: Policy | None = None
    for p in policies:
        if applies(p, vhost, name, kind, qtype) and (
                found is None or p.priority > found.priority
                or (p.priority == found.priority and p.name < found.name)):
            found = p
    return found


def matching(policies: Mapping[Any, Policy], operator_policies: Mapping[Any, Policy],
             key: str, kind: str, qtype: str = "classic") -> tuple[Policy | None, Policy | None]:
    """The policy and operator policy that apply to the queue or exchange
    whose table key (node/broker/vhost.py) is `key`."""
    vhost, name = split_key(key)
    return (best(policies.values(), vhost, name, kind, qtype),
            best(operator_policies.values(), vhost, name, kind, qtype))


def merge_value(key: str, val: Any, op_val: Any) -> Any:
    """rabbit_policies:merge_policy_value: the operator policy's more
    conservative value."""
    if key in ("message-ttl", "max-length", "max-length-bytes", "max-in-memory-length",
               "max-in-memory-bytes", "expires"):
        return min(val, op_val)
    if key == "delivery-limit":
        if (isinstance(val, int) and val < 0) or (isinstance(op_val, int) and op_val < 0):
            return max(val, op_val)  # one of them is unlimited
        return min(val, op_val)
    if key in ("queue-version", "overflow"):
        return op_val
    if isinstance(val, bool) and isinstance(op_val, bool):
        return op_val
    return val


def effective_definition(policy: Policy | None, op: Policy | None) -> dict[str, Any]:
    """rabbit_policy:merge_operator_definitions (keys in order)."""
    d = dict(policy.definition) if policy is not None else {}
    o = op.definition if op is not None else {}
    out: dict[str, Any] = {}
    for k in sorted({*d, *o}):
        if k in d and k in o:
            out[k] = merge_value(k, d[k], o[k])
        else:
            out[k] = d[k] if k in d else o[k]
    return out


# ---------------------------------------------------- effective settings
class QueueSettings(NamedTuple):
    """What enforcement reads of a queue (None: unbounded / none)."""

    message_ttl: int | None
    expires: int | None
    max_length: int | None
    max_length_bytes: int | None
    overflow: str
    dlx: str | None
    dlrk: str | None
    delivery_limit: int | None


# RabbitMQ 4.x's default for a quorum queue (rabbit_quorum_queue ?DEFAULT_DELIVERY_LIMIT)
DEFAULT_DELIVERY_LIMIT = 20


def queue_settings(arguments: Mapping[str, Any], policy: Mapping[str, Any] | None = None,
                   quorum_defaults: bool = False) -> QueueSettings:
    """The queue's effective settings from its x-arguments and its effective
    policy definition, as RabbitMQ resolves each (args_policy_lookup): the
    smaller of the two for the limits and TTLs, the argument for the
    dead-letter target, for overflow the argument on a classic queue and the
    policy on a quorum queue, and for delivery-limit the smaller unless one
    is negative (unlimited: then the larger). With `quorum_defaults` (machine
    version 3 on) a quorum queue with neither has RabbitMQ 4.x's delivery
    limit of 20 (rabbit_quorum_queue:get_delivery_limit); a negative one
    means none."""
    pol = policy or {}
    qtype = queue_type(arguments)

    def lookup(key: str, resolve: str) -> Any:
        a, p = arguments.get("x-" + key), pol.get(key)
        if a is None:
            return p
        if p is None:
            return a
        if resolve == "min":
            return min(p, a)
        if resolve == "policy":
            return p
        if resolve == "limit":
            return max(p, a) if p < 0 or a < 0 else min(p, a)
        return a

    limit = lookup("delivery-limit", "limit")
    return QueueSettings(
        message_ttl=lookup("message-ttl", "min"),
        expires=lookup("expires", "min"),
        max_length=lookup("max-length", "min"),
        max_length_bytes=lookup("max-length-bytes", "min"),
        overflow=lookup("overflow", "policy" if qtype == "quorum" else "arg") or "drop-head",
        dlx=lookup("dead-letter-exchange", "arg"),
        dlrk=lookup("dead-letter-routing-key", "arg"),
        delivery_limit=_delivery_limit(limit, qtype == "quorum" and quorum_defaults))


def _delivery_limit(limit: Any, default: bool) -> int | None:
    if isinstance(limit, bool) or not isinstance(limit, int):  # rabbit_fifo ignores a non-integer
        return DEFAULT_DELIVERY_LIMIT if default else None
    return None if limit < 0 else limit


def alternate_exchange(arguments: Mapping[str, Any], policy: Mapping[str, Any] | None
                       ) -> str | None:
    """rabbit_policy:get_arg: the argument, else the policy's."""
    ae = arguments.get("alternate-exchange")
    if isinstance(ae, bytes):
        ae = ae.decode("utf-8", "replace")
    if isinstance(ae, str):
        return ae
    pae = (policy or {}).get("alternate-exchange")
    return pae if isinstance(pae, str) else None
