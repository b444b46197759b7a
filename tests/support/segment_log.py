"""Helpers of the segment-log unit tests: a log of small segments, random
entries, and a flipped bit on disk."""
from __future__ import annotations

import random
from pathlib import Path

from node.replication.raft.log import SegmentLog

SEG = 64 * 1024
Entry = tuple[bytes, int, int]


def open_log(tmp: Path, **kw: object) -> SegmentLog:
    return SegmentLog(str(tmp / "log"), str(tmp / "raft.journal.meta"), segment_bytes=SEG, **kw)  # type: ignore[arg-type]


def fill(j: SegmentLog, n: int, first: int = 1, seed: int = 1) -> list[Entry]:
    """n random entries (1..5,000 bytes) from index `first` on, appended."""
    rnd = random.Random(seed)
    out = []
    for i in range(first, first + n):
        e = (rnd.randbytes(rnd.randrange(1, 5000)), i, 1 + i // 100)
        j.add(*e)
        out.append(e)
    return out


def entries(j: SegmentLog) -> list[Entry]:
    return [j[i] for i in range(len(j))]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
