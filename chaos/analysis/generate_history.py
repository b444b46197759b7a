#!/usr/bin/env python3
"""Synthetic chaos-run history (chaos/HISTORY.md format) for the history checker.

    python chaos/analysis/generate_history.py RUN_DIR --events 10000000 --seed 7 \\
        [--lost 25] [--unexpected 3] [--faults 3] [--workers 2] [--parquet]

Writes RUN_DIR/run.json, one pub-NNN.jsonl per publisher (its publishes and the
deliveries/settles of its messages), control.jsonl (faults, injected unexpected
deliveries, drain_done) and expected.json: the metrics the checker must find
(confirmed, lost, duplicates, unexpected, recovered, redeliveries, the injected
ids). Deterministic for a given seed and parameters (independent of --workers):
every publisher has its own random stream.

The model, per message: a publish whose outcome is ack, or (more often inside
fault windows) nack / timeout / connection-lost; an uncertain outcome may still
have been enqueued; a failed publish is republished (same msg_id) with some
probability. Every enqueued copy is delivered (redelivered=false), sometimes
nack-requeued or crashed and delivered again (redelivered=true). Injected lost
messages are acked and never delivered; injected unexpected ones are delivered
and never published.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

FAULT_KINDS = ("kill-leader", "pause", "partition", "kill-follower")


@dataclass
class Params:
    out: str
    events: int = 100_000
    seed: int = 1
    run: str = ""
    experiment: str = "synthetic"
    publishers: int = 8
    consumers: int = 6
    nodes: int = 3
    rate: float = 5000.0  # publishes per second, all publishers together
    faults: int = 3
    fault_seconds: float = 0.0  # 0: 35 % of the run, split among the faults
    fail: float = 0.002  # failed-outcome probability outside faults
    fault_fail: float = 0.05  # ... inside fault windows
    republish: float = 0.8  # a failed publish is republished (same msg_id)
    uncertain_enqueued: float = 0.5  # timeout/connection-lost that was enqueued anyway
    redeliver: float = 0.02  # first delivery nack-requeued or crashed
    crash_share: float = 0.3
    lost: int = 0
    unexpected: int = 0
    start_ts: float = 1_700_000_000.0
    workers: int = 0

    def events_per_msg(self) -> float:
        return 3.0 + 2.0 * self.redeliver + 3.0 * self.fail

    def span(self) -> float:
        return self.events / self.events_per_msg() / self.rate

    def fault_windows(self) -> list[tuple[float, float, str]]:
        span, f = self.span(), self.faults
        if f <= 0:
            return []
        d = self.fault_seconds or span * 0.35 / f
        out = []
        for i in range(f):
            mid = self.start_ts + span * (0.15 + 0.7 * (i + 0.5) / f)
            name = f"{FAULT_KINDS[i % len(FAULT_KINDS)]} n{1 + i % self.nodes}"
            out.append((mid - d / 2, mid + d / 2, name))
        return out


def _f(x: float) -> str:
    return f"{x:.6f}"


def gen_publisher(task: tuple[Params, int, list[int]]) -> dict[str, Any]:
    """Write pub-NNN.jsonl for publisher p; return its tallies."""
    prm, p, lost_ks = task
    rng = random.Random(f"{prm.seed}:{p}")
    rnd, expo, randrange = rng.random, rng.expovariate, rng.randrange
    P, run = prm.publishers, prm.run
    target = math.ceil(prm.events / P)
    workload_end = prm.start_ts + prm.span()
    windows = [(s, e) for s, e, _ in prm.fault_windows()]
    wi = 0
    lost_set = set(lost_ks)
    pub = f"p{p}"
    nodes = [f"n{i + 1}" for i in range(prm.nodes)]
    node_i = p % prm.nodes
    consumers = [f"c{i}" for i in range(prm.consumers)]
    n_cons = len(consumers)
    seq = 0
    ev = 0
    tally: dict[str, float] = dict(publishes=0, acks=0, confirmed=0, lost=0, duplicates=0, recovered=0, redeliveries=0)
    max_ts = 0.0
    head_p = '{"type":"publish","run":"' + run + '","msg_id":"'
    head_d = '{"type":"deliver","run":"' + run + '","msg_id":"'
    head_s = '{"type":"settle","run":"' + run + '","msg_id":"'
    path = os.path.join(prm.out, f"pub-{p:03d}.jsonl")
    buf: list[str] = []
    with open(path, "w", buffering=1 << 20) as fh:
        k = 0
        while ev < target:
            g = k * P + p
            mid = f"{pub}-{g}"
            t = prm.start_ts + g / prm.rate + rnd() * 0.0005
            while wi < len(windows) and t > windows[wi][1]:
                wi += 1
            in_fault = wi < len(windows) and windows[wi][0] <= t
            node = nodes[node_i]
            copies: list[float] = []  # enqueue times
            acked = False
            forced_lost = k in lost_set
            if forced_lost or rnd() >= (prm.fault_fail if in_fault else prm.fail):
                lat = 0.0005 + expo(250.0)
                if in_fault and rnd() < 0.3:
                    lat += 0.05 + rnd() * 1.5
                seq += 1
                buf.append(f'{head_p}{mid}","publisher":"{pub}","seq":{seq},"node":"{node}","send_ts":{_f(t)},"outcome":"ack","outcome_ts":{_f(t + lat)}}}\n')
                ev += 1
                tally["publishes"] += 1
                tally["acks"] += 1
                acked = True
                copies.append(t + lat * 0.5)
            else:
                u = rnd()
                kind = "nack" if u < 1 / 3 else ("timeout" if u < 2 / 3 else "connection-lost")
                if kind == "nack":
                    ots = t + 0.001 + expo(200.0)
                    ots_s = _f(ots)
                elif kind == "timeout":
                    ots = t + 5.0
                    ots_s = _f(ots)
                else:
                    ots = t + 0.2 + rnd()
                    ots_s = "null"
                seq += 1
                buf.append(f'{head_p}{mid}","publisher":"{pub}","seq":{seq},"node":"{node}","send_ts":{_f(t)},"outcome":"{kind}","outcome_ts":{ots_s}}}\n')
                ev += 1
                tally["publishes"] += 1
                if kind != "nack" and rnd() < prm.uncertain_enqueued:
                    copies.append(t + 0.001)
                if kind == "connection-lost":
                    node_i = (node_i + 1) % prm.nodes
                    node = nodes[node_i]
                if rnd() < prm.republish:
                    t2 = ots + 0.01
                    lat = 0.0005 + expo(250.0)
                    seq += 1
                    buf.append(f'{head_p}{mid}","publisher":"{pub}","seq":{seq},"node":"{node}","send_ts":{_f(t2)},"outcome":"ack","outcome_ts":{_f(t2 + lat)}}}\n')
                    ev += 1
                    tally["publishes"] += 1
                    tally["acks"] += 1
                    acked = True
                    copies.append(t2 + lat * 0.5)
            if acked:
                tally["confirmed"] += 1
            if forced_lost:
                tally["lost"] += 1
                copies = []
            elif len(copies) >= 2:
                tally["duplicates"] += 1
            elif not acked and copies:
                tally["recovered"] += 1
            for enq in copies:
                dts = enq + 0.001 + expo(100.0)
                c = randrange(n_cons)
                ph = "drain" if dts > workload_end else "workload"
                dn = nodes[c % prm.nodes]
                buf.append(f'{head_d}{mid}","consumer":"{consumers[c]}","node":"{dn}","redelivered":false,"ts":{_f(dts)},"phase":"{ph}"}}\n')
                ev += 1
                if rnd() < prm.redeliver:
                    action = "crash" if rnd() < prm.crash_share else "nack-requeue"
                    buf.append(f'{head_s}{mid}","consumer":"{consumers[c]}","node":"{dn}","ts":{_f(dts + 0.001)},"action":"{action}"}}\n')
                    c2 = (c + 1) % n_cons
                    dts += 1.0 if action == "crash" else 0.01
                    ph = "drain" if dts > workload_end else "workload"
                    buf.append(f'{head_d}{mid}","consumer":"{consumers[c2]}","node":"{nodes[c2 % prm.nodes]}","redelivered":true,"ts":{_f(dts)},"phase":"{ph}"}}\n')
                    c = c2
                    ev += 2
                    tally["redeliveries"] += 1
                buf.append(f'{head_s}{mid}","consumer":"{consumers[c]}","node":"{nodes[c % prm.nodes]}","ts":{_f(dts + 0.001)},"action":"ack"}}\n')
                ev += 1
                if dts > max_ts:
                    max_ts = dts
            k += 1
            if len(buf) >= 20000:
                fh.write("".join(buf))
                buf.clear()
        fh.write("".join(buf))
    tally["events"] = ev
    tally["messages"] = k
    tally["max_ts"] = max_ts
    return tally


def generate(prm: Params) -> dict[str, Any]:
    """Write the run; return the expected metrics (also written to expected.json)."""
    os.makedirs(prm.out, exist_ok=True)
    prm.run = prm.run or f"gen-{prm.seed}"
    P = prm.publishers
    rng = random.Random(f"{prm.seed}:main")
    per_pub_msgs = prm.events / prm.events_per_msg() / P
    cap = int(per_pub_msgs * 0.8)
    if prm.lost > cap * P:
        raise SystemExit(f"--lost {prm.lost}: too many for {prm.events} events")
    picked: set[tuple[int, int]] = set()
    while len(picked) < prm.lost:
        picked.add((rng.randrange(P), rng.randrange(max(cap, 1))))
    lost_by_pub: dict[int, list[int]] = {p: [] for p in range(P)}
    for p, k in picked:
        lost_by_pub[p].append(k)
    tasks = [(prm, p, sorted(lost_by_pub[p])) for p in range(P)]
    workers = prm.workers or os.cpu_count() or 1
    if workers > 1 and P > 1:
        with mp.get_context("fork").Pool(min(workers, P)) as pool:
            tallies = pool.map(gen_publisher, tasks, chunksize=1)
    else:
        tallies = [gen_publisher(t) for t in tasks]
    total = {k: sum(t[k] for t in tallies) for k in tallies[0] if k != "max_ts"}
    end_ts = max(t["max_ts"] for t in tallies) + 1.0

    # control.jsonl: faults, injected unexpected deliveries, drain_done
    span = prm.span()
    ghosts = [f"ghost-{prm.seed}-{i}" for i in range(prm.unexpected)]
    with open(os.path.join(prm.out, "control.jsonl"), "w") as fh:
        for s, e, name in prm.fault_windows():
            fh.write(json.dumps({"type": "fault", "run": prm.run, "name": name, "start_ts": s, "end_ts": e}) + "\n")
        for gid in ghosts:
            ts = prm.start_ts + rng.random() * span
            fh.write(json.dumps({"type": "deliver", "run": prm.run, "msg_id": gid, "consumer": "c0", "node": "n1",
                                 "redelivered": False, "ts": ts, "phase": "workload"}) + "\n")
            fh.write(json.dumps({"type": "settle", "run": prm.run, "msg_id": gid, "consumer": "c0", "node": "n1",
                                 "ts": ts + 0.001, "action": "ack"}) + "\n")
        fh.write(json.dumps({"type": "drain_done", "run": prm.run, "ts": end_ts}) + "\n")
    n_control = len(prm.fault_windows()) + 2 * len(ghosts) + 1
    with open(os.path.join(prm.out, "run.json"), "w") as fh:
        json.dump({"run": prm.run, "experiment": prm.experiment, "started": prm.start_ts, "ended": end_ts}, fh)

    expected = {
        "run": prm.run,
        "events": total["events"] + n_control,
        "messages": total["messages"],
        "publishes": total["publishes"],
        "acks": total["acks"],
        "confirmed": total["confirmed"],
        "lost": total["lost"],
        "duplicates": total["duplicates"],
        "unexpected": len(ghosts),
        "recovered": total["recovered"],
        "redeliveries": total["redeliveries"],
        "lost_ids": sorted(f"p{p}-{k * P + p}" for p, k in picked),
        "unexpected_ids": ghosts,
        "faults": [{"name": n, "start_ts": s, "end_ts": e} for s, e, n in prm.fault_windows()],
        "params": {k: v for k, v in asdict(prm).items() if k not in ("out", "workers")},
    }
    with open(os.path.join(prm.out, "expected.json"), "w") as fh:
        json.dump(expected, fh, indent=1)
    return expected


def to_parquet(run_dir: str, master: str | None = None) -> None:
    """Rewrite the run's JSONL files as RUN_DIR/events.parquet (Spark, the checker's schema)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import check_history as ch

    spark = ch.make_spark(master)
    df = spark.read.schema(ch.SCHEMA).json(os.path.join(run_dir, "*.jsonl"))
    df.write.mode("overwrite").parquet(os.path.join(run_dir, "events.parquet"))
    for name in os.listdir(run_dir):
        if name.endswith(".jsonl"):
            os.remove(os.path.join(run_dir, name))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", metavar="RUN_DIR")
    d = Params(out="")
    for name, val in asdict(d).items():
        if name == "out":
            continue
        ap.add_argument("--" + name.replace("_", "-"), type=type(val), default=val)
    ap.add_argument("--parquet", action="store_true", help="write events.parquet instead of JSONL (via Spark)")
    ap.add_argument("--clean", action="store_true", help="empty RUN_DIR first")
    a = ap.parse_args(argv)
    if a.clean and os.path.isdir(a.out):
        shutil.rmtree(a.out)
    prm = Params(**{k: getattr(a, k) for k in asdict(d)})
    t = time.monotonic()
    exp = generate(prm)
    gen_s = time.monotonic() - t
    if a.parquet:
        t2 = time.monotonic()
        to_parquet(prm.out)
        print(f"parquet: {time.monotonic() - t2:.1f} s", file=sys.stderr)
    summary = {k: exp[k] for k in ("run", "events", "confirmed", "lost", "duplicates", "unexpected", "recovered", "redeliveries")}
    summary["seconds"] = round(gen_s, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
