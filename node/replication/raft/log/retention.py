"""The segments kept below Raft's start for the message store, and their compaction.

Snapshots hold messages' places in the log, not their bytes (issue 27 item
3), so a segment Raft no longer needs stays on disk and readable while the
`retain(first, last)` callback (the state's per-bucket counts) says live
messages are in it; release() deletes the others. import_records() writes a
sparse segment (`<first>-<last>.lseg`): the live entries a leader's snapshot
brought, or what compact() copies out of a mostly dead retained segment.
Retention is that half of SegmentLog (segment_log.py), a mixin over Recovery.
"""
from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterable

from crc32c import crc32c

from node.replication.raft.data_dir import PRIVATE_FILE
from node.replication.raft.log.fs import _fsync_dir
from node.replication.raft.log.handle import EntryHandle
from node.replication.raft.log.recovery import Recovery
from node.replication.raft.log.segment import (
    _REC,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    SPARSE,
    LogDamaged,
    _Segment,
    _unlink_segment,
)
from node.replication.raft.storage_fault import FSYNC, guarded, stop_if_fatal

log = logging.getLogger(__name__)

Retain = Callable[[int, int], bool]  # (first index, last index) of a segment -> keep it


class Retention(Recovery):
    """SegmentLog's retained segments: import, release, compaction."""

    COMPACT_BELOW = 0.25  # a retained segment is rewritten when its live records are under this share
    COMPACT_MIN_BYTES = 1 << 20  # (smaller ones are not worth it, unless segments are that small)

    segment_bytes: int
    retain: Retain | None
    granule: int
    compactions: int

    def import_records(self, records: Iterable[bytes]) -> _Segment | None:
        """Store records (as a leader's snapshot brought them, or a compaction
        copies them, each already checked, indices ascending) in a new sparse
        segment below Raft's start, synced before it is used; None if none."""
        tmp = os.path.join(self.dir, "import.lseg.tmp")
        with guarded(tmp, "create"):
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        seg = _Segment(tmp, 0, fd, sparse=True)
        op = "write"
        try:
            head = struct.pack("<8sHHIQ", MAGIC, FORMAT_VERSION, HEADER_SIZE, SPARSE, 0)
            head += struct.pack("<II", crc32c(head), 0)  # first index 0: the name says the range
            pending = [head]
            size = pos = HEADER_SIZE
            crc = 0
            assert seg.idxs is not None
            for raw in records:
                _length, _crc, idx, term = _REC.unpack_from(raw)
                if seg.idxs and idx <= seg.idxs[-1]:
                    raise ValueError(f"raft log: imported entry {idx} after {seg.idxs[-1]}")
                seg.idxs.append(idx)
                seg.offsets.append(pos)
                seg.terms.append(term)
                pending.append(raw)
                crc = crc32c(raw, crc)
                size += len(raw)
                pos += len(raw)
                if size >= 4 << 20:
                    os.write(fd, b"".join(pending))
                    pending, size = [], 0
            os.write(fd, b"".join(pending))
            op = FSYNC
            os.fsync(fd)
        except BaseException as exc:
            if isinstance(exc, OSError):
                stop_if_fatal(tmp, op, exc)
            seg.close()  # (not os.close: the segment's __del__ would close the number again)
            os.unlink(tmp)
            raise
        if not seg.idxs:
            seg.close()
            os.unlink(tmp)
            return None
        seg.end = seg.reserved = pos
        seg.first = seg.idxs[0]
        seg.path = os.path.join(self.dir, f"{seg.first:020d}-{seg.last:020d}.lseg")
        for old in [s for s in self.hidden if s.path == seg.path]:
            self.hidden.remove(old)  # the same range brought again (closed with its last handle)
        with guarded(tmp, "rename"):
            os.replace(tmp, seg.path)
        _fsync_dir(self.dir)
        seg.crc = int(crc)
        self._seal(seg)  # (replaces the index file of the same range brought before)
        self.hidden.append(seg)
        return seg

    def release(self) -> None:
        """Delete the hidden segments `retain` no longer keeps (call it when
        messages in them are gone)."""
        keep = []
        for seg in self.hidden:
            if self.retain is not None and len(seg.offsets) and self.retain(seg.first, seg.last):
                keep.append(seg)
                continue
            _unlink_segment(seg.path)  # its fd closes with the last EntryHandle on it (_Segment.__del__)
        if len(keep) != len(self.hidden):
            _fsync_dir(self.dir)
        self.hidden = keep
        if keep:
            self.compact()

    def compact(self) -> int:
        """Rewrite the live records of one mostly-dead retained segment (live
        records under COMPACT_BELOW of its bytes) into a sparse segment and
        delete it: a few messages never settled must not keep whole segments
        (RabbitMQ's quorum queues before 4.3 filled disks that way). One
        segment per call (the tick calls it every second); returns the bytes
        freed."""
        if self.retain is None:
            return 0
        for seg in list(self.hidden):
            if seg.end < min(self.COMPACT_MIN_BYTES, self.segment_bytes // 2) or seg.fd < 0:
                continue
            live = self._live_positions(seg)
            if len(live) == len(seg.offsets):
                continue
            live_bytes = sum(seg.span(p)[1] for p in live)
            if live_bytes > seg.end * self.COMPACT_BELOW:
                continue
            try:
                new = self.import_records(self._checked_record(seg, p) for p in live)
            except LogDamaged as exc:  # left as it is: a reader of that record stops the node
                log.error("raft log: %s not compacted: %s", seg.path, exc)
                continue
            self.hidden.remove(seg)
            if new is None or new.path != seg.path:
                _unlink_segment(seg.path)  # (readable until its last EntryHandle goes)
                _fsync_dir(self.dir)
            self.compactions += 1
            log.info("raft log: %s compacted: %d of %d records live, %d bytes freed", seg.path, len(live),
                     len(seg.offsets), seg.end - live_bytes)
            return seg.end - live_bytes
        return 0

    def _live_positions(self, seg: _Segment) -> list[int]:
        """Positions of the records `retain` keeps, asked per `granule` indices."""
        assert self.retain is not None
        g = self.granule
        idxs = seg.idxs
        out = []
        block, alive = -1, False
        for p in range(len(seg.offsets)):
            idx = idxs[p] if idxs is not None else seg.first + p
            b = idx // g
            if b != block:
                block, alive = b, self.retain(b * g, b * g + g - 1)
            if alive:
                out.append(p)
        return out

    def _checked_record(self, seg: _Segment, pos: int) -> bytes:
        start, size = seg.span(pos)
        idx = seg.idxs[pos] if seg.idxs is not None else seg.first + pos
        return EntryHandle(seg, start, size, idx).record()
