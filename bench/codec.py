"""Micro benchmark of the codec's hot path: encode and decode (with publish
spans, as the raft thread decodes) of one Batch of 128 publishes of 1 KiB and
of one Batch of 128 small records (acks and credits), written counted (C/Q
records, machine version >= 2) and count-less (R/P, machine version 1).
Best of 15 rounds, microseconds per batch.

    .venv/bin/python bench/codec.py
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from node.broker.ids import ChanId
from node.replication import codec
from node.replication import command as cmd


def best(fn: Callable[[], object], n: int = 200, rounds: int = 15) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n)
    return min(times) * 1e6


def main() -> None:
    chan = ChanId("n1", 7, 3)
    props = {"delivery_mode": 2, "content_type": "application/octet-stream", "headers": {"k": 1}}
    pubs: list[cmd.Command] = [cmd.BasicPublish(chan, i + 1, "", "q1", False, props, os.urandom(1024))
                               for i in range(128)]
    small: list[cmd.Command] = [cmd.BasicAck(chan, i, False) for i in range(64)]
    small += [cmd.BasicCredit(chan, "ctag", 10) for _ in range(64)]
    before = codec.writes_counted()
    try:
        for name, commands in (("128 publishes of 1 KiB", pubs), ("128 acks and credits", small)):
            batch = cmd.Batch("n1", 1, 1, 1.0, commands)
            for counted in (True, False):
                codec.write_counted(counted)
                data = codec.encode_batch(batch)
                enc = best(lambda b=batch: codec.encode_batch(b))
                dec = best(lambda d=data: codec.decode_batch(d, 0, {}))
                print(f"{name:24} {'counted' if counted else 'count-less':10} {len(data):7} B  "
                      f"encode {enc:6.0f} us  decode {dec:6.0f} us")
    finally:
        codec.write_counted(before)


if __name__ == "__main__":
    main()
