"""The Raft log on disk: segment files of bounded size, every record checksummed.

pysyncobj's FileJournal kept one mmap'd file and every entry also in a Python
list until the next snapshot (the heap grew with the backlog), with no
checksum and no version. This journal implements the same interface (add,
clear, deleteEntriesFrom/To, [i] and slices, len, the meta getters/setters)
with nothing per entry in the heap but 12 bytes in two arrays.

On disk, in <data dir>/log/:
- `<first raft index, 20 digits>.seg`: a 32-byte header (magic, format
  version, header size, first index, CRC32C of the header) then records,
  each `length u32 | crc32c u32 | index u64 | term u64 | payload`, where
  length counts index+term+payload and the CRC covers length, index, term
  and payload. A segment rolls over past `segment_bytes` (one record larger
  than that gets a segment of its own).
- `<first index>-<last index>.lseg`: a segment of selected entries (the
  same header with flag 1, the same records, indices ascending with gaps):
  the live entries a snapshot from the leader brought (snapshots hold
  messages' places in the log, not their bytes; issue 27 item 3). Always
  below Raft's start, searched before the other retained segments.
- `start`: the first index Raft sees (moves after a snapshot,
  deleteEntriesTo), versioned and checksummed, written by atomic replace.
Term, vote and commit index stay in FsyncMetaStorer's file (journal.py).

Durability: appends are pwrite()s into space reserved with fallocate (a full
disk is ENOSPC before anything is written, and nothing is appended); the
shim's group commit calls flush() once per tick, which fdatasyncs every
segment written since; a new segment file and the directory are fsync'd when
it is created.

Recovery (open): every record's CRC is verified. A bad record at the end of
the last segment with nothing after it but zeros (a write cut by a crash) is
truncated with an info line. Any other bad record (a flipped bit, a hole, a
bad header): that record and everything after it leave the log, with an
error line naming file and offset; Raft re-fetches them from the leader. On
a node without peers, damage at or below the stored commit index cannot be
repaired: LogDamaged is raised (the node refuses to start, one line).

The message store (issue 27 item 1, node/replication/message_store.py):
handle(idx) gives another thread an EntryHandle that preads and checks one
entry (it keeps its segment's fd open, so a segment released meanwhile stays
readable until the handle is gone), read(idx, offset, length) reads part of
an entry, and a `retain(first, last)` callback keeps segments Raft no longer
needs (below a snapshot) on disk and readable while it says live messages
are in them (the state's per-bucket counts).
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
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, overload

from crc32c import crc32c

from node.replication.raft.data_dir import PRIVATE_DIR, PRIVATE_FILE
from node.replication.raft.journal import FsyncMetaStorer, _fallocate, _fsync_dir
from node.replication.raft.segment_index import SUFFIX as INDEX_SUFFIX
from node.replication.raft.segment_index import crc_range, read_index, remove_index, write_index

log = logging.getLogger(__name__)

MAGIC = b"MQRAFTSG"
FORMAT_VERSION = 1
# magic, version, header size, reserved, first index, header crc, pad
_HEADER = struct.Struct("<8sHHIQII")
HEADER_SIZE = _HEADER.size  # 32
_REC = struct.Struct("<IIQQ")  # length, crc, index, term
REC_SIZE = _REC.size  # 24
_LEN = struct.Struct("<I")
_START = struct.Struct("<8sHQI")  # magic, version, first index, crc
START_MAGIC = b"MQRAFTST"
MAX_SEGMENT_BYTES = (1 << 32) - 1  # record offsets are array('I')
SPARSE = 1  # header flag: a segment of selected entries (.lseg)

Entry = tuple[bytes, int, int]  # (command, raft index, term), pysyncobj's shape
Retain = Callable[[int, int], bool]  # (first index, last index) of a segment -> keep it


class LogDamaged(Exception):
    """The log is damaged where this node cannot repair it (or is of a newer format)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path  # the segment whose record failed on read ("" at open)


def seg_name(first: int) -> str:
    return f"{first:020d}.seg"


def encode_record(command: bytes, idx: int, term: int) -> bytes:
    length = 16 + len(command)
    head = struct.pack("<IQQ", length, idx, term)
    crc = crc32c(command, crc32c(head))
    return _REC.pack(length, crc, idx, term) + command


def _record_crc(length: int, idx: int, term: int, payload: bytes | memoryview) -> int:
    return int(crc32c(payload, crc32c(struct.pack("<IQQ", length, idx, term))))


RECORD = _REC  # a record's header (length, crc, index, term), for readers of shipped records
record_crc = _record_crc


class _Segment:
    """One segment file: its fd, where each record starts, each record's term."""

    __slots__ = ("path", "first", "fd", "offsets", "terms", "end", "reserved", "no_fallocate", "dirty",
                 "idxs", "crc", "sealed", "unverified")

    def __init__(self, path: str, first: int, fd: int, sparse: bool = False) -> None:
        self.path = path
        self.first = first
        self.fd = fd
        self.offsets = array("I")
        self.terms = array("Q")
        # a sparse segment's record indices (ascending, with gaps); None: first, first+1, ...
        self.idxs: array[int] | None = array("Q") if sparse else None
        self.end = HEADER_SIZE
        self.reserved = 0
        self.no_fallocate = False
        self.dirty = False
        self.crc: int | None = 0  # CRC32C of the bytes after the header (None: not known yet)
        self.sealed = False  # never appended to again; its index file is written
        self.unverified = False  # taken from its index file unchecked: the scrub checks its CRC

    @property
    def last(self) -> int:  # first - 1 when empty
        idxs = self.idxs
        if idxs is not None:
            return idxs[-1] if idxs else self.first - 1
        return self.first + len(self.offsets) - 1

    def position(self, idx: int) -> int:
        """Where record `idx` is in the arrays; -1 if it is not here."""
        if not self.first <= idx <= self.last:
            return -1
        idxs = self.idxs
        if idxs is None:
            return idx - self.first
        k = bisect.bisect_left(idxs, idx)
        return k if k < len(idxs) and idxs[k] == idx else -1

    def span(self, pos: int) -> tuple[int, int]:
        start = self.offsets[pos]
        stop = self.offsets[pos + 1] if pos + 1 < len(self.offsets) else self.end
        return start, stop - start

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        # a released segment is unlinked but stays readable while an
        # EntryHandle (a delivery on its way to the event loop) holds it
        self.close()


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
        raw = os.pread(seg.fd, self.size, self.start)
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


def _unlink_segment(path: str) -> None:
    os.unlink(path)
    remove_index(path)


class SegmentLog:
    """pysyncobj's Journal interface over segment files (see the module doc)."""

    RESERVE = 1 << 20  # fallocate a MiB at a time
    COMPACT_BELOW = 0.25  # a retained segment is rewritten when its live records are under this share
    COMPACT_MIN_BYTES = 1 << 20  # (smaller ones are not worth it, unless segments are that small)

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

    # ------------------------------------------------------------ recovery
    def _read_start(self) -> int | None:
        try:
            with open(os.path.join(self.dir, "start"), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        if len(raw) == _START.size:
            magic, version, first, crc = _START.unpack(raw)
            if magic == START_MAGIC and crc == crc32c(raw[:-4]):
                if version > FORMAT_VERSION:
                    raise LogDamaged(f"{self.dir}/start: format version {version}, this build reads up to "
                                     f"{FORMAT_VERSION}")
                return int(first)
        log.error("raft log: %s/start is damaged; the log starts at its first segment", self.dir)
        return None

    def _write_start(self, first: int) -> None:
        body = struct.pack("<8sHQ", START_MAGIC, FORMAT_VERSION, first)
        path = os.path.join(self.dir, "start")
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            os.write(fd, body + struct.pack("<I", crc32c(body)))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(self.dir)

    def _open(self, repairable: bool) -> None:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(".seg"))
        start = self._read_start()
        commit = int(self._meta.get("raftCommitIndex", 0) or 0)
        scanned: list[_Segment] = []
        damage: tuple[str, int, str, int] | None = None  # (path, offset, why, first index lost)
        doomed: list[str] = []  # files to remove, once it is decided that the node starts
        paths = [os.path.join(self.dir, name) for name in names]
        # two at a time: a sealed segment is checked by one CRC over its bytes
        # (segment_index), which runs without the GIL
        # (the last segment is walked whatever the budget)
        verify = [self._take_budget(os.path.getsize(p)) for p in reversed(paths[:-1])][::-1] + [True]
        with ThreadPoolExecutor(2) as pool:
            found = list(pool.map(lambda k: self._scan(paths[k], last=k == len(paths) - 1, verify=verify[k]),
                                  range(len(paths))))
        for k, name in enumerate(names):
            path = paths[k]
            seg, bad = found[k]
            if damage is not None:  # everything after a damaged record leaves the log
                if seg is not None:
                    seg.close()
                doomed.append(path)
                continue
            if seg is not None:
                scanned.append(seg)
            else:
                doomed.append(path)
            if bad is not None:
                damage = (*bad, seg.last + 1 if seg is not None else self._first_of(name))
        while scanned and not scanned[-1].offsets:  # created, never written: no entries
            seg = scanned.pop()
            seg.close()
            doomed.append(seg.path)
        # Raft's part: the contiguous run of segments that ends the log and reaches back to `start`
        run: list[_Segment] = scanned[-1:]
        while len(run) < len(scanned) and (start is None or run[0].first > start):
            prev = scanned[-len(run) - 1]
            if prev.last + 1 != run[0].first:
                break
            run.insert(0, prev)
        if start is None:
            start = run[0].first if run else 0
        if run and start < run[0].first:  # entries start..run[0].first-1 are missing
            if damage is None or damage[3] > start:
                damage = (run[0].path, 0, f"entries from index {start} are missing", start)
            run = []
        elif run and start > run[-1].last + 1:  # everything Raft needs is gone
            run = []
        if damage is not None:
            path, offset, why, lost = damage
            if not repairable and lost <= commit:
                for seg in scanned:
                    seg.close()
                raise LogDamaged(f"{path} at offset {offset}: {why} (index {lost}, at or below the commit "
                                 f"index {commit}; a node without peers cannot re-fetch it)")
            line = (f"raft log damaged: {path} at offset {offset}: {why}; entries from index "
                    f"{max(lost, start)} on are dropped")
            log.error("%s%s", line, ", to be re-fetched from the leader" if repairable else "")
            self.recovered.append(line)
        for path in doomed:
            _unlink_segment(path)
        for seg in scanned:  # cut after its last good record (a no-op where it ends there)
            if seg.end < seg.reserved and (seg is scanned[-1] or damage is not None):
                self._truncate_file(seg, seg.end)
        in_run = {id(s) for s in run}
        self.hidden = [s for s in scanned if id(s) not in in_run]
        while run and run[0].last < start:
            self.hidden.append(run.pop(0))
        self.hidden += self._open_sparse()  # searched first (_locate goes from the end)
        self._segs = run
        self._firsts = [s.first for s in run]
        self._start = start if run else max(start, 1)
        if run:  # appended to from here on: no index file, its CRC kept from its bytes
            self._unseal(run[-1])
        for seg in self.hidden + run[:-1]:
            if not seg.sealed:
                self._seal(seg)
        self.unverified = [s for s in self.hidden + run if s.unverified]
        segment_files = {s.path for s in self.hidden + run}
        for name in os.listdir(self.dir):  # index files of segments no longer there, or cut short
            if name.endswith(INDEX_SUFFIX + ".tmp") or name.endswith(INDEX_SUFFIX) \
                    and os.path.join(self.dir, name[:-len(INDEX_SUFFIX)]) not in segment_files:
                os.unlink(os.path.join(self.dir, name))
        # no release() here: what the retained segments hold is known once the
        # snapshot is loaded (it holds their messages' places, not their bytes)
        if commit > self._last():
            self._meta["raftCommitIndex"] = max(self._last(), 1)  # the rest comes from the leader

    def _open_sparse(self) -> list[_Segment]:
        """The .lseg segments (entries a leader's snapshot brought), each read to
        its last good record; damage is reported (recovered) and cut off: the
        snapshot check after the load finds what is missing."""
        out = []
        for name in sorted(n for n in os.listdir(self.dir) if n.endswith(".lseg")):
            path = os.path.join(self.dir, name)
            seg, bad = self._scan(path, last=False, sparse=True, verify=self._take_budget(os.path.getsize(path)))
            if bad is not None:
                line = f"raft log damaged: {bad[0]} at offset {bad[1]}: {bad[2]}; the records from there on are dropped"
                log.error("%s", line)
                self.recovered.append(line)
                if seg is not None and seg.end < seg.reserved:
                    self._truncate_file(seg, seg.end)
            if seg is None or not seg.offsets:
                if seg is not None:
                    seg.close()
                _unlink_segment(path)
                continue
            assert seg.idxs is not None
            seg.first = seg.idxs[0]  # (its header says 0: written before the range was known)
            out.append(seg)
        return out

    @staticmethod
    def _first_of(name: str) -> int:
        try:
            return int(name.split(".")[0])
        except ValueError:
            return 0

    def _take_budget(self, size: int) -> bool:
        """Whether a sealed segment of `size` bytes is checked at open."""
        if self._verify_left is None:
            return True
        take = self._verify_left > 0
        self._verify_left -= size
        return take

    def _scan(self, path: str, last: bool, sparse: bool = False, verify: bool = True,
              ) -> tuple[_Segment | None, tuple[str, int, str] | None]:
        """Open a segment and index its records; (segment, damage) where damage
        is None, or (path, offset, why) with the segment cut at that offset."""
        fd = os.open(path, os.O_RDWR)
        size = os.fstat(fd).st_size
        head = os.pread(fd, HEADER_SIZE, 0)
        if len(head) < HEADER_SIZE:
            os.close(fd)
            if last and not head.strip(b"\0"):
                log.info("raft log: %s: a segment cut short at its creation, removed", path)
                return None, None
            return None, (path, 0, "header cut short")
        magic, version, hsize, flags, first, hcrc, _p = _HEADER.unpack(head)
        # a newer build's header has a valid CRC; with a bad one the version is
        # damage like any other (a flipped bit there refused to start a member
        # that could re-fetch the segment)
        if magic == MAGIC and version > FORMAT_VERSION and hcrc == crc32c(head[:24]):  # never drop it
            os.close(fd)
            raise LogDamaged(f"{path}: segment format version {version}, this build reads up to {FORMAT_VERSION}")
        if magic != MAGIC or hcrc != crc32c(head[:24]) or hsize != HEADER_SIZE \
                or bool(flags & SPARSE) != sparse:
            os.close(fd)
            return None, (path, 0, "bad segment header (magic, checksum or kind)")
        seg = _Segment(path, first, fd, sparse)
        seg.reserved = size
        if not last and self._load_index(seg, size, verify):
            return seg, None
        seg.crc = None
        with self._walk_lock:
            self.walked += 1
        remove_index(path)  # (not valid, or not there: the segment is written again if sealed)
        idxs = seg.idxs
        pos = HEADER_SIZE
        expect = first
        chunk = b""
        chunk_at = pos
        while pos + REC_SIZE <= size:
            # read ahead in 1 MiB chunks: one pread per record is slow on big logs
            if pos + REC_SIZE > chunk_at + len(chunk):
                chunk_at, chunk = pos, os.pread(fd, max(1 << 20, REC_SIZE), pos)
            length, crc, idx, term = _REC.unpack_from(chunk, pos - chunk_at)
            if length == 0 and crc == 0 and idx == 0:
                break  # preallocated zeros: the end
            stop = pos + 8 + length
            why = None
            if length < 16 or stop > size:
                why = f"record length {length} out of range"
            elif idx != expect if idxs is None else idx < expect:
                why = f"record index {idx}, expected {expect}"
            else:
                if stop > chunk_at + len(chunk):
                    chunk_at, chunk = pos, os.pread(fd, max(1 << 20, stop - pos), pos)
                payload = memoryview(chunk)[pos - chunk_at + REC_SIZE:stop - chunk_at]
                if _record_crc(length, idx, term, payload) != crc:
                    why = "checksum mismatch"
            if why is not None:
                # a write cut by a crash: only zeros (preallocated) follow
                if last and self._zeros_after(fd, min(stop, size) if length >= 16 else pos + REC_SIZE, size):
                    log.info("raft log: %s: a record cut short at offset %d (a write the crash "
                             "interrupted), truncated", path, pos)
                    seg.end = pos
                    return seg, None
                seg.end = pos
                return seg, (path, pos, why)
            seg.offsets.append(pos)
            seg.terms.append(term)
            if idxs is not None:
                idxs.append(idx)
                expect = idx
            expect += 1
            pos = stop
        seg.end = pos
        return seg, None

    @staticmethod
    def _load_index(seg: _Segment, size: int, verify: bool) -> bool:
        """Take a sealed segment's arrays from its index file if that is valid
        and (verify) the segment's bytes still have its CRC, and nothing
        follows its end."""
        got = read_index(seg.path, seg.fd, seg.first, seg.idxs is not None, HEADER_SIZE, size, verify)
        if got is None:
            return False
        (offsets, terms, idxs), end, seg.crc = got
        seg.unverified = not verify
        tail = os.pread(seg.fd, REC_SIZE, end)
        if tail.count(0) != len(tail):  # records after the indexed end: walk it
            return False
        seg.offsets, seg.terms, seg.end = offsets, terms, end
        if idxs is not None:
            seg.idxs = idxs
        seg.sealed = True
        return True

    def _seal(self, seg: _Segment) -> None:
        """Write a segment's index file: it is never appended to again."""
        if seg.sealed or not seg.offsets or seg.fd < 0:
            return
        try:
            if seg.crc is None:
                seg.crc = crc_range(seg.fd, HEADER_SIZE, seg.end)
            write_index(seg.path, seg.first, seg.end, seg.crc, seg.offsets, seg.terms, seg.idxs)
        except OSError as exc:  # only a cache: the next start walks this segment
            log.warning("raft log: index of %s not written: %s", seg.path, exc)
            return
        seg.sealed = True

    @staticmethod
    def _unseal(seg: _Segment) -> None:
        """A segment appended to or cut again: its index file goes."""
        seg.unverified = False  # (its records are checked as read)
        if seg.sealed:
            remove_index(seg.path)
            seg.sealed = False
            seg.crc = None
        if seg.crc is None and seg.fd >= 0:
            seg.crc = crc_range(seg.fd, HEADER_SIZE, seg.end)

    def unchecked(self, path: str) -> bool:
        """Whether `path` is a segment the start took unchecked and the scrub
        has not checked yet (its index file goes: the next start walks it)."""
        for seg in list(self.unverified):
            if seg.path == path and seg.unverified:
                remove_index(path)
                return True
        return False

    def scrub(self, stop: threading.Event, rate: float, on_damage: Callable[[str], None]) -> None:
        """Check the CRC of every sealed segment open() took unchecked (on its
        own thread, at most `rate` bytes a second). A mismatch: its index file
        goes and on_damage(path) is called (the node restarts, and the open
        walks that segment and drops the damaged record and what follows, as
        at any start). Reads of single records check their own CRC meanwhile."""
        began = time.monotonic()
        checked = 0
        for seg in list(self.unverified):
            if stop.is_set():
                return
            try:  # its own fd: the raft thread may close and unlink the segment meanwhile
                fd = os.dup(seg.fd)
            except OSError:
                continue
            try:
                if os.fstat(fd).st_ino != os.stat(seg.path).st_ino:
                    continue  # released, or another file at that path now
                crc = crc_range(fd, HEADER_SIZE, seg.end, rate, stop)
            except OSError:
                continue
            finally:
                os.close(fd)
            if stop.is_set():
                return
            if not seg.unverified:  # cut or appended to meanwhile (its records are checked as read)
                continue
            if crc != seg.crc:
                remove_index(seg.path)
                on_damage(seg.path)
                return
            seg.unverified = False
            checked += seg.end
        self.unverified = []
        if checked:
            log.info("raft log: %d MB of sealed segments checked in the background in %.1f s",
                     checked >> 20, time.monotonic() - began)

    @staticmethod
    def _zeros_after(fd: int, pos: int, size: int) -> bool:
        while pos < size:
            block = os.pread(fd, min(1 << 20, size - pos), pos)
            if not block or block.count(0) != len(block):
                return not block
            pos += len(block)
        return True

    def _truncate_file(self, seg: _Segment, pos: int) -> None:
        seg.unverified = False
        if seg.sealed:
            remove_index(seg.path)
            seg.sealed = False
        os.ftruncate(seg.fd, pos)
        os.fsync(seg.fd)
        seg.end = pos
        seg.reserved = pos
        seg.crc = None

    # ----------------------------------------------------------- appends
    def _new_segment(self, first: int) -> _Segment:
        path = os.path.join(self.dir, seg_name(first))
        for seg in [s for s in self.hidden if s.path == path]:  # (retained, same first index)
            log.warning("raft log: retained segment %s replaced by a new one", path)
            self.hidden.remove(seg)  # (closed with its last EntryHandle)
            _unlink_segment(path)  # a new inode: a handle still on the old one reads the old bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            head = struct.pack("<8sHHIQ", MAGIC, FORMAT_VERSION, HEADER_SIZE, 0, first)
            head += struct.pack("<II", crc32c(head), 0)
            if os.pwrite(fd, head, 0) != HEADER_SIZE:
                raise OSError(errno.ENOSPC, "short write of a segment header")
            os.fsync(fd)
            _fsync_dir(self.dir)
        except OSError:
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
                self._write_start(idx)
                self._start = idx
            self._segs.append(seg)
            self._firsts.append(idx)
        end = seg.end + len(record)
        if end > MAX_SEGMENT_BYTES:
            raise OSError(errno.EFBIG, "raft log: record too large for a segment")
        self._reserve(seg, end)
        written = os.pwrite(seg.fd, record, seg.end)
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
                    os.fdatasync(seg.fd)
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

    def import_records(self, records: Iterable[bytes]) -> _Segment | None:
        """Store records (as a leader's snapshot brought them, or a compaction
        copies them, each already checked, indices ascending) in a new sparse
        segment below Raft's start, synced before it is used; None if none."""
        tmp = os.path.join(self.dir, "import.lseg.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        seg = _Segment(tmp, 0, fd, sparse=True)
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
            os.fsync(fd)
        except BaseException:
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
        os.replace(tmp, seg.path)
        _fsync_dir(self.dir)
        seg.crc = int(crc)
        self._seal(seg)  # (replaces the index file of the same range brought before)
        self.hidden.append(seg)
        return seg

    def _record(self, idx: int) -> tuple[bytes, int]:
        """(the record's bytes, term) read back and verified."""
        seg, pos = self._locate(idx)
        start, size = seg.span(pos)
        raw = os.pread(seg.fd, size, start)
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
        self._write_start(new_start)
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
