#!/usr/bin/env python3
"""The benchmark suite: mirrorq (1 node, 3 nodes) vs RabbitMQ 3.10 (1 node classic queue,
3-node quorum queue, 3-node classic mirrored queue), one broker at a time.

    .venv/bin/python bench/suite.py                      # everything, 3 repeats (make bench)
    .venv/bin/python bench/suite.py --quick              # small counts, 1 repeat, all targets
    .venv/bin/python bench/suite.py --smoke --targets mirrorq-1          # seconds
    .venv/bin/python bench/suite.py --targets mirrorq-3,rabbitmq-3q --scenarios S1,S1w,S4
    .venv/bin/python bench/suite.py --targets mirrorq-3,rabbitmq-3q --alternate \\
        --scenarios S1,S1w100,S3p300,S3auto --payloads random,compressible   # issue 11's table

Scenarios (1 KiB persistent messages to a fresh durable queue unless said otherwise; the
load is bench/java/Bench.java on the RabbitMQ Java client, one JVM per run):
  S0       generator check: publish without confirms, N threads/connections, transient
           messages (the broker's disk is not the limit) -- must reach >= 50,000 msg/s
  S0p      the same with persistent messages (for reference)
  S1       streaming confirms, no window (unbounded outstanding)
  S1w100   streaming confirms, at most 100 outstanding (confirm latency p50/p99)
  S1w1000  streaming confirms, at most 1,000 outstanding
  S2       tx.commit after every message
  S3p1 S3p100 S3p300
           consume a pre-filled queue, manual acks (one basic.ack per message) at prefetch
           1 / 100 / 300
  S3auto   the same with auto-ack
  S4       one producer at a fixed rate (2,000 msg/s) + one consumer in the same JVM:
           end-to-end latency p50/p99 over the measured seconds after a warm-up
  S5       100,000 publishes with confirms and no window: publish rate of the last 10%
           of the publishes / the first 10% (must not collapse), and the confirm rate

Payloads (--payloads, default random): `random` = per publisher 256 distinct random bodies
(seeded, repeatable), cycled per publish, so nothing compresses (real payloads);
`compressible` = one random block sent again and again, the generator's old behaviour, which
zlib (in mirrorq's Raft transport) shrinks ~100x. With both, every scenario runs with each
(alternating within every repeat) and the table has a row per payload; cases other than
random are keyed `<scenario>/<payload>` in the JSON.

--alternate: repeat i of every target before repeat i+1 of any (each target is started and
stopped once per round, on fresh data), so slow drifts of the machine's load hit all targets
alike; default: all repeats of a target back to back.

Writes bench/results/suite.json (parameters, machine, versions, every repeat's raw
result, medians, ratios) and a PNG chart next to it; prints a table. Exit status 0 only
if every run of every scenario finished and passed its sanity checks.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from cluster import RABBITMQCTL, MirrorqCluster, RabbitCluster  # noqa: E402
from run import (  # noqa: E402
    JARS,
    RABBITMQ_SERVER,
    MirrorqNode,
    RabbitNode,
    compile_bench,
    epmd_pids,
    log,
    tail,
)

S0_TARGET_MSG_PER_S = 50_000

# --------------------------------------------------------------------------- scenarios

SCENARIOS: list[dict[str, Any]] = [
    {"id": "S0", "group": "S0", "what": "publish, no confirms, transient, N threads (generator check)"},
    {"id": "S0p", "group": "S0", "what": "publish, no confirms, persistent, N threads"},
    {"id": "S1", "group": "S1", "what": "streaming confirms, no window"},
    {"id": "S1w100", "group": "S1w", "what": "streaming confirms, window 100"},
    {"id": "S1w1000", "group": "S1w", "what": "streaming confirms, window 1,000"},
    {"id": "S2", "group": "S2", "what": "tx.commit after every message"},
    {"id": "S3p1", "group": "S3", "what": "consume pre-filled queue, manual ack, prefetch 1"},
    {"id": "S3p100", "group": "S3", "what": "consume pre-filled queue, manual ack, prefetch 100"},
    {"id": "S3p300", "group": "S3", "what": "consume pre-filled queue, manual ack, prefetch 300"},
    {"id": "S3auto", "group": "S3", "what": "consume pre-filled queue, auto-ack"},
    {"id": "S4", "group": "S4", "what": "fixed-rate producer + consumer, end-to-end latency"},
    {"id": "S5", "group": "S5", "what": "publish with confirms, no window: last/first 10% publish rate"},
]
SCENARIO_IDS = [s["id"] for s in SCENARIOS]
SCENARIO_BY_ID = {s["id"]: s for s in SCENARIOS}

# which latency fields a scenario reports as p50/p99
LATENCY_OF = {"S1": "confirm", "S1w100": "confirm", "S1w1000": "confirm", "S2": "commit",
              "S4": "e2e", "S5": "confirm"}

# --------------------------------------------------------------------------- payloads

PAYLOADS = ["random", "compressible"]
PAYLOAD_WHAT = {
    "random": "256 distinct random bodies per publisher (seeded), cycled: incompressible",
    "compressible": "one random block repeated (zlib shrinks it ~100x)",
}


def case_key(sid: str, payload: str) -> str:
    """Key of one (scenario, payload) case: the scenario id for `random`, else `S1/compressible`."""
    return sid if payload == "random" else f"{sid}/{payload}"


def rotated(items: list[str], i: int) -> list[str]:
    """`items` starting at position i (mod len): repeat i runs the payloads in another order."""
    k = i % len(items) if items else 0
    return items[k:] + items[:k]


# --------------------------------------------------------------------------- targets

TARGET_KEYS = ["mirrorq-1", "rabbitmq-1", "mirrorq-3", "rabbitmq-3q", "rabbitmq-3m"]
TARGET_LABELS = {
    "mirrorq-1": "mirrorq, 1 node",
    "mirrorq-3": "mirrorq, 3 nodes",
    "rabbitmq-1": "RabbitMQ 1 node, classic queue",
    "rabbitmq-3q": "RabbitMQ 3 nodes, quorum queue",
    "rabbitmq-3m": "RabbitMQ 3 nodes, classic mirrored (ha-mode all)",
}
# (mirrorq target, RabbitMQ target): ratio = mirrorq / RabbitMQ; the first pair of each
# mirrorq target is its primary comparison
COMPARISONS = [("mirrorq-1", "rabbitmq-1"), ("mirrorq-3", "rabbitmq-3q"), ("mirrorq-3", "rabbitmq-3m")]


class Target:
    key: str
    broker: str
    nodes: int
    queue_type: str | None = None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def endpoint(self) -> tuple[str, str, str]:
        """(client URI, declare URI, placement note)."""
        raise NotImplementedError

    def setup_info(self, cp: str) -> dict[str, Any]:
        return {}

    def log_tail(self) -> str:
        return ""

    def raft_report(self) -> dict[str, Any]:
        """mirrorq only: per node, what the Raft layer saw during the round."""
        return {}


class _OneNode(Target):
    """A single broker process (MirrorqNode or RabbitNode) in its own work dir."""

    nodes = 1

    def __init__(self, key: str, node: Any, workdir: Path) -> None:
        self.key = key
        self.node = node
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self.node.start()

    def stop(self) -> None:
        self.node.stop()

    def endpoint(self) -> tuple[str, str, str]:
        return self.node.url, self.node.url, "the only node"

    def log_tail(self) -> str:
        return tail(self.node.logfile, 20)


class MirrorqOne(_OneNode):
    broker = "mirrorq"

    def __init__(self, workdir: Path) -> None:
        super().__init__("mirrorq-1", MirrorqNode(workdir / "mirrorq-1"), workdir / "mirrorq-1")


class MirrorqThree(Target):
    """3-node mirrorq cluster; every client (and the declares) on a follower."""

    broker, nodes = "mirrorq", 3

    def __init__(self, workdir: Path) -> None:
        self.key = "mirrorq-3"
        self.cluster = MirrorqCluster(workdir / "mirrorq-3")

    def start(self) -> None:
        log("starting a 3-node mirrorq cluster")
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()

    def endpoint(self) -> tuple[str, str, str]:
        leader = self.cluster.leader(timeout=30)
        follower = (leader + 1) % len(self.cluster.nodes)
        ids = [nd["id"] for nd in self.cluster.nodes]
        url = self.cluster.url(follower)
        return url, url, f"clients on follower {ids[follower]} (leader {ids[leader]})"

    def setup_info(self, cp: str) -> dict[str, Any]:
        leader = self.cluster.leader(timeout=30)
        return {"leader": self.cluster.nodes[leader]["id"],
                "placement": "publisher, consumer and declares on a follower"}

    def log_tail(self) -> str:
        return "\n".join(f"---- {nd['id']}\n{tail(nd['log'], 10)}" for nd in self.cluster.nodes)

    def raft_report(self) -> dict[str, Any]:
        keys = ("role", "term", "leader_changes", "prevote_rounds", "longest_raft_stall_ms",
                "longest_leader_gap_ms",
                "snapshots", "forced_compactions", "resends", "nacked_publishes")
        out = {}
        for i, nd in enumerate(self.cluster.nodes):
            st = self.cluster.status(i, timeout=3.0)
            out[nd["id"]] = {k: st.get(k) for k in keys} if st else None
        return out


class RabbitOne(_OneNode):
    broker = "rabbitmq"

    def __init__(self, workdir: Path) -> None:
        super().__init__("rabbitmq-1", RabbitNode(workdir / "rabbitmq-1"), workdir / "rabbitmq-1")

    def setup_info(self, cp: str) -> dict[str, Any]:
        return {"queue_type": "classic (no x-queue-type argument)"}


class _RabbitCluster(RabbitCluster):
    """cluster.RabbitCluster, clients in the default vhost (the queue type is explicit)."""

    def url(self, i: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.nodes[i]['port']}/%2F"


class RabbitThree(Target):
    """3-node RabbitMQ cluster. The queue is declared over node A (so its leader / master is
    there: queue-leader-locator client-local), the clients connect to node B."""

    broker, nodes = "rabbitmq", 3

    def __init__(self, workdir: Path, kind: str) -> None:
        self.kind = kind
        self.key = "rabbitmq-3q" if kind == "quorum" else "rabbitmq-3m"
        self.queue_type = "quorum" if kind == "quorum" else None
        self.cluster = _RabbitCluster(workdir / self.key)
        self.version = ""

    def start(self) -> None:
        log(f"starting a 3-node RabbitMQ cluster ({self.kind})")
        self.cluster.start()
        self.version = self.cluster.ctl(0, "version").strip()
        if self.kind == "mirrored":
            self.cluster.ctl(0, "set_policy", "-p", "/", "--apply-to", "queues", "ha-all", ".*",
                             '{"ha-mode":"all","ha-sync-mode":"automatic"}')

    def stop(self) -> None:
        self.cluster.stop()

    def endpoint(self) -> tuple[str, str, str]:
        names = [nd["name"].split("@")[0] for nd in self.cluster.nodes]
        return (self.cluster.url(1), self.cluster.url(0),
                f"clients on {names[1]}, queue declared on {names[0]} (leader/master there)")

    def setup_info(self, cp: str) -> dict[str, Any]:
        """Declare a probe queue the way the scenarios do and ask rabbitmqctl what it is."""
        client, declare, _ = self.endpoint()
        q = f"bench-probe-{uuid.uuid4().hex[:8]}"
        args = ["--mode", "confirms", "--count", "1", "--window", "1", "--queue", q, "--keep",
                "--check-depth", "--declare-uri", declare]
        if self.queue_type:
            args += ["--queue-type", self.queue_type]
        res = run_java(cp, client, 120, *args)
        info: dict[str, Any] = {"probe": {k: res.get(k) for k in ("error", "queue_count") if k in res}}
        items = (["name", "type", "leader", "members"] if self.kind == "quorum"
                 else ["name", "type", "policy", "pid", "slave_pids", "synchronised_slave_pids"])
        try:
            listing = self.cluster.ctl(0, "list_queues", "-p", "/", *items, "--no-table-headers")
            line = next((ln for ln in listing.splitlines() if ln.startswith(q)), "")
            info["list_queues"] = dict(zip(items, line.split("\t"), strict=False))
        except Exception as exc:  # noqa: BLE001 - informational
            info["list_queues_error"] = str(exc)
        lq = info.get("list_queues", {})
        node_a = self.cluster.nodes[0]["name"]
        info["leader_on_declaring_node"] = node_a in (lq.get("leader", "") if self.kind == "quorum"
                                                      else lq.get("pid", ""))
        if self.kind == "quorum":
            ok = lq.get("type") == "quorum" and lq.get("members", "").count("@") == 3
        else:
            ok = (lq.get("type") == "classic" and lq.get("policy") == "ha-all"
                  and lq.get("synchronised_slave_pids", "").count("@") == 2)
        info["queue_kind_ok"] = ok
        run_java(cp, client, 60, "--mode", "consume", "--queue", q, "--count", "1", "--delete")
        if not ok:
            raise RuntimeError(f"{self.key}: the probe queue is not what the target needs: {info}")
        return info

    def log_tail(self) -> str:
        return "\n".join(f"---- {nd['name']}\n{tail(nd['dir'] / 'stdout.log', 10)}"
                         for nd in self.cluster.nodes)


def stop_new_epmd(before: set[int]) -> None:
    """Stop the epmd daemons that appeared since `before` (started by this run's nodes) and
    wait for them to exit, so the next target starts with the same epmd state."""
    new = epmd_pids() - before
    for pid in new:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while epmd_pids() & new and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in epmd_pids() & new:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def make_target(key: str, workdir: Path) -> Target:
    if key == "mirrorq-1":
        return MirrorqOne(workdir)
    if key == "mirrorq-3":
        return MirrorqThree(workdir)
    if key == "rabbitmq-1":
        return RabbitOne(workdir)
    if key == "rabbitmq-3q":
        return RabbitThree(workdir, "quorum")
    if key == "rabbitmq-3m":
        return RabbitThree(workdir, "mirrored")
    raise ValueError(key)


# --------------------------------------------------------------------------- java runs

def run_java(cp: str, uri: str, timeout: float, *args: str) -> dict[str, Any]:
    cmd = ["java", "-Xmx1g", "-XX:+UseParallelGC", "-cp", cp, "Bench", "--uri", uri, *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        so, se = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout}s", "args": list(args), "sanity_ok": False}
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    lines = [ln for ln in so.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"no JSON output (rc={proc.returncode}): {se[-1500:]}", "args": list(args),
                "sanity_ok": False}
    res: dict[str, Any] = json.loads(lines[-1])
    if proc.returncode != 0 and "error" not in res:
        res["error"] = f"exit status {proc.returncode}"
    if "error" in res:
        res["sanity_ok"] = False
    res["wall_s"] = round(time.monotonic() - t0, 2)
    return res


def run_once(cp: str, target: Target, sid: str, a: argparse.Namespace,
             payload: str = "random") -> dict[str, Any]:
    """One repeat of one scenario on one target with one payload, on a fresh queue."""
    client, declare, placement = target.endpoint()
    q = f"bench-{sid.lower()}-{uuid.uuid4().hex[:8]}"
    common = ["--size", str(a.size), "--timeout", str(int(a.stall)), "--declare-uri", declare,
              "--payload", payload]
    if target.queue_type:
        common += ["--queue-type", target.queue_type]
    warm = ["--warmup", str(a.warmup)]
    t = a.timeout
    res: dict[str, Any]
    if sid in ("S0", "S0p"):
        args = ["--mode", "publish", "--count", str(a.s0_count), "--threads", str(a.s0_threads),
                "--queue", q, *common, *warm]
        if sid == "S0":
            args.append("--transient")
        res = run_java(cp, client, t, *args)
    elif sid in ("S1", "S1w100", "S1w1000", "S5"):
        window = {"S1": 0, "S5": 0, "S1w100": 100, "S1w1000": 1000}[sid]
        count = a.s5_count if sid == "S5" else a.s1_count
        res = run_java(cp, client, t, "--mode", "confirms", "--count", str(count), "--window",
                       str(window), "--publishers", "1", "--queue", q, "--check-depth", *common, *warm)
    elif sid == "S2":
        res = run_java(cp, client, t, "--mode", "tx", "--count", str(a.s2_count), "--queue", q,
                       *common, *warm)
    elif sid.startswith("S3"):
        count = a.s3p1_count if sid == "S3p1" else a.s3_count
        fill = run_java(cp, client, t, "--mode", "confirms", "--count", str(count), "--window",
                        "1000", "--publishers", "1", "--queue", q, "--keep", "--check-depth", *common)
        if "error" in fill:
            return {"error": f"fill: {fill['error']}", "fill": fill, "placement": placement,
                    "payload": payload, "sanity_ok": False}
        args = ["--mode", "consume", "--queue", q, "--count", str(count), "--delete",
                "--timeout", str(int(a.stall))]
        if sid == "S3auto":
            args.append("--auto-ack")
        else:
            args += ["--prefetch", sid[len("S3p"):], "--ack-every", str(a.s3_ack_every)]
        res = run_java(cp, client, t, *args)
        res["fill"] = {k: fill.get(k) for k in ("msg_per_s", "acked", "queue_count", "wall_s",
                                                "payload", "payload_pool")}
    elif sid == "S4":
        res = run_java(cp, client, t, "--mode", "latency", "--rate", str(a.s4_rate), "--duration",
                       str(a.s4_duration), "--warmup-seconds", str(a.s4_warmup), "--prefetch",
                       str(a.s4_prefetch), "--queue", q, *common, *warm)
    else:
        raise ValueError(sid)
    res["placement"] = placement
    res["payload"] = payload
    return res


# --------------------------------------------------------------------------- statistics

def med_min_max(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


SUMMARY_FIELDS = ["msg_per_s", "publish_msg_per_s", "enqueued_msg_per_s", "publish_split_ratio",
                  "confirm_split_ratio", "publish_rate_first10", "publish_rate_last10",
                  "confirm_rate_first10", "confirm_rate_last10", "max_outstanding",
                  "e2e_sched_p99_ms", "max_schedule_lag_ms"]


def summarize(sid: str, repeats: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in repeats if "error" not in r and r.get("sanity_ok")]
    s: dict[str, Any] = {"repeats": len(repeats), "ok": len(ok),
                         "sanity_ok": bool(repeats) and len(ok) == len(repeats)}
    for f in SUMMARY_FIELDS:
        vals = [float(r[f]) for r in ok if isinstance(r.get(f), int | float)]
        mm = med_min_max(vals)
        if mm is not None:
            s[f] = mm
    lat = LATENCY_OF.get(sid)
    if lat:
        for p in ("p50", "p99"):
            mm = med_min_max([float(r[f"{lat}_{p}_ms"]) for r in ok if f"{lat}_{p}_ms" in r])
            if mm is not None:
                s[f"{p}_ms"] = mm
        s["latency"] = lat
    errors = [r["error"] for r in repeats if "error" in r]
    if errors:
        s["errors"] = errors
    return s


def headline(sid: str) -> tuple[str, str, bool]:
    """(summary field, label, higher is better) used for the mirrorq/RabbitMQ ratio."""
    if sid == "S4":
        return "p99_ms", "e2e p99 latency", False
    return "msg_per_s", "msg/s", True


def split_case(case: str) -> tuple[str, str]:
    """(scenario id, payload) of a case key (see case_key)."""
    sid, _, payload = case.partition("/")
    return sid, payload or "random"


def comparisons(targets: dict[str, Any], cases: list[str]) -> list[dict[str, Any]]:
    """mirrorq / RabbitMQ ratios per case (scenario and payload)."""
    rows = []
    for case in cases:
        sid, payload = split_case(case)
        field, label, higher = headline(sid)
        for m, r in COMPARISONS:
            ms = targets.get(m, {}).get("scenarios", {}).get(case, {}).get("summary", {})
            rs = targets.get(r, {}).get("scenarios", {}).get(case, {}).get("summary", {})
            if not ms or not rs:  # the pair did not both run it (S0: RabbitMQ only)
                continue
            mv = (ms.get(field) or {}).get("median")
            rv = (rs.get(field) or {}).get("median")
            row: dict[str, Any] = {"scenario": sid, "payload": payload, "case": case,
                                   "mirrorq": m, "rabbitmq": r, "metric": label,
                                   "higher_is_better": higher, "mirrorq_median": mv,
                                   "rabbitmq_median": rv,
                                   "ratio": round(mv / rv, 3) if mv and rv else None}
            if sid == "S4":  # the rate is fixed: also the p50 ratio
                m50 = (ms.get("p50_ms") or {}).get("median")
                r50 = (rs.get("p50_ms") or {}).get("median")
                row["ratio_p50"] = round(m50 / r50, 3) if m50 and r50 else None
            if sid == "S5":
                msr = (ms.get("publish_split_ratio") or {}).get("median")
                rsr = (rs.get("publish_split_ratio") or {}).get("median")
                row["mirrorq_publish_split_ratio"] = msr
                row["rabbitmq_publish_split_ratio"] = rsr
            rows.append(row)
    return rows


def payload_effects(targets: dict[str, Any], cases: list[str]) -> list[dict[str, Any]]:
    """Per scenario and target run with both payloads: median(random) / median(compressible)
    of the headline metric (msg/s; S4: e2e p99), i.e. what incompressible bodies cost."""
    rows = []
    for case in cases:
        sid, payload = split_case(case)
        if payload != "random" or case_key(sid, "compressible") not in cases:
            continue
        field, label, higher = headline(sid)
        for key, entry in targets.items():
            sc = entry.get("scenarios", {})
            rs = sc.get(case, {}).get("summary", {})
            cs = sc.get(case_key(sid, "compressible"), {}).get("summary", {})
            if not rs or not cs:
                continue
            rv = (rs.get(field) or {}).get("median")
            cv = (cs.get(field) or {}).get("median")
            rows.append({"scenario": sid, "target": key, "metric": label, "higher_is_better": higher,
                         "random_median": rv, "compressible_median": cv,
                         "ratio": round(rv / cv, 3) if rv and cv else None})
    return rows


# --------------------------------------------------------------------------- environment

def sh(*cmd: str, timeout: float = 30) -> str:
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"<{exc}>"


def dpkg_version(pkg: str) -> str | None:
    out = sh("dpkg-query", "-W", "-f", "${Version}", pkg)
    return out if out and "no packages found" not in out and not out.startswith("<") else None


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"cores": os.cpu_count(), "kernel": platform.release(),
                            "kernel_version": platform.version(), "platform": platform.platform(),
                            "machine": platform.machine()}
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", cpu, re.M)
        info["cpu_model"] = m.group(1).strip() if m else None
    except OSError:
        info["cpu_model"] = None
    try:
        mem = Path("/proc/meminfo").read_text()
        m = re.search(r"^MemTotal:\s*(\d+) kB", mem, re.M)
        info["memory_mib"] = int(m.group(1)) // 1024 if m else None
    except OSError:
        info["memory_mib"] = None
    info["loadavg_at_start"] = list(os.getloadavg())
    info["other_brokers_running_at_start"] = [
        ln for ln in sh("pgrep", "-af", r"beam\.smp|node\.app serve").splitlines() if ln]
    return info


def versions() -> dict[str, Any]:
    v: dict[str, Any] = {"python": platform.python_version()}
    try:
        import importlib.metadata as md
        v["mirrorq"] = md.version("mirrorq")
        v["pysyncobj"] = md.version("pysyncobj")
    except Exception:  # noqa: BLE001
        m = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
        v["mirrorq"] = m.group(1) if m else None
    v["rabbitmq"] = dpkg_version("rabbitmq-server")
    otp = sorted(glob.glob("/usr/lib/erlang/releases/*/OTP_VERSION"))
    v["erlang_otp"] = Path(otp[-1]).read_text().strip() if otp else None
    v["erlang_package"] = dpkg_version("erlang-base")
    v["java"] = sh("java", "-version").splitlines()[0] if shutil.which("java") else None
    v["amqp_client_package"] = dpkg_version("librabbitmq-client-java")
    try:
        with zipfile.ZipFile(JARS[0]) as z:
            mf = z.read("META-INF/MANIFEST.MF").decode(errors="replace")
        m = re.search(r"^(?:Implementation|Bundle)-Version:\s*(\S+)", mf, re.M)
        v["amqp_client"] = m.group(1) if m else None
    except (OSError, KeyError, zipfile.BadZipFile):
        v["amqp_client"] = None
    return v


# --------------------------------------------------------------------------- output

def fmt_num(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:,.1f}"
    return f"{v:.3g}"


def table(report: dict[str, Any]) -> str:
    payloads = report["params"].get("payloads", ["random"])
    several = len(payloads) > 1
    effects = {(e["scenario"], e["target"]): e for e in report.get("payload_effects", [])}
    head = ["scenario", *(["payload"] if several else []), "target", "median msg/s [min-max]",
            "p50/p99 ms", "extra", "ratio mirrorq/RabbitMQ", *(["random/compr."] if effects else [])]
    body: list[list[str]] = []
    ratio_of: dict[tuple[str, str], list[str]] = {}
    for c in report["comparisons"]:
        case = c.get("case", c["scenario"])
        if c["ratio"] is not None:
            short = c["rabbitmq"].replace("rabbitmq-", "r")
            txt = f"{c['ratio']:.2f} vs {short}"
            if c["scenario"] == "S4":
                txt = f"p99 {c['ratio']:.2f} / p50 {c.get('ratio_p50') or 0:.2f} vs {short}"
            ratio_of.setdefault((case, c["mirrorq"]), []).append(txt)
        else:
            ratio_of.setdefault((case, c["mirrorq"]), [])
    for case in report["params"].get("cases", report["params"]["scenarios"]):
        sid, payload = split_case(case)
        for key in report["params"]["targets"]:
            sc = report["targets"].get(key, {}).get("scenarios", {}).get(case)
            if sc is None:
                continue
            s = sc["summary"]
            rate = s.get("msg_per_s")
            cell = (f"{fmt_num(rate['median'])} [{fmt_num(rate['min'])}-{fmt_num(rate['max'])}]"
                    if rate else "-")
            if not s.get("sanity_ok"):
                cell = f"ERROR ({s['ok']}/{s['repeats']} ok) " + (cell if rate else "")
            lat = "-"
            if "p50_ms" in s and "p99_ms" in s:
                lat = f"{fmt_num(s['p50_ms']['median'])} / {fmt_num(s['p99_ms']['median'])}"
            extra = ""
            if sid == "S5" and "publish_split_ratio" in s:
                extra = (f"publish last/first 10% {s['publish_split_ratio']['median']:.2f}"
                         f" [{s['publish_split_ratio']['min']:.2f}-{s['publish_split_ratio']['max']:.2f}]")
            elif sid.startswith("S0") and "enqueued_msg_per_s" in s:
                extra = f"enqueued {fmt_num(s['enqueued_msg_per_s']['median'])}/s"
            elif sid == "S4" and "e2e_sched_p99_ms" in s:
                extra = f"p99 from schedule {fmt_num(s['e2e_sched_p99_ms']['median'])} ms"
            ratio = "; ".join(ratio_of.get((case, key), [])) if key.startswith("mirrorq") else ""
            row = [sid, *([payload] if several else []), key, cell, lat, extra, ratio]
            if effects:
                e = effects.get((sid, key))
                row.append("" if payload != "random" else "-" if e is None or e["ratio"] is None
                           else f"{'p99 ' if sid == 'S4' else ''}{e['ratio']:.2f}")
            body.append(row)
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    prev = None
    for b in body:
        if prev is not None and b[0] != prev:
            lines.append("")
        prev = b[0]
        lines.append("  ".join(x.ljust(w) for x, w in zip(b, widths, strict=True)).rstrip())
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"no chart: {exc}"
    keys = [k for k in report["params"]["targets"] if k in report["targets"]]
    if not keys:
        return "no chart: no target ran"
    colors = {"mirrorq-1": "#1f77b4", "mirrorq-3": "#2ca02c", "rabbitmq-1": "#ff7f0e",
              "rabbitmq-3q": "#d62728", "rabbitmq-3m": "#9467bd"}

    def summ(key: str, sid: str) -> dict[str, Any]:
        return report["targets"].get(key, {}).get("scenarios", {}).get(sid, {}).get("summary", {})

    cases = report["params"].get("cases", report["params"]["scenarios"])
    rate_sids = [c for c in cases if split_case(c)[0] != "S4"]
    lat_sids = [c for c in cases if split_case(c)[0] in ("S1w100", "S1w1000", "S2", "S4")]
    panels = [p for p in (("rate", rate_sids), ("lat", lat_sids),
                          ("split", [c for c in cases if split_case(c)[0] == "S5"])) if p[1]]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(10, 1.3 * len(rate_sids) + 6), 4.2 * len(panels)),
                             squeeze=False)
    width = 0.8 / len(keys)
    for ax, (kind, ss) in zip(axes[:, 0], panels, strict=True):
        for j, key in enumerate(keys):
            xs, ys, lo, hi, p50 = [], [], [], [], []
            for i, sid in enumerate(ss):
                s = summ(key, sid)
                field = {"rate": "msg_per_s", "lat": "p99_ms", "split": "publish_split_ratio"}[kind]
                v = s.get(field)
                if not v:
                    continue
                xs.append(i + (j - (len(keys) - 1) / 2) * width)
                ys.append(v["median"])
                lo.append(v["median"] - v["min"])
                hi.append(v["max"] - v["median"])
                p50.append((s.get("p50_ms") or {}).get("median"))
            if not xs:
                continue
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=TARGET_LABELS[key],
                   color=colors.get(key))
            if kind == "lat":
                pts = [(x, p) for x, p in zip(xs, p50, strict=True) if p is not None]
                if pts:
                    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="_", color="black",
                               s=80, zorder=3)
        ax.set_xticks(range(len(ss)))
        ax.set_xticklabels([c.replace("/", "\n") for c in ss])
        if kind == "rate":
            ax.set_yscale("log")
            ax.set_ylabel("msg/s (median, min-max; log)")
            ax.set_title(f"Throughput, {report['params']['size']:,}-byte persistent messages "
                         "(S0: transient, no confirms)")
            if "S0" in ss:
                ax.axhline(S0_TARGET_MSG_PER_S, color="grey", linestyle=":", linewidth=1)
        elif kind == "lat":
            ax.set_yscale("log")
            ax.set_ylabel("ms (bar p99, tick p50; log)")
            ax.set_title("Latency: confirm (S1w), tx.commit (S2), end-to-end at fixed rate (S4)")
        else:
            ax.set_yscale("log")
            ax.set_ylabel("last 10% / first 10% publish rate (log)")
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
            ax.set_title("S5: 100k unconfirmed outstanding, publish rate does not collapse")
        ax.grid(axis="y", alpha=0.3)
        if kind == panels[0][0]:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    fig.suptitle(f"mirrorq vs RabbitMQ {report['versions'].get('rabbitmq') or ''} "
                 f"({report['machine'].get('cores')} cores, {report['params']['repeats']} repeat(s), "
                 f"preset {report['params']['preset']}, "
                 f"payload {'/'.join(report['params'].get('payloads', ['random']))})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------- main

PRESETS: dict[str, dict[str, Any]] = {
    "full": {"s0_count": 200_000, "s1_count": 50_000, "s2_count": 2_000, "s3_count": 50_000,
             "s3p1_count": 10_000, "s4_duration": 10.0, "s4_warmup": 2.0, "s5_count": 100_000,
             "warmup": 2_000, "repeats": 3},
    "quick": {"s0_count": 50_000, "s1_count": 5_000, "s2_count": 200, "s3_count": 3_000,
              "s3p1_count": 500, "s4_duration": 3.0, "s4_warmup": 1.0, "s5_count": 20_000,
              "warmup": 500, "repeats": 1},
    "smoke": {"s0_count": 2_000, "s1_count": 300, "s2_count": 20, "s3_count": 200,
              "s3p1_count": 50, "s4_duration": 1.0, "s4_warmup": 0.5, "s5_count": 1_000,
              "warmup": 0, "repeats": 1},
}


def parse_list(text: str, universe: list[str], groups: dict[str, list[str]], what: str) -> list[str]:
    if text in ("", "all"):
        return list(universe)
    chosen: list[str] = []
    for item in text.split(","):
        item = item.strip()
        found = groups.get(item) or ([item] if item in universe else None)
        if not found:
            raise SystemExit(f"unknown {what} {item!r}; choose from {', '.join(universe)} "
                             f"or {', '.join(sorted(groups))}")
        chosen += [x for x in found if x not in chosen]
    return [x for x in universe if x in chosen]


def run_target(cp: str, key: str, entry: dict[str, Any], workdir: Path, sids: list[str],
               payloads: list[str], reps: list[int], a: argparse.Namespace, epmd_before: set[int],
               round_no: int | None) -> None:
    """Start target `key`, run repeats `reps` (0-based) of every scenario with every payload,
    stop it. Results go to entry["scenarios"][case]; a failure to start or set up the target to
    entry["error"]. round_no: the round of an --alternate run (entry["rounds"] gets one item)."""
    t_start = time.monotonic()
    target: Target | None = None
    rinfo: dict[str, Any] = {"round": round_no}
    try:
        if key.startswith("rabbitmq") and not os.path.exists(RABBITMQ_SERVER):
            raise RuntimeError(f"{RABBITMQ_SERVER} not found (apt-get install rabbitmq-server)")
        if key in ("rabbitmq-3q", "rabbitmq-3m") and not os.path.exists(RABBITMQCTL):
            raise RuntimeError(f"{RABBITMQCTL} not found")
        target = make_target(key, workdir)
        log(f"== {key}: {TARGET_LABELS[key]}" + (f" (round {round_no})" if round_no else ""))
        target.start()
        rinfo["startup_s"] = round(time.monotonic() - t_start, 1)
        rinfo["setup"] = target.setup_info(cp)
        entry.setdefault("startup_s", rinfo["startup_s"])
        entry.setdefault("setup", rinfo["setup"])
        if isinstance(target, RabbitThree):
            entry["rabbitmqctl_version"] = target.version
        for sid in sids:
            for i in reps:
                for payload in rotated(payloads, i):
                    case = case_key(sid, payload)
                    sc = entry["scenarios"].setdefault(
                        case, {"scenario": sid, "payload": payload, "repeats": [],
                               "summary": summarize(sid, [])})
                    if a.pause:
                        time.sleep(a.pause)
                    res = run_once(cp, target, sid, a, payload)
                    res["repeat"] = i + 1
                    sc["repeats"].append(res)
                    sc["summary"] = summarize(sid, sc["repeats"])
                    log(f"  {key} {case} #{i + 1}: " + one_line(sid, res))
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}" + (f" (round {round_no})" if round_no else "")
        log(f"{key}: {entry['error']}")
        if target is not None:
            log(target.log_tail())
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
    finally:
        if target is not None:
            try:
                raft = target.raft_report()
            except Exception as exc:  # noqa: BLE001 - a report, never the run's outcome
                raft = {"error": str(exc)}
            if raft:
                rinfo["raft"] = raft
                stalls = [v["longest_raft_stall_ms"] for v in raft.values()
                          if isinstance(v, dict) and v.get("longest_raft_stall_ms") is not None]
                terms = sorted({v["term"] for v in raft.values() if isinstance(v, dict)})
                gaps = [v["longest_leader_gap_ms"] for v in raft.values()
                        if isinstance(v, dict) and v.get("longest_leader_gap_ms")]
                log(f"  {key} raft: longest raft-thread stall {max(stalls, default=0):.0f} ms, "
                    f"longest follower silence between AppendEntries {max(gaps, default=0):.0f} ms, "
                    f"terms {terms}, " + ", ".join(f"{n}: {v}" for n, v in raft.items()))
            target.stop()
        if key.startswith("rabbitmq"):
            stop_new_epmd(epmd_before)
        rinfo["elapsed_s"] = round(time.monotonic() - t_start, 1)
        entry["elapsed_s"] = round(entry.get("elapsed_s", 0.0) + rinfo["elapsed_s"], 1)
        if round_no is not None:
            entry.setdefault("rounds", []).append(rinfo)
        log(f"== {key} done in {rinfo['elapsed_s']} s" + (f" (round {round_no})" if round_no else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small counts, 1 repeat (minutes for all targets)")
    p.add_argument("--smoke", action="store_true", help="tiny counts, 1 repeat (seconds per target)")
    p.add_argument("--targets", default="all",
                   help=f"comma list of {', '.join(TARGET_KEYS)}, or mirrorq, rabbitmq, 1node, 3node, all")
    p.add_argument("--scenarios", default="all",
                   help=f"comma list of {', '.join(SCENARIO_IDS)} or groups S0..S5 (S1w, S3 = all variants)")
    p.add_argument("--s0-targets", default="rabbitmq-1",
                   help="targets S0/S0p run on (default rabbitmq-1; else the first RabbitMQ target selected)")
    p.add_argument("--repeats", type=int, help="runs per scenario and target (default 3; quick/smoke 1)")
    p.add_argument("--alternate", action="store_true",
                   help="one round per repeat: every target runs repeat i (started and stopped again, "
                   "fresh data) before any runs repeat i+1; default: a target's repeats back to back")
    p.add_argument("--size", type=int, default=1024, help="message body bytes (default 1024)")
    p.add_argument("--payloads", default="random",
                   help="comma list of random (default: 256 distinct random bodies per publisher, "
                   "incompressible), compressible (one random block repeated, as before), or both")
    p.add_argument("--s0-count", type=int)
    p.add_argument("--s0-threads", type=int, default=4, help="S0 publisher threads, one connection each")
    p.add_argument("--s1-count", type=int, help="S1 and S1w messages (default 50,000)")
    p.add_argument("--s2-count", type=int, help="S2 tx messages (default 2,000)")
    p.add_argument("--s3-count", type=int, help="S3p100/S3p300/S3auto pre-filled messages (default 50,000)")
    p.add_argument("--s3p1-count", type=int,
                   help="S3p1 pre-filled messages (default 10,000: prefetch 1 is one round trip a message)")
    p.add_argument("--s3-ack-every", type=int, default=1,
                   help="S3 manual acks: 1 = one basic.ack per message (default); K>1 = ack multiple every K")
    p.add_argument("--s4-rate", type=float, default=2000.0)
    p.add_argument("--s4-duration", type=float, help="S4 measured seconds (default 10)")
    p.add_argument("--s4-warmup", type=float, help="S4 warm-up seconds, not measured (default 2)")
    p.add_argument("--s4-prefetch", type=int, default=100)
    p.add_argument("--s5-count", type=int, help="S5 messages (default 100,000)")
    p.add_argument("--warmup", type=int, help="untimed confirmed messages to a throwaway queue in each "
                   "publishing JVM first (default 2,000; quick 500; smoke 0)")
    p.add_argument("--timeout", type=float, default=1200, help="wall limit per Bench process, s")
    p.add_argument("--stall", type=float, default=60, help="a run fails after this long without progress, s")
    p.add_argument("--pause", type=float, default=1.0, help="seconds between runs")
    p.add_argument("--out", default=str(BENCH / "results" / "suite.json"))
    p.add_argument("--chart", help="PNG path (default: --out with .png)")
    p.add_argument("--no-chart", action="store_true")
    p.add_argument("--keep-workdir", action="store_true")
    a = p.parse_args(argv)

    preset = "smoke" if a.smoke else "quick" if a.quick else "full"
    for k, v in PRESETS[preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.repeats < 1:
        raise SystemExit("--repeats must be >= 1")

    target_groups = {"mirrorq": ["mirrorq-1", "mirrorq-3"],
                     "rabbitmq": ["rabbitmq-1", "rabbitmq-3q", "rabbitmq-3m"],
                     "1node": ["mirrorq-1", "rabbitmq-1"],
                     "3node": ["mirrorq-3", "rabbitmq-3q", "rabbitmq-3m"]}
    keys = parse_list(a.targets, TARGET_KEYS, target_groups, "target")
    groups: dict[str, list[str]] = {}
    for s in SCENARIOS:
        groups.setdefault(s["group"], []).append(s["id"])
    sids = parse_list(a.scenarios, SCENARIO_IDS, groups, "scenario")
    payloads = parse_list(a.payloads, PAYLOADS, {"both": list(PAYLOADS)}, "payload")
    cases = [case_key(sid, pl) for sid in sids for pl in payloads]
    s0_on = [k for k in parse_list(a.s0_targets, TARGET_KEYS, target_groups, "target") if k in keys]
    if not s0_on:
        s0_on = [k for k in keys if k.startswith("rabbitmq")][:1]

    def todo(key: str) -> list[str]:
        return [s for s in sids if not s.startswith("S0") or key in s0_on]

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    started = time.time()
    report: dict[str, Any] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "params": {
            "preset": preset, "repeats": a.repeats, "targets": keys, "scenarios": sids,
            "s0_targets": s0_on, "size": a.size, "persistent": True, "durable_queue": True,
            "payloads": payloads, "payload_what": {pl: PAYLOAD_WHAT[pl] for pl in payloads},
            "cases": cases, "alternate": a.alternate,
            "order": ("rounds: repeat i on every target, then repeat i+1; payload order rotates per "
                      "repeat" if a.alternate else "per target: each scenario's repeats back to back; "
                      "payload order rotates per repeat"),
            "s0": {"count": a.s0_count, "threads": a.s0_threads, "S0": "transient",
                   "S0p": "persistent", "confirms": False, "target_msg_per_s": S0_TARGET_MSG_PER_S},
            "s1": {"count": a.s1_count, "windows": {"S1": "none", "S1w100": 100, "S1w1000": 1000},
                   "publishers": 1},
            "s2": {"count": a.s2_count},
            "s3": {"count": a.s3_count, "count_S3p1": a.s3p1_count, "prefetch": {"S3p1": 1, "S3p100": 100, "S3p300": 300},
                   "ack_every": a.s3_ack_every, "fill": "streaming confirms, window 1,000 (untimed)"},
            "s4": {"rate": a.s4_rate, "duration_s": a.s4_duration, "warmup_s": a.s4_warmup,
                   "prefetch": a.s4_prefetch, "consumer_acks": "manual, one per message",
                   "producer": "streaming confirms, no window"},
            "s5": {"count": a.s5_count, "window": "none", "split": "first vs last 10% of publishes"},
            "warmup_messages": a.warmup, "stall_s": a.stall, "timeout_s": a.timeout,
            "pause_s": a.pause,
        },
        "machine": machine_info(),
        "versions": versions(),
        "targets": {},
    }
    if report["machine"]["other_brokers_running_at_start"]:
        log(f"WARNING: other brokers are running: {report['machine']['other_brokers_running_at_start']}")
    log(f"preset {preset}: {a.repeats} repeat(s){' in alternating rounds' if a.alternate else ''}; "
        f"targets {', '.join(keys)}; scenarios {', '.join(sids)}; payloads {', '.join(payloads)}")

    epmd_before = epmd_pids()
    workdir = Path(tempfile.mkdtemp(prefix="mirrorq-suite-"))
    os.chmod(workdir, 0o755)  # RabbitMQ runs as user rabbitmq below it
    failed = False
    try:
        cp = compile_bench(workdir / "classes")
        # one round with every repeat, or (--alternate) one round per repeat
        rounds = [[i] for i in range(a.repeats)] if a.alternate else [list(range(a.repeats))]
        for rnd, reps in enumerate(rounds):
            if a.alternate:
                log(f"==== round {rnd + 1} of {len(rounds)}")
            rdir = workdir / f"round{rnd + 1}" if a.alternate else workdir
            rdir.mkdir(exist_ok=True)
            os.chmod(rdir, 0o755)
            for key in keys:
                entry = report["targets"].setdefault(key, {"label": TARGET_LABELS[key], "scenarios": {}})
                if "error" in entry:  # it failed in an earlier round: not again
                    continue
                run_target(cp, key, entry, rdir, todo(key), payloads, reps, a, epmd_before,
                           rnd + 1 if a.alternate else None)
    finally:
        if a.keep_workdir:
            log(f"workdir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        report["elapsed_s"] = round(time.time() - started, 1)
        report["machine"]["loadavg_at_end"] = list(os.getloadavg())
        finish(report, a)

    for entry in report["targets"].values():
        if "error" in entry or any(not sc["summary"]["sanity_ok"] for sc in entry["scenarios"].values()):
            failed = True
    return 1 if failed else 0


def finish(report: dict[str, Any], a: argparse.Namespace) -> None:
    cases = report["params"]["cases"]
    report["comparisons"] = comparisons(report["targets"], cases)
    report["payload_effects"] = payload_effects(report["targets"], cases)
    errors = []
    for key, entry in report["targets"].items():
        if "error" in entry:
            errors.append(f"{key}: {entry['error']}")
        for case, sc in entry["scenarios"].items():
            for e in sc["summary"].get("errors", []):
                errors.append(f"{key} {case}: {e}")
    report["errors"] = errors
    report["sanity_ok"] = not errors
    gen = None
    for key in report["params"]["s0_targets"]:
        s0 = case_key("S0", report["params"]["payloads"][0])
        s = report["targets"].get(key, {}).get("scenarios", {}).get(s0, {}).get("summary", {})
        if s.get("msg_per_s"):
            gen = {"target": key, "threads": a.s0_threads, "msg_per_s": s["msg_per_s"],
                   "meets_target": s["msg_per_s"]["median"] >= S0_TARGET_MSG_PER_S,
                   "target_msg_per_s": S0_TARGET_MSG_PER_S}
            break
    report["s0_generator"] = gen
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    chart_path = Path(a.chart) if a.chart else out.with_suffix(".png")
    if not a.no_chart:
        problem = chart(report, chart_path)
        report["chart"] = problem or str(chart_path)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    if gen:
        verdict = "OK" if gen["meets_target"] else "BELOW TARGET"
        print(f"\nS0 generator check on {gen['target']} ({gen['threads']} threads, 1 KiB transient, "
              f"no confirms): {gen['msg_per_s']['median']:,.0f} msg/s median "
              f"(>= {S0_TARGET_MSG_PER_S:,}: {verdict})")
    print("\nratio = median(mirrorq) / median(RabbitMQ) of msg/s (S4: of the e2e latency "
          "percentiles, lower is better)")
    for pl in report["params"]["payloads"]:
        print(f"payload {pl}: {report['params']['size']:,}-byte bodies, {PAYLOAD_WHAT[pl]}")
    if report.get("payload_effects"):
        print("random/compr. = median(random) / median(compressible) on the same target (msg/s; "
              "S4: e2e p99)")
    for e in errors:
        print(f"! {e}")
    print(f"results: {out}" + (f", chart: {report.get('chart')}" if not a.no_chart else "")
          + f" ({report['elapsed_s']} s)")


def one_line(sid: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    s = f"{r.get('msg_per_s')} msg/s"
    lat = LATENCY_OF.get(sid)
    if lat and f"{lat}_p50_ms" in r:
        s += f", {lat} p50 {r[f'{lat}_p50_ms']} ms p99 {r[f'{lat}_p99_ms']} ms"
    if sid == "S5":
        s += (f", publish first10 {r.get('publish_rate_first10')} last10 {r.get('publish_rate_last10')}"
              f" (x{r.get('publish_split_ratio')})")
    if sid.startswith("S0"):
        s += f", enqueued {r.get('enqueued_msg_per_s')} msg/s"
    return s + f" [{r.get('wall_s')} s]"


if __name__ == "__main__":
    sys.exit(main())
