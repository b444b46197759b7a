"""Global runtime parameters and the cluster name (pure).

RabbitMQ keeps cluster-wide settings as global runtime parameters, a name
and a JSON value each; the cluster name is the parameter "cluster_name"
(rabbit_nodes:cluster_name/0 reads it, set_cluster_name/2 writes it), and
names starting with "internal" are not exported with the definitions
(rabbit_definitions:is_internal_parameter). A value travels in the
replicated log as codec values, so it is checked here before it is proposed:
plain JSON only, nested at most MAX_DEPTH deep, integers within what the
codec reads back (node/replication/codec.py) and the whole bounded in size.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

CLUSTER_NAME = "cluster_name"
INTERNAL_PREFIX = "internal"
MAX_DEPTH = 32  # the codec refuses records nested deeper than 48
MAX_INT_BITS = 500  # the codec reads integers of up to 64 bytes
MAX_VALUE_BYTES = 64 * 1024  # one parameter's JSON text; a batch holds 512 KiB
MAX_NAME_BYTES = 255


def json_error(v: Any, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    if v is None or isinstance(v, (bool, str, float)):
        return None
    if isinstance(v, int):
        return None if v.bit_length() <= MAX_INT_BITS else "an integer too large"
    if isinstance(v, list):
        for item in v:
            why = json_error(item, depth + 1)
            if why is not None:
                return why
        return None
    if isinstance(v, dict):
        for k, item in v.items():
            if not isinstance(k, str):
                return "an object key that is not a string"
            why = json_error(item, depth + 1)
            if why is not None:
                return why
        return None
    return f"a {type(v).__name__}, not a JSON value"


def global_parameter_error(name: Any, value: Any) -> str | None:
    """Why (name, value) cannot be a global parameter, or None."""
    if not isinstance(name, str) or not name:
        return "a global parameter needs a name"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"a global parameter's name is at most {MAX_NAME_BYTES} bytes"
    why = json_error(value, 0)
    if why is not None:
        return f"the value holds {why}"
    if len(json.dumps(value)) > MAX_VALUE_BYTES:
        return f"the value is longer than {MAX_VALUE_BYTES} bytes as JSON"
    return None


def cluster_name(parameters: Mapping[str, Any], members: list[str]) -> str:
    """The cluster's name: the "cluster_name" parameter when set (a value
    that is not a string as its JSON text), else mirrorq's derived name,
    `mirrorq@<first member>` (RabbitMQ derives its default from the node
    name and host)."""
    value = parameters.get(CLUSTER_NAME)
    if value is not None or CLUSTER_NAME in parameters:
        return value if isinstance(value, str) else json.dumps(value)
    return f"mirrorq@{members[0]}" if members else "mirrorq"


def exported(parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The definitions export's `global_parameters`: every set parameter but
    the internal ones (RabbitMQ's list_global_runtime_parameters)."""
    return [{"name": n, "value": v} for n, v in parameters.items()
            if not n.startswith(INTERNAL_PREFIX)]
