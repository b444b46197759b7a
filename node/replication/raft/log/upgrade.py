"""Open the node's Raft log, converting a journal of the previous format first,
and put it in the place of the journal pysyncobj made (adopt).

Before issue 27 the log was pysyncobj's FileJournal, `<data dir>/raft.journal`:
a 40-byte header (name 24, version 8, format u32, end of the last record
u32) then records `size u32 | index u64 | term u64 | command | size u32`,
no checksum. It is read record by record (not through pysyncobj, which would
map it and keep every entry in a list), written into segments in
`<data dir>/log.upgrade`, which is renamed to `log` once complete; only then
is the old file removed. A crash at any point leaves either the old journal
or the finished segments, never half of each.
"""
from __future__ import annotations

import logging
import os
import shutil
import struct
from collections.abc import Iterator
from typing import Any

from pysyncobj.syncobj import _COMMAND_TYPE

from node.replication.raft.log.fs import _fsync_dir
from node.replication.raft.log.retention import Retain
from node.replication.raft.log.segment import LogDamaged
from node.replication.raft.log.segment_log import SegmentLog

log = logging.getLogger(__name__)

OLD_HEADER = 40  # pysyncobj's FIRST_RECORD_OFFSET
OLD_END_AT = 36  # where it keeps the end of the last record


def old_records(path: str) -> Iterator[tuple[bytes, int, int]]:
    """(command, index, term) of every record of a pysyncobj FileJournal."""
    with open(path, "rb") as f:
        head = f.read(OLD_HEADER)
        if len(head) < OLD_HEADER:
            return
        (end,) = struct.unpack_from("<I", head, OLD_END_AT)
        pos = OLD_HEADER
        while pos < end:
            raw = f.read(4)
            if len(raw) < 4:
                raise LogDamaged(f"{path} at offset {pos}: old journal cut short")
            (size,) = struct.unpack("<I", raw)
            body = f.read(size + 4)
            if size < 16 or len(body) < size + 4 or body[size:] != raw:
                raise LogDamaged(f"{path} at offset {pos}: old journal record malformed")
            idx, term = struct.unpack_from("<QQ", body)
            yield body[16:size], idx, term
            pos += size + 8


def open_log(data_dir: str, repairable: bool, segment_bytes: int, retain: Retain | None = None,
             granule: int = 16, verify_bytes: int | None = None) -> SegmentLog:
    directory = os.path.join(data_dir, "log")
    old = os.path.join(data_dir, "raft.journal")
    meta = old + ".meta"  # the term/vote/commit file keeps its name (and content) across the upgrade
    if os.path.exists(old):
        if not os.path.isdir(directory):
            _convert(old, data_dir, meta, segment_bytes)
        os.unlink(old)  # converted (now, or before a crash that came before this unlink)
        _fsync_dir(data_dir)
    return SegmentLog(directory, meta, segment_bytes=segment_bytes, repairable=repairable, retain=retain,
                      granule=granule, verify_bytes=verify_bytes)


def _convert(old: str, data_dir: str, meta: str, segment_bytes: int) -> None:
    tmp = os.path.join(data_dir, "log.upgrade")
    shutil.rmtree(tmp, ignore_errors=True)
    new = SegmentLog(tmp, meta, segment_bytes=segment_bytes)
    n = 0
    for command, idx, term in old_records(old):
        if n == 0 and len(new):  # (never: a fresh directory)
            new.clear()
        new.add(command, idx, term)
        n += 1
    new.flush()
    new._destroy()
    os.rename(tmp, os.path.join(data_dir, "log"))
    _fsync_dir(data_dir)
    log.warning("raft log: %s (pysyncobj's format) converted into %d checksummed entries in %s/log",
                old, n, data_dir)


def adopt(syncobj: Any, journal: SegmentLog) -> None:
    """Make `journal` the log of `syncobj`, created without a journalFile (so with
    a MemoryJournal): what SyncObj.__init__ read from its journal is read again
    from ours (term, vote, commit index; a NO_OP first entry in an empty log)."""
    syncobj._SyncObj__raftLog = journal
    if not len(journal):
        journal.add(bytes([_COMMAND_TYPE.NO_OP]), 1, 0)
    syncobj._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), journal[-1][2])
    syncobj._SyncObj__votedForNodeId = journal.getVotedForNodeId()
    syncobj._SyncObj__raftCommitIndex = journal.getRaftCommitIndex()
