"""One segment file of the Raft log: its header, its records and their CRC.

A segment (`<first index, 20 digits>.seg`, or `<first>-<last>.lseg` for the
selected entries a leader's snapshot brought: header flag SPARSE, indices
ascending with gaps) is a 32-byte header (magic, format version, header size,
flags, first index, CRC32C of the header) then records, each
`length u32 | crc32c u32 | index u64 | term u64 | payload`, where length
counts index+term+payload and the CRC covers length, index, term and
payload. Magic and version come from node/replication/format.py (SEGMENT).
_Segment is one open segment: its fd and, per record, where it starts and
its term (and, sparse, its index): 12 bytes in arrays, nothing else in the
heap.
"""
from __future__ import annotations

import bisect
import os
import struct
from array import array

from crc32c import crc32c

from node.replication import format
from node.replication.raft.log.index import remove_index
from node.replication.raft.storage_fault import guarded

MAGIC = format.SEGMENT.magic
FORMAT_VERSION = format.SEGMENT.version
# magic, version, header size, reserved, first index, header crc, pad
_HEADER = struct.Struct("<8sHHIQII")
HEADER_SIZE = _HEADER.size  # 32
_REC = struct.Struct("<IIQQ")  # length, crc, index, term
REC_SIZE = _REC.size  # 24
MAX_SEGMENT_BYTES = (1 << 32) - 1  # record offsets are array('I')
SPARSE = 1  # header flag: a segment of selected entries (.lseg)

Entry = tuple[bytes, int, int]  # (command, raft index, term), pysyncobj's shape


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


def _unlink_segment(path: str) -> None:
    with guarded(path, "unlink"):  # ENOENT: a segment went behind our back
        os.unlink(path)
        remove_index(path)
