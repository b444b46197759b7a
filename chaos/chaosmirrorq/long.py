"""`make chaos-long`: every experiment many times with different seeds, one Spark
check over all the histories, a report with a table and charts.

    python -m chaosmirrorq.long                       # 10 rounds of every experiment
    python -m chaosmirrorq.long --runs 3 --minutes 45 --only leader-kill-loop,packet-loss
    python -m chaosmirrorq.long --spark standalone    # the check on a standalone Spark cluster
    python -m chaosmirrorq.long --docs docs/chaos-long

A round runs each experiment once (`chaos run`, judged like the suite), so a
time budget (--minutes) that ends early still covers every experiment evenly.
Run k of an experiment uses seed SEED+k: the body sizes and bytes
(CHAOS_SEED) and the fault's length, drawn log-uniformly from
--fault-seconds (5..60 s by default; kills stay down min(that, 20) s, a long
pause and a full disk last at least 8 s, beyond the 5 s in-sync bound). Each
run is first judged alone with the pure-Python checker (a JVM start per run
would cost more than the run); then its history is kept as
OUT/raw/<experiment>/<run id>/ and, once every run is done, one Spark job
(chaos/analysis/long_report.py) rewrites them all as Parquet partitioned by
experiment and run (OUT/parquet) and checks them together: OUT/report.json,
OUT/report.md (per experiment: runs, confirmed, lost, duplicates, unexpected,
corrupted, recovered, confirm p99 in and out of fault windows, longest stall;
per fault kind: the verdicts inside its windows) and OUT/charts/<experiment>.png.
Any run that fails, or any loss in the Spark check, makes the exit status 1.

A full run (10 rounds of 18 experiments with 5-60 s faults) takes about three
hours here. `--resume` keeps OUT and runs only the (round, experiment) pairs
not yet in OUT/runs.json, so it can be done in sittings with --minutes; each
row records the commit it ran (the report lists them), and every sitting
ends with the one Spark check over all the histories kept so far.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaosmirrorq import suite
from harness.process import REPO

ANALYSIS = REPO / "chaos" / "analysis"


def fault_seconds(seed: int, lo: float, hi: float, experiment: str = "") -> float:
    """Log-uniform in [lo, hi]: short faults often, a minute-long one now and then;
    a different draw for each experiment of a round."""
    rng = random.Random(f"{seed}/{experiment}")
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 1)


def run_env(base: dict[str, str], seed: int, lo: float, hi: float, experiment: str = "") -> dict[str, str]:
    secs = fault_seconds(seed, lo, hi, experiment)
    env = dict(base)
    env.update(CHAOS_SEED=str(seed), CHAOS_FAULT_SECONDS=str(secs),
               CHAOS_LONG_PAUSE_SECONDS=str(max(secs, 8.0)), CHAOS_DISK_FULL_SECONDS=str(max(secs, 8.0)),
               CHAOS_DOWN_SECONDS=str(min(secs, 20.0)), CHAOS_CHECKER="fallback")
    return env


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def parse_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want MIN:MAX seconds, e.g. 5:60") from None
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: want 0 < MIN <= MAX")
    return lo, hi


def keep_history(base: Path, raw: Path, experiment: str) -> str | None:
    """Move the run's history to RAW/<experiment>/<run id>/; returns the run id."""
    hist = base / "history"
    meta = hist / "run.json"
    if not meta.exists():
        return None
    run_id = str(json.loads(meta.read_text()).get("run") or base.name)
    dest = raw / experiment / run_id
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(hist), str(dest))
    return run_id


def spark_check(out: Path, mode: str, timeout: float) -> tuple[int, float]:
    """The one Spark job over every run: local[2] or a standalone cluster (a master
    and two workers on loopback, started and stopped here)."""
    args = [str(ANALYSIS / "long_report.py"), str(out / "raw"), "--dataset", str(out / "parquet"),
            "--out", str(out / "report.json"), "--md", str(out / "report.md"),
            "--charts", str(out / "charts")]
    t0 = time.monotonic()
    with open(out / "spark.log", "w") as log:
        if mode == "standalone":
            sys.path.insert(0, str(ANALYSIS))
            import spark_standalone as ss  # the analysis scripts are not a package

            sdir = out / "spark-standalone"
            cluster = ss.up(sdir, workers=2, cores=1, memory="2g")
            try:
                rc = subprocess.call(ss.submit_cmd(cluster, args, executor_memory="2g"), env=ss._env(sdir),
                                     stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            finally:
                ss.down(sdir)
        else:
            rc = subprocess.call([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    return rc, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="rounds: runs of each experiment (default 10)")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="stop starting runs after this many minutes (0: no limit)")
    ap.add_argument("--only", default="", help="comma-separated experiment names")
    ap.add_argument("--seed", type=int, default=1000, help="run k of an experiment uses SEED+k")
    ap.add_argument("--fault-seconds", type=parse_range, default=(5.0, 60.0), metavar="MIN:MAX")
    ap.add_argument("--out", default=str(REPO / "data" / "chaos-long"))
    ap.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    ap.add_argument("--spark", choices=("local", "standalone"), default="local",
                    help="where the one Spark check runs (default local[2])")
    ap.add_argument("--docs", default="", help="copy report.md and the charts here (e.g. docs/chaos-long)")
    ap.add_argument("--resume", action="store_true",
                    help="keep OUT and run only what OUT/runs.json does not hold yet")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.minutes < 0:
        ap.error("--minutes must be >= 0")
    names = [n for n in args.only.split(",") if n] or list(suite.ORDER)
    unknown = [n for n in names if not (suite.EXPERIMENTS_DIR / f"{n}.json").exists()]
    if unknown:
        ap.error(f"no such experiment: {', '.join(unknown)}")

    out = Path(args.out).resolve()
    rows: list[dict[str, Any]] = []
    if args.resume and (out / "runs.json").exists():
        rows = json.loads((out / "runs.json").read_text())
    elif out.exists():
        shutil.rmtree(out)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    done = {(r["round"], r["experiment"]) for r in rows}
    commit = git_commit()
    env = dict(os.environ)
    for var, val in suite.SHORT.items():
        env.setdefault(var, val)
    from chaosmirrorq.netns import netns_unavailable_reason
    if netns_unavailable_reason():
        env["CHAOS_NETNS"] = "false"
    skips = {n: r for n in names if (r := suite.skip_reason(suite.EXPERIMENTS_DIR / f"{n}.json"))}
    for n, why in skips.items():
        print(f"[chaos-long] {n}: SKIP ({why})", flush=True)
    todo = [n for n in names if n not in skips]
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else math.inf
    t0 = time.monotonic()
    stopped_early = False
    for k in range(args.runs):
        for name in todo:
            if (k, name) in done:
                continue
            if time.monotonic() >= deadline:
                stopped_early = True
                break
            seed = args.seed + k
            renv = run_env(env, seed, args.fault_seconds[0], args.fault_seconds[1], name)
            round_dir = out / "runs" / f"r{k:02d}"
            print(f"[chaos-long] round {k + 1}/{args.runs} {name} seed={seed} "
                  f"fault={renv['CHAOS_FAULT_SECONDS']}s ...", flush=True)
            started = time.monotonic()
            row = suite.run_one(name, round_dir, renv, args.timeout)
            row.update(round=k, seed=seed, fault_seconds=float(renv["CHAOS_FAULT_SECONDS"]), commit=commit)
            row["run"] = keep_history(round_dir / name, out / "raw", name)
            if row["verdict"] == "PASS":  # a passing run's node data is not needed (GBs over an hour)
                shutil.rmtree(round_dir / name / "cluster", ignore_errors=True)
            row["wall_s"] = round(time.monotonic() - started, 1)
            rows.append(row)
            print(f"[chaos-long] {name} r{k}: {row['verdict']} in {row.get('seconds')}s "
                  f"confirmed={row.get('confirmed')} lost={row.get('lost')} {'; '.join(row['reasons'])}",
                  flush=True)
            (out / "runs.json").write_text(json.dumps(rows, indent=2, default=str))
        if stopped_early:
            break
    chaos_seconds = sum(float(r.get("wall_s") or r.get("seconds") or 0) for r in rows)
    commits = sorted({str(r.get("commit") or "?") for r in rows})
    rounds = max((r["round"] for r in rows), default=-1) + 1
    failed = [r for r in rows if r["verdict"] != "PASS"]
    kept = [r for r in rows if r.get("run")]
    rc_spark, spark_seconds = (2, 0.0)
    if kept:
        print(f"[chaos-long] Spark check of {len(kept)} runs ({args.spark}) ...", flush=True)
        rc_spark, spark_seconds = spark_check(out, args.spark, timeout=3600)
    summary = {"runs": len(rows), "failed": len(failed), "skipped": skips, "stopped_early": stopped_early,
               "chaos_seconds": round(chaos_seconds, 1), "spark": args.spark, "spark_exit": rc_spark,
               "spark_seconds": round(spark_seconds, 1), "fault_seconds": list(args.fault_seconds),
               "seed": args.seed, "commits": commits, "sitting_seconds": round(time.monotonic() - t0, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    md = out / "report.md"
    if md.exists():
        header = (f"`make chaos-long`: {len(rows)} runs of {len(todo)} experiments in "
                  f"{chaos_seconds / 60:.0f} min (seeds {args.seed}..{args.seed + rounds - 1}, faults "
                  f"{args.fault_seconds[0]:g}-{args.fault_seconds[1]:g} s), then one Spark check "
                  f"({args.spark}) in {spark_seconds:.0f} s. Failed runs: {len(failed)}. "
                  f"Build: {', '.join(commits)}.\n\n")
        md.write_text(header + md.read_text())
        print(md.read_text())
        if args.docs:
            docs = Path(args.docs)
            docs.mkdir(parents=True, exist_ok=True)
            shutil.copy(md, docs / "report.md")
            for png in sorted((out / "charts").glob("*.png")):
                shutil.copy(png, docs / png.name)
    else:
        print(f"[chaos-long] no report: the Spark check exited {rc_spark} (see {out / 'spark.log'})")
    print(f"[chaos-long] {len(rows) - len(failed)}/{len(rows)} runs passed; Spark check exit {rc_spark}; "
          f"details in {out}")
    return 0 if not failed and rc_spark == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
