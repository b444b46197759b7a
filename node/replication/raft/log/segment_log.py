"""SegmentLog: pysyncobj's Journal interface over the log's segment files.

pysyncobj's FileJournal kept one mmap'd file and every entry also in a Python
list until the next snapshot (the heap grew with the backlog), with no
checksum and no version. This journal implements the same interface (add,
clear, deleteEntriesFrom/To, [i] and slices, len, the meta getters/setters)
with nothing per entry in the heap but 12 bytes in two arrays (segment.py).

Durability: appends are pwrite()s into space reserved with fallocate (a full
disk is ENOSPC before anything is written, and nothing is appended); the
shim's group commit calls flush() once per tick, which fdatasyncs every
segment written since; a new segment file and the directory are fsync'd when
it is created. An error that says the disk can no longer be trusted (EIO,
EROFS, the directory gone, any failed fdatasync) stops the node
(storage_fault.py); a full disk does not.

For the message store: handle(idx) gives another thread an EntryHandle
(handle.py), read(idx, offset, length) reads part of an entry, also from a
segment kept below Raft's start for its live messages (retention.py).
Opening and checking the log: recovery.py. SegmentLog is Recovery, then
Retention, then this file's appends, reads, truncations and meta.
"""
from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from crc32c import crc32c

from node.replication.raft.data_dir import PRIVATE_DIR, PRIVATE_FILE
from node.replication.raft.log.fs import _fallocate, _fsync_dir
from node.replication.raft.log.handle import EntryHandle, _Entries
from node.replication.raft.log.meta import FsyncMetaStorer
from node.replication.raft.log.retention import Retain, Retention
from node.replication.raft.log.segment import (
    _REC,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    MAX_SEGMENT_BYTES,
    REC_SIZE,
    Entry,
    LogDamaged,
    _record_crc,
    _Segment,
    _unlink_segment,
    encode_record,
    seg_name,
)
from node.replication.raft.log.start import write_start
from node.replication.raft.storage_fault import FSYNC, stop_if_fatal

log = logging.getLogger(__name__)


class SegmentLog(Retention):
    """pysyncobj's Journal interface over segment files (see the module doc)."""

    RESERVE = 1 << 20  # fallocate a MiB at a time

    def __init__(self, directory: str, meta_path: str, segment_bytes: int = 64 << 20,
                 repairable: bool = True, cache_bytes: int = 8 << 20, retain: Retain | None = None,
                 granule: int = 16, verify_bytes: int | None = None) -> None:
        if not 4096 <= segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes {segment_bytes} outside 4096..{MAX_SEGMENT_BYTES}")
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.retain = retain
        self.granule = granule  # how finely `retain` tells live entries apart (compaction)
        self.compactions = 0
        self._segs: list[_Segment] = []  # Raft's log: contiguous indices
        self._firsts: list[int] = []  # their first indices (bisect)
        self._start = 0  # first index Raft sees (inside _segs[0])
        self.hidden: list[_Segment] = []  # below Raft's start, kept for `retain`
        self._cache: OrderedDict[int, Entry] = OrderedDict()
        self._cache_bytes = 0
        self._cache_cap = cache_bytes
        self._cache_mark = 0  # age_cache: the last index at its last call
        self._meta_storer = FsyncMetaStorer(meta_path)
        self._meta: dict[str, Any] = self._meta_storer.getMeta()
        self._meta_saved = True
        self.recovered: list[str] = []  # what open() dropped, one line each (tests, status)
        self.walked = 0  # segments open() read record by record (no valid index file)
        # sealed segments are checked at open, newest first, up to this many
        # bytes (None: all); the rest after the start, by scrub()
        self._verify_left = verify_bytes
        self.unverified: list[_Segment] = []
        self._walk_lock = threading.Lock()  # (open() reads two segments at a time)
        os.makedirs(directory, mode=PRIVATE_DIR, exist_ok=True)
        began = time.monotonic()
        self._open(repairable)
        segs = self._segs + self.hidden
        if segs:
            log.info("raft log opened in %.2f s: %d segments, %d MB (%d MB left to the background check), "
                     "%d of them record by record", time.monotonic() - began, len(segs),
                     sum(s.end for s in segs) >> 20, sum(s.end for s in self.unverified) >> 20, self.walked)

    # ----------------------------------------------------------- appends
    def _new_segment(self, first: int) -> _Segment:
        path = os.path.join(self.dir, seg_name(first))
        for seg in [s for s in self.hidden if s.path == path]:  # (retained, same first index)
            log.warning("raft log: retained segment %s replaced by a new one", path)
            self.hidden.remove(seg)  # (closed with its last EntryHandle)
            _unlink_segment(path)  # a new inode: a handle still on the old one reads the old bytes
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        except OSError as exc:
            stop_if_fatal(path, "create", exc)  # (ENOENT: the log's directory is gone)
            raise
        op = "write"
        try:
            head = struct.pack("<8sHHIQ", MAGIC, FORMAT_VERSION, HEADER_SIZE, 0, first)
            head += struct.pack("<II", crc32c(head), 0)
            if os.pwrite(fd, head, 0) != HEADER_SIZE:
                raise OSError(errno.ENOSPC, "short write of a segment header")
            op = FSYNC
            os.fsync(fd)
            _fsync_dir(self.dir)
        except OSError as exc:
            stop_if_fatal(path, op, exc)
            os.close(fd)
            os.unlink(path)
            raise
        seg = _Segment(path, first, fd)
        seg.reserved = HEADER_SIZE
        return seg

    def _reserve(self, seg: _Segment, end: int) -> None:
        if end <= seg.reserved or seg.no_fallocate:
            return
        upto = max(end, min(seg.reserved + self.RESERVE, self.segment_bytes))
        try:
            _fallocate(seg.fd, seg.reserved, upto - seg.reserved)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                stop_if_fatal(seg.path, "fallocate", exc)
                raise  # ENOSPC: nothing written, nothing appended
            seg.no_fallocate = True  # (FUSE): pwrite still reports a full disk itself
        else:
            seg.reserved = upto

    def add(self, command: Any, idx: int, term: int) -> None:
        data = command if isinstance(command, bytes) else bytes(command)
        if self._segs and idx != self._last() + 1:
            raise ValueError(f"raft log: append of index {idx} after {self._last()}")
        record = encode_record(data, idx, term)
        seg = self._segs[-1] if self._segs else None
        if seg is None or (seg.offsets and seg.end + len(record) > self.segment_bytes):
            if seg is not None:
                self._seal(seg)
            seg = self._new_segment(idx)
            if not self._segs:
                write_start(self.dir, idx)
                self._start = idx
            self._segs.append(seg)
            self._firsts.append(idx)
        end = seg.end + len(record)
        if end > MAX_SEGMENT_BYTES:
            raise OSError(errno.EFBIG, "raft log: record too large for a segment")
        self._reserve(seg, end)
        try:
            written = os.pwrite(seg.fd, record, seg.end)
        except OSError as exc:
            stop_if_fatal(seg.path, "write", exc)
            raise
        if written != len(record):  # a full disk without fallocate
            raise OSError(errno.ENOSPC, "raft log: short write")
        seg.offsets.append(seg.end)
        seg.terms.append(term)
        seg.end = end
        seg.dirty = True
        if seg.crc is not None:
            seg.crc = crc32c(record, seg.crc)
        self._remember(idx, (data, idx, term))

    sync_appends = True  # False only in the broken build (RaftConfig.unsafe_no_fsync)

    def flush(self) -> None:
        for seg in self._segs:
            if seg.dirty:
                if self.sync_appends:
                    try:
                        os.fdatasync(seg.fd)
                    except OSError as exc:  # never retried as if it had worked (fsyncgate)
                        stop_if_fatal(seg.path, FSYNC, exc)
                        raise
                seg.dirty = False

    # ------------------------------------------------------------- reads
    def _last(self) -> int:
        return self._segs[-1].last if self._segs else self._start - 1

    @property
    def meta_damaged(self) -> bool:
        """The meta file was unreadable at open: term 0, and the vote cast is unknown."""
        return bool(self._meta_storer.damaged)

    def first_index(self) -> int:
        return self._start

    def last_index(self) -> int:
        return self._last()

    def __len__(self) -> int:
        return self._last() - self._start + 1 if self._segs else 0

    def __getitem__(self, item: int | slice) -> Any:
        n = len(self)
        if isinstance(item, slice):
            lo, hi, step = item.indices(n)
            if step == 1:  # read as used: pysyncobj asks for whole tails (all of it at a restart)
                return _Entries(self, self._start + lo, max(0, hi - lo))
            return [self._entry(self._start + i) for i in range(lo, hi, step)]
        i = item + n if item < 0 else item
        if not 0 <= i < n:
            raise IndexError("raft log index out of range")
        return self._entry(self._start + i)

    def term_at(self, idx: int) -> int:
        seg, pos = self._locate(idx)
        return int(seg.terms[pos])

    def _locate(self, idx: int) -> tuple[_Segment, int]:
        k = bisect.bisect_right(self._firsts, idx) - 1
        if k >= 0 and self._segs[k].first <= idx <= self._segs[k].last:
            return self._segs[k], idx - self._segs[k].first
        # newest first: what a leader's snapshot brought, then what left Raft's
        # part last (clear() puts a follower's replaced log, which may hold
        # entries the leader overwrote, at the front)
        for seg in reversed(self.hidden):
            pos = seg.position(idx)
            if pos >= 0:
                return seg, pos
        raise IndexError(f"raft log: no entry {idx}")

    def missing(self, indices: Iterable[int]) -> list[int]:
        """Those of `indices` (ascending) that are not readable here: one look
        per index, trying the segment of the previous hit first (a snapshot
        names tens of thousands of entries, mostly neighbours)."""
        out = []
        seg: _Segment | None = None
        for idx in indices:
            if seg is not None and seg.position(idx) >= 0:
                continue
            try:
                seg, _pos = self._locate(idx)
            except IndexError:
                out.append(idx)
        return out

    def has(self, idx: int) -> bool:
        """Whether entry `idx` is readable here (Raft's part or retained)."""
        try:
            self._locate(idx)
        except IndexError:
            return False
        return True

    def _record(self, idx: int) -> tuple[bytes, int]:
        """(the record's bytes, term) read back and verified."""
        seg, pos = self._locate(idx)
        start, size = seg.span(pos)
        try:
            raw = os.pread(seg.fd, size, start)
        except OSError as exc:
            stop_if_fatal(seg.path, "read", exc)
            raise
        length, crc, ridx, term = _REC.unpack_from(raw)
        if len(raw) != size or length != size - 8 or ridx != idx \
                or _record_crc(length, ridx, term, memoryview(raw)[REC_SIZE:]) != crc:
            raise LogDamaged(f"{seg.path} at offset {start}: record {idx} fails its checksum on read", seg.path)
        return raw, term

    def _entry(self, idx: int) -> Entry:
        hit = self._cache.get(idx)
        if hit is not None:
            return hit
        raw, term = self._record(idx)
        entry = (raw[REC_SIZE:], idx, term)
        self._remember(idx, entry)
        return entry

    def handle(self, idx: int) -> EntryHandle:
        """A handle on entry `idx` (also in a retained segment) for a reader on
        another thread (raft thread only: it reads the index arrays)."""
        seg, pos = self._locate(idx)
        start, size = seg.span(pos)
        return EntryHandle(seg, start, size, idx)

    def read(self, idx: int, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` inside entry `idx`'s payload, also from a
        retained segment below Raft's start. The record's CRC is checked."""
        raw, _term = self._record(idx)
        if offset < 0 or length < 0 or REC_SIZE + offset + length > len(raw):
            raise ValueError(f"raft log: read past entry {idx}")
        return raw[REC_SIZE + offset:REC_SIZE + offset + length]

    def _remember(self, idx: int, entry: Entry) -> None:
        cache = self._cache
        if idx in cache:
            return
        cache[idx] = entry
        self._cache_bytes += len(entry[0])
        while self._cache_bytes > self._cache_cap and len(cache) > 1:
            _k, old = cache.popitem(last=False)
            self._cache_bytes -= len(old[0])

    def age_cache(self) -> int:
        """Called now and then (every CACHE_IDLE_CHECK s): the cached entries
        appended before the last call go, whatever their bytes (an idle or
        drained node holds only what the last seconds appended, not up to
        `cache_bytes` of old entries). Returns how many went."""
        mark, self._cache_mark = self._cache_mark, self.last_index()
        cache = self._cache
        old = [k for k in cache if k <= mark]
        for k in old:
            self._cache_bytes -= len(cache.pop(k)[0])
        return len(old)

    def _forget(self, lo: int, hi: int) -> None:
        for k in [k for k in self._cache if lo <= k <= hi]:
            self._cache_bytes -= len(self._cache.pop(k)[0])

    # ------------------------------------------------------ truncations
    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 - pysyncobj's name
        """Drop entries from position entryFrom on (a conflict with the leader)."""
        if not self._segs or entryFrom >= len(self):
            return
        cut = self._start + max(entryFrom, 0)
        self._forget(cut, self._last())
        while self._segs and self._segs[-1].first >= cut and len(self._segs) > 1:
            self._drop_tail_segment()
        seg = self._segs[-1]
        self._unseal(seg)  # appended to again
        pos = max(cut - seg.first, 0)
        if pos < len(seg.offsets):
            end = seg.offsets[pos]
            del seg.offsets[pos:]
            del seg.terms[pos:]
            # on disk at once: a stale record left past the end could come back at a restart
            self._truncate_file(seg, end)
        if cut <= self._start:  # everything: an empty log (pysyncobj never does this)
            self._drop_tail_segment()

    def _drop_tail_segment(self) -> None:
        seg = self._segs.pop()
        self._firsts.pop()
        seg.close()
        _unlink_segment(seg.path)
        _fsync_dir(self.dir)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 - pysyncobj's name
        """Raft forgets entries before position entryTo (they are in a snapshot);
        whole segments below are deleted unless `retain` keeps them."""
        if entryTo <= 0 or not self._segs:
            return
        new_start = self._start + min(entryTo, len(self) - 1)
        self._forget(self._start, new_start - 1)
        write_start(self.dir, new_start)
        self._start = new_start
        while len(self._segs) > 1 and self._segs[0].last < new_start:
            self.hidden.append(self._segs.pop(0))
            self._firsts.pop(0)
        self.release()

    def clear(self) -> None:
        """An empty log (a snapshot from the leader replaces it): every segment
        is dropped or, if retained, hidden. The next add starts a new segment."""
        self._cache.clear()
        self._cache_bytes = 0
        if self._segs:
            self._start = self._last() + 1
            self._seal(self._segs[-1])
        self.hidden[:0] = self._segs  # searched last: entries the leader may have overwritten
        self._segs = []
        self._firsts = []
        self.release()

    def reset(self) -> None:
        """Forget every entry (a member whose state cannot be rebuilt here
        starts over and is repaired by the leader): every segment file goes,
        the commit index is 0; term and vote stay (Raft's promises)."""
        for seg in self.hidden + self._segs:
            seg.close()
            _unlink_segment(seg.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, "start"))
        _fsync_dir(self.dir)
        self.hidden, self._segs, self._firsts = [], [], []
        self._start = 1
        self._cache.clear()
        self._cache_bytes = 0
        self._meta["raftCommitIndex"] = 0
        self._meta_storer.storeMeta(self._meta)
        self._meta_saved = True

    # --------------------------------------------------------- meta
    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802,N803 - pysyncobj's names
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return int(self._meta.get("raftCommitIndex", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802,N803
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._meta_storer.storeMeta(self._meta)  # before any message reflecting them
        self._meta_saved = True

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:  # noqa: N802
        return self._meta.get("votedForNodeId")

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if not self._meta_saved:
            self._meta_storer.storeMeta(self._meta)
            self._meta_saved = True

    # --------------------------------------------------------- sizes, end
    def bytes_used(self) -> int:
        """Bytes of Raft's part of the log (what a snapshot would compact)."""
        if not self._segs:
            return 0
        first = self._segs[0]
        start, _n = first.span(self._start - first.first)
        return sum(s.end for s in self._segs) - start

    def segment_files(self) -> list[str]:
        return [s.path for s in self.hidden + self._segs]

    def _destroy(self) -> None:
        self.flush()
        self.onOneSecondTimer()
        for seg in self.hidden + self._segs:
            seg.close()
