"""Removes the stopped pod sandboxes of deleted pods as soon as they stop, not
at the kubelet's next container GC.

The kubelet v1.20 deletes a Terminating pod from the API only once its sandbox
is gone ("is terminated, but some pod sandboxes have not been cleaned up" at
--v=4), and only its container GC removes a stopped sandbox: once a minute
(ContainerGCPeriod, not configurable). Every pod deletion in the tests then
took 0-60 s more than the broker's own stop (which ends on SIGTERM in ~1.5 s,
containerd's StopContainer included): 31-52 s per pod in the config roll.
This does what that GC does for a deleted pod (RemovePodSandbox through the
CRI on containerd's socket), every second. A sandbox is removed only if it is
NOTREADY and its pod is gone from the API, has another uid, or is being deleted.

The CRI messages are encoded by hand (four fields of
k8s.io/cri-api runtime/v1alpha2 api.proto): no generated code for two calls.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

_SERVICE = "/runtime.v1alpha2.RuntimeService/"
SANDBOX_NOTREADY = 1  # PodSandboxState


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message: ints for varints, bytes for
    length-delimited fields; fixed-width fields are skipped."""
    i = 0

    def varint() -> int:
        nonlocal i
        shift = n = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7

    while i < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, varint()
        elif wire == 2:
            n = varint()
            yield number, data[i:i + n]
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire} not handled")


def list_request(state: int) -> bytes:
    """ListPodSandboxRequest{filter: {state: {state}}}."""
    return _field(1, _field(2, _varint(1 << 3 | 0) + _varint(state)))


def remove_request(sandbox_id: str) -> bytes:
    """RemovePodSandboxRequest{pod_sandbox_id}."""
    return _field(1, sandbox_id.encode())


def parse_sandboxes(data: bytes) -> list[dict[str, str]]:
    """ListPodSandboxResponse -> [{id, name, uid, namespace}]."""
    out = []
    for number, item in _fields(data):
        if number != 1 or not isinstance(item, bytes):
            continue
        box: dict[str, str] = {}
        for f, v in _fields(item):
            if f == 1 and isinstance(v, bytes):
                box["id"] = v.decode()
            elif f == 2 and isinstance(v, bytes):
                for mf, mv in _fields(v):
                    if isinstance(mv, bytes) and mf in (1, 2, 3):
                        box[("name", "uid", "namespace")[mf - 1]] = mv.decode()
        out.append(box)
    return out


def deleted(pod: dict[str, Any] | None, uid: str) -> bool:
    """Whether the pod a sandbox was made for is gone or going (pure)."""
    if pod is None:
        return True
    meta = pod.get("metadata") or {}
    return meta.get("uid") != uid or bool(meta.get("deletionTimestamp"))


class SandboxReaper:
    def __init__(self, sock: Path, get_pod: Callable[[str, str], dict[str, Any] | None]) -> None:
        self._channel = grpc.insecure_channel(f"unix://{sock}")
        ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731 - raw protobuf both ways
        self._list = self._channel.unary_unary(_SERVICE + "ListPodSandbox",
                                               request_serializer=ident, response_deserializer=ident)
        self._remove = self._channel.unary_unary(_SERVICE + "RemovePodSandbox",
                                                 request_serializer=ident, response_deserializer=ident)
        self._get_pod = get_pod
        self.removed: list[str] = []  # "namespace/name" of each sandbox removed

    def sync(self) -> None:
        for box in parse_sandboxes(self._list(list_request(SANDBOX_NOTREADY), timeout=5)):
            ns, name, uid = box.get("namespace", ""), box.get("name", ""), box.get("uid", "")
            if box.get("id") and deleted(self._get_pod(ns, name), uid):
                self._remove(remove_request(box["id"]), timeout=30)
                self.removed.append(f"{ns}/{name}")
                del self.removed[:-100]

    def close(self) -> None:
        self._channel.close()
