"""The snapshot a leader sends: its file, then the log entries its messages
are in, as an entries section (format.SNAPSHOT_ENTRIES).

Snapshots hold messages' places in the log, not their bytes (issue 27 item
3): a leader sends a follower the snapshot file followed by those entries
(an entries section: ENTRIES_MAGIC, version, count, then the records as in a
segment, each with its CRC); the follower checks the snapshot and every
record (_received_entries) before it stores the records in a segment of
their own (SegmentLog.import_records) and installs the snapshot.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import IO, Any

from node.replication import format
from node.replication.raft.log import (
    REC_SIZE,
    RECORD,
    EntryHandle,
    SegmentLog,
    record_crc,
)
from node.replication.raft.snapshot.envelope import SnapshotFormatError, check_file, snapshot_size
from node.replication.raft.snapshot.reader import read_entries
from node.replication.raft.storage_fault import FSYNC, guarded

ENTRIES_MAGIC = format.SNAPSHOT_ENTRIES.magic
ENTRIES_VERSION = format.SNAPSHOT_ENTRIES.version
_ENTRIES = struct.Struct("<8sHHQ")  # magic, version, reserved, count


class _Outgoing:
    """One snapshot on its way to one follower: the file's bytes, then the
    entries section. The entries are pinned when the transmission starts (an
    EntryHandle keeps its segment readable if it is released meanwhile) and
    read, checked, one chunk at a time."""

    def __init__(self, path: str, journal: SegmentLog) -> None:
        self.f = open(path, "rb")  # noqa: SIM115 - closed by close()
        try:
            self.left = snapshot_size(self.f.read(64))
            self.f.seek(0)
            # checked before the first byte goes out: damage found by the
            # receiver only was sent again and again
            check_file(self.f, self.left)
            self.f.seek(0)
            entries = read_entries(self.f)
            self.f.seek(0)
            self.handles: list[EntryHandle | None] = [journal.handle(i) for i in entries]
        except BaseException:
            self.f.close()
            raise
        self.k = -1  # -1: the section's header is next

    def chunk(self, size: int) -> bytes:
        if self.left > 0:
            data = self.f.read(min(size, self.left))
            if not data:
                raise OSError("snapshot file cut short while being sent")
            self.left -= len(data)
            return data
        handles = self.handles
        if self.k >= len(handles):
            return b""
        parts = []
        n = 0
        if self.k < 0:
            parts.append(_ENTRIES.pack(ENTRIES_MAGIC, ENTRIES_VERSION, 0, len(handles)))
            self.k = 0
        while self.k < len(handles) and n < size:
            h = handles[self.k]
            assert h is not None
            raw = h.record()  # checked: damage is never sent
            handles[self.k] = None  # its segment may go once every pin on it has
            self.k += 1
            parts.append(raw)
            n += len(raw)
        return b"".join(parts)

    def close(self) -> None:
        self.f.close()
        self.handles = []


def fits(length: int, available: int, what: str) -> int:
    """`length`, read from a received file, if the file holds that many bytes
    past where it was read: checked before anything is allocated for it (a
    u32/u64 from the wire would otherwise size the read)."""
    if length < 0 or length > available:
        raise SnapshotFormatError(f"{what} of {length} bytes, only {max(available, 0)} received")
    return length


def _received_entries(f: IO[bytes], expect: Any, end: int) -> Iterator[bytes]:
    """The records of a received entries section (the file's bytes up to
    `end`), each checked (CRC, index) against the indices the snapshot names,
    and each record's length against the bytes left before it is read;
    SnapshotFormatError if not."""
    head = f.read(_ENTRIES.size)
    if len(head) != _ENTRIES.size:
        raise SnapshotFormatError("the log entries the snapshot needs are missing")
    magic, version, _r, count = _ENTRIES.unpack(head)
    if magic != ENTRIES_MAGIC or version != ENTRIES_VERSION or count != len(expect):
        raise SnapshotFormatError(f"entries section: {magic!r} version {version}, {count} entries "
                                  f"for {len(expect)} needed")
    for idx in expect:
        rec = f.read(REC_SIZE)
        if len(rec) != REC_SIZE:
            raise SnapshotFormatError(f"entries section cut short before entry {idx}")
        length, crc, ridx, term = RECORD.unpack(rec)
        payload = f.read(fits(max(length - 16, 0), end - f.tell(), f"entry {idx}"))
        if ridx != idx or length < 16 or len(payload) != length - 16 \
                or record_crc(length, ridx, term, payload) != crc:
            raise SnapshotFormatError(f"entry {idx} of the snapshot is damaged (or out of order)")
        yield rec + payload
    if f.read(1):
        raise SnapshotFormatError("trailing bytes after the snapshot's entries")


def _cut_synced(path: str, size: int) -> None:
    """Cut `path` to `size` bytes and fsync that: the received file was synced
    with the log entries after the snapshot, so an unsynced cut could be undone
    by a power loss after the rename (which is synced) and leave raft.dump with
    trailing bytes: unreadable, the member's log reset (harness.lazyfs showed it)."""
    with guarded(path, "open"):
        fd = os.open(path, os.O_WRONLY)
    try:
        with guarded(path, "truncate"):
            os.ftruncate(fd, size)
        with guarded(path, FSYNC):
            os.fsync(fd)
    finally:
        os.close(fd)
