"""The snapshot file's envelope: the header (magic, format version, the
body's length and CRC32) and its checks, and SnapshotFormatError with the
checks every part of the reader raises it through.

  header  magic (8) | format version u16 | reserved u16 | body length u64 | CRC32 of the body u32

The whole body is covered by the CRC: a damaged file is refused before any of
it is decoded. A new layout gets a new version number (node/replication/format.py,
SNAPSHOT); this build reads READ_VERSIONS. The body is written through _Writer,
which keeps its length and CRC for the header written last.
"""
from __future__ import annotations

import struct
import zlib
from typing import IO, Any, NamedTuple

from node.replication import format
from node.replication.codec import encode_into

MAGIC = format.SNAPSHOT.magic  # not a pickle (0x80), not text
FORMAT_VERSION = format.SNAPSHOT.version  # written from machine version 5 on; 4 from 3 on; 3 below it
READ_VERSIONS = format.SNAPSHOT.reads
_HEADER = struct.Struct("<8sHHQI")
HEADER_SIZE = _HEADER.size
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_FLUSH_PIECES = 16384  # encoded pieces joined into one write


class SnapshotFormatError(ValueError):
    """Bytes that are not a snapshot this build can load (foreign, damaged,
    truncated, another format version)."""


class RaftMeta(NamedTuple):
    """Where the snapshot stands in the Raft log, as plain values: the last
    two entries it covers (command, index, term) and the cluster's addresses."""

    last: tuple[bytes, int, int]
    prev: tuple[bytes, int, int]
    members: tuple[str, ...]


class _Writer:
    """Collects encoded pieces and hands them to `sink` in large writes,
    keeping the body's length and CRC."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.out: list[bytes] = []
        self.length = 0
        self.crc = 0

    def value(self, v: Any) -> None:
        encode_into(v, self.out)

    def u32(self, n: int) -> None:
        self.out.append(_U32.pack(n))

    def maybe_flush(self) -> None:
        if len(self.out) >= _FLUSH_PIECES:
            self.flush()

    def flush(self) -> None:
        data = b"".join(self.out)
        self.out = []
        self.crc = zlib.crc32(data, self.crc)
        self.length += len(data)
        self.sink.write(data)


def check(data: bytes | memoryview) -> int:
    """Check the header and the body's CRC; returns where the body starts.
    Raises SnapshotFormatError naming what is wrong."""
    if data[:1] == b"\x80":  # pickle protocol 2+: what builds before issue 26 wrote
        raise SnapshotFormatError("a pickled snapshot of an older build, never loaded")
    if data[:len(MAGIC)] != MAGIC:
        raise SnapshotFormatError("not a mirrorq snapshot (no magic)")
    if len(data) < HEADER_SIZE:
        raise SnapshotFormatError(f"truncated: {len(data)} bytes, no whole snapshot header")
    _magic, version, _reserved, length, crc = _HEADER.unpack_from(data, 0)
    if version not in READ_VERSIONS:
        raise SnapshotFormatError(f"snapshot format version {version}: this build reads "
                                  f"versions {', '.join(map(str, READ_VERSIONS))}")
    if length != len(data) - HEADER_SIZE:
        raise SnapshotFormatError(f"body of {len(data) - HEADER_SIZE} bytes, the header says {length}: "
                                  "truncated or trailing bytes")
    if zlib.crc32(memoryview(data)[HEADER_SIZE:]) != crc:
        raise SnapshotFormatError("checksum mismatch: the snapshot is damaged")
    return HEADER_SIZE


def check_file(f: IO[bytes], size: int) -> None:
    """check() of the snapshot at the start of `f` (`size` bytes: snapshot_size),
    its CRC computed 4 MiB at a time (a leader checks what it is about to send)."""
    head = f.read(HEADER_SIZE)
    _magic, version, _reserved, length, crc = _HEADER.unpack_from(head, 0)
    if version not in READ_VERSIONS:
        raise SnapshotFormatError(f"snapshot format version {version}: this build reads "
                                  f"versions {', '.join(map(str, READ_VERSIONS))}")
    left, got = size - HEADER_SIZE, 0
    while left > 0:
        chunk = f.read(min(left, 4 << 20))
        if not chunk:
            raise SnapshotFormatError(f"body cut short: {size - HEADER_SIZE - left} of {length} bytes")
        got = zlib.crc32(chunk, got)
        left -= len(chunk)
    if got != crc:
        raise SnapshotFormatError("checksum mismatch: the snapshot is damaged")


def snapshot_size(head: bytes) -> int:
    """The whole snapshot's size in bytes, from its first HEADER_SIZE bytes
    (the snapshot a leader sends is followed by the log entries it needs)."""
    if len(head) < HEADER_SIZE or head[:len(MAGIC)] != MAGIC:
        raise SnapshotFormatError("not a mirrorq snapshot (no magic)")
    _magic, _version, _reserved, length, _crc = _HEADER.unpack_from(head, 0)
    return HEADER_SIZE + int(length)


# the checks of decoded values: each raises SnapshotFormatError naming what is malformed
def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise SnapshotFormatError(f"malformed snapshot: {what}")


def _tuple(v: Any, n: int, what: str) -> tuple[Any, ...]:
    _expect(type(v) is tuple and len(v) == n, f"{what}: expected {n} fields")
    return v  # type: ignore[no-any-return]


def _dict(v: Any, what: str) -> dict[Any, Any]:
    _expect(type(v) is dict, f"{what}: expected a table")
    return v  # type: ignore[no-any-return]


def _pairs(v: Any, what: str) -> list[tuple[Any, Any]]:
    _expect(type(v) is list and all(type(p) is tuple and len(p) == 2 for p in v),
            f"{what}: expected a list of pairs")
    return v  # type: ignore[no-any-return]


def _entry(v: Any) -> tuple[bytes, int, int]:
    _expect(type(v) is tuple and len(v) == 3 and type(v[0]) is bytes and type(v[1]) is int
            and type(v[2]) is int, "raft entry")
    return v  # type: ignore[no-any-return]


def _list(v: Any, what: str) -> list[Any]:
    _expect(type(v) is list, f"{what}: expected a list")
    return v  # type: ignore[no-any-return]


def _at(items: list[Any], i: Any, what: str) -> Any:
    _expect(type(i) is int and 0 <= i < len(items), f"{what} reference {i!r} out of range")
    return items[i]

