"""The Raft log on disk: segment files of bounded size, every record checksummed.

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
- `<segment>.idx`: a sealed segment's index file, a cache never trusted over
  the segment.
- `start`: the first index Raft sees (moves after a snapshot,
  deleteEntriesTo), versioned and checksummed, written by atomic replace.
Term, vote and commit index stay in FsyncMetaStorer's file (meta.py),
<data dir>/raft.journal.meta. Magics and versions: node/replication/format.py.

segment_log.py  SegmentLog: pysyncobj's journal interface (append, flush, truncate, read, meta)
recovery.py     its open: segments read back and checked, damage cut off; the background scrub
retention.py    segments kept below Raft's start for live messages: import, release, compaction
segment.py      one segment file: header, records, CRC (_Segment, encode_record, LogDamaged)
handle.py       entries read back: EntryHandle (from another thread), _Entries (a lazy slice)
index.py        a sealed segment's index file (<segment>.idx)
start.py        the `start` file
meta.py         the meta file (term, vote, commit index): FsyncMetaStorer
fs.py           fallocate and directory fsync
upgrade.py      open_log: opens the log, converting an older build's raft.journal first; adopt
"""
from __future__ import annotations

from node.replication.raft.log.handle import EntryHandle
from node.replication.raft.log.segment import (
    REC_SIZE,
    RECORD,
    LogDamaged,
    encode_record,
    record_crc,
)
from node.replication.raft.log.segment_log import SegmentLog

__all__ = ["REC_SIZE", "RECORD", "EntryHandle", "LogDamaged", "SegmentLog", "encode_record", "record_crc"]
