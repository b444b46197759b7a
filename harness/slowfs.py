"""A FUSE passthrough filesystem whose fsync can be made slow (the slow-disk
fault) or whose writes can fail (the failed-disk fault, issue 46).

    python -m harness.slowfs BACKING MOUNTPOINT --delay-file FILE [--fault-file FILE]

Every operation is passed to the same path under BACKING; fsync (and fsyncdir)
first sleeps the number of milliseconds in FILE (re-read at most every 50 ms;
0 or missing: no delay), then fsyncs the backing file. An msync(MS_SYNC) of a
shared mapping of a file in the mount reaches the daemon as FUSE_FSYNC (the
kernel writes the dirty pages back, FUSE_WRITE, then asks for the sync), so
pysyncobj's mmap'd journal flush waits for the delay too; `flush` (close) does
not sleep. The fault file (re-read as often) names an error mode: `eio` (a
failing disk) or `erofs` (a read-only remount); while it does, every operation
that would change something (write, create, an open for writing, truncate,
rename, unlink, mkdir, fsync, ...) fails with that errno; reads, stat and
close go on. Empty or missing: none. Runs in the foreground, multi-threaded (fusepy over libfuse2), until
unmounted or SIGTERM. Written for harness.datafs; not a general tool.
"""
from __future__ import annotations

import argparse
import errno
import os
import threading
import time
from typing import Any

from fuse import FUSE, FuseOSError, Operations  # fusepy (libfuse2)

FAULTS = {"eio": errno.EIO, "erofs": errno.EROFS}  # the fault file's modes
# operations that change the filesystem (open and create: by their flags)
MUTATING = frozenset({"write", "create", "truncate", "rename", "unlink", "mkdir", "rmdir", "link",
                      "symlink", "chmod", "chown", "utimens", "fsync", "fsyncdir", "mknod",
                      "setxattr", "removexattr"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


def fault_errno(mode: str) -> int | None:
    """The errno of a fault file's mode (None: no fault; an unknown mode: EIO)."""
    mode = mode.strip().lower()
    return None if not mode else FAULTS.get(mode, errno.EIO)


def mutates(op: str, args: tuple[Any, ...]) -> bool:
    if op == "open":
        return bool(args[1] & _WRITE_FLAGS)
    return op in MUTATING


class SlowFs(Operations):  # type: ignore[misc]
    def __init__(self, backing: str, delay_file: str | None, fault_file: str | None = None) -> None:
        self.backing = os.path.realpath(backing)
        self.delay_file = delay_file
        self.fault_file = fault_file
        self._delay = 0.0
        self._fault: int | None = None
        self._read_at = 0.0
        self._fault_read_at = 0.0
        self._lock = threading.Lock()
        self.fsyncs = 0
        self.faults = 0  # operations failed by the fault mode

    # ------------------------------------------------------------ helpers
    def _p(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def delay(self) -> float:
        """Seconds each fsync sleeps now."""
        now = time.monotonic()
        with self._lock:
            if now - self._read_at >= 0.05 and self.delay_file:
                self._read_at = now
                try:
                    with open(self.delay_file) as f:
                        self._delay = max(0.0, float(f.read().strip() or 0)) / 1000.0
                except (OSError, ValueError):
                    self._delay = 0.0
            return self._delay

    def fault(self) -> int | None:
        """The errno every changing operation fails with now (None: none)."""
        now = time.monotonic()
        with self._lock:
            if now - self._fault_read_at >= 0.05 and self.fault_file:
                self._fault_read_at = now
                try:
                    with open(self.fault_file) as f:
                        self._fault = fault_errno(f.read())
                except OSError:
                    self._fault = None
            return self._fault

    def __call__(self, op: str, *args: Any) -> Any:
        err = self.fault() if self.fault_file else None
        if err is not None and mutates(op, args):
            self.faults += 1
            raise FuseOSError(err)
        try:
            return super().__call__(op, *args)
        except OSError as exc:  # the backing file system's errno, to the caller
            raise FuseOSError(exc.errno or errno.EIO) from None

    # ------------------------------------------------------------ metadata
    def access(self, path: str, amode: int) -> None:
        if not os.access(self._p(path), amode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                             "st_atime", "st_mtime", "st_ctime", "st_blocks")}

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._p(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                             "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._p(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._p(path), uid, gid)

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        os.utime(self._p(path), times)

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._p(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._p(path))

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._p(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._p(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._p(path))

    def rename(self, old: str, new: str) -> None:
        os.replace(self._p(old), self._p(new))

    def symlink(self, target: str, source: str) -> None:
        os.symlink(source, self._p(target))

    def link(self, target: str, source: str) -> None:
        os.link(self._p(source), self._p(target))

    # ------------------------------------------------------------ files
    def open(self, path: str, flags: int) -> int:
        return os.open(self._p(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        # O_RDWR whatever the caller asked: fusepy does not pass its flags, and
        # the kernel reads a file created O_RDWR through this same handle (an
        # O_WRONLY one failed the node's reads of a new log segment with EBADF,
        # once its entry cache let go of them: raft ticks failed, links desynced)
        return os.open(self._p(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._p(path), length)

    def flush(self, path: str, fh: int) -> None:
        return None  # close(): nothing to do (the data is in the backing file already)

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        d = self.delay()
        if d > 0:
            time.sleep(d)
        self.fsyncs += 1
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        d = self.delay()
        if d > 0:
            time.sleep(d)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--delay-file", default=None)
    ap.add_argument("--fault-file", default=None)
    args = ap.parse_args(argv)
    # allow_other: the node runs as root too, but possibly in another mount namespace
    # (ip netns exec); big_writes: the journal's write-back in 128 KiB requests
    FUSE(SlowFs(args.backing, args.delay_file, args.fault_file), args.mountpoint, foreground=True, nothreads=False,
         allow_other=True, big_writes=True, max_write=131072)


if __name__ == "__main__":
    main()
