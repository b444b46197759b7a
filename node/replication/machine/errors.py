"""Channel and connection errors raised by command handlers, and the
builders of their texts (RabbitMQ's wording).
"""
from __future__ import annotations

from typing import Any

from node.broker.vhost import ResourceKey, split_key


class _ChanErr(Exception):
    def __init__(self, code: int, text: str, ids: tuple[int, int]) -> None:
        super().__init__(text)
        self.code, self.text, self.ids = code, text, ids


class _ConnErr(_ChanErr):
    pass


def _where(key: ResourceKey) -> str:
    """How error texts name a resource: 'name' in vhost 'v'."""
    vhost, name = split_key(key)
    return f"'{name}' in vhost '{vhost}'"


def _not_found(kind: str, key: ResourceKey, ids: tuple[int, int]) -> _ChanErr:
    return _ChanErr(404, f"NOT_FOUND - no {kind} {_where(key)}", ids)


def _locked(key: ResourceKey, ids: tuple[int, int]) -> _ChanErr:
    return _ChanErr(405, f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue "
                         f"{_where(key)}. It could be originally declared on another "
                         f"connection or the exclusive property value does not match that of "
                         f"the original declaration.", ids)


def _default_x(ids: tuple[int, int]) -> _ChanErr:
    return _ChanErr(403, "ACCESS_REFUSED - operation not permitted on the default exchange", ids)


def _type_name(v: Any) -> str:
    """AMQP field type names as RabbitMQ prints them in error texts."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "signedint" if -(2**31) <= v < 2**31 else "long"
    if isinstance(v, float):
        return "double"
    if isinstance(v, str | bytes):
        return "longstr"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, list):
        return "array"
    if v is None:
        return "void"
    return type(v).__name__


def _fmt_arg(v: Any) -> str:
    if v is None:
        return "none"
    shown = v.decode("utf-8", "replace") if isinstance(v, bytes) else v  # may not be UTF-8
    if isinstance(v, bool):
        shown = str(v).lower()
    return f"the value '{shown}' of type '{_type_name(v)}'"


def _b(v: bool) -> str:
    return "true" if v else "false"
