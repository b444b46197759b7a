"""File-system helpers of the Raft log (and the snapshot beside it):

- _fallocate: growth reserved with fallocate(2), so a full disk is an
  OSError (ENOSPC) before a write;
- _fsync_dir: a directory fsync'd, so that the names created, replaced or
  removed in it are durable (a failure stops the node: storage_fault).
"""
from __future__ import annotations

import ctypes
import os
from typing import Any

from node.replication.raft.storage_fault import FSYNC, guarded


def _fallocate(fd: int, offset: int, length: int) -> None:
    """fallocate(2) mode 0. Not os.posix_fallocate: where the filesystem has no
    fallocate (FUSE, e.g. the chaos slow-disk mount) glibc emulates it by
    writing a byte into every block of the range, a FUSE round trip each;
    here that is EOPNOTSUPP and the segment log stops preallocating."""
    if _libc_fallocate is None:
        os.posix_fallocate(fd, offset, length)
        return
    if _libc_fallocate(fd, 0, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


try:
    _libc_fallocate: Any = ctypes.CDLL(None, use_errno=True).fallocate64
    _libc_fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    _libc_fallocate.restype = ctypes.c_int
except (AttributeError, OSError):  # not glibc
    _libc_fallocate = None


def _fsync_dir(path: str) -> None:
    with guarded(path, "open"):
        fd = os.open(path, os.O_RDONLY)
    try:
        with guarded(path, FSYNC):
            os.fsync(fd)
    finally:
        os.close(fd)
