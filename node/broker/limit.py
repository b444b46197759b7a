"""Vhost and user limits and topic permissions as RabbitMQ has them (pure):
validation with RabbitMQ's texts, what a limit means, and the refusals.

Limits (rabbit_vhost_limit, rabbit_auth_backend_internal): a vhost's
max-connections and max-queues, a user's max-connections and max-channels.
A negative value (or none) is no limit; 0 allows none. A count at or over
the limit refuses the next one.

Topic permissions (rabbit_auth_backend_internal:check_topic_access): per user,
vhost and topic exchange, a write and a read regular expression matched
(unanchored, RE2) against the routing key of a publish (write) or the binding
key of a bind/unbind (read), after {username} and {vhost} in the pattern are
replaced by the escaped values. An empty pattern permits nothing ("^$"); an
exchange without a topic permission for the user is not restricted.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import re2  # type: ignore[import-untyped]

from node.broker.pattern import PatternError, compile_pattern, searches
from node.broker.policy import erl

VHOST, USER = "vhost", "user"
MAX_CONNECTIONS, MAX_QUEUES, MAX_CHANNELS = "max-connections", "max-queues", "max-channels"
NAMES = {VHOST: (MAX_CONNECTIONS, MAX_QUEUES), USER: (MAX_CONNECTIONS, MAX_CHANNELS)}

Limits = Mapping[str, int]


def limit_error(scope: str, name: str, value: Any) -> str | None:
    """Why `value` cannot be the limit `name` of a vhost or user, as
    RabbitMQ's parameter validation words it, or None."""
    if name not in NAMES[scope]:
        where = "limits" if scope == VHOST else "user-limits"
        return f"Unrecognised terms [{{{erl(name)},{erl(value)}}}] in {where}"
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{name} should be a number, actually was {erl(value)}"
    if not -(2 ** 63) <= value < 2 ** 63:
        return f"{name} should be a number that fits in 64 bits"
    return None


def limit_of(limits: Limits | None, name: str) -> int | None:
    """The limit in force (None: unlimited; a negative value is none)."""
    if not limits:
        return None
    value = limits.get(name)
    if value is None or value < 0:
        return None
    return value


def over(limits: Limits | None, name: str, count: int) -> int | None:
    """The limit `count` existing ones already reach (refuse one more), or None."""
    limit = limit_of(limits, name)
    return limit if limit is not None and count >= limit else None


# ---------------------------------------------------------------- refusals
def vhost_connections_refused(vhost: str, user: str, limit: int) -> str:
    return (f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}': "
            f"connection limit ({limit}) is reached")


def user_connections_refused(user: str, limit: int) -> str:
    return (f"NOT_ALLOWED - connection refused for user '{user}': "
            f"user connection limit ({limit}) is reached")


def user_channels_refused(user: str, limit: int) -> str:
    return (f"NOT_ALLOWED - number of channels opened for user '{user}' has reached "
            f"the maximum allowed user limit of {limit}")


def queues_refused(queue: str, vhost: str, limit: int) -> str:
    return (f"PRECONDITION_FAILED - cannot declare queue '{queue}': "
            f"queue limit in vhost '{vhost}' ({limit}) is reached")


# -------------------------------------------------------- topic permissions
def topic_pattern_error(write: Any, read: Any) -> str | None:
    """Why the patterns cannot be a topic permission, or None."""
    for what, pattern in (("write", write), ("read", read)):
        if not isinstance(pattern, str):
            return f"{what} should be a string, actually was {erl(pattern)}"
        try:
            compile_pattern(pattern)
        except PatternError as exc:
            return f"{what} pattern {pattern!r} is invalid: {exc}"
    return None


def expand(pattern: str, user: str, vhost: str) -> str:
    """RabbitMQ's expand_topic_permission: {username} and {vhost} replaced
    by their values, escaped."""
    if "{" not in pattern:
        return pattern
    return pattern.replace("{username}", re2.escape(user)).replace("{vhost}", re2.escape(vhost))


def topic_permitted(pattern: str, user: str, vhost: str, key: str) -> bool:
    if not pattern:  # RabbitMQ reads "" as "^$"
        pattern = "^$"
    return searches(expand(pattern, user, vhost), key)


def topic_refusal(permissions: Mapping[tuple[str, str, str], tuple[str, str]],
                  user: str | None, vhost: str, exchange: str, key: str,
                  write: bool) -> str | None:
    """Why `user` may not write (publish) or read (bind, unbind) `key` on the
    topic exchange `exchange` of `vhost` (RabbitMQ's
    check_topic_authorisation), or None. No permission of the user on the
    exchange: allowed, as RabbitMQ. A channel whose user is unknown (its
    connection is not in the connection table) is refused wherever some
    user has a topic permission on the exchange: it fails closed, since it
    cannot be told apart from a restricted user (issue 42)."""
    kind = "write" if write else "read"
    if user is None:
        if any(k[1] == vhost and k[2] == exchange for k in permissions):
            return (f"ACCESS_REFUSED - {kind} access to topic '{key}' in exchange "
                    f"'{exchange}' in vhost '{vhost}' refused: the channel's user is unknown")
        return None
    perm = permissions.get((user, vhost, exchange))
    if perm is None or topic_permitted(perm[0] if write else perm[1], user, vhost, key):
        return None
    return topic_refused(kind, key, exchange, vhost, user)


def topic_refused(kind: str, key: str, exchange: str, vhost: str, user: str) -> str:
    """kind: "write" or "read" (rabbit_access_control:check_topic_access)."""
    return (f"ACCESS_REFUSED - {kind} access to topic '{key}' in exchange '{exchange}' "
            f"in vhost '{vhost}' refused for user '{user}'")
