"""Version 5 (issue 27): a queue's ready messages as its packed index's
columns (node/broker/fifo.py), as they are in memory, written by
_write_packed and read by _PackedReader.

  u64 count, u64 how many are not persistent, the int64 x 4 records, a u8
  flag and the float64 expiries if any message has one, the (exchange,
  routing key) table (one codec value), u32 per message indexing it
  (0xFFFFFFFF: a message kept as an object, written after, in order, as any
  message).

A restart reads a backlog with a few large copies instead of a struct per
message; the log-entries check and the live counts run per distinct entry
(the records of a queue are in log order).
"""
from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from typing import Any

from node.broker.fifo import CHUNK, PackedFifo
from node.replication.format import little_endian
from node.replication.raft.snapshot.envelope import (
    _U64,
    SnapshotFormatError,
    _expect,
    _list,
    _Writer,
)
from node.replication.raft.snapshot.message import _MessageReader, _MessageWriter

_NO_PAIR = 0xFFFFFFFF  # version 5: a ready message written as an object
_POSITIVE_TOP = bytes(range(128))  # an int64's last byte (little-endian) when it is >= 0


def _write_packed(w: _Writer, ready: PackedFifo, msgs: _MessageWriter) -> None:
    """PackedFifo.columns() as one piece each, written a chunk at a time."""
    table: list[tuple[str, str]] = []
    at: dict[int, int] = {}  # id of a shared pair -> its place in the table
    objects = []
    for _nums, _exp, refs in ready.column_chunks():  # the table first (it precedes the ids)
        for r in refs:
            if type(r) is tuple:
                if id(r) not in at:
                    at[id(r)] = len(table)
                    table.append(r)
            else:
                objects.append(r)
    w.out.append(_U64.pack(len(ready)))
    w.out.append(_U64.pack(ready.transient))
    for k, (nums, _exp, _refs) in enumerate(ready.column_chunks()):
        w.out.append(little_endian(nums))
        _flush_every(w, k)
    if not ready.has_expiry():
        w.out.append(b"\x00")
    else:
        w.out.append(b"\x01")
        for k, (_nums, exp, refs) in enumerate(ready.column_chunks()):
            w.out.append(bytes(8 * len(refs)) if exp is None else little_endian(exp))
            _flush_every(w, k)
    w.value(table)
    for k, (_nums, _exp, refs) in enumerate(ready.column_chunks()):
        w.out.append(little_endian(array("I", [at[id(r)] if type(r) is tuple else _NO_PAIR for r in refs])))
        _flush_every(w, k)
    for m in objects:
        msgs.write(m)
        w.maybe_flush()


def _flush_every(w: _Writer, k: int) -> None:
    if k & 63 == 63:  # 64 chunks: 4 MiB of records
        w.flush()


class _PackedReader(_MessageReader):
    """The snapshot body's reader of version-5 ready columns."""

    def _column(self, typecode: str, n: int, what: str) -> array[Any]:
        a = array(typecode)
        size = a.itemsize * n
        _expect(size <= len(self.data) - self.pos, f"{what} past the end")
        a.frombytes(memoryview(self.data)[self.pos:self.pos + size])  # one copy, not two
        if sys.byteorder != "little":
            a.byteswap()
        self.pos += size
        return a

    def packed(self) -> PackedFifo:
        """Version 5: a queue's ready messages as columns."""
        n, transient = _U64.unpack_from(self.data, self.pos)[0], _U64.unpack_from(self.data, self.pos + 8)[0]
        self.pos += 16
        _expect(transient <= n, "ready messages: more transient than there are")
        # no field is negative: no int64's top byte has its sign bit set (C speed,
        # where min() made 40M Python ints at 10M messages)
        _expect(32 * n <= len(self.data) - self.pos, "ready records past the end")
        records = memoryview(self.data)[self.pos:self.pos + 32 * n]
        top = bytes(records[7::8])
        _expect(not top.translate(None, _POSITIVE_TOP), "ready records: a negative field")
        self.pos += 32 * n  # copied chunk by chunk below, once
        flag = self.data[self.pos]
        self.pos += 1
        _expect(flag in (0, 1), "ready expiries flag")
        exp = self._column("d", n, "ready expiries") if flag else None
        table = _list(self.value(), "ready routing table")
        pairs: dict[int, tuple[str, str] | None] = {}
        for i, t in enumerate(table):
            _expect(type(t) is tuple and len(t) == 2 and type(t[0]) is str and type(t[1]) is str,
                    "ready routing table entry")
            pairs[i] = t
        pairs[_NO_PAIR] = None
        ids = self._column("I", n, "ready references")
        parts: list[tuple[array[int], array[float] | None, list[Any]]] = []
        get = pairs.__getitem__
        swap = sys.byteorder != "little"
        for a in range(0, n, CHUNK):
            nums = array("q")
            nums.frombytes(records[32 * a:32 * min(a + CHUNK, n)])
            if swap:
                nums.byteswap()
            try:
                refs: list[Any] = list(map(get, ids[a:a + CHUNK]))
            except KeyError:
                raise SnapshotFormatError("ready message: routing table index out of range") from None
            parts.append((nums, None if exp is None else exp[a:a + CHUNK], refs))
        objects = ids.count(_NO_PAIR)
        k = -1
        for _ in range(objects):
            k = ids.index(_NO_PAIR, k + 1)
            parts[k // CHUNK][2][k % CHUNK] = self.message()
        col = array("q")  # the records' Raft indices: every fourth int64 from the second
        col.frombytes(records.cast("q")[1::4].tobytes())
        if swap:
            col.byteswap()
        if objects:
            col = array("q", (v for v, i in zip(col, ids, strict=True) if i != _NO_PAIR))
        self._count_packed(col)
        return PackedFifo.from_chunks(parts, transient, objects)

    def _count_packed(self, col: array[int]) -> None:
        """_logged for a queue's packed records (their Raft indices, `col`):
        once per distinct entry when in log order (they are: a queue takes
        them as they are applied)."""
        n = len(col)
        runs = []
        p = 0
        prev = -1
        while p < n:  # sorted iff every run is one value and the runs increase
            v = col[p]
            e = bisect_right(col, v, p)
            if v <= prev or col[p:e].count(v) != e - p:
                break
            runs.append((v, e - p))
            prev = v
            p = e
        else:
            for v, count in runs:
                self._logged(v, count)
            return
        for v in col:  # never written so; read anyway
            self._logged(v, 1)
