"""Random checksummed message bodies and their frames.

A body is `TAG:ID:CCCCCCCC:` followed by random bytes up to the requested size, where
CCCCCCCC is the crc32 (8 lowercase hex digits) of everything else: the `TAG:ID:` head
and the random tail. Real payloads (JSON, protobuf, compressed or encrypted data) do
not compress; the random tail makes sure the replication path is exercised with bodies
that zlib cannot shrink. The random bytes may contain b":": parse only the first fields.
"""
from __future__ import annotations

import os
import random
import threading
import zlib

from harness.amqp import frame

POOL_BYTES = 8 * 1024 * 1024  # random bytes bodies are cut from (> a follower's 4 MiB window)
CHECKSUM_LEN = 8


def body_overhead(tag: str, msg_id: int) -> int:
    """Bytes of a body that are not random: `TAG:ID:CCCCCCCC:`."""
    return len(f"{tag}:{msg_id}:") + CHECKSUM_LEN + 1


_POOLS: dict[int | None, bytes] = {}
_POOLS_LOCK = threading.Lock()


def random_pool(seed: int | None = None) -> bytes:
    """POOL_BYTES random bytes (os.urandom; random.Random(seed).randbytes with a seed),
    made once per process and seed."""
    with _POOLS_LOCK:
        pool = _POOLS.get(seed)
        if pool is None:
            pool = os.urandom(POOL_BYTES) if seed is None else random.Random(seed).randbytes(POOL_BYTES)
            _POOLS[seed] = pool
        return pool


def checksum(head: bytes, tail: bytes | memoryview) -> bytes:
    return b"%08x" % zlib.crc32(tail, zlib.crc32(head))


class RandomBodies:
    """Random checksummed bodies (see above) of `min_size`..`max_size` bytes, cut from a
    shared pool of random bytes: no random-number generation per message, only a slice
    and a crc32. Consecutive bodies take consecutive, non-overlapping slices of the pool
    (from a random start), so nothing repeats within POOL_BYTES of one maker's output.
    Sizes are log-uniform between the bounds (as many 1-2 KiB as 32-64 KiB bodies; mean
    about 15 KiB for 1-64 KiB), from random.Random(seed). Thread-safe."""

    def __init__(self, min_size: int = 1024, max_size: int | None = None,
                 seed: int | str | None = None, pool_seed: int | None = None) -> None:
        self.min_size = max(0, int(min_size))
        self.max_size = max(self.min_size, int(max_size if max_size is not None else min_size))
        self.rng = random.Random(seed)
        self.pool = random_pool(pool_seed)
        self._off = self.rng.randrange(len(self.pool))
        self._lock = threading.Lock()

    def next_size(self) -> int:
        lo, hi = self.min_size, self.max_size
        if hi <= lo or lo <= 0:
            return hi
        with self._lock:
            u = self.rng.random()
        return min(hi, max(lo, int(round(lo * (hi / lo) ** u))))

    def _take(self, n: int) -> bytes:
        pool = self.pool
        n = min(n, len(pool))
        with self._lock:
            off = self._off
            if off + n > len(pool):
                off = 0
            self._off = off + n
        return pool[off:off + n]

    def make(self, tag: str, msg_id: int, size: int | None = None) -> bytes:
        """A body of exactly `size` bytes (default: the next random size), longer only when
        `size` is below the `TAG:ID:CCCCCCCC:` overhead."""
        if size is None:
            size = self.next_size()
        head = f"{tag}:{msg_id}:".encode()
        tail = self._take(max(0, size - len(head) - CHECKSUM_LEN - 1))
        return head + checksum(head, tail) + b":" + tail


_DEFAULT_BODIES: RandomBodies | None = None


def make_body(tag: str, msg_id: int, size: int = 1024) -> bytes:
    """`TAG:ID:CCCCCCCC:<random bytes>`, exactly `size` bytes when `size` >= the overhead
    (body_overhead); body_id() reads the id back, body_ok() checks the checksum."""
    global _DEFAULT_BODIES
    if _DEFAULT_BODIES is None:
        _DEFAULT_BODIES = RandomBodies()
    return _DEFAULT_BODIES.make(tag, msg_id, size)


def body_id(body: bytes) -> tuple[str, int]:
    """(tag, id) from a body's head. ValueError if it has none."""
    tag, mid, _ = body.split(b":", 2)
    return tag.decode(), int(mid)


def body_ok(body: bytes) -> bool:
    """True when `body` is a make_body() body whose checksum matches its content."""
    i1 = body.find(b":")
    i2 = body.find(b":", i1 + 1) if i1 >= 0 else -1
    if i1 <= 0 or i2 < 0:
        return False
    end = i2 + 1 + CHECKSUM_LEN
    if len(body) < end + 1 or body[end:end + 1] != b":":
        return False
    try:
        int(body[i1 + 1:i2])
    except ValueError:
        return False
    head = body[:i2 + 1]
    return body[i2 + 1:end] == checksum(head, memoryview(body)[end + 1:])


def body_frames(channel: int, body: bytes, frame_max: int = 131072) -> bytes:
    """`body` as content-body frames of at most `frame_max` bytes each."""
    step = max(1, frame_max - 8)
    if len(body) <= step:
        return frame(3, channel, body)
    return b"".join(frame(3, channel, body[i:i + step]) for i in range(0, len(body), step))
