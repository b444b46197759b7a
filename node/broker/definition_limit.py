"""How many policies a vhost may hold and how large a policy or a global
parameter may be (pure): the bounds on what a policymaker can make every
member hold and match in the apply (issue 42).

Two layers. The node's settings (DefinitionLimits, top-level keys of
node.toml) are checked before a write is proposed, with a 400 and a
RabbitMQ-like "Validation failed" text. The apply checks the CEILING_*
constants, the same on every member whatever its settings (a setting may not
exceed them): a write that passed a lagging check on some node, or raced
another one, still cannot take a vhost past them. RabbitMQ itself has no
such limits.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from node.broker.pattern import MAX_REGEX

# what the apply enforces (the settings' upper bounds)
CEILING_POLICIES = 10_000  # per vhost, of each family (policies, operator policies)
CEILING_NAME_BYTES = 4096
CEILING_DEFINITION_BYTES = 256 * 1024
CEILING_GLOBAL_PARAMETERS = 10_000
CEILING_PARAMETER_BYTES = 256 * 1024


@dataclass(frozen=True)
class DefinitionLimits:
    # per vhost and family: a normal tenant has a few dozen; the apply cost of
    # a policy write is at most (queues + exchanges of the vhost) x this
    max_policies_per_vhost: int = 1000
    max_policy_name_bytes: int = 255
    max_policy_pattern_length: int = MAX_REGEX  # characters (RE2's bound too)
    max_policy_definition_bytes: int = 16 * 1024  # the definition as JSON text
    max_global_parameters: int = 1000
    max_parameter_bytes: int = 64 * 1024  # a global parameter's value as JSON text


# (setting, lower bound, upper bound): what node.toml may say
SETTINGS: tuple[tuple[str, int, int], ...] = (
    ("max_policies_per_vhost", 1, CEILING_POLICIES),
    ("max_policy_name_bytes", 1, CEILING_NAME_BYTES),
    ("max_policy_pattern_length", 1, MAX_REGEX),
    ("max_policy_definition_bytes", 2, CEILING_DEFINITION_BYTES),
    ("max_global_parameters", 1, CEILING_GLOBAL_PARAMETERS),
    ("max_parameter_bytes", 4, CEILING_PARAMETER_BYTES),
)


def json_size(v: Any) -> int:
    """The value's size as JSON text (what the API took), in bytes."""
    return len(json.dumps(v, separators=(",", ":"), default=str).encode("utf-8", "surrogatepass"))


def _name_bytes(name: str) -> int:
    return len(name.encode("utf-8", "surrogatepass"))


def policy_size_error(name: str, pattern: Any, definition: Any,
                      limits: DefinitionLimits) -> str | None:
    """Why this policy is too large for the node's settings, or None."""
    if _name_bytes(name) > limits.max_policy_name_bytes:
        return f"policy name is longer than {limits.max_policy_name_bytes} bytes"
    if isinstance(pattern, str) and len(pattern) > limits.max_policy_pattern_length:
        return f"pattern is longer than {limits.max_policy_pattern_length} characters"
    if json_size(definition) > limits.max_policy_definition_bytes:
        return f"definition is longer than {limits.max_policy_definition_bytes} bytes as JSON"
    return None


def policy_count_error(vhost: str, count: int, limits: DefinitionLimits) -> str | None:
    """Why one more policy may not be created in `vhost` holding `count`."""
    if count >= limits.max_policies_per_vhost:
        return (f"vhost '{vhost}' already has {count} policies: the limit is "
                f"{limits.max_policies_per_vhost} (max_policies_per_vhost)")
    return None


def parameter_error(name: str, value: Any, count: int, new: bool,
                    limits: DefinitionLimits) -> str | None:
    """Why a global parameter `name` = `value` exceeds the settings (count:
    how many are set; new: `name` is not one of them), or None."""
    if new and count >= limits.max_global_parameters:
        return (f"{count} global parameters are set: the limit is "
                f"{limits.max_global_parameters} (max_global_parameters)")
    if json_size(value) > limits.max_parameter_bytes:
        return f"the value is longer than {limits.max_parameter_bytes} bytes as JSON"
    return None


def policy_over_ceiling(name: str, pattern: str, definition: Mapping[str, Any],
                        count: int, new: bool) -> bool:
    """The apply's check: does this policy write go past the ceilings?"""
    return ((new and count >= CEILING_POLICIES) or _name_bytes(name) > CEILING_NAME_BYTES
            or len(pattern) > MAX_REGEX
            or json_size(dict(definition)) > CEILING_DEFINITION_BYTES)


def parameter_over_ceiling(name: str, value: Any, count: int, new: bool) -> bool:
    """The apply's check for a global parameter write."""
    return ((new and count >= CEILING_GLOBAL_PARAMETERS)
            or _name_bytes(name) > CEILING_NAME_BYTES
            or json_size(value) > CEILING_PARAMETER_BYTES)
