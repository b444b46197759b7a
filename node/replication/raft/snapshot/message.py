"""A message in the snapshot: written by _MessageWriter, read by
_MessageReader (the base of the snapshot's reader).

A message is a fixed struct, its exchange and routing key, then (version 3)
where its bytes are in the Raft log: the index of the entry, the offset and
length of its properties inside it (the body follows them). A message whose
properties or body are held in the state instead has them inline: a codec
table or a back reference (publishes routed to several queues share one
table and one body, and still do after a load), the body as raw bytes.
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from typing import Any

from node.broker.fifo import PackedFifo
from node.broker.queue import Message, raw_priority
from node.replication.codec import decode_from, encode_into
from node.replication.format import snapshot_version
from node.replication.message_store import BUCKET_SHIFT, make_loc
from node.replication.raft.snapshot.envelope import (
    _HEADER,
    _U32,
    SnapshotFormatError,
    _at,
    _expect,
    _Writer,
)

# seq, expires_at, delivery_count, flags, exchange length, routing key length,
# body length (or, with _BODY_REF, the index of a body written before)
_MSG = struct.Struct("<qdIBIII")  # versions 1 and 2
# version 3: flags u16, and the priority; body length is the size where the body is logged
_MSG3 = struct.Struct("<qdIHIIIB")
# version 4: and the acquired count and the deadline (0: none)
_MSG4 = struct.Struct("<qdIHIIIBId")
_LOC = struct.Struct("<QII")  # Raft index, properties' offset and length in the entry
_PERSISTENT, _REDELIVERED, _EXPIRES, _PROPS_EMPTY, _PROPS_REF, _BODY_REF = 1, 2, 4, 8, 16, 32
_HAS_LOC, _BODY_LOGGED, _PROPS_LOGGED = 64, 128, 256  # version 3
_PLAIN = _HAS_LOC | _BODY_LOGGED | _PROPS_LOGGED  # all in the log (a packed ready message)


class _MessageWriter:
    """Messages, with property tables and inline bodies shared between queues
    written once; bytes in the log as their place there."""

    def __init__(self, w: _Writer, machine_version: int) -> None:
        self.w = w
        self.bodies: dict[int, int] = {}  # back references, by id()
        self.props: dict[int, int] = {}
        self.n_bodies = 0
        self.n_props = 0
        # a member of a build before machine version 3 reads up to version 3
        # (4 from machine version 3 on, 5 from 5 on: format.SNAPSHOT_VERSION_SINCE)
        self.version = snapshot_version(machine_version)

    def write(self, m: Message) -> None:
        out = self.w.out
        flags = (_PERSISTENT if m.persistent else 0) | (_REDELIVERED if m.redelivered else 0)
        expires = m.expires_at
        if expires is not None:
            flags |= _EXPIRES
        props, body, loc = m.props, m.body, m.loc
        pref = bref = -1
        if loc is not None:
            flags |= _HAS_LOC
        if props is None:
            if loc is None:
                raise SnapshotFormatError("a message without properties and without a place in the log")
            flags |= _PROPS_LOGGED
        elif not props:
            flags |= _PROPS_EMPTY
        else:
            pref = self.props.get(id(props), -1)
            if pref >= 0:
                flags |= _PROPS_REF
            else:
                self.props[id(props)] = self.n_props
                self.n_props += 1
        if body is None:
            if loc is None:
                raise SnapshotFormatError("a message without a body and without a place in the log")
            flags |= _BODY_LOGGED
        else:
            bref = self.bodies.get(id(body), -1)
            if bref >= 0:
                flags |= _BODY_REF
            else:
                self.bodies[id(body)] = self.n_bodies
                self.n_bodies += 1
        ex = m.exchange.encode()
        rk = m.routing_key.encode()
        n = m.size if body is None else (bref if bref >= 0 else len(body))
        if self.version >= 4:
            out.append(_MSG4.pack(m.seq, 0.0 if expires is None else expires, m.delivery_count,
                                  flags, len(ex), len(rk), n, min(m.priority, 255),
                                  m.acquired_count, m.deadline or 0.0))
        else:
            out.append(_MSG3.pack(m.seq, 0.0 if expires is None else expires, m.delivery_count,
                                  flags, len(ex), len(rk), n, min(m.priority, 255)))
        out.append(ex)
        out.append(rk)
        if loc is not None:
            out.append(_LOC.pack(loc >> 64, (loc >> 32) & 0xFFFFFFFF, loc & 0xFFFFFFFF))
        if flags & _PROPS_REF:
            out.append(_U32.pack(pref))
        elif props:
            encode_into(props, out)
        if body is not None and bref < 0:
            out.append(body)


class _MessageReader:
    """The snapshot body being read: its position, and what messages share
    (property tables, bodies, names) and count in (the log's buckets)."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos
        self.version = _HEADER.unpack_from(data, 0)[1]
        self.logged: array[int] = array("Q")  # the log-entries section
        self.live: dict[int, int] = {}  # the state's per-bucket counts, rebuilt
        self.bodies: list[bytes] = []
        self.props: list[dict[str, Any]] = []
        self.names: dict[bytes, str] = {}

    def value(self) -> Any:
        v, self.pos = decode_from(self.data, self.pos)
        return v

    def u32(self) -> int:
        n: int = _U32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return n

    def count(self, what: str) -> int:
        n = self.u32()
        _expect(n <= len(self.data) - self.pos, f"{what}: count {n} past the end")
        return n

    def _name(self, raw: bytes) -> str:
        """One str per distinct exchange or routing key, not one per message
        (the same few recur)."""
        name = self.names.get(raw)
        if name is None:
            name = self.names[raw] = raw.decode()
        return name

    def _logged(self, idx: int, n: int) -> None:
        """`n` messages in the entry at `idx`: it must be in the log-entries
        section; they count in its bucket's live count."""
        logged = self.logged
        k = bisect_left(logged, idx)
        _expect(k < len(logged) and logged[k] == idx, f"message at log index {idx} not in the log-entries section")
        b = idx >> BUCKET_SHIFT
        self.live[b] = self.live.get(b, 0) + n

    def plain_ready(self, ready: PackedFifo) -> bool:
        """The next message, if plain (in the log, never delivered: most of
        a backlog), straight into `ready` without a Message (restart time);
        False, and nothing read, for any other."""
        data, pos = self.data, self.pos
        (seq, expires, count, flags, n_ex, n_rk, n, priority, acquired,
         deadline) = _MSG4.unpack_from(data, pos)
        if (flags & ~(_PERSISTENT | _EXPIRES) != _PLAIN or count or acquired or deadline):
            return False
        pos += _MSG4.size
        end = pos + n_ex + n_rk
        _expect(end + _LOC.size <= len(data), "message truncated")
        idx, at, n_props = _LOC.unpack_from(data, end)
        if at >= 1 << 31:
            return False
        exchange, rk = self._name(data[pos:pos + n_ex]), self._name(data[pos + n_ex:end])
        self._logged(idx, 1)
        ready.append_plain(seq, exchange, rk, idx, (at << 32) | n_props, n, priority,
                           bool(flags & _PERSISTENT), expires if flags & _EXPIRES else None)
        self.pos = end + _LOC.size
        return True

    def message(self) -> Message:
        data = self.data
        pos = self.pos
        acquired, deadline = 0, 0.0
        if self.version >= 4:
            (seq, expires, count, flags, n_ex, n_rk, n, priority, acquired,
             deadline) = _MSG4.unpack_from(data, pos)
            pos += _MSG4.size
        elif self.version >= 3:
            seq, expires, count, flags, n_ex, n_rk, n, priority = _MSG3.unpack_from(data, pos)
            pos += _MSG3.size
        else:
            seq, expires, count, flags, n_ex, n_rk, n = _MSG.unpack_from(data, pos)
            pos += _MSG.size
            priority = -1
        end = pos + n_ex + n_rk
        _expect(end <= len(data), "message truncated")
        exchange, rk = self._name(data[pos:pos + n_ex]), self._name(data[pos + n_ex:end])
        pos = end
        loc: int | None = None
        if flags & _HAS_LOC:
            idx, at, n_props = _LOC.unpack_from(data, pos)
            pos += _LOC.size
            self._logged(idx, 1)
            loc = make_loc(idx, at, n_props)
        props: dict[str, Any] | None
        if flags & _PROPS_LOGGED:
            _expect(loc is not None, "properties in the log without a place there")
            props = None
        elif flags & _PROPS_EMPTY:
            props = {}
        elif flags & _PROPS_REF:
            props = _at(self.props, _U32.unpack_from(data, pos)[0], "properties")
            pos += 4
        else:
            props, pos = decode_from(data, pos)
            _expect(type(props) is dict, "message properties")
            self.props.append(props)
        body: bytes | None
        if flags & _BODY_LOGGED:
            _expect(loc is not None, "a body in the log without a place there")
            body = None
        elif flags & _BODY_REF:
            body = _at(self.bodies, n, "body")
        else:
            end = pos + n
            _expect(end <= len(data), "message body truncated")
            body = data[pos:end]
            pos = end
            self.bodies.append(body)
        self.pos = pos
        m = Message.__new__(Message)
        m.seq, m.exchange, m.routing_key, m.props, m.body = seq, exchange, rk, props, body
        m.size = n if body is None else len(body)
        m.loc = loc
        m.priority = priority if priority >= 0 else raw_priority(props or {})
        m.persistent = bool(flags & _PERSISTENT)
        m.redelivered = bool(flags & _REDELIVERED)
        m.expires_at = expires if flags & _EXPIRES else None
        m.delivery_count = count
        m.acquired_count = acquired
        m.deadline = deadline or None
        return m
