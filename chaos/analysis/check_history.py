#!/usr/bin/env python3
"""History checker for mirrorq chaos runs, on Spark (PySpark DataFrames).

    python chaos/analysis/check_history.py RUN_DIR [RUN_DIR ...] \\
        --out report.json --chart chart.png [--master local[2]]
    spark-submit chaos/analysis/check_history.py RUN_DIR ... --out ... --chart ...

Reads every RUN_DIR/*.jsonl (and RUN_DIR/*.parquet) with an explicit schema and
computes per run the metrics defined in chaos/HISTORY.md. Only small aggregates
come back to the driver. Exit status: 0 when every run has lost == 0,
unexpected == 0 and corrupted == 0, 1 otherwise, 2 when no verdict could be
reached (bad input: one line on stderr).
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
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

EVENT_TYPES = ("publish", "deliver", "settle", "fault", "drain_done")
OUTCOMES = ("ack", "nack", "timeout", "connection-lost")
SETTLE_ACTIONS = ("ack", "nack-requeue", "crash")
PHASES = ("before", "during", "after", "between")
CORRUPT = "_corrupt_record"
EVENT_COLUMNS = ("rk", "type", "run", "msg_id", "send_ts", "outcome", "outcome_ts", "redelivered", "ts",
          "action", "name", "start_ts", "end_ts", "corrupted", "dead_lettered")
LOST_SAMPLE = 20
PERCENTILE_ACCURACY = 10000  # rank error <= n / 10000 (exact for small groups)
BUCKET_PERCENTILE_ACCURACY = 1000
MAX_BUCKETS = 50000  # per run; the bucket widens beyond that (with a warning)

# One schema for every event type (the union of the fields of chaos/HISTORY.md).
SCHEMA = T.StructType(
    [
        T.StructField("type", T.StringType()),
        T.StructField("run", T.StringType()),
        T.StructField("msg_id", T.StringType()),
        T.StructField("publisher", T.StringType()),
        T.StructField("seq", T.LongType()),
        T.StructField("node", T.StringType()),
        T.StructField("send_ts", T.DoubleType()),
        T.StructField("outcome", T.StringType()),
        T.StructField("outcome_ts", T.DoubleType()),
        T.StructField("consumer", T.StringType()),
        T.StructField("redelivered", T.BooleanType()),
        T.StructField("ts", T.DoubleType()),
        T.StructField("phase", T.StringType()),
        T.StructField("corrupted", T.BooleanType()),  # deliver: the body failed its check
        T.StructField("dead_lettered", T.StringType()),  # deliver: x-death's latest reason
        T.StructField("action", T.StringType()),
        T.StructField("name", T.StringType()),
        T.StructField("start_ts", T.DoubleType()),
        T.StructField("end_ts", T.DoubleType()),
    ]
)
JSON_SCHEMA = T.StructType(SCHEMA.fields + [T.StructField(CORRUPT, T.StringType())])


class BadInput(Exception):
    """The input cannot be checked (exit 2)."""


@dataclass
class Run:
    key: int
    dir: str
    run_id: str
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- spark


def under_spark_submit() -> bool:
    """spark-submit (and the pyspark shell) start Python with a gateway to their JVM."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def make_spark(master: str | None = None) -> SparkSession:
    """getOrCreate a session. The master comes from --master when given; under
    spark-submit from spark-submit; otherwise it is local[2]. Cheap-startup settings
    are only applied when this process launches Spark itself."""
    existing = SparkSession.getActiveSession()
    builder = SparkSession.builder.appName("mirrorq-history-check")
    if existing is None and not under_spark_submit():
        builder = (
            builder.master(master or "local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.driver.memory", os.environ.get("CHECK_HISTORY_DRIVER_MEMORY", "2g"))
        )
    elif master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet_glob_warning(spark)
    return spark


def _quiet_glob_warning(spark: SparkSession) -> None:
    """Reading RUN_DIR/*.jsonl makes FileStreamSink log a WARN with a stack trace
    (it looks for a streaming-sink metadata dir at the glob). Silence that logger."""
    try:
        jvm = spark.sparkContext._jvm
        if jvm is None:
            return
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming",  # FileStreamSink (3.x; .sinks in 4.x)
            jvm.org.apache.logging.log4j.Level.ERROR,
        )
    except Exception:  # noqa: BLE001 - cosmetic only (e.g. another logging backend)
        pass


def _shuffle_partitions_explicit(spark: SparkSession) -> bool:
    # set with spark-submit --conf / spark-defaults (not by make_spark's local default)
    return under_spark_submit() and spark.sparkContext.getConf().contains(
        "spark.sql.shuffle.partitions"
    )


def tune_shuffle_partitions(spark: SparkSession, input_partitions: int) -> int:
    """Small inputs: 4 shuffle partitions (no 200 empty tasks). Big inputs: about two
    per input split, up to 400 (AQE coalesces what is left empty)."""
    if _shuffle_partitions_explicit(spark):
        return int(spark.conf.get("spark.sql.shuffle.partitions") or 200)
    n = max(4, min(400, 2 * input_partitions))
    spark.conf.set("spark.sql.shuffle.partitions", str(n))
    return n


# --------------------------------------------------------------------------- input


def _join(d: str, name: str) -> str:
    return d.rstrip("/") + "/" + name


def _read_optional(fn: Any) -> DataFrame | None:
    try:
        return fn()
    except AnalysisException as e:
        if "PATH_NOT_FOUND" in str(e) or "Path does not exist" in str(e):
            return None
        raise


def read_run_meta(spark: SparkSession, d: str) -> dict[str, Any] | None:
    path = _join(d, "run.json")
    if "://" not in path and os.path.isfile(path):
        with open(path) as f:  # a local file: no Spark job for a few bytes
            text = f.read()
    else:
        df = _read_optional(lambda: spark.read.text(path, wholetext=True))
        rows = df.collect() if df is not None else []
        if not rows:
            return None
        text = rows[0][0]
    try:
        meta = json.loads(text)
    except ValueError as e:
        raise BadInput(f"{_join(d, 'run.json')}: not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise BadInput(f"{_join(d, 'run.json')}: not a JSON object")
    return meta


def read_run_events(spark: SparkSession, d: str) -> DataFrame:
    parts: list[DataFrame] = []
    js = _read_optional(
        lambda: spark.read.schema(JSON_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .json(_join(d, "*.jsonl"))
    )
    if js is not None:
        parts.append(js.withColumn("_file", F.col("_metadata.file_path")))
    pq = _read_optional(lambda: spark.read.schema(SCHEMA).parquet(_join(d, "*.parquet")))
    if pq is not None:
        parts.append(
            pq.withColumn(CORRUPT, F.lit(None).cast("string")).withColumn(
                "_file", F.col("_metadata.file_path")
            )
        )
    if not parts:
        raise BadInput(f"{d}: no *.jsonl or *.parquet files (or no such directory)")
    df = parts[0]
    for p in parts[1:]:
        df = df.unionByName(p)
    return df


def load_runs(spark: SparkSession, dirs: list[str]) -> tuple[DataFrame, list[Run]]:
    """All events of all runs in one DataFrame, tagged with the run's index `rk`."""
    runs: list[Run] = []
    frames: list[DataFrame] = []
    seen: dict[str, str] = {}
    for d in dirs:
        if is_dataset(d):
            df, ds_runs = load_dataset(spark, d, len(runs))
            for r in ds_runs:
                if r.run_id in seen:
                    raise BadInput(f"{r.dir}: run id {r.run_id!r} already given by {seen[r.run_id]}")
                seen[r.run_id] = r.dir
            runs += ds_runs
            frames.append(df.select(*JSON_SCHEMA.fieldNames(), "_file", "rk"))
            continue
        i = len(runs)
        meta = read_run_meta(spark, d)
        base = d.rstrip("/").rsplit("/", 1)[-1] or d
        run = Run(key=i, dir=d, run_id=str((meta or {}).get("run") or base), meta=meta or {})
        if meta is None:
            run.warnings.append("no run.json: run id taken from the directory name")
        if run.run_id in seen:
            raise BadInput(f"{d}: run id {run.run_id!r} already given by {seen[run.run_id]}")
        seen[run.run_id] = d
        runs.append(run)
        frames.append(read_run_events(spark, d).select(*JSON_SCHEMA.fieldNames(), "_file")
                      .withColumn("rk", F.lit(i)))
    df = frames[0]
    for f in frames[1:]:
        df = df.unionByName(f)
    return df, runs


PARTITION_RE = re.compile(r"/experiment=([^/]*)/run=([^/]*)/")


def is_dataset(path: str) -> bool:
    """A local directory holding experiment=*/ partitions (a chaos-long dataset)."""
    return os.path.isdir(path) and any(n.startswith("experiment=") for n in os.listdir(path))


def load_dataset(spark: SparkSession, root: str, first_key: int) -> tuple[DataFrame, list[Run]]:
    """A Parquet dataset partitioned by experiment and run (ROOT/experiment=E/run=R/
    part-*.parquet, as Spark's partitionBy writes it): every (experiment, run) is a
    run, keys from first_key on. The run list comes from the file listing, not a scan."""
    schema = T.StructType(SCHEMA.fields + [T.StructField("experiment", T.StringType())])
    df = _read_optional(lambda: spark.read.schema(schema).option("basePath", root).parquet(root))
    if df is None:
        raise BadInput(f"{root}: no such dataset")
    pairs = set()
    for path in df.inputFiles():
        m = PARTITION_RE.search(path)
        if m is None:
            raise BadInput(f"{root}: {path} is not under experiment=*/run=*/")
        pairs.add((unquote(m.group(1)), unquote(m.group(2))))
    if not pairs:
        raise BadInput(f"{root}: no Parquet files under experiment=*/run=*/")
    runs = [Run(key=first_key + i, dir=f"{root.rstrip('/')}/experiment={e}/run={r}", run_id=r,
                meta={"run": r, "experiment": e})
            for i, (e, r) in enumerate(sorted(pairs))]
    keys = spark.createDataFrame([(r.meta["experiment"], r.run_id, r.key) for r in runs],
                                 "experiment string, run string, rk int")
    ev = (df.withColumn("_file", F.col("_metadata.file_path"))
          .join(F.broadcast(keys), ["experiment", "run"])
          .withColumn(CORRUPT, F.lit(None).cast("string"))
          .drop("experiment"))
    return ev, runs


def _in(col: Column, values: tuple[str, ...]) -> Column:
    return F.coalesce(col.isin(*values), F.lit(False))


def invalid_expr() -> Column:
    """True for an event the checker cannot use (see README: bad input)."""
    t = F.col("type")
    c = F.col
    ok = (
        F.when(c(CORRUPT).isNotNull(), False)
        .when(t == "publish", c("msg_id").isNotNull() & c("send_ts").isNotNull() & _in(c("outcome"), OUTCOMES))
        .when(t == "deliver", c("msg_id").isNotNull() & c("redelivered").isNotNull() & c("ts").isNotNull())
        .when(t == "settle", c("msg_id").isNotNull() & _in(c("action"), SETTLE_ACTIONS))
        .when(
            t == "fault",
            c("start_ts").isNotNull() & (c("end_ts").isNull() | (c("end_ts") >= c("start_ts"))),
        )
        .when(t == "drain_done", c("ts").isNotNull())
        .otherwise(False)
    )
    return ~F.coalesce(ok, F.lit(False))


def bad_input_message(ev: DataFrame, runs: list[Run], counts: dict[int, int]) -> str:
    rk = next(k for k, n in counts.items() if n)
    row = (
        ev.filter((F.col("rk") == rk) & invalid_expr())
        .select("_file", F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*SCHEMA.fieldNames()))).alias("rec"))
        .limit(1)
        .collect()
    )
    total = sum(counts.values())
    example = ""
    if row:
        rec = (row[0]["rec"] or "").strip().replace("\n", " ")
        example = f"; e.g. in {row[0]['_file']}: {rec[:160]}"
    return f"{runs[rk].dir}: {total} malformed or incomplete event(s){example}"


# --------------------------------------------------------------------------- phases


def merge_windows(windows: list[tuple[float, float | None]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping fault windows; an open window (end null) runs to +inf."""
    ws = sorted((s, math.inf if e is None else e) for s, e in windows)
    out: list[tuple[float, float]] = []
    for s, e in ws:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def phase_of(ts: Column, merged: list[tuple[float, float]]) -> Column:
    """before: ts < first fault start; during: inside a fault window (bounds included);
    after: ts > last fault end; between: in a gap between two fault windows.
    No faults at all: everything is `before`."""
    if not merged:
        return F.lit("before")
    conds = [ts >= F.lit(s) if math.isinf(e) else ts.between(F.lit(s), F.lit(e)) for s, e in merged]
    during = conds[0]
    for cond in conds[1:]:
        during = during | cond
    expr = F.when(ts < F.lit(merged[0][0]), "before").when(during, "during")
    last_end = merged[-1][1]
    if not math.isinf(last_end):
        expr = expr.when(ts > F.lit(last_end), "after")
    return expr.otherwise("between")


def phase_spans(
    merged: list[tuple[float, float]], t0: float | None, t1: float | None
) -> dict[str, dict[str, float | None]]:
    """Each phase's window and length, clipped to the run's publish span [t0, t1]."""
    out: dict[str, dict[str, float | None]] = {}
    if t0 is None or t1 is None:
        return {p: {"from": None, "to": None, "seconds": 0.0} for p in PHASES}

    def clip(a: float, b: float) -> float:
        return max(0.0, min(b, t1) - max(a, t0))

    if not merged:
        out["before"] = {"from": t0, "to": t1, "seconds": t1 - t0}
        for p in ("during", "after", "between"):
            out[p] = {"from": None, "to": None, "seconds": 0.0}
        return out
    first, last = merged[0][0], merged[-1][1]
    out["before"] = {"from": t0, "to": first, "seconds": clip(-math.inf, first)}
    out["during"] = {
        "from": first,
        "to": None if math.isinf(last) else last,
        "seconds": sum(clip(s, e) for s, e in merged),
    }
    out["after"] = (
        {"from": None, "to": None, "seconds": 0.0}
        if math.isinf(last)
        else {"from": last, "to": t1, "seconds": clip(last, math.inf)}
    )
    gaps = [(merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1)]
    out["between"] = {"from": None, "to": None, "seconds": sum(clip(a, b) for a, b in gaps)}
    return out


def _per_run(runs: list[Run], fn: Any) -> Column:
    expr = None
    for r in runs:
        cond = F.col("rk") == r.key
        expr = F.when(cond, fn(r)) if expr is None else expr.when(cond, fn(r))
    assert expr is not None
    return expr


# --------------------------------------------------------------------------- analysis


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def analyze(
    spark: SparkSession, dirs: list[str], bucket_seconds: float = 1.0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check the runs in `dirs`. Returns (report, chart data). Raises BadInput."""
    started = time.monotonic()
    raw, runs = load_runs(spark, dirs)
    input_partitions = raw.rdd.getNumPartitions()
    shuffle_partitions = tune_shuffle_partitions(spark, input_partitions)

    # Not cached: caching every event costs more than re-reading the few fields a pass
    # needs (the JSON reader only parses the projected fields). Two scans: every count
    # and the validation (one aggregation by msg_id, then by run), then the publishes
    # (cached, narrow) for phases, per-fault figures and chart buckets; a failing run
    # pays a third for its lost ids.
    ev = raw.select(*EVENT_COLUMNS, invalid_expr().alias("bad"))
    return _analyze(spark, raw, ev, runs, bucket_seconds, started, input_partitions, shuffle_partitions)


class _Stages:
    """Wall time of each Spark pass (report["checker"]["stages"])."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.times: dict[str, float] = {}

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.times[name] = round(now - self.t, 2)
        self.t = now


def _analyze(
    spark: SparkSession,
    raw: DataFrame,
    ev: DataFrame,
    runs: list[Run],
    bucket_seconds: float,
    started: float,
    input_partitions: int,
    shuffle_partitions: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    st = _Stages()
    c, t = F.col, F.col("type")
    is_pub, is_dlv = t == "publish", t == "deliver"
    is_ack = is_pub & (c("outcome") == "ack")
    is_bad_dlv = is_dlv & F.coalesce(c("corrupted"), F.lit(False))

    def n(cond: Column) -> Column:
        return F.sum(F.when(cond, 1).otherwise(0))

    # ---- pass 1 (one scan): everything but latency, in two aggregation levels.
    # Level 1 groups by (run, msg_id): publishes, deliveries and settles of a message
    # meet; a fault gets a group of its own (name, start, end); the rest share one.
    fault_key = F.concat_ws(
        "\u0000", F.lit("\u0000fault"), c("name"), c("start_ts").cast("string"), c("end_ts").cast("string")
    )
    key = F.coalesce(c("msg_id"), F.when(t == "fault", fault_key), F.lit("\u0000other"))
    l1 = [F.count(F.lit(1)).alias("events"), n(c("bad")).alias("bad")]
    l1 += [n(t == x).alias(f"t_{x}") for x in EVENT_TYPES]
    l1 += [n(is_pub & (c("outcome") == o)).alias(f"o_{o}") for o in OUTCOMES]
    l1 += [n((t == "settle") & (c("action") == a)).alias(f"s_{a}") for a in SETTLE_ACTIONS]
    l1 += [
        n(is_dlv & c("redelivered")).alias("redeliveries"),
        n(is_ack & c("outcome_ts").isNull()).alias("acks_without_ts"),
        # a dead-lettered copy (x-death: expired, maxlen, ...) is the same message's first
        # delivery from another queue, not a second enqueue by the publisher
        n(is_dlv & ~c("redelivered") & c("dead_lettered").isNull()).alias("first_dlvs"),
        n(is_dlv & ~c("redelivered") & c("dead_lettered").isNotNull()).alias("first_dead_dlvs"),
        n(is_bad_dlv).alias("corrupt_dlvs"),
        F.coalesce(F.max(is_ack), F.lit(False)).alias("acked"),
        F.min(F.when(is_pub, c("send_ts"))).alias("t0"),
        F.max(F.when(is_pub, c("send_ts"))).alias("t1"),
        F.min(F.when(is_ack, c("send_ts"))).alias("ack_send_ts"),
        F.min(F.when(is_dlv, c("ts"))).alias("dlv_ts"),
        F.min(F.when(is_bad_dlv, c("ts"))).alias("corrupt_ts"),
        F.min("run").alias("run_min"),
        F.max("run").alias("run_max"),
        F.coalesce(F.max(t == "fault"), F.lit(False)).alias("is_fault"),
        F.max(F.when(t == "fault", c("name"))).alias("f_name"),
        F.min(F.when(t == "fault", c("start_ts"))).alias("f_start"),
        F.max(F.when(t == "fault", c("end_ts"))).alias("f_end"),
    ]
    per_msg = ev.groupBy("rk", key.alias("key")).agg(*l1)
    pubs_c, dlvs_c = c("t_publish"), c("t_deliver")
    # a damaged copy does not deliver the message: lost = confirmed, no intact delivery
    lost_c = c("acked") & (dlvs_c - c("corrupt_dlvs") == 0)
    unexp_c = (pubs_c == 0) & (dlvs_c > 0)
    corrupt_c = c("corrupt_dlvs") > 0
    dup_c = (c("first_dlvs") > 1) | (c("first_dead_dlvs") > 1)
    summed = ["events", "bad", "redeliveries", "acks_without_ts", "corrupt_dlvs"]
    summed += [f"t_{x}" for x in EVENT_TYPES] + [f"o_{o}" for o in OUTCOMES] + [f"s_{a}" for a in SETTLE_ACTIONS]
    l2 = [F.sum(x).alias(x) for x in summed]
    l2 += [
        F.min("t0").alias("t0"),
        F.max("t1").alias("t1"),
        F.min("run_min").alias("run_min"),
        F.max("run_max").alias("run_max"),
        n(pubs_c > 0).alias("published"),
        n(c("acked")).alias("confirmed"),
        n(lost_c).alias("lost"),
        n(dup_c).alias("duplicates"),
        n(unexp_c).alias("unexpected"),
        n(corrupt_c).alias("corrupted"),
        n((pubs_c > 0) & ~c("acked") & (dlvs_c > 0)).alias("recovered"),
        n(dlvs_c > 0).alias("delivered"),
        F.collect_list(
            F.when(c("is_fault"), F.struct(c("f_name").alias("name"), c("f_start").alias("start_ts"), c("f_end").alias("end_ts")))
        ).alias("faults"),
    ]
    # Level 2 groups by run and, for a message with a verdict (lost, duplicate,
    # unexpected, corrupted, recovered), by the VERDICT_BUCKET of its first publish
    # (first delivery when unpublished): one row per run for the rest, and at most
    # one per bucket with a verdict, so the verdicts can be placed in the fault
    # windows on the driver without another scan.
    flagged = lost_c | unexp_c | corrupt_c | dup_c | (
        (pubs_c > 0) & ~c("acked") & (dlvs_c > 0))
    vb = F.when(flagged, F.floor(F.coalesce(c("t0"), c("dlv_ts")) / VERDICT_BUCKET)).cast("long")
    rows = per_msg.groupBy("rk", vb.alias("vb")).agg(*l2).collect()
    stats = _merge_level2(rows)
    verdict_buckets = _verdict_buckets(rows)
    msg_stats = stats
    for r in runs:
        if r.key not in stats:
            raise BadInput(f"{r.dir}: no events")
    bad = {k: s["bad"] for k, s in stats.items()}
    if any(bad.values()):
        raise BadInput(bad_input_message(raw, runs, bad))
    for r in runs:
        s = stats[r.key]
        if s["run_min"] != s["run_max"]:
            raise BadInput(f"{r.dir}: events of several runs ({s['run_min']!r}, {s['run_max']!r})")
        if s["run_min"] is not None and r.meta.get("run") and s["run_min"] != r.run_id:
            raise BadInput(f"{r.dir}: events are of run {s['run_min']!r}, run.json says {r.run_id!r}")
        if s["t_publish"] == 0:
            raise BadInput(f"{r.dir}: no publish events")
    st.done("scan+counts")

    # faults: a few rows, collected by pass 1
    faults: dict[int, list[dict[str, Any]]] = {
        r.key: sorted(
            ({"name": f["name"], "start_ts": f["start_ts"], "end_ts": f["end_ts"]} for f in stats[r.key]["faults"]),
            key=lambda f: (f["start_ts"], f["name"] or ""),
        )
        for r in runs
    }
    merged = {k: merge_windows([(f["start_ts"], f["end_ts"]) for f in fs]) for k, fs in faults.items()}
    for r in runs:  # verdicts per fault window and per phase
        for f in faults[r.key]:
            f["verdicts"] = verdicts_in(verdict_buckets.get(r.key, []), [(f["start_ts"], f["end_ts"])])

    # diagnosis, only when something is wrong: one more pass over the same aggregation
    # (not cached: caching it costs a clean run more than this costs a failing one)
    lost_ids: dict[int, list[str]] = {}
    unexp_ids: dict[int, list[str]] = {}
    corrupt_ids: dict[int, list[str]] = {}
    if any(m["lost"] or m["unexpected"] or m["corrupted"] for m in stats.values()):
        lost_ids, unexp_ids, corrupt_ids = _sample_ids(per_msg, lost_c, unexp_c, corrupt_c)
    st.done("lost-ids")

    # ---- pass 3: confirm latency and throughput per phase (by send_ts)
    pubs = ev.filter(is_pub).select(
        "rk",
        "send_ts",
        "outcome_ts",
        is_ack.alias("ack"),
        F.when(is_ack & c("outcome_ts").isNotNull(), (c("outcome_ts") - c("send_ts")) * 1000.0).alias("lat_ms"),
    )
    pubs = pubs.withColumn("phase", _per_run(runs, lambda r: phase_of(c("send_ts"), merged[r.key])))
    pubs = pubs.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _latency_and_report(spark, runs, st, pubs, stats, msg_stats, faults, merged, lost_ids,
                                   unexp_ids, corrupt_ids, bucket_seconds, started, input_partitions,
                                   shuffle_partitions, verdict_buckets)
    finally:
        pubs.unpersist()


def _latency_and_report(
    spark: SparkSession,
    runs: list[Run],
    st: _Stages,
    pubs: DataFrame,
    stats: dict[int, dict[str, Any]],
    msg_stats: dict[int, dict[str, Any]],
    faults: dict[int, list[dict[str, Any]]],
    merged: dict[int, list[tuple[float, float]]],
    lost_ids: dict[int, list[str]],
    unexp_ids: dict[int, list[str]],
    corrupt_ids: dict[int, list[str]],
    bucket_seconds: float,
    started: float,
    input_partitions: int,
    shuffle_partitions: int,
    verdict_buckets: dict[int, list[tuple[float, dict[str, int]]]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    c = F.col

    def n(cond: Column) -> Column:
        return F.sum(F.when(cond, 1).otherwise(0))

    phase_rows = (
        pubs.groupBy("rk", "phase")
        .agg(
            F.count(F.lit(1)).alias("publishes"),
            n(c("ack")).alias("acks"),
            F.percentile_approx("lat_ms", [0.5, 0.95, 0.99], PERCENTILE_ACCURACY).alias("pct"),
            F.max("lat_ms").alias("max_ms"),
        )
        .collect()
    )
    by_phase: dict[int, dict[str, Any]] = {r.key: {} for r in runs}
    for pr in phase_rows:
        by_phase[pr["rk"]][pr["phase"]] = pr

    # each fault window on its own (windows may overlap: a publish counts for each)
    fault_rows_stats: dict[tuple[int, int], Any] = {}
    if any(faults.values()):

        def fault_indexes(r: Run) -> Column:
            fs = faults[r.key]
            if not fs:
                return F.array().cast("array<int>")
            conds = [
                F.when(
                    (c("send_ts") >= F.lit(f["start_ts"]))
                    & (F.lit(True) if f["end_ts"] is None else c("send_ts") <= F.lit(f["end_ts"])),
                    F.lit(i),
                )
                for i, f in enumerate(fs)
            ]
            return F.filter(F.array(*conds), lambda x: x.isNotNull())

        for fr in (
            pubs.filter(c("phase") == "during")
            .select("rk", "ack", "lat_ms", F.explode(_per_run(runs, fault_indexes)).alias("fi"))
            .groupBy("rk", "fi")
            .agg(
                F.count(F.lit(1)).alias("publishes"),
                n(c("ack")).alias("acks"),
                F.percentile_approx("lat_ms", [0.5, 0.95, 0.99], PERCENTILE_ACCURACY).alias("pct"),
                F.max("lat_ms").alias("max_ms"),
            )
            .collect()
        ):
            fault_rows_stats[(fr["rk"], fr["fi"])] = fr
    # per experiment (a name in run.json, or the dataset's partition): confirm latency
    # inside and outside the fault windows over all its runs
    exp_names = sorted({str(r.meta.get("experiment") or "") for r in runs})
    exp_index = [exp_names.index(str(r.meta.get("experiment") or "")) for r in sorted(runs, key=lambda r: r.key)]
    exp_col = F.element_at(F.array(*[F.lit(i) for i in exp_index]), c("rk") + 1)
    exp_lat: dict[tuple[int, bool], Any] = {
        (er["e"], er["in_fault"]): er
        for er in pubs.groupBy(exp_col.alias("e"), (c("phase") == "during").alias("in_fault"))
        .agg(F.percentile_approx("lat_ms", [0.5, 0.99], PERCENTILE_ACCURACY).alias("pct"),
             F.count(F.lit(1)).alias("publishes"))
        .collect()
    }
    st.done("phases")

    # ---- pass 4: 1 s buckets for the chart (publishes and latency by send_ts, confirms by outcome_ts)
    widths: dict[int, float] = {}
    for r in runs:
        s = stats[r.key]
        span = (s["t1"] or 0.0) - (s["t0"] or 0.0)
        w = bucket_seconds
        if span / w > MAX_BUCKETS:
            w = span / MAX_BUCKETS
            r.warnings.append(f"chart bucket widened to {w:.3f} s ({span:.0f} s run)")
        widths[r.key] = w
    t0c = _per_run(runs, lambda r: F.lit(stats[r.key]["t0"]))
    wc = _per_run(runs, lambda r: F.lit(widths[r.key]))
    pub_b = (
        pubs.withColumn("b", F.floor((c("send_ts") - t0c) / wc))
        .groupBy("rk", "b")
        .agg(
            F.count(F.lit(1)).alias("publishes"),
            F.percentile_approx("lat_ms", [0.5, 0.99], BUCKET_PERCENTILE_ACCURACY).alias("pct"),
        )
        .collect()
    )
    ack_b = (
        pubs.filter(c("ack") & c("outcome_ts").isNotNull())
        .withColumn("b", F.floor((c("outcome_ts") - t0c) / wc))
        .groupBy("rk", "b")
        .count()
        .collect()
    )

    st.done("buckets")

    # ---- assemble
    report_runs: dict[str, Any] = {}
    chart: dict[str, Any] = {"runs": []}
    all_ok = True
    for r in runs:
        s, m = stats[r.key], msg_stats.get(r.key, {})
        spans = phase_spans(merged[r.key], s["t0"], s["t1"])
        phases: dict[str, Any] = {}
        for p in PHASES:
            row = by_phase[r.key].get(p)
            if p == "between" and row is None and spans["between"]["seconds"] == 0:
                continue
            phases[p] = {"from_ts": spans[p]["from"], "to_ts": spans[p]["to"]}
            phases[p].update(_phase_stats(row, spans[p]["seconds"] or 0.0))
            phases[p]["verdicts"] = dict.fromkeys(VERDICTS, 0)
        for ts, counts in verdict_buckets.get(r.key, []):
            ph = phases.setdefault(phase_at(ts, merged[r.key]), {"verdicts": dict.fromkeys(VERDICTS, 0)})
            for k in VERDICTS:
                ph["verdicts"][k] += counts[k]
        w = widths[r.key]
        acks_series = [(b * w, cnt / w) for b, cnt in sorted((b["b"], b["count"]) for b in ack_b if b["rk"] == r.key)]
        rate_before = (phases.get("before") or {}).get("acks_per_s")
        for i, f in enumerate(faults[r.key]):
            row = fault_rows_stats.get((r.key, i))
            secs = phase_spans(merge_windows([(f["start_ts"], f["end_ts"])]), s["t0"], s["t1"])["during"]["seconds"] or 0.0
            f.update(_phase_stats(row, secs))
            f["stall_s"] = stall_seconds(
                acks_series, w, rate_before, f["start_ts"] - (s["t0"] or 0.0),
                None if f["end_ts"] is None else f["end_ts"] - (s["t0"] or 0.0), (s["t1"] or 0.0) - (s["t0"] or 0.0))
        if s["t_drain_done"] == 0:
            r.warnings.append("no drain_done event: the final drain may not have completed")
        if s["acks_without_ts"]:
            r.warnings.append(f"{s['acks_without_ts']} ack outcome(s) without outcome_ts (no latency)")
        lost, unexpected = int(m.get("lost", 0)), int(m.get("unexpected", 0))
        corrupted = int(m.get("corrupted", 0))
        ok = lost == 0 and unexpected == 0 and corrupted == 0
        all_ok = all_ok and ok
        report_runs[r.run_id] = {
            "dir": r.dir,
            "experiment": r.meta.get("experiment"),
            "ok": ok,
            "confirmed": int(m.get("confirmed", 0)),
            "lost": lost,
            "duplicates": int(m.get("duplicates", 0)),
            "unexpected": unexpected,
            "corrupted": corrupted,
            "corrupted_deliveries": int(m.get("corrupt_dlvs", 0)),
            "recovered": int(m.get("recovered", 0)),
            "redeliveries": int(s["redeliveries"]),
            "lost_ids": lost_ids.get(r.key, []),
            "unexpected_ids": unexp_ids.get(r.key, []),
            "corrupted_ids": corrupt_ids.get(r.key, []),
            "published_ids": int(m.get("published", 0)),
            "delivered_ids": int(m.get("delivered", 0)),
            "events": {x: int(s[f"t_{x}"]) for x in EVENT_TYPES},
            "publish_outcomes": {o: int(s[f"o_{o}"]) for o in OUTCOMES},
            "settle_actions": {a: int(s[f"s_{a}"]) for a in SETTLE_ACTIONS},
            "drained": s["t_drain_done"] > 0,
            "faults": faults[r.key],
            "phases": phases,
            "warnings": r.warnings,
        }
        pb = sorted((b["b"], b["publishes"], b["pct"]) for b in pub_b if b["rk"] == r.key)
        ab = sorted((b["b"], b["count"]) for b in ack_b if b["rk"] == r.key)
        chart["runs"].append(
            {
                "run": r.run_id,
                "t0": s["t0"],
                "bucket_s": w,
                "publish": [(b * w, cnt / w) for b, cnt, _ in pb],
                "confirm": [(b * w, cnt / w) for b, cnt in ab],
                "p50_ms": [(b * w, p[0]) for b, _, p in pb if p and p[0] is not None],
                "p99_ms": [(b * w, p[1]) for b, _, p in pb if p and p[1] is not None],
                "faults": [
                    (f["start_ts"] - s["t0"], None if f["end_ts"] is None else f["end_ts"] - s["t0"], f["name"])
                    for f in faults[r.key]
                ],
                "t_end": (s["t1"] or s["t0"]) - s["t0"],
            }
        )
    experiments: dict[str, Any] = {}
    for r in sorted(runs, key=lambda r: r.key):
        rr = report_runs[r.run_id]
        name = str(r.meta.get("experiment") or "")
        e = experiments.setdefault(name, {"runs": 0, "ok": True, **{k: 0 for k in ("confirmed", *VERDICTS)},
                                          "faults": 0, "stall_s_max": None})
        e["runs"] += 1
        e["ok"] = e["ok"] and rr["ok"]
        for k in ("confirmed", *VERDICTS):
            e[k] += rr[k]
        e["faults"] += len(rr["faults"])
        for f in rr["faults"]:
            if f.get("stall_s") is not None:
                e["stall_s_max"] = max(e["stall_s_max"] or 0.0, f["stall_s"])
    for i, name in enumerate(exp_names):
        if name not in experiments:
            continue
        for in_fault, label in ((True, "in_faults"), (False, "outside_faults")):
            er = exp_lat.get((i, in_fault))
            pct = (er["pct"] if er else None) or [None, None]
            experiments[name][f"confirm_p50_ms_{label}"] = _r(pct[0])
            experiments[name][f"confirm_p99_ms_{label}"] = _r(pct[1])
    report = {
        "runs": report_runs,
        "experiments": experiments,
        "ok": all_ok,
        "checker": {
            "spark": spark.version,
            "master": spark.sparkContext.master,
            "input_partitions": input_partitions,
            "shuffle_partitions": shuffle_partitions,
            "seconds": round(time.monotonic() - started, 2),
            "stages": st.times,
        },
    }
    return report, chart


def _phase_stats(row: Any, secs: float) -> dict[str, Any]:
    pubs_n = row["publishes"] if row else 0
    acks_n = row["acks"] if row else 0
    pct = (row["pct"] if row else None) or [None, None, None]
    return {
        "seconds": _r(secs),
        "publishes": pubs_n,
        "acks": acks_n,
        "publishes_per_s": _r(pubs_n / secs) if secs > 0 else None,
        "acks_per_s": _r(acks_n / secs) if secs > 0 else None,
        "confirm_latency_ms": {
            "p50": _r(pct[0]),
            "p95": _r(pct[1]),
            "p99": _r(pct[2]),
            "max": _r(row["max_ms"]) if row else None,
        },
    }


VERDICTS = ("lost", "duplicates", "unexpected", "corrupted", "recovered")
VERDICT_BUCKET = 0.1  # seconds: a verdict is placed in a fault window to this resolution
_L2_MIN = ("t0", "run_min")
_L2_MAX = ("t1", "run_max")


def _merge_level2(rows: list[Any]) -> dict[int, dict[str, Any]]:
    """Per run: the level-2 rows of its buckets folded into one (sums, min, max and
    the fault lists concatenated)."""
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        d = row.asDict()
        d.pop("vb", None)
        cur = out.get(d["rk"])
        if cur is None:
            out[d["rk"]] = d
            continue
        for k, v in d.items():
            if k == "rk":
                continue
            if k == "faults":
                cur[k] = list(cur[k]) + list(v)
            elif k in _L2_MIN:
                cur[k] = v if cur[k] is None else (cur[k] if v is None else min(cur[k], v))
            elif k in _L2_MAX:
                cur[k] = v if cur[k] is None else (cur[k] if v is None else max(cur[k], v))
            else:
                cur[k] = (cur[k] or 0) + (v or 0)
    return out


def _verdict_buckets(rows: list[Any]) -> dict[int, list[tuple[float, dict[str, int]]]]:
    """Per run: (bucket midpoint ts, verdict counts) of the buckets holding verdicts."""
    out: dict[int, list[tuple[float, dict[str, int]]]] = {}
    for row in rows:
        if row["vb"] is None:
            continue
        counts = {k: int(row[k] or 0) for k in VERDICTS}
        if any(counts.values()):
            out.setdefault(row["rk"], []).append(((row["vb"] + 0.5) * VERDICT_BUCKET, counts))
    return out


def verdicts_in(buckets: list[tuple[float, dict[str, int]]],
                windows: list[tuple[float, float | None]]) -> dict[str, int]:
    """The verdict counts of the messages first published inside any of `windows`
    (an open window runs to the end)."""
    tot = dict.fromkeys(VERDICTS, 0)
    for ts, counts in buckets:
        if any(s <= ts and (e is None or ts <= e) for s, e in windows):
            for k in VERDICTS:
                tot[k] += counts[k]
    return tot


def phase_at(ts: float, merged: list[tuple[float, float]]) -> str:
    """phase_of for one timestamp on the driver."""
    if not merged or ts < merged[0][0]:
        return "before"
    if any(s <= ts <= e for s, e in merged):
        return "during"
    if ts > merged[-1][1]:
        return "after"
    return "between"


def stall_seconds(acks: list[tuple[float, float]], bucket: float, rate_before: float | None,
                  start: float, end: float | None, t_end: float) -> float | None:
    """The longest run of chart buckets, from a fault's start to 30 s after its end,
    in which confirms fell below 10 % of the rate before the first fault: how long
    the cluster stopped confirming (0 when it never did). `acks` are the chart's
    (bucket offset, acks/s); offsets, start and end are seconds since the run's
    first publish."""
    if not rate_before:
        return None
    rate = {round(x / bucket): y for x, y in acks}
    last = math.floor(min(t_end, (t_end if end is None else end) + 30.0) / bucket)
    longest = cur = 0
    for i in range(math.floor(start / bucket), last + 1):
        cur = cur + 1 if rate.get(i, 0.0) < 0.1 * rate_before else 0
        longest = max(longest, cur)
    return round(longest * bucket, 3)


def _sample_ids(
    per_msg: DataFrame, lost: Column, unexpected: Column, corrupted: Column
) -> tuple[dict[int, list[str]], dict[int, list[str]], dict[int, list[str]]]:
    """The first LOST_SAMPLE lost msg_ids per run (by the send_ts of their first acked
    publish, then msg_id), the first unexpected ones (by first delivery) and the first
    corrupted ones (by first damaged delivery). A msg_id may be in several lists."""
    from pyspark.sql.window import Window

    c = F.col
    kinds = F.array(
        F.when(lost, F.struct(F.lit(0).alias("k"), c("ack_send_ts").alias("ord"))),
        F.when(unexpected, F.struct(F.lit(1).alias("k"), c("dlv_ts").alias("ord"))),
        F.when(corrupted, F.struct(F.lit(2).alias("k"), c("corrupt_ts").alias("ord"))),
    )
    cand = (
        per_msg.filter(lost | unexpected | corrupted)
        .select("rk", "key", F.explode(F.filter(kinds, lambda x: x.isNotNull())).alias("x"))
        .select("rk", "key", c("x.k").alias("kind"), c("x.ord").alias("ord"))
    )
    w = Window.partitionBy("rk", "kind").orderBy(c("ord").asc_nulls_last(), c("key"))
    rows = (
        cand.withColumn("i", F.row_number().over(w))
        .filter(c("i") <= LOST_SAMPLE)
        .select("rk", "kind", "i", "key")
        .collect()
    )
    out: tuple[dict[int, list[str]], dict[int, list[str]], dict[int, list[str]]] = ({}, {}, {})
    for row in sorted(rows, key=lambda x: (x["rk"], x["kind"], x["i"])):
        out[row["kind"]].setdefault(row["rk"], []).append(row["key"])
    return out


# --------------------------------------------------------------------------- chart


def render_chart(chart: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = chart["runs"]
    fig, axes = plt.subplots(
        2 * len(runs), 1, figsize=(12, 3.4 * 2 * len(runs)), squeeze=False, sharex=False
    )
    for i, cr in enumerate(runs):
        ax_rate, ax_lat = axes[2 * i][0], axes[2 * i + 1][0]
        for ax in (ax_rate, ax_lat):
            for k, (s, e, name) in enumerate(cr["faults"]):
                end = cr["t_end"] if e is None else e
                ax.axvspan(s, end, color="tab:red", alpha=0.15, label="fault" if k == 0 else None)
                if ax is ax_rate and len(cr["faults"]) <= 12:
                    ax.annotate(name or "", (s, 1.0), xycoords=("data", "axes fraction"),
                                fontsize=7, va="top", rotation=90, color="tab:red")
        if cr["publish"]:
            x, y = zip(*cr["publish"], strict=True)
            ax_rate.step(x, y, where="post", label="publishes/s", lw=1)
        if cr["confirm"]:
            x, y = zip(*cr["confirm"], strict=True)
            ax_rate.step(x, y, where="post", label="confirms (acks)/s", lw=1)
        ax_rate.set_title(f"run {cr['run']}: publish and confirm rate ({cr['bucket_s']:g} s buckets)")
        ax_rate.set_ylabel("msgs/s")
        ax_rate.legend(loc="lower right", fontsize=8)
        positive = True
        for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
            if cr[key]:
                x, y = zip(*cr[key], strict=True)
                positive = positive and min(y) > 0
                ax_lat.step(x, y, where="post", label=f"confirm latency {label}", lw=1)
        if positive and (cr["p50_ms"] or cr["p99_ms"]):
            ax_lat.set_yscale("log")
        ax_lat.set_ylabel("ms")
        ax_lat.set_xlabel("seconds since the first publish (by send_ts)")
        ax_lat.legend(loc="upper right", fontsize=8)
        ax_lat.set_title(f"run {cr['run']}: confirm latency per bucket (by send_ts)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="check_history.py",
        description="Check mirrorq chaos histories (chaos/HISTORY.md) on Spark. "
        "Exit 0: no lost, unexpected or corrupted message in any run; 1: some; 2: no verdict (bad input).",
    )
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                    help="a run directory, or a dataset root partitioned experiment=*/run=*/ (Parquet)")
    ap.add_argument("--out", required=True, help="JSON report path (local file on the driver)")
    ap.add_argument("--chart", help="PNG chart path (local file on the driver)")
    ap.add_argument("--master", help="Spark master (default: local[2], or spark-submit's)")
    ap.add_argument("--bucket", type=float, default=1.0, help="chart bucket in seconds (default 1)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bucket <= 0:
        print("check_history: error: --bucket must be > 0", file=sys.stderr)
        return 2
    had_session = SparkSession.getActiveSession() is not None
    spark = make_spark(args.master)
    try:
        report, chart = analyze(spark, args.run_dirs, args.bucket)
        text = json.dumps(report, indent=2, sort_keys=False)
        with open(args.out, "w") as f:
            f.write(text + "\n")
        if args.chart:
            render_chart(chart, args.chart)
        print(text)
        return 0 if report["ok"] else 1
    except BadInput as e:
        print(f"check_history: error: {e}", file=sys.stderr)
        return 2
    except AnalysisException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"check_history: error: {first}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - no verdict is exit 2, never 1 ("lost")
        traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"check_history: error: {type(e).__name__}: {first}", file=sys.stderr)
        return 2
    finally:
        if not had_session:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
