"""Snapshot helpers for tests: a state through the snapshot format and back
(what a follower installs), and a structural comparison of two states that
follows the object graph (sharing included) field by field."""
from __future__ import annotations

from collections import deque
from typing import Any

from node.broker.channel import Channel, Consumer
from node.broker.dead_letter import DeadLetter, DeadLetterStore
from node.broker.exchange import Binding, Exchange
from node.broker.fifo import PackedFifo
from node.broker.queue import Message, Queue
from node.replication.machine import BrokerState
from node.replication.raft.snapshot import RaftMeta, encode_snapshot, read_snapshot

META = RaftMeta((b"\x01", 41, 3), (b"\x01", 40, 3), ("127.0.0.1:1", "127.0.0.1:2"))
_KEEP: dict[int, list[Any]] = {}  # per comparison: made messages kept alive
_RECORDS = (BrokerState, Exchange, Binding, Queue, Message, Channel, Consumer, DeadLetter,
            DeadLetterStore)


def snapshot_copy(state: BrokerState) -> BrokerState:
    """The state written as a snapshot and read back."""
    restored, meta = read_snapshot(encode_snapshot(state, META))
    assert meta == META
    return restored


def assert_same_state(a: Any, b: Any) -> None:
    """a and b hold the same values in the same order, and share objects the
    same way (an object reached twice in a is reached twice, as one object,
    in b). Raises AssertionError naming the path of the first difference."""
    seen: dict[int, int] = {}
    try:
        _same(a, b, "state", seen)
    finally:
        _KEEP.pop(id(seen), None)


def _same(a: Any, b: Any, path: str, seen: dict[int, int], shared: bool = False) -> None:
    if type(a) is not type(b):
        raise AssertionError(f"{path}: {type(a).__name__} != {type(b).__name__}")
    if isinstance(a, _RECORDS) or (shared and a is not None and len(a) > 1):
        # identity: the same record, or message body or property table, of a
        # must map to one object of b (empty and one-byte values are
        # singletons or fresh either way: not compared)
        if id(a) in seen:
            if seen[id(a)] != id(b):
                raise AssertionError(f"{path}: sharing differs")
            return
        seen[id(a)] = id(b)
    if isinstance(a, _RECORDS):
        for name in type(a).__slots__:
            if name in ("_topic_cache", "_topic"):
                continue  # derived, rebuilt on demand / from the bindings
            _same(getattr(a, name), getattr(b, name), f"{path}.{name}", seen,
                  isinstance(a, Message) and name in ("body", "props"))
    elif isinstance(a, dict):
        if path.endswith(".bands"):  # a priority queue's FIFOs: band_order is their order
            a, b = dict(sorted(a.items())), dict(sorted(b.items()))
        if list(a) != list(b):
            raise AssertionError(f"{path}: keys {list(a)!r} != {list(b)!r}")
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]", seen)
    elif isinstance(a, PackedFifo):
        # messages are made as they are read: keep them alive for the whole
        # comparison, or a later one could reuse an id that `seen` maps
        la, lb = list(a), list(b)
        _KEEP.setdefault(id(seen), []).append((la, lb))
        _same(la, lb, path, seen)
    elif isinstance(a, list | tuple | deque):
        if len(a) != len(b):
            raise AssertionError(f"{path}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]", seen)
    elif a != b and not (isinstance(a, float) and a != a and b != b):
        raise AssertionError(f"{path}: {a!r} != {b!r}")


def snapshot_bytes(state: BrokerState) -> bytes:
    """The state's snapshot encoding: equal bytes, equal states (a fingerprint)."""
    return encode_snapshot(state, META)
