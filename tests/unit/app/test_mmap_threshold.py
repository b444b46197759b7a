"""The node pins glibc's mmap threshold (node.app.memory.fix_mmap_threshold):
once a multi-MiB buffer has been freed, a 256 KiB block must still be mmap'd
(and so unmapped on free) instead of landing in the heap, where it fragments
what malloc_trim can hand back after a drain. Each case runs in a fresh
interpreter: the threshold is process-wide."""
from __future__ import annotations

import ctypes.util
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

_PROBE = r"""
import ctypes, ctypes.util, sys
from node.app.memory import fix_mmap_threshold
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
pinned = fix_mmap_threshold() if sys.argv[1] == "pin" else False
big = bytearray(8 << 20)  # mmap'd at the start threshold; freeing it raises the dynamic one
del big
before = libc.mallinfo2().hblks
block = bytearray(256 << 10)
print(pinned, libc.mallinfo2().hblks - before)
"""


def _probe(mode: str, env: dict[str, str] | None = None) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                         check=True, env={**os.environ, **(env or {})}, timeout=60).stdout.split()
    return out[0], int(out[1])


def test_pinned_threshold_keeps_mmapping_blocks_after_a_large_free() -> None:
    assert ctypes.util.find_library("c")
    assert _probe("pin") == ("True", 1)


def test_without_the_pin_glibc_moves_such_blocks_into_the_heap() -> None:
    # the behaviour the pin exists for: if this starts failing, glibc no longer
    # adapts its threshold and the pin may go
    assert _probe("none") == ("False", 0)


def test_an_explicit_environment_setting_is_left_to_glibc() -> None:
    pinned, _ = _probe("pin", {"MALLOC_MMAP_THRESHOLD_": "1048576"})
    assert pinned == "False"
