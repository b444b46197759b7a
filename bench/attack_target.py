"""What an isolation attack (bench/attack_*.py, run by bench/isolation.py) is given:
a running cluster's endpoints and an administrator's credentials. Each attack
creates its own vhost, user and objects through the management API with them,
then attacks as that (non-administrator) user; the victim publishes on a vhost
of its own meanwhile.

An attack module defines:
    NAME: str                                   # e.g. "topic-bindings"
    def setup(t: Target) -> None                # its vhost, user, permissions, objects
    def run(t: Target, stop: threading.Event) -> dict[str, float]
        # attack until `stop` is set; returns its own figures (requests made, ...)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    amqp: tuple[tuple[str, int], ...]  # (host, port) of each node's AMQP listener
    http: tuple[str, ...]  # base URL of each node's management API, e.g. http://127.0.0.1:15672
    user: str  # an administrator
    password: str
