"""Message bodies and properties live in the Raft log, not in the state.

Every member's log holds the same bytes at the same Raft index, so where a
publish's encoded properties and body sit inside an entry's payload is the
same on every node: the state keeps that place (a `loc`, one int) instead
of the bytes. loc = index << 64 | offset of the properties << 32 | their
length; the body follows the properties, its length is the message's size.

Reading back happens off the raft thread: the effect of a delivery carries
`(handle, props offset, props length, size)`, where the handle (made on the
raft thread, see raft/log/handle.EntryHandle) preads and checks the whole
record; the event loop keeps the last payloads read in a PayloadCache, so a
consumer draining a queue reads and checks each entry once, not once per
message (node/amqp/server.py reads them before the connection gets the
delivery). Dead-lettering (x-death) reads a message's properties on the raft
thread (rare: queues with a DLX): the state machine is handed a read-only
PropsReader for that (the node's LogReader), it does no I/O by itself.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from node.replication.codec import CodecError, decode_from
from node.replication.effect import Deliver, Effect, GetOk

# live-message counts per 16 Raft indices (retention of log segments): fine enough
# that a segment is freed soon after its messages, one dict item per 16 entries
BUCKET_SHIFT = 4


class Handle(Protocol):
    idx: int

    def payload(self) -> bytes: ...


class PropsReader(Protocol):
    """Read only: the properties of a message stored in the log, by its loc
    (what apply is given to read them with; None where messages are inline)."""

    def props(self, loc: int) -> dict[str, Any]: ...


def make_loc(idx: int, props_at: int, props_len: int) -> int:
    return (idx << 64) | (props_at << 32) | props_len


def split_loc(loc: int) -> tuple[int, int, int]:
    return loc >> 64, (loc >> 32) & 0xFFFFFFFF, loc & 0xFFFFFFFF


def loc_index(loc: int) -> int:
    return loc >> 64


class StoredMessageError(Exception):
    """A stored message could not be read back intact. damaged: the log's
    bytes are bad (checksum, range, decode), not just unreadable (a closed fd
    at shutdown)."""

    def __init__(self, text: str, damaged: bool = True) -> None:
        super().__init__(text)
        self.damaged = damaged


_PROPS_CACHE: dict[bytes, dict[str, Any]] = {}  # encoded -> decoded (read only, like shared props)
_PROPS_CACHE_MAX = 4096


def decode_props(payload: bytes, at: int, n: int) -> dict[str, Any]:
    """Properties as encoded in the log. Most publishers send the same few
    property tables over and over: decoded ones are kept by their bytes
    (deliveries never change a props dict: they were shared before, too)."""
    if n == 1 and payload[at] == 0x4E:  # N: none
        return {}
    raw = payload[at:at + n]
    hit = _PROPS_CACHE.get(raw)
    if hit is not None:
        return hit
    try:
        props, end = decode_from(payload, at)
    except CodecError as exc:
        raise StoredMessageError(f"stored properties do not decode: {exc}") from None
    if type(props) is not dict or end != at + n:
        raise StoredMessageError("stored properties malformed")
    if len(_PROPS_CACHE) >= _PROPS_CACHE_MAX:
        _PROPS_CACHE.clear()
    _PROPS_CACHE[raw] = props
    return props  # type: ignore[no-any-return]


class PayloadCache:
    """The last entry payloads read (checked), by Raft index, bounded in bytes.
    Committed entries never change, so the index alone is the key. One per thread."""

    def __init__(self, cap: int = 16 << 20) -> None:
        self._items: OrderedDict[int, bytes] = OrderedDict()
        self._bytes = 0
        self._cap = cap
        self.reads = 0  # entries read from the log (tests, figures)
        self._reads_seen = 0

    def get(self, idx: int, fetch: Callable[[], bytes]) -> bytes:
        items = self._items
        hit = items.get(idx)
        if hit is not None:
            items.move_to_end(idx)
            return hit
        data = fetch()
        self.reads += 1
        items[idx] = data
        self._bytes += len(data)
        while self._bytes > self._cap and len(items) > 1:
            _k, old = items.popitem(last=False)
            self._bytes -= len(old)
        return data

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    def clear_if_idle(self) -> None:
        """Called now and then (the loop's timer): no entry was read since the
        last call, so nobody is draining: the cached payloads go (a drained
        node gives back its 16 MiB)."""
        if self.reads == self._reads_seen and self._items:
            self.clear()
        self._reads_seen = self.reads


LOOP_CACHE = PayloadCache()  # the event loop's (deliveries, basic.get, management get)

Stored = tuple[Handle, int, int, int]  # (handle, props offset, props length, size)


def load(stored: Stored, props: dict[str, Any] | None, body: bytes | None,
         cache: PayloadCache = LOOP_CACHE) -> tuple[dict[str, Any], bytes]:
    """A delivery's properties and body: those given, the rest from the log."""
    handle, at, n, size = stored
    payload = cache._items.get(handle.idx)  # the hot path: the entry was read just before
    if payload is None:
        try:
            payload = cache.get(handle.idx, handle.payload)
        except OSError as exc:  # a closed fd (the node stopping)
            raise StoredMessageError(f"message at index {handle.idx} unreadable: {exc}", False) from None
        except Exception as exc:  # the record fails its checksum (raft.log.LogDamaged)
            raise StoredMessageError(f"message at index {handle.idx}: {exc}") from None
    body_at = at + n
    if body_at + size > len(payload):
        raise StoredMessageError("stored message past the end of its entry")
    if props is None:
        props = decode_props(payload, at, n)
    if body is None:
        body = payload[body_at:body_at + size]
    return props, body


def with_delivery_count(props: dict[str, Any], count: int, acquired: int = -1
                        ) -> dict[str, Any]:
    """The props of a redelivery from a quorum queue: x-delivery-count says how
    often the message came back (failed), x-acquired-count how often it was
    handed out before; each added when >= 0 (a new dict: props are shared
    between queues)."""
    props = dict(props)
    headers = dict(props.get("headers") or {})
    if count >= 0:
        headers["x-delivery-count"] = count
    if acquired >= 0:
        headers["x-acquired-count"] = acquired
    props["headers"] = headers
    return props


class LogReader:
    """This node's log as the raft thread reads messages from it (a
    PropsReader): the properties of a stored message for apply, and the
    handles deliveries of stored bytes carry to the event loop."""

    def __init__(self, entry_handle: Callable[[int], Handle]) -> None:
        self._entry_handle = entry_handle  # raft thread only (it reads the log's index)
        self._cache = PayloadCache(4 << 20)  # dead-lettering's reads
        self._handles: dict[int, Handle] = {}  # index -> handle, the last few made

    def props(self, loc: int) -> dict[str, Any]:
        idx, at, n = split_loc(loc)
        payload = self._cache.get(idx, self._entry_handle(idx).payload)
        return decode_props(payload, at, n)

    def resolve(self, effects: list[Effect]) -> list[Effect]:
        """`effects` with every delivery of bytes in the log given a handle the
        event loop reads them by (raft thread: only it may look into the log's
        index)."""
        return [self._resolve(e) if (type(e) is Deliver or type(e) is GetOk) and e.stored is not None  # type: ignore[union-attr]
                else e for e in effects]

    def _resolve(self, e: Effect) -> Effect:
        """Deliveries come in runs from one entry: its handle is reused (a few
        kept, each keeps its segment's fd open, so the set stays small)."""
        assert isinstance(e, Deliver | GetOk)
        loc, size = e.stored
        idx, at, n = split_loc(loc)
        handles = self._handles
        h = handles.get(idx)
        if h is None:
            if len(handles) >= 32:
                handles.clear()
            h = handles[idx] = self._entry_handle(idx)
        # stored is the third last field of both: no _replace (slow, per message)
        return tuple.__new__(type(e), (*e[:-3], (h, at, n, size), *e[-2:]))  # type: ignore[no-any-return]

    def clear(self) -> None:
        """A snapshot replaced the state (and what the log holds)."""
        self._cache.clear()
        self._handles.clear()
