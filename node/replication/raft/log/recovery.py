"""Opening the Raft log: every segment read back and checked, damage cut off,
and the sealed segments' CRC checked in the background (scrub).

Every record's CRC is verified at open, a sealed segment's by the one CRC
its index file records (index.py; up to `verify_bytes`, newest first, the
rest by scrub()). A bad record at the end of the last segment with nothing
after it but zeros (a write cut by a crash) is truncated with an info line.
Any other bad record (a flipped bit, a hole, a bad header): that record and
everything after it leave the log, with an error line naming file and
offset; Raft re-fetches them from the leader. On a node without peers,
damage at or below the stored commit index cannot be repaired: LogDamaged
is raised (the node refuses to start, one line).

Recovery is the open/scan/seal half of SegmentLog (segment_log.py), a mixin.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crc32c import crc32c

from node.replication.raft.log.index import SUFFIX as INDEX_SUFFIX
from node.replication.raft.log.index import crc_range, read_index, remove_index, write_index
from node.replication.raft.log.segment import (
    _HEADER,
    _REC,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    REC_SIZE,
    SPARSE,
    LogDamaged,
    _record_crc,
    _Segment,
    _unlink_segment,
)
from node.replication.raft.log.start import read_start
from node.replication.raft.storage_fault import FSYNC, guarded, stop_if_fatal

log = logging.getLogger(__name__)


class Recovery:
    """SegmentLog's open (read, check and repair its segments), its sealing
    of segments (index files) and the background scrub."""

    dir: str
    _meta: dict[str, Any]
    _segs: list[_Segment]
    _firsts: list[int]
    _start: int
    hidden: list[_Segment]
    recovered: list[str]
    walked: int
    _verify_left: int | None
    unverified: list[_Segment]
    _walk_lock: threading.Lock

    def _last(self) -> int:
        raise NotImplementedError  # (SegmentLog's)

    def _open(self, repairable: bool) -> None:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(".seg"))
        start = read_start(self.dir)
        commit = int(self._meta.get("raftCommitIndex", 0) or 0)
        scanned: list[_Segment] = []
        damage: tuple[str, int, str, int] | None = None  # (path, offset, why, first index lost)
        doomed: list[str] = []  # files to remove, once it is decided that the node starts
        paths = [os.path.join(self.dir, name) for name in names]
        # two at a time: a sealed segment is checked by one CRC over its bytes
        # (index.py's crc_range), which runs without the GIL
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
            stop_if_fatal(seg.path, "write index of", exc)  # (but not on a broken disk)
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
                try:
                    if os.fstat(fd).st_ino != os.stat(seg.path).st_ino:
                        continue  # released, or another file at that path now
                except OSError:
                    continue  # (released meanwhile: ENOENT is no fault here)
                crc = crc_range(fd, HEADER_SIZE, seg.end, rate, stop)
            except OSError as exc:
                stop_if_fatal(seg.path, "read", exc)
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
        with guarded(seg.path, "truncate"):
            os.ftruncate(seg.fd, pos)
        with guarded(seg.path, FSYNC):
            os.fsync(seg.fd)
        seg.end = pos
        seg.reserved = pos
        seg.crc = None
