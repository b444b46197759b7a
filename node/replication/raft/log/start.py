"""The log's `start` file: the first index Raft sees.

It moves after a snapshot (deleteEntriesTo) and is written by atomic
replace: magic, format version (node/replication/format.py, LOG_START),
first index u64, CRC32C of those, little-endian. Missing (a log that never
moved its start) or damaged, the log starts at its first segment.
"""
from __future__ import annotations

import logging
import os
import struct

from crc32c import crc32c

from node.replication import format
from node.replication.raft.data_dir import PRIVATE_FILE
from node.replication.raft.log.fs import _fsync_dir
from node.replication.raft.log.segment import LogDamaged
from node.replication.raft.storage_fault import FSYNC, guarded

log = logging.getLogger(__name__)

_START = struct.Struct("<8sHQI")  # magic, version, first index, crc
START_MAGIC = format.LOG_START.magic
FORMAT_VERSION = format.LOG_START.version


def read_start(directory: str) -> int | None:
    """The first index in `directory`'s start file; None if there is none (or it is damaged)."""
    try:
        with open(os.path.join(directory, "start"), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if len(raw) == _START.size:
        magic, version, first, crc = _START.unpack(raw)
        if magic == START_MAGIC and crc == crc32c(raw[:-4]):
            if version > FORMAT_VERSION:
                raise LogDamaged(f"{directory}/start: format version {version}, this build reads up to "
                                 f"{FORMAT_VERSION}")
            return int(first)
    log.error("raft log: %s/start is damaged; the log starts at its first segment", directory)
    return None


def write_start(directory: str, first: int) -> None:
    """Replace the start file (synced, and its directory)."""
    body = struct.pack("<8sHQ", START_MAGIC, FORMAT_VERSION, first)
    path = os.path.join(directory, "start")
    tmp = path + ".tmp"
    with guarded(tmp, "create"):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        with guarded(tmp, "write"):
            os.write(fd, body + struct.pack("<I", crc32c(body)))
        with guarded(tmp, FSYNC):
            os.fsync(fd)
    finally:
        os.close(fd)
    with guarded(tmp, "rename"):
        os.replace(tmp, path)
    _fsync_dir(directory)
