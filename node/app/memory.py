"""The node's memory for the memory high-watermark alarm, as RabbitMQ measures
it: the memory the node may use (the cgroup's limit when the node runs under
one, a container, else the machine's RAM: vm_memory_high_watermark.relative)
and the memory the process really uses (its resident set, like RabbitMQ's
rss vm_memory_calculation_strategy), with libc's free pages handed back to
the OS while over the watermark, so that a drain can clear the alarm."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max",  # cgroup v2
                  "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v1


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def physical_memory(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def total_memory(cgroup_limits: tuple[str, ...] = _CGROUP_LIMITS,
                 meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes: the smaller of RAM and the cgroup limit (v1 reports "no limit" as
    a huge number, which RAM then caps); None when neither can be read."""
    ram = physical_memory(meminfo)
    limits = [n for n in (_read_int(p) for p in cgroup_limits) if n]
    if ram is not None:
        limits.append(ram)
    return min(limits) if limits else None


def resolve_watermark(relative: float | None, absolute: int) -> int:
    """The watermark in bytes: `relative` of total_memory() when set, else
    `absolute` (0 = off). Unknown memory: off, with a warning."""
    if relative is None:
        return absolute
    total = total_memory()
    if total is None:
        log.warning("cannot tell this machine's memory: the memory high-watermark is off "
                    "(set memory_high_watermark to a number of bytes)")
        return 0
    return int(total * relative)


_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(statm: str = "/proc/self/statm") -> int | None:
    """This process's resident set (one short read: cheap enough per timer tick).
    Forked snapshot children are other processes and are not counted: their
    pages are shared copy-on-write and only diverge while a snapshot is written
    (the headroom of the default watermark covers that)."""
    try:
        with open(statm) as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _libc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0): Python frees a drained queue's bodies to malloc,
    which keeps the pages; this returns every whole free page to the OS.
    None on a libc without it (musl): RSS then falls only as malloc allows."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: fn(0)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 << 10


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Pin glibc's mmap threshold (its start value) so it stops adapting. By
    default every freed mmap'd block raises it (up to 32 MiB): after a backlog's
    multi-MiB buffers (snapshot chunks, log reads) the batches that follow come
    from the heap, interleave with long-lived objects, and a drained node kept
    ~10-17 MB more than a fresh one that malloc_trim could not hand back. With
    the threshold pinned they are mmap'd and unmapped when freed. Left alone
    when MALLOC_MMAP_THRESHOLD_ is set (glibc has applied it) or outside
    glibc. True when set."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(fn(_M_MMAP_THRESHOLD, size))


class ProcessMemory:
    """The figure the memory alarm compares with the watermark: the resident
    set, read at most once per `interval`. While over the watermark, free
    malloc pages are trimmed (at most once per `trim_interval`: on a large heap
    it takes milliseconds) before the alarm is decided; otherwise once per
    `idle_trim_interval`, so that what a drain, a log replay at start or a
    burst freed goes back to the OS (a drained node ends near a fresh one's
    size, not at its peak)."""

    def __init__(self, watermark: int, interval: float = 0.1, trim_interval: float = 1.0,
                 read: Callable[[], int | None] = resident_bytes,
                 idle_trim_interval: float = 20.0) -> None:
        self.watermark = watermark
        self.interval, self.trim_interval = interval, trim_interval
        self.idle_trim_interval = idle_trim_interval
        self._read = read
        self._trim = _libc_trim()
        self._read_at = self._trimmed_at = float("-inf")
        self._born = time.monotonic()
        self.used = 0
        self.trims = 0

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self._read_at < self.interval:
            return self.used
        self._read_at = now
        used = self._read() or 0
        over = self.watermark > 0 and used > self.watermark
        since = now - self._trimmed_at
        if self._trim is not None and (now - max(self._trimmed_at, self._born) >= self.idle_trim_interval
                                       or (over and since >= self.trim_interval)):
            self._trimmed_at = now
            self._trim()
            self.trims += 1
            used = self._read() or used
        self.used = used
        return used
