"""Checks of a request's JSON body (RabbitMQ's answers to a bad one: 400
with the reason), and a published message's properties."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def arguments(body: Mapping[str, Any]) -> dict[str, Any]:
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise bad_request("arguments must be an object")
    return args


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
        elif not isinstance(value, str):
            raise bad_request(f"{key} must be a string")
        out[key] = value
    return out
