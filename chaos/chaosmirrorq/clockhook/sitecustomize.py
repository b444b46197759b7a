"""Loaded at interpreter start by a node whose PYTHONPATH starts with this
directory (chaosmirrorq.clock, mode "python"): the wall clock of that process,
time.time() and time.time_ns(), is offset by the number of seconds in the file
MIRRORQ_CLOCK_OFFSET_FILE (re-read at most every 0.1 s), so that the chaos
action step_clock can step it at run time, as an NTP or operator step of
CLOCK_REALTIME would. The monotonic clocks stay untouched (a real step never
moves them). Not a package module: only this file is put on the path."""
from __future__ import annotations

import os
import time as _time

_PATH = os.environ.get("MIRRORQ_CLOCK_OFFSET_FILE", "")
if _PATH:
    _real_time, _real_time_ns, _mono = _time.time, _time.time_ns, _time.monotonic
    _cache = [0.0, -1.0]  # offset (s), when read (monotonic)

    def _offset() -> float:
        now = _mono()
        if now - _cache[1] >= 0.1:
            _cache[1] = now
            try:
                with open(_PATH) as f:
                    _cache[0] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
        return _cache[0]

    def time() -> float:  # noqa: D103
        return _real_time() + _offset()

    def time_ns() -> int:  # noqa: D103
        return _real_time_ns() + int(_offset() * 1e9)

    _time.time = time
    _time.time_ns = time_ns
