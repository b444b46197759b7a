#!/usr/bin/env python3
"""py-spy profiles of a 3-node mirrorq cluster under load (docs/performance.md).

    .venv/bin/python bench/profile.py [--seconds 12] [--out bench/profile]

Starts 3 nodes on loopback, drives bench/java/Bench.java against a follower
(scenario: streaming confirms, window 1,000, then a consume with manual acks,
prefetch 300), and meanwhile records the leader and that follower with
`py-spy record --format raw` (collapsed stacks, all threads). Writes the raw
stacks and a summary (top functions by own samples and by inclusive samples)
per node and phase to OUT/profile-summary.txt.
"""
from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from run import bench, compile_bench  # noqa: E402

from harness.process import Cluster  # noqa: E402

PYSPY = str(REPO / ".venv" / "bin" / "py-spy")


def summarize(raw: Path, top: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  if " (" in f else f for f in stack.split(";")]
        if frames:
            own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    out = [f"samples: {total}", "  own%   function"]
    out += [f"  {100 * c / total:5.1f}  {f}" for f, c in own.most_common(top)]
    out += ["  incl%  function"]
    out += [f"  {100 * c / total:5.1f}  {f}" for f, c in incl.most_common(top)]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--out", default=str(BENCH / "profile"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="mq-profile-"))
    cp = compile_bench(tmp / "classes")
    c = Cluster(tmp, 3).start()
    report = []
    try:
        leader = c.leader()
        follower = c.followers()[0]
        url = f"amqp://guest:guest@127.0.0.1:{follower.amqp_port}/"
        phases = [("publish", ["--mode", "confirms", "--count", "400000", "--size", "1024",
                               "--window", "1000", "--queue", "prof", "--keep"]),
                  ("consume", ["--mode", "consume", "--queue", "prof", "--prefetch", "300",
                               "--ack-every", "1"])]
        for phase, args in phases:
            result: dict = {}
            t = threading.Thread(target=lambda args=args, result=result: result.update(
                bench(cp, url, 600, *args)))
            t.start()
            time.sleep(2.0)  # past connection setup and JVM warm-up
            procs = []
            for role, node in (("leader", leader), ("follower", follower)):
                raw = out / f"{phase}-{role}.txt"
                procs.append((role, raw, subprocess.Popen(
                    [PYSPY, "record", "--format", "raw", "--threads", "--nonblocking", "-r", "200",
                     "-d", str(int(a.seconds)), "-o", str(raw), "-p", str(node.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
            for _role, _raw, p in procs:
                p.wait(timeout=a.seconds + 60)
            t.join(900)
            rate = result.get("rate") or result.get("msgs_per_sec") or result.get("error")
            report.append(f"===== {phase}: Bench result: {rate}")
            for role, raw, _p in procs:
                report.append(f"--- {phase} / {role} ({raw.name})")
                report.append(summarize(raw) if raw.exists() else "no profile")
    finally:
        c.kill_all()
    text = "\n".join(report)
    (out / "profile-summary.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
