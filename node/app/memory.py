"""The memory a node may use, for the default (relative) memory high-watermark:
the cgroup's limit when the node runs under one (a container), else the
machine's RAM, as RabbitMQ computes vm_memory_high_watermark.relative."""
from __future__ import annotations

import logging

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
