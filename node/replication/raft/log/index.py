"""A sealed segment's index file: where its records are, so a restart need not
walk them.

Opening the log used to walk every record of every segment and check its CRC
in Python: 10M entries took 5.6 s on a warm page cache (issue 27's restart
target is 5 s for everything). A segment that will never be appended to again
(one Raft rolled over from, a retained one, an imported .lseg) gets
`<segment file>.idx` beside it (magic and version: node/replication/format.py,
SEGMENT_INDEX):

    magic "MQRAFTIX" | version u16 | flags u16 | count u32 | first u64 |
    end u64 | segment crc u32 | offsets u32 x count | terms u64 x count |
    (sparse: indices u64 x count) | crc32c of all the above u32

little-endian. `segment crc` is the CRC32C of the segment's bytes from its
header's end to `end`, kept as the records were appended. At open a segment
with a valid index file is checked by that one CRC, read at C speed on two
threads (about 10 GB/s here, against 2 GB/s for the walk), and its arrays are
taken from the file. Any mismatch (a flipped bit, a truncation, an index file
from before a rewrite) falls back to the walk, which finds and handles the
damaged record exactly as before: the index file is a cache, never trusted
over the segment. It is written without fsync for the same reason.
"""
from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import time
from array import array

from crc32c import crc32c

from node.replication import format
from node.replication.raft.data_dir import PRIVATE_FILE

MAGIC = format.SEGMENT_INDEX.magic
VERSION = format.SEGMENT_INDEX.version
SPARSE = 1
_HEAD = struct.Struct("<8sHHIQQI")  # magic, version, flags, count, first, end, segment crc
SUFFIX = ".idx"
_CHUNK = 4 << 20

Arrays = tuple["array[int]", "array[int]", "array[int] | None"]  # offsets, terms, indices (sparse)


def index_path(segment_path: str) -> str:
    return segment_path + SUFFIX


def _from_le(typecode: str, raw: memoryview) -> array[int]:
    a = array(typecode)
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def crc_range(fd: int, start: int, end: int, rate: float = 0.0, stop: threading.Event | None = None) -> int:
    """CRC32C of a file's bytes start..end (preadv into one buffer; both calls
    release the GIL, so two segments are checked at once on two cores); at
    most `rate` bytes a second if given; -1 if the file is shorter or `stop`
    is set meanwhile."""
    buf = bytearray(min(_CHUNK, max(end - start, 1)))
    view = memoryview(buf)
    crc = 0
    pos = start
    began = time.monotonic()
    while pos < end:
        n = os.preadv(fd, [view[:min(len(buf), end - pos)]], pos)
        if n <= 0:
            return -1  # shorter than the index says
        crc = crc32c(view[:n], crc)
        pos += n
        ahead = (pos - start) / rate - (time.monotonic() - began) if rate > 0 else 0.0
        if stop is not None:
            if stop.wait(ahead) if ahead > 0 else stop.is_set():
                return -1
        elif ahead > 0:
            time.sleep(ahead)
    return int(crc)


def write_index(segment_path: str, first: int, end: int, segment_crc: int, offsets: array[int],
                terms: array[int], idxs: array[int] | None) -> None:
    """Write (replace) the index file of a sealed segment. Not fsync'd: after a
    crash it is either whole and right or fails its own CRC."""
    head = _HEAD.pack(MAGIC, VERSION, SPARSE if idxs is not None else 0, len(offsets), first, end,
                      segment_crc)
    parts = [head, format.little_endian(offsets), format.little_endian(terms)]
    if idxs is not None:
        parts.append(format.little_endian(idxs))
    body = b"".join(parts)
    path = index_path(segment_path)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        os.write(fd, body + struct.pack("<I", crc32c(body)))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove_index(segment_path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(index_path(segment_path))


def read_index(segment_path: str, fd: int, first: int, sparse: bool, header_size: int,
               file_size: int, verify: bool = True) -> tuple[Arrays, int, int] | None:
    """(arrays, end, segment crc) from the segment's index file if it is valid
    and (`verify`) the segment's bytes still have the CRC it records; None:
    walk the segment. Unverified, the segment is checked later (scrub)."""
    try:
        with open(index_path(segment_path), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if len(raw) < _HEAD.size + 4 or struct.unpack_from("<I", raw, len(raw) - 4)[0] != crc32c(
            memoryview(raw)[:-4]):
        return None
    magic, version, flags, count, ifirst, end, seg_crc = _HEAD.unpack_from(raw)
    if magic != MAGIC or version != VERSION or bool(flags & SPARSE) != sparse or count == 0 \
            or (not sparse and ifirst != first) or not header_size < end <= file_size \
            or len(raw) != _HEAD.size + count * (4 + 8 + (8 if sparse else 0)) + 4:
        return None
    if verify and crc_range(fd, header_size, end) != seg_crc:
        return None
    view = memoryview(raw)
    at = _HEAD.size
    offsets = _from_le("I", view[at:at + 4 * count])
    at += 4 * count
    terms = _from_le("Q", view[at:at + 8 * count])
    at += 8 * count
    idxs = _from_le("Q", view[at:at + 8 * count]) if sparse else None
    if offsets[0] != header_size or offsets[-1] >= end:
        return None
    return (offsets, terms, idxs), end, int(seg_crc)
