"""The one table of mirrorq's own on-disk and wire formats (docs/formats.md).

Every artifact that carries a magic and a version takes both from here, so
two artifacts cannot share a magic and a version bump is one edit that the
table in docs/formats.md (checked against FORMATS by
tests/unit/replication/test_format.py) has to follow.

`reads` are the versions this build still reads; `since` is the machine
version (node/replication/machine/version.py) from which the current
version is written (1: every build since the artifact exists).
"""
from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Format:
    name: str  # the artifact, as docs/formats.md names it
    magic: bytes
    version: int  # the version this build writes
    reads: tuple[int, ...]  # the versions this build reads
    since: int  # the machine version from which `version` is written
    where: str  # the module that reads and writes it

    def __post_init__(self) -> None:
        if self.version not in self.reads:
            raise ValueError(f"{self.name}: writes version {self.version} it cannot read")


# The Raft log's segment file (<first index>.seg, <first>-<last>.lseg): header and records.
SEGMENT = Format("log segment", b"MQRAFTSG", 1, (1,), 1, "node/replication/raft/log/segment.py")
# The log's `start` file: the first index Raft sees (shares the segment's version).
LOG_START = Format("log start", b"MQRAFTST", 1, (1,), 1, "node/replication/raft/log/start.py")
# A sealed segment's index file (<segment>.idx): a cache, never trusted over the segment.
SEGMENT_INDEX = Format("segment index", b"MQRAFTIX", 1, (1,), 1,
                       "node/replication/raft/log/index.py")
# Term, vote and commit index (raft.journal.meta); version 1 had no CRC.
META = Format("raft meta", b"MQMETA2\n", 2, (1, 2), 1, "node/replication/raft/log/meta.py")
META_V1_MAGIC = b"MQMETA1\n"
# The snapshot file: the replicated state and its Raft position.
SNAPSHOT = Format("snapshot", b"\x89MQSNAP\n", 5, (1, 2, 3, 4, 5), 5,
                  "node/replication/raft/snapshot/envelope.py")
# The entries a leader sends after its snapshot file (InstallSnapshot's retained records).
SNAPSHOT_ENTRIES = Format("snapshot entries", b"MQSNPENT", 1, (1,), 1,
                          "node/replication/raft/snapshot/transfer.py")
# The Raft peer link's handshake: 02 (the dialer proves first, a MAC on every frame);
# 3, negotiated inside 02's handshake (HELLO's "frames"): a MAC on each frame's
# header too, checked before its body is read. A member of version 2 gets 2.
PEER_LINK = Format("peer link", b"MQRAFT02", 3, (2, 3), 1, "node/replication/raft/link/handshake.py")

FORMATS: tuple[Format, ...] = (SEGMENT, LOG_START, SEGMENT_INDEX, META, SNAPSHOT,
                               SNAPSHOT_ENTRIES, PEER_LINK)

# snapshot versions by the machine version that first writes them (below 3: version 3)
SNAPSHOT_VERSION_SINCE = {3: 1, 4: 3, 5: 5}


def snapshot_version(machine_version: int) -> int:
    """The snapshot format a cluster at `machine_version` writes (every member reads it)."""
    return max(v for v, since in SNAPSHOT_VERSION_SINCE.items() if machine_version >= since)


def little_endian(a: array[Any]) -> bytes:
    """An array's bytes little-endian, the byte order of every format above."""
    if sys.byteorder == "little":
        return a.tobytes()
    copy = array(a.typecode, a)
    copy.byteswap()
    return copy.tobytes()
