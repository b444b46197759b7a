#!/usr/bin/env python3
"""A Spark standalone cluster on loopback, from the pyspark distribution: one
master and N workers (`spark-class org.apache.spark.deploy.master.Master` /
`...worker.Worker`), so the history checker runs on a real cluster with
`spark-submit --master spark://...`, not only on local[*].

    python chaos/analysis/spark_standalone.py up --dir data/spark [--workers 2] \\
        [--cores 1] [--memory 1g]
    python chaos/analysis/spark_standalone.py submit --dir data/spark -- \\
        chaos/analysis/check_history.py RUN_DIR --out report.json
    python chaos/analysis/spark_standalone.py down --dir data/spark

`up` picks free ports, starts the processes (logs in DIR/logs), waits until the
master reports every worker ALIVE and writes DIR/cluster.json (master URL,
pids); `down` stops exactly those pids (SIGTERM, then SIGKILL after a grace).
`make spark-up` / `make spark-down` wrap it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
STATE = "cluster.json"


def spark_home() -> Path:
    """The pyspark package is a Spark distribution (bin/, jars/)."""
    import pyspark
    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    master_url: str
    master_ui: str
    pids: list[int] = field(default_factory=list)
    workers: int = 0


def _env(base: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = HOST
    env["SPARK_LOCAL_DIRS"] = str(base / "tmp")
    # the workers run the checker's executors: no Python UDFs, so no Python needed,
    # but spark-submit's driver and any executor use this interpreter
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


def _alive_workers(ui: str) -> int:
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=2) as resp:
            info = json.load(resp)
    except (OSError, ValueError):
        return -1
    return sum(1 for w in info.get("workers", []) if w.get("state") == "ALIVE")


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        # own session: `down` and a crashed test kill the whole process group
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def up(base: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
       timeout: float = 90.0) -> Cluster:
    base.mkdir(parents=True, exist_ok=True)
    (base / "logs").mkdir(exist_ok=True)
    (base / "tmp").mkdir(exist_ok=True)
    if (base / STATE).exists():
        raise SystemExit(f"spark_standalone: {base / STATE} exists: run `down` first")
    env = _env(base)
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, ui_port = free_port(), free_port()
    cluster = Cluster(f"spark://{HOST}:{port}", f"http://{HOST}:{ui_port}", [], workers)
    procs = [_start([spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                     "--port", str(port), "--webui-port", str(ui_port)],
                    base / "logs" / "master.log", env)]
    cluster.pids.append(procs[0].pid)
    (base / STATE).write_text(json.dumps(asdict(cluster)))  # so `down` can clean up
    try:
        for k in range(workers):
            wdir = base / f"worker-{k}"
            wdir.mkdir(exist_ok=True)
            p = _start([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", HOST,
                        "--port", str(free_port()), "--webui-port", str(free_port()),
                        "--cores", str(cores), "--memory", memory, "--work-dir", str(wdir),
                        cluster.master_url], base / "logs" / f"worker-{k}.log", env)
            procs.append(p)
            cluster.pids.append(p.pid)
            (base / STATE).write_text(json.dumps(asdict(cluster)))
        deadline = time.monotonic() + timeout
        while _alive_workers(cluster.master_ui) < workers:
            dead = [p.pid for p in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"spark_standalone: pids {dead} exited; see {base / 'logs'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"spark_standalone: {workers} workers not ALIVE at "
                                   f"{cluster.master_ui} within {timeout:.0f}s")
            time.sleep(0.3)
    except BaseException:
        down(base)
        raise
    return cluster


def load(base: Path) -> Cluster:
    return Cluster(**json.loads((base / STATE).read_text()))


def down(base: Path, grace: float = 10.0) -> None:
    state = base / STATE
    if not state.exists():
        return
    pids = load(base).pids
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            _reap(pid)
            time.sleep(0.1)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap(pid)
    state.unlink()


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def submit_cmd(cluster: Cluster, args: list[str], executor_memory: str = "1g") -> list[str]:
    """spark-submit of a Python application (e.g. check_history.py) to the cluster."""
    return [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url,
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", f"spark.driver.host={HOST}", "--executor-memory", executor_memory,
            *args]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spark_standalone",
                                 description="A Spark standalone cluster on loopback")
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("--dir", type=Path, required=True)
    u.add_argument("--workers", type=int, default=2)
    u.add_argument("--cores", type=int, default=1)
    u.add_argument("--memory", default="1g")
    d = sub.add_parser("down")
    d.add_argument("--dir", type=Path, required=True)
    s = sub.add_parser("submit")
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("app", nargs=argparse.REMAINDER, help="-- APP.py [ARGS]")
    args = ap.parse_args(argv)
    if args.cmd == "up":
        if args.workers < 1 or args.cores < 1:
            ap.error("--workers and --cores must be >= 1")
        c = up(args.dir, args.workers, args.cores, args.memory)
        print(f"spark standalone: {c.master_url} ({c.workers} workers), UI {c.master_ui}")
        return 0
    if args.cmd == "down":
        down(args.dir)
        return 0
    app = args.app[1:] if args.app[:1] == ["--"] else args.app
    if not app:
        ap.error("submit needs -- APP.py [ARGS]")
    if not (args.dir / STATE).exists():
        ap.error(f"no cluster in {args.dir}: run `up` first")
    return subprocess.call(submit_cmd(load(args.dir), app), env=_env(args.dir))


if __name__ == "__main__":
    sys.exit(main())
