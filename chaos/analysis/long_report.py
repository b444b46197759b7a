#!/usr/bin/env python3
"""The Spark job of `make chaos-long`: every run's history, one dataset, one check.

    python chaos/analysis/long_report.py RAW --dataset DS --out report.json \\
        --md report.md --charts CHART_DIR [--master spark://...|local[2]]
    spark-submit chaos/analysis/long_report.py RAW --dataset DS ...

RAW holds one directory per run, RAW/<experiment>/<run id>/ (the workload's
*.jsonl and run.json). In one Spark session this job
1. rewrites them as a Parquet dataset partitioned by experiment and run
   (DS/experiment=E/run=R/part-*.parquet),
2. checks the whole dataset with check_history.analyze (every run judged on its
   own; the per-experiment sums, and the verdicts per fault window),
3. writes the JSON report, a Markdown table (one row per experiment) and one
   chart per experiment (confirm rate and confirm p99 of every run against
   time, fault windows shaded).
Exit status as check_history.py: 0 no run lost, duplicated-unexpected or
corrupted anything; 1 some did; 2 no verdict (bad input).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_history as ch  # noqa: E402 - the checker beside this file
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

RAW_RE = r"/([^/]+)/([^/]+)/[^/]+\.jsonl$"


def to_dataset(spark: SparkSession, raw: str, dataset: str) -> int:
    """RAW/<experiment>/<run>/*.jsonl -> DS partitioned by experiment and run; the
    experiment comes from each run's directory, the run from its events. Returns
    the number of run directories."""
    runs = sorted(p.parent for p in Path(raw).glob("*/*/run.json"))
    if not runs:
        raise ch.BadInput(f"{raw}: no RAW/<experiment>/<run>/run.json")
    df = (spark.read.schema(ch.JSON_SCHEMA).option("mode", "PERMISSIVE")
          .option("columnNameOfCorruptRecord", ch.CORRUPT)
          .json([str(r / "*.jsonl") for r in runs]))
    path = F.col("_metadata.file_path")
    df = df.withColumn("experiment", F.regexp_extract(path, RAW_RE, 1))
    # a line that is not JSON keeps its place as an event without a type: the
    # checker reports it as bad input (exit 2), as it does for the JSONL
    df = df.withColumn("run", F.coalesce(F.col("run"), F.regexp_extract(path, RAW_RE, 2)))
    (df.select(*ch.SCHEMA.fieldNames(), "experiment")
     .write.mode("overwrite").partitionBy("experiment", "run").parquet(dataset))
    return len(runs)


def table(report: dict[str, Any]) -> str:
    head = ["experiment", "runs", "confirmed", "lost", "duplicates", "unexpected", "corrupted", "recovered",
            "p99 confirm ms in faults", "p99 outside", "longest stall s", "verdict"]
    rows = [head, ["---"] * len(head)]
    for name, e in sorted(report["experiments"].items()):
        def ms(v: Any) -> str:
            return "-" if v is None else f"{v:.0f}"
        rows.append([name, str(e["runs"]), str(e["confirmed"]), str(e["lost"]), str(e["duplicates"]),
                     str(e["unexpected"]), str(e["corrupted"]), str(e["recovered"]),
                     ms(e.get("confirm_p99_ms_in_faults")), ms(e.get("confirm_p99_ms_outside_faults")),
                     "-" if e.get("stall_s_max") is None else f"{e['stall_s_max']:g}",
                     "PASS" if e["ok"] else "FAIL"])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n"


def fault_table(report: dict[str, Any]) -> str:
    """Verdicts per fault kind (the fault's name without its node), all runs."""
    kinds: dict[str, dict[str, Any]] = {}
    for run in report["runs"].values():
        for f in run["faults"]:
            kind = re.sub(r"-n\d+$", "", (f.get("name") or "-").split()[0])  # "pause-n2 n2" -> pause
            k = kinds.setdefault(kind, {"windows": 0, **dict.fromkeys(ch.VERDICTS, 0), "stall_s_max": 0.0})
            k["windows"] += 1
            for v in ch.VERDICTS:
                k[v] += (f.get("verdicts") or {}).get(v, 0)
            k["stall_s_max"] = max(k["stall_s_max"], f.get("stall_s") or 0.0)
    head = ["fault", "windows", *ch.VERDICTS, "longest stall s"]
    rows = [head, ["---"] * len(head)]
    for kind, k in sorted(kinds.items()):
        rows.append([kind, str(k["windows"]), *(str(k[v]) for v in ch.VERDICTS), f"{k['stall_s_max']:g}"])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n"


def render_experiment_charts(report: dict[str, Any], chart: dict[str, Any], out_dir: str) -> list[str]:
    """One PNG per experiment: confirms/s and confirm p99 of each of its runs
    (seconds since the run's first publish), every run's fault windows shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    by_exp: dict[str, list[dict[str, Any]]] = {}
    for cr in chart["runs"]:
        exp = report["runs"][cr["run"]].get("experiment") or "run"
        by_exp.setdefault(exp, []).append(cr)
    written = []
    for exp, crs in sorted(by_exp.items()):
        fig, (ax_rate, ax_lat) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
        for cr in crs:
            for s, e, _name in cr["faults"]:
                end = cr["t_end"] if e is None else e
                for ax in (ax_rate, ax_lat):
                    ax.axvspan(s, end, color="tab:red", alpha=min(0.3, 0.6 / len(crs)), lw=0)
            w = cr["bucket_s"]
            n = int(cr["t_end"] // w) + 1
            # every bucket: no confirm in a second is a 0 (a stall), not the last rate
            # held; a second without publishes has no latency (a gap)
            rate = [0.0] * n
            for x, y in cr["confirm"]:
                if 0 <= round(x / w) < n:
                    rate[round(x / w)] = y
            p99 = [math.nan] * n
            for x, y in cr["p99_ms"]:
                if 0 <= round(x / w) < n:
                    p99[round(x / w)] = max(y, 0.1)
            xs = [i * w for i in range(n)]
            ax_rate.step(xs, rate, where="post", lw=0.8, alpha=0.8)
            ax_lat.step(xs, p99, where="post", lw=0.8, alpha=0.8)
        e = report["experiments"].get(exp, {})
        ax_rate.set_title(f"{exp}: {len(crs)} runs, {e.get('confirmed')} confirmed, {e.get('lost')} lost "
                          f"(fault windows shaded)")
        ax_rate.set_ylabel("confirms/s")
        ax_lat.set_yscale("log")
        ax_lat.set_ylabel("confirm p99 ms (1 s buckets)")
        ax_lat.set_xlabel("seconds since the run's first publish")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{exp}.png")
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="long_report.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", help="RAW/<experiment>/<run>/ histories (JSONL + run.json)")
    ap.add_argument("--dataset", required=True, help="where the Parquet dataset goes (overwritten)")
    ap.add_argument("--out", required=True, help="JSON report")
    ap.add_argument("--md", help="Markdown tables")
    ap.add_argument("--charts", help="directory for one PNG per experiment")
    ap.add_argument("--master", help="Spark master (default local[2], or spark-submit's)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    had_session = SparkSession.getActiveSession() is not None
    spark = ch.make_spark(args.master)
    try:
        n = to_dataset(spark, args.raw, args.dataset)
        t_convert = time.monotonic() - t0
        report, chart = ch.analyze(spark, [args.dataset])
        report["checker"]["convert_seconds"] = round(t_convert, 2)
        report["checker"]["run_dirs"] = n
        report["checker"]["total_seconds"] = round(time.monotonic() - t0, 2)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        if args.md:
            Path(args.md).write_text(
                f"Per experiment ({n} runs, checked on Spark {report['checker']['spark']} "
                f"`{report['checker']['master']}` in {report['checker']['total_seconds']:.0f} s):\n\n"
                + table(report) + "\nPer fault kind (every window of every run):\n\n" + fault_table(report))
        if args.charts:
            render_experiment_charts(report, chart, args.charts)
        print(table(report))
        return 0 if report["ok"] else 1
    except ch.BadInput as e:
        print(f"long_report: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - no verdict is exit 2, never 1
        traceback.print_exc()
        print(f"long_report: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    finally:
        if not had_session:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
