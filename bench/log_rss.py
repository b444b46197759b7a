#!/usr/bin/env python3
"""RSS of one mirrorq node as a backlog of persistent messages grows, before any snapshot.

    .venv/bin/python bench/log_rss.py                  # 100,000 x 1 KiB
    .venv/bin/python bench/log_rss.py --count 300000

Starts one node (compaction on time only, an hour: no snapshot during the run), reads
its VmRSS, fills a durable queue with N random persistent messages (Java generator,
streaming confirms), reads VmRSS again, kill -9s and restarts it and reads VmRSS once
the queue reports N messages. Prints JSON: RSS before/after, bytes per message, the
fill rate, the log's bytes on disk. Issue 27: pysyncobj's journal kept every entry in
a Python list until a snapshot; the segment log keeps 12 bytes per entry.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from run import amqp_ready, bench, compile_bench, tail  # noqa: E402
from snapshot import Node, passive_count  # noqa: E402


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def rss_parts(pid: int) -> dict[str, float]:
    """RssAnon (heap) and RssFile (mapped files), MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("RssAnon:", "RssFile:")):
            out[line.split(":")[0]] = round(int(line.split()[1]) / 1e3, 1)
    return out


def disk(data: Path) -> int:
    return sum(p.stat().st_size for p in data.rglob("*") if p.is_file())


def wait_up(node: Node) -> None:
    deadline = time.monotonic() + 120
    while not amqp_ready("127.0.0.1", node.amqp_port):
        if not node.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"node did not start:\n{tail(node.logfile)}")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--size", type=int, default=1024)
    a = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="mirrorq-rss-"))
    node = Node(workdir, 3600.0)
    queue = f"rss-{uuid.uuid4().hex[:8]}"
    try:
        cp = compile_bench(workdir / "classes")
        node.start()
        wait_up(node)
        time.sleep(2)
        assert node.proc is not None
        before = rss(node.proc.pid)
        fill = bench(cp, node.url, 1800, "--mode", "confirms", "--count", str(a.count), "--size", str(a.size),
                     "--window", "500", "--publishers", "1", "--queue", queue, "--keep", "--timeout", "120")
        if "error" in fill:
            raise RuntimeError(f"fill failed: {fill['error']}")
        after = rss(node.proc.pid)
        node.kill9()
        node.start()
        wait_up(node)
        deadline = time.monotonic() + 600
        while passive_count(node.amqp_port, queue) != a.count:
            if time.monotonic() > deadline or not node.alive():
                raise RuntimeError(f"queue not back after the restart:\n{tail(node.logfile)}")
            time.sleep(0.2)
        restarted = rss(node.proc.pid)
        time.sleep(25)  # the node hands back what the replay freed (idle malloc trim, 20 s)
        settled = rss(node.proc.pid)
        parts = rss_parts(node.proc.pid)
        out = {"count": a.count, "size": a.size, "fill_msg_per_s": fill.get("msg_per_s"),
               "rss_before_mb": round(before / 1e6, 1), "rss_after_fill_mb": round(after / 1e6, 1),
               "rss_bytes_per_message": round((after - before) / a.count),
               "rss_after_restart_mb": round(restarted / 1e6, 1),
               "rss_restart_settled_mb": round(settled / 1e6, 1), "rss_restart_settled_parts_mb": parts,
               "data_dir_mb": round(disk(node.data) / 1e6, 1)}
        print(json.dumps(out))
        return 0
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
