"""Entries read back from the log: EntryHandle and _Entries.

The message store (issue 27 item 1, node/replication/message_store.py) gets
from SegmentLog.handle(idx) an EntryHandle that preads and checks one entry
on another thread (it keeps its segment's fd open, so a segment released
meanwhile stays readable until the handle is gone). _Entries is what a slice
of the log gives pysyncobj: a run of entries read one by one when used.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, overload

from node.replication.raft.log.segment import (
    _REC,
    REC_SIZE,
    Entry,
    LogDamaged,
    _record_crc,
    _Segment,
)
from node.replication.raft.storage_fault import stop_if_fatal

if TYPE_CHECKING:
    from node.replication.raft.log.segment_log import SegmentLog


class EntryHandle:
    """One committed entry, readable from any thread: the segment (kept open
    while this handle lives) and where the record is in it. Made on the raft
    thread (SegmentLog.handle), read elsewhere: no index array is touched."""

    __slots__ = ("seg", "start", "size", "idx")

    def __init__(self, seg: _Segment, start: int, size: int, idx: int) -> None:
        self.seg = seg
        self.start = start
        self.size = size
        self.idx = idx

    def payload(self) -> bytes:
        """The entry's payload, its record's CRC checked (LogDamaged if not)."""
        return self.record()[REC_SIZE:]

    def record(self) -> bytes:
        """The whole record as on disk (header and payload), its CRC checked."""
        seg = self.seg
        try:
            raw = os.pread(seg.fd, self.size, self.start)
        except OSError as exc:  # (EBADF, a node stopping, is raised as it was)
            stop_if_fatal(seg.path, "read", exc)
            raise
        if len(raw) != self.size or len(raw) < REC_SIZE:
            raise LogDamaged(f"{seg.path} at offset {self.start}: record {self.idx} cut short on read", seg.path)
        length, crc, ridx, term = _REC.unpack_from(raw)
        if length != self.size - 8 or ridx != self.idx \
                or _record_crc(length, ridx, term, memoryview(raw)[REC_SIZE:]) != crc:
            raise LogDamaged(f"{seg.path} at offset {self.start}: record {self.idx} fails its checksum on read",
                             seg.path)
        return raw


class _Entries(Sequence[Entry]):
    """A run of entries read one by one when used, not all at once: pysyncobj
    slices the log from an index to its end (a restart applying the whole log,
    a follower checking an append), which held every entry of the run in the
    heap at once (the RSS after a restart). Used at once, never kept."""

    __slots__ = ("_log", "_lo", "_n")

    def __init__(self, log_: SegmentLog, lo: int, n: int) -> None:
        self._log = log_
        self._lo = lo
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, i: int) -> Entry: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Entry]: ...

    def __getitem__(self, i: int | slice) -> Entry | Sequence[Entry]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(self._n)
            if step == 1:
                return _Entries(self._log, self._lo + lo, max(0, hi - lo))
            return [self._log._entry(self._lo + k) for k in range(lo, hi, step)]
        k = i + self._n if i < 0 else i
        if not 0 <= k < self._n:
            raise IndexError("raft log index out of range")
        return self._log._entry(self._lo + k)
