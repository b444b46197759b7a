"""The node's status dict <-> the NodeStatus message of node/admin/admin.proto.

A status is the same JSON-able dict that the node builds and render_metrics
takes; the call_* helpers give it back to callers exactly as built.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from node.admin import admin_pb2 as pb

_REPEATED = ("members", "in_sync", "draining")
_SCALARS: dict[str, type] = {}
for _f in pb.NodeStatus.DESCRIPTOR.fields:
    if _f.name not in _REPEATED and _f.name != "extra":
        _SCALARS[_f.name] = {_f.TYPE_STRING: str, _f.TYPE_INT64: int, _f.TYPE_BOOL: bool,
                             _f.TYPE_DOUBLE: float}[_f.type]


def _fits(value: Any, kind: type) -> bool:
    # exact Python types only, so that a round trip never turns 0 into 0.0 or True into 1
    return type(value) is kind or (kind is int and isinstance(value, int)
                                   and not isinstance(value, bool))


def status_to_pb(status: Mapping[str, Any]) -> pb.NodeStatus:
    """Known keys go to typed fields; anything else (a key this schema does
    not name yet, or a value of an unexpected type) travels JSON-encoded in
    `extra`, so a newer node never loses information to an older schema."""
    msg = pb.NodeStatus()
    for key, value in status.items():
        kind = _SCALARS.get(key)
        if kind is not None and (value is None or _fits(value, kind)):
            if value is not None:
                setattr(msg, key, value)
        elif key in _REPEATED and isinstance(value, list | tuple) \
                and all(isinstance(v, str) for v in value):
            getattr(msg, key).extend(value)
        else:
            try:
                msg.extra[key] = json.dumps(value, sort_keys=True, default=str)
            except (TypeError, ValueError):  # e.g. non-string dict keys: never fail a Status
                msg.extra[key] = json.dumps(repr(value))
    return msg


def pb_to_status(msg: pb.NodeStatus) -> dict[str, Any]:
    """The dict the node built: every named key (None when unset), lists as lists."""
    out: dict[str, Any] = {}
    for key in _SCALARS:
        out[key] = getattr(msg, key) if msg.HasField(key) else None
    for key in _REPEATED:
        out[key] = list(getattr(msg, key))
    for key, text in msg.extra.items():
        out[key] = json.loads(text)
    return out


def _change_to_dict(msg: pb.ChangeResponse | pb.TransferLeadershipResponse) -> dict[str, Any]:
    return {"ok": msg.ok, "status": pb_to_status(msg.status)}

