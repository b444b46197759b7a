"""Fail-stop on storage errors (issue 46).

An I/O error that means the data directory can no longer be trusted (it or a
segment is gone, EIO, a read-only filesystem, any failed fsync) ends the node:
one CRITICAL line naming the file, the operation and the errno, then exit
code EXIT_STORAGE at once, as a crash would (its Raft links break, so the
leader takes it out of the in-sync set, I3). The supervisor restarts it and
it is repaired from its peers, or refuses to start with one line. A full disk
(ENOSPC, EDQUOT) is not fatal: nothing was appended, publishers are blocked
and the node recovers when space is back.

Why not retry: a removed or unmounted directory leaves the open fds working
(writes to unlinked files succeed), so a node spun for hours forking a
snapshot writer that could never open its file; and a failed fsync must never
be retried as if it had worked (fsyncgate: Linux marks the dirty pages clean
after a failed writeback, and the next fsync reports success without them).

Pure decisions (is_fatal, dir_gone, retry_delay, should_warn) and thin shells (fail_stop,
stop_if_fatal, guarded, probe_dir). The forked snapshot writer must not log:
it reports its errno in its exit status (child_status / child_errno).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

log = logging.getLogger(__name__)

EXIT_STORAGE = 5  # (3: log damage, 4: machine version)

# the medium or the directory is gone or broken: nothing written there can be trusted
_FATAL = frozenset({
    errno.ENOENT, errno.ENOTDIR, errno.EIO, errno.EROFS, errno.ESTALE, errno.ENODEV, errno.ENXIO,
    errno.EUCLEAN, errno.EACCES, errno.EPERM, errno.ENOTCONN,  # (ENOTCONN: a FUSE daemon gone)
})
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
# an fd problem of ours (EBADF: closed while stopping) or an fd that cannot sync
# (EINVAL, EROFS aside): no statement about the disk
_NOT_ABOUT_THE_DISK = frozenset({errno.EBADF, errno.EINVAL, errno.EINTR})

FSYNC = "fsync"  # the one operation whose every failure is fatal (fsyncgate)


def is_fatal(err: int | None, op: str) -> bool:
    """Whether an OSError with `err` during `op` ("write", "fsync", "open",
    "rename", "read", "stat", ...) under the data dir must stop the node."""
    if err in _NOT_ABOUT_THE_DISK or err is None:
        return False
    if op == FSYNC:
        return True  # even ENOSPC: the pages it did not write are marked clean, never written
    return err in _FATAL


def describe(path: str, op: str, exc: OSError) -> str:
    code = exc.errno
    name = errno.errorcode.get(code, str(code)) if code is not None else "?"
    return f"{op} of {path} failed: {name} ({exc.strerror or exc})"


_FAILING = threading.Lock()  # held by the thread that logs the line and exits


def fail_stop(path: str, op: str, exc: OSError) -> NoReturn:
    """Log one CRITICAL line and exit EXIT_STORAGE now (any thread): no
    shutdown sequence, nothing more written; peers see the links break."""
    if not _FAILING.acquire(blocking=False):
        # another thread met the failure too (the raft thread and the event
        # loop's read of the same disk): it logs the one line and exits
        time.sleep(30)
        os._exit(EXIT_STORAGE)
    log.critical("storage failure: %s; the data directory cannot be trusted: exiting (code %d) "
                 "so that a restart repairs this member from its peers", describe(path, op, exc),
                 EXIT_STORAGE)
    logging.shutdown()
    os._exit(EXIT_STORAGE)


def stop_if_fatal(path: str, op: str, exc: OSError) -> None:
    """fail_stop if `exc` is fatal for `op`; else return (the caller re-raises or copes)."""
    if is_fatal(exc.errno, op):
        fail_stop(exc.filename if isinstance(exc.filename, str) else path, op, exc)


@contextlib.contextmanager
def guarded(path: str, op: str) -> Iterator[None]:
    """`with guarded(path, "write"): ...`: a fatal OSError stops the node, any
    other is raised as it was."""
    try:
        yield
    except OSError as exc:
        stop_if_fatal(path, op, exc)
        raise


# ---------------------------------------------------------------- the data dir

def open_dir(path: str) -> int:
    """An fd on the data dir, held while the node runs, to tell later whether
    the directory at `path` is still this one (check_dir)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def dir_gone(held: os.stat_result, at_path: os.stat_result) -> str | None:
    """Why the directory the node opened (`held`: fstat of its fd) is no longer
    the one at its path (`at_path`), or None. An inode number alone is no proof
    (a directory removed and made again often gets the same one)."""
    if held.st_nlink == 0:
        return "removed while open"
    if (held.st_dev, held.st_ino) != (at_path.st_dev, at_path.st_ino):
        return "replaced by another directory (removed and made again, or its volume unmounted)"
    return None


def check_dir(path: str, fd: int) -> None:
    """The data dir is still there and still the one opened (two stats; once
    a second from the raft thread): open fds keep working after it is
    removed, so without this a node whose volume went away ran on for hours."""
    try:
        held = os.fstat(fd)
        at_path = os.stat(path)
    except OSError as exc:
        stop_if_fatal(path, "stat", exc)
        return
    why = dir_gone(held, at_path)
    if why is not None:
        fail_stop(path, "stat", OSError(errno.ENOENT, why))


def probe_dir(path: str) -> bool:
    """Create, write and remove a small file in `path` (after a failed
    snapshot: the writer's error alone does not say whether the directory is
    usable). A fatal error stops the node; False after another one (a full
    disk). No fsync: on a full disk with delayed allocation that would be a
    failed fsync, fatal, where a full disk must not be."""
    probe = os.path.join(path, ".probe")
    op = "create"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            op = "write"
            os.write(fd, b"probe\n")
        finally:
            os.close(fd)
        op = "unlink"
        os.unlink(probe)
    except OSError as exc:
        stop_if_fatal(probe, op, exc)
        with contextlib.suppress(OSError):
            os.unlink(probe)
        return False
    return True


# ---------------------------------------------------------------- the snapshot writer

CHILD_ERRNO_BASE = 64  # a child's exit status BASE + errno: it failed with that OSError
_CHILD_MAX_ERRNO = 255 - CHILD_ERRNO_BASE


def child_status(exc: BaseException) -> int:
    """The exit status the forked snapshot writer ends with after `exc` (1: not an OSError)."""
    code = exc.errno if isinstance(exc, OSError) else None
    return CHILD_ERRNO_BASE + code if code is not None and 0 < code <= _CHILD_MAX_ERRNO else 1


def child_errno(wait_status: int) -> int | None:
    """The errno a snapshot writer's waitpid status reports, or None."""
    if not os.WIFEXITED(wait_status):
        return None
    code = os.WEXITSTATUS(wait_status)
    return code - CHILD_ERRNO_BASE if code > CHILD_ERRNO_BASE else None


# ---------------------------------------------------------------- bounded retries

SNAPSHOT_RETRY_FIRST = 1.0  # s after the first failure
SNAPSHOT_RETRY_MAX = 300.0
WARN_EVERY = 60.0  # s between two warnings about the same failing task


def retry_delay(failures: int, first: float = SNAPSHOT_RETRY_FIRST, cap: float = SNAPSHOT_RETRY_MAX) -> float:
    """Seconds before the next attempt after `failures` consecutive failures
    (0: at once): first, 2 x first, 4 x first ... up to `cap`."""
    if failures <= 0:
        return 0.0
    return float(min(cap, first * (2 ** min(failures - 1, 30))))


def should_warn(now: float, last_warned: float | None, every: float = WARN_EVERY) -> bool:
    """At most one warning per `every` seconds (None: never warned)."""
    return last_warned is None or now - last_warned >= every
