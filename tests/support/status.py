"""NodeStatus values for tests of its readers: every figure zero or empty unless given."""
from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from node.replication.status import NodeStatus, PeerStatus


def node_status(**given: Any) -> NodeStatus:
    zero: dict[type | str, Any] = {"int": 0, "int | None": None, "str | None": None, "str": "",
                                   "bool": False, "float": 0.0, "list[str]": []}
    values: dict[str, Any] = {}
    for f in fields(NodeStatus):
        if f.name in given or f.default is not MISSING:
            continue
        kind = str(f.type)
        values[f.name] = zero.get(kind, {} if kind.startswith("dict") else ())
    peers = tuple(p if isinstance(p, PeerStatus) else peer(**p) for p in given.pop("peers", ()))
    return NodeStatus(**{**values, **given, "peers": peers})


def peer(member: str, connected: bool = True, match_index: int = 0, address: str = "",
         lost: bool = False, reply_age: float | None = None) -> PeerStatus:
    return PeerStatus(member, address or f"h:{member}", match_index, connected, lost, reply_age)
