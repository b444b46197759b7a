"""Checks of a request's JSON body (RabbitMQ's answers to a bad one: 400
with the reason), and a published message's properties."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from node.broker.fieldtypes import Int64
from node.http.errors import bad_request


def boolean(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise bad_request(f"{key} must be a boolean")
    if not isinstance(value, bool):
        raise bad_request(f"{key} must be a boolean")
    return value


FLOAT_MAX = 3.4028234663852886e38  # AMQP tables carry a JSON float as a 32-bit float


def amqp_value(value: Any, where: str) -> None:
    """400 for a number an AMQP table cannot carry (1e308, nested anywhere),
    before it reaches the encoder (a 500 and a traceback otherwise)."""
    if isinstance(value, float) and (not math.isfinite(value) or abs(value) > FLOAT_MAX):
        raise bad_request(f"{where}: {value!r} is out of range")
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
        raise bad_request(f"{where}: {value} is out of range")
    if isinstance(value, dict):
        for k, v in value.items():
            amqp_value(v, f"{where}.{k}")
    elif isinstance(value, list):
        for v in value:
            amqp_value(v, where)


def arguments(body: Mapping[str, Any]) -> dict[str, Any]:
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise bad_request("arguments must be an object")
    amqp_value(args, "arguments")
    return args


def routing_key(body: Mapping[str, Any], default: str | None = "") -> str:
    """The body's routing_key: a string of at most 255 bytes, what AMQP's
    shortstr holds (it goes on in one; longer was a 500 before)."""
    rk = body.get("routing_key", default)
    if rk is None:
        raise bad_request("routing_key is missing")
    if not isinstance(rk, str):
        raise bad_request("routing_key must be a string")
    if len(rk.encode("utf-8", "surrogatepass")) > 255:
        raise bad_request("routing_key is longer than 255 bytes")
    return rk


def json_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


PROP_KEYS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
             "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
             "user_id", "app_id")


def amqp_properties(props: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in props.items():
        if key not in PROP_KEYS:
            raise bad_request(f"unknown property {key!r}")
        if key in ("delivery_mode", "priority", "timestamp"):
            if isinstance(value, str) and value.isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad_request(f"{key} must be an integer")
        elif key == "headers":
            if not isinstance(value, dict):
                raise bad_request("headers must be an object")
            amqp_value(value, "headers")
            value = _json_header(value)
        elif not isinstance(value, str):
            raise bad_request(f"{key} must be a string")
        out[key] = value
    return out


def _json_header(value: Any) -> Any:
    """A JSON integer is a long (`l`) in a published message's headers, as
    RabbitMQ's management API makes it (rabbit_misc:type_val); floats are
    doubles by default."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return Int64(value)
    if isinstance(value, dict):
        return {k: _json_header(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_header(v) for v in value]
    return value
