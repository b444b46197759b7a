#!/usr/bin/env python3
"""Compare mirrorq with RabbitMQ on the same scenarios, driven by a Java load generator.

    python bench/run.py                      # start a mirrorq node and a RabbitMQ, run both
    python bench/run.py --quick              # small N smoke run
    python bench/run.py --skip-mirrorq --rabbitmq-url amqp://guest:guest@127.0.0.1:5690/
    python bench/run.py --quick --skip-rabbitmq --out /tmp/x.json

Scenarios (the same on both brokers, one broker at a time so they do not share the CPUs):
  confirms  N persistent messages of S bytes to a durable queue, streaming confirms with
            a bounded outstanding window (bench/java/Bench.java --mode confirms)
  consume   drain that queue with manual acks (prefetch, ack multiple every K)
  tx        T persistent messages with tx.commit after each

Bodies are incompressible by default (--payload random: 256 distinct random bodies per
publisher, cycled); --payload compressible repeats one random block (zlib shrinks it ~100x).

Prints a table and writes the JSON (default bench/results/latest.json).
Exit status: 0 if every scenario on every broker completed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
JARS = ["/usr/share/java/amqp-client.jar", "/usr/share/java/slf4j-api.jar",
        "/usr/share/java/slf4j-nop.jar"]
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a bound-to-0 port could be
    taken as the source port of an outgoing connection before the node binds it
    (see harness.process.free_port, which this is)."""
    from harness.process import free_port as low_free_port
    return low_free_port()


def amqp_ready(host: str, port: int) -> bool:
    """True when the port answers the AMQP 0-9-1 header with a connection.start frame."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.settimeout(2.0)
            s.sendall(b"AMQP\x00\x00\x09\x01")
            data = s.recv(7)
            return len(data) >= 1 and data[0] == 1
    except OSError:
        return False


def wait_ready(port: int, timeout: float, proc: subprocess.Popen[bytes] | None, what: str,
               logfile: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before accepting AMQP"
                               + (f"; log tail:\n{tail(logfile)}" if logfile else ""))
        if amqp_ready("127.0.0.1", port):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not accept AMQP on port {port} within {timeout}s"
                       + (f"; log tail:\n{tail(logfile)}" if logfile else ""))


def tail(path: Path | None, n: int = 30) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "<no log>"


# --------------------------------------------------------------------------- brokers

class MirrorqNode:
    """One `python -m node.app serve` on free ports with a throwaway data dir."""

    name = "mirrorq"
    ready_timeout = 30.0  # s until AMQP answers (bench/backlog.py restarts with a backlog: longer)
    log_level = "WARNING"  # bench/backlog.py: INFO (the start phases' timings)

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        # fixed for the node's life: a restart on the same data must find itself at the
        # Raft address it recorded (bench/backlog.py restarts it)
        self.raft_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.logfile = workdir / "mirrorq-b1.log"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self) -> None:
        data = self.workdir / "mirrorq-data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "node.app", "serve", "--node-id", "b1",
                "--amqp-port", str(self.port), "--raft-port", str(self.raft_port),
                "--metrics-port", str(self.metrics_port),
                "--data-dir", str(data), "--log-level", self.log_level]
        log(f"starting mirrorq: {' '.join(argv[1:])}")
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        wait_ready(self.port, self.ready_timeout, self.proc, "mirrorq", self.logfile)

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def epmd_pids() -> set[int]:
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() != "epmd":
                    continue
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):  # an exited epmd not yet reaped is no epmd
                    pids.add(int(d.name))
            except (OSError, IndexError):
                pass
    return pids


class RabbitNode:
    """A throwaway RabbitMQ node: own ports, mnesia/log dirs in a temp dir owned by rabbitmq."""

    name = "rabbitmq"
    ready_timeout = 90.0  # s until AMQP answers (bench/backlog.py restarts with a backlog: longer)

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "rabbitmq"
        self.port = free_port()
        self.dist_port = free_port()
        self.nodename = f"bench{uuid.uuid4().hex[:6]}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        self.logfile = self.dir / "stdout.log"
        self.epmd_before: set[int] = set()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self) -> None:
        if not os.path.exists(RABBITMQ_SERVER):
            raise RuntimeError(f"{RABBITMQ_SERVER} not found; pass --rabbitmq-url or --skip-rabbitmq")
        try:
            rmq = pwd.getpwnam("rabbitmq")
        except KeyError:
            raise RuntimeError("no 'rabbitmq' user; pass --rabbitmq-url or --skip-rabbitmq") from None
        euid = os.geteuid()
        if euid not in (0, rmq.pw_uid):
            raise RuntimeError("starting RabbitMQ needs root or the rabbitmq user; pass --rabbitmq-url")
        for sub in ("mnesia", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "enabled_plugins").write_text("[].\n")
        os.chmod(self.dir.parent, 0o755)
        if euid == 0:
            for root, _dirs, files in os.walk(self.dir):
                os.chown(root, rmq.pw_uid, rmq.pw_gid)
                for f in files:
                    os.chown(os.path.join(root, f), rmq.pw_uid, rmq.pw_gid)
            os.chown(self.dir.parent, rmq.pw_uid, rmq.pw_gid)
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "HOME": str(self.dir),
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(self.dir / "feature_flags"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PLUGINS_DIR": ":".join(["/usr/lib/rabbitmq/plugins",
                                              *glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins")]),
        }
        self.epmd_before = epmd_pids()
        log(f"starting RabbitMQ {self.nodename} on port {self.port} (dir {self.dir})")
        kw: dict[str, Any] = {}
        if euid == 0:
            kw = {"user": rmq.pw_uid, "group": rmq.pw_gid, "extra_groups": []}
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen([RABBITMQ_SERVER], cwd=str(self.dir), env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, **kw)
        wait_ready(self.port, self.ready_timeout, self.proc, "RabbitMQ", self.logfile)

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        if p is not None:
            try:  # stray children of the node (same process group)
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not self.epmd_before:  # we started epmd: stop exactly the one(s) that appeared
            for pid in epmd_pids() - self.epmd_before:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


class Remote:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


# --------------------------------------------------------------------------- java

def compile_bench(outdir: Path) -> str:
    javac = shutil.which("javac")
    if javac is None or shutil.which("java") is None:
        raise SystemExit("javac/java not found (install openjdk-17-jdk-headless)")
    missing = [j for j in JARS if not os.path.exists(j)]
    if missing:
        raise SystemExit(f"missing jars: {missing} (install librabbitmq-client-java libslf4j-java)")
    jars = os.pathsep.join(JARS)
    proc = subprocess.run([javac, "-nowarn", "-d", str(outdir), "-cp", jars,
                           str(BENCH / "java" / "Bench.java")],
                          capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise SystemExit(f"javac failed:\n{proc.stdout}\n{proc.stderr}")
    return os.pathsep.join([str(outdir), jars])


def bench(cp: str, url: str, timeout: float, *args: str) -> dict[str, Any]:
    cmd = ["java", "-Xmx512m", "-XX:+UseParallelGC", "-cp", cp, "Bench", "--uri", url, *args]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout}s", "args": list(args)}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"no JSON output (rc={proc.returncode}): {proc.stderr[-1500:]}", "args": list(args)}
    res: dict[str, Any] = json.loads(lines[-1])
    if proc.returncode != 0 and "error" not in res:
        res["error"] = f"exit status {proc.returncode}"
    res["wall_s"] = round(time.monotonic() - t0, 2)
    return res


def run_scenarios(cp: str, url: str, a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    q = f"bench-c-{uuid.uuid4().hex[:8]}"
    confirm_args = ["--mode", "confirms", "--count", str(a.count), "--size", str(a.size),
                    "--window", str(a.window), "--publishers", str(a.publishers),
                    "--queue", q, "--timeout", str(int(a.stall)), "--warmup", str(a.warmup),
                    "--payload", a.payload]
    if not a.no_consume:
        confirm_args.append("--keep")
    log(f"  confirms: {a.count} x {a.size} B ({a.payload}), window {a.window}, {a.publishers} publisher(s)")
    out["confirms"] = bench(cp, url, a.timeout, *confirm_args)
    log(f"    -> {summary(out['confirms'])}")
    if not a.no_consume:
        log(f"  consume: drain {q}, prefetch {a.prefetch}")
        out["consume"] = bench(cp, url, a.timeout, "--mode", "consume", "--queue", q,
                               "--count", str(a.count), "--prefetch", str(a.prefetch),
                               "--ack-every", str(a.ack_every), "--timeout", str(int(a.stall)),
                               "--delete")
        log(f"    -> {summary(out['consume'])}")
    log(f"  tx: {a.tx_count} x {a.size} B, tx.commit each")
    out["tx"] = bench(cp, url, a.timeout, "--mode", "tx", "--count", str(a.tx_count),
                      "--size", str(a.size), "--payload", a.payload)
    log(f"    -> {summary(out['tx'])}")
    c, t = out["confirms"].get("msg_per_s"), out["tx"].get("msg_per_s")
    if c and t:
        out["confirms_over_tx"] = round(c / t, 1)
    return out


def summary(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    s = f"{r.get('msg_per_s')} msg/s in {r.get('elapsed_ms')} ms"
    for k in ("confirm", "commit"):
        if f"{k}_p50_ms" in r:
            s += f", {k} p50 {r[f'{k}_p50_ms']} ms p99 {r[f'{k}_p99_ms']} ms"
    return s


# --------------------------------------------------------------------------- report

def comparison(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    m, r = results.get("mirrorq", {}), results.get("rabbitmq", {})
    for sc in ("confirms", "consume", "tx"):
        if sc not in m.get("scenarios", {}) and sc not in r.get("scenarios", {}):
            continue
        mr = m.get("scenarios", {}).get(sc, {})
        rr = r.get("scenarios", {}).get(sc, {})
        row: dict[str, Any] = {"scenario": sc,
                               "mirrorq_msg_per_s": None if "error" in mr else mr.get("msg_per_s"),
                               "rabbitmq_msg_per_s": None if "error" in rr else rr.get("msg_per_s")}
        if row["mirrorq_msg_per_s"] and row["rabbitmq_msg_per_s"]:
            row["ratio"] = round(row["mirrorq_msg_per_s"] / row["rabbitmq_msg_per_s"], 3)
        else:
            row["ratio"] = None
        lat = "confirm" if sc == "confirms" else "commit" if sc == "tx" else None
        if lat:
            for who, res in (("mirrorq", mr), ("rabbitmq", rr)):
                if f"{lat}_p50_ms" in res:
                    row[f"{who}_p50_ms"] = res[f"{lat}_p50_ms"]
                    row[f"{who}_p99_ms"] = res[f"{lat}_p99_ms"]
        for who, res in (("mirrorq", mr), ("rabbitmq", rr)):
            if "error" in res:
                row[f"{who}_error"] = res["error"]
        rows.append(row)
    return rows


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if v >= 10 else f"{v:.3g}"
    return str(v)


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ["scenario", "mirrorq msg/s", "RabbitMQ msg/s", "ratio", "mirrorq p50/p99 ms",
            "RabbitMQ p50/p99 ms"]
    body = []
    for r in rows:
        def lat(who: str, r: dict[str, Any] = r) -> str:
            if f"{who}_p50_ms" not in r:
                return "-"
            return f"{fmt(r[who + '_p50_ms'])} / {fmt(r[who + '_p99_ms'])}"
        body.append([r["scenario"], fmt(r["mirrorq_msg_per_s"]) if "mirrorq_error" not in r else "ERROR",
                     fmt(r["rabbitmq_msg_per_s"]) if "rabbitmq_error" not in r else "ERROR",
                     fmt(r["ratio"]), lat("mirrorq"), lat("rabbitmq")])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    print(line)
    print("  ".join("-" * w for w in widths))
    for b in body:
        print("  ".join(str(x).ljust(w) for x, w in zip(b, widths, strict=True)))
    for r in rows:
        for who in ("mirrorq", "rabbitmq"):
            if f"{who}_error" in r:
                print(f"! {r['scenario']} on {who}: {r[who + '_error']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: small N (count 500, tx 50)")
    p.add_argument("--skip-mirrorq", action="store_true")
    p.add_argument("--skip-rabbitmq", action="store_true")
    p.add_argument("--mirrorq-url", help="use this running mirrorq instead of starting a node")
    p.add_argument("--rabbitmq-url", help="use this running RabbitMQ instead of starting one")
    p.add_argument("--count", type=int, help="confirms messages (default 10000; quick 500)")
    p.add_argument("--tx-count", type=int, help="tx.commit-each messages (default 2000; quick 50)")
    p.add_argument("--size", type=int, default=1024, help="message body bytes (default 1024)")
    p.add_argument("--payload", choices=["random", "compressible"], default="random",
                   help="bodies: random = 256 distinct random bodies per publisher, cycled (default); "
                   "compressible = one random block repeated (zlib shrinks it ~100x)")
    p.add_argument("--window", type=int, default=1000, help="max unconfirmed per publisher (default 1000)")
    p.add_argument("--publishers", type=int, default=1)
    p.add_argument("--warmup", type=int, help="untimed confirms warmup messages (default 2000; quick 0)")
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--ack-every", type=int, default=100)
    p.add_argument("--no-consume", action="store_true", help="skip the consume drain")
    p.add_argument("--timeout", type=float, help="per scenario wall timeout, s (default 600; quick 120)")
    p.add_argument("--stall", type=float, default=60, help="give up after this long without progress, s")
    p.add_argument("--out", default=str(BENCH / "results" / "latest.json"))
    p.add_argument("--keep-workdir", action="store_true", help="keep node data/logs for inspection")
    a = p.parse_args(argv)
    a.count = a.count if a.count is not None else (500 if a.quick else 10_000)
    a.tx_count = a.tx_count if a.tx_count is not None else (50 if a.quick else 2_000)
    a.warmup = a.warmup if a.warmup is not None else (0 if a.quick else 2_000)
    a.timeout = a.timeout if a.timeout is not None else (120 if a.quick else 600)

    workdir = Path(tempfile.mkdtemp(prefix="mirrorq-bench-"))
    results: dict[str, Any] = {}
    failed = False
    try:
        cp = compile_bench(workdir / "classes")
        targets: list[Any] = []
        if not a.skip_mirrorq:
            targets.append(Remote("mirrorq", a.mirrorq_url) if a.mirrorq_url else MirrorqNode(workdir))
        if not a.skip_rabbitmq:
            targets.append(Remote("rabbitmq", a.rabbitmq_url) if a.rabbitmq_url else RabbitNode(workdir))
        for t in targets:
            entry: dict[str, Any] = {"started_by_bench": not isinstance(t, Remote)}
            results[t.name] = entry
            try:
                t.start()
                entry["url"] = t.url
                log(f"{t.name} at {t.url}")
                entry["scenarios"] = run_scenarios(cp, t.url, a)
            except Exception as exc:  # noqa: BLE001 - report and go on with the other broker
                entry["error"] = f"{type(exc).__name__}: {exc}"
                log(f"{t.name}: {entry['error']}")
            finally:
                t.stop()
            if "error" in entry or any(isinstance(v, dict) and "error" in v
                                       for v in entry.get("scenarios", {}).values()):
                failed = True
    finally:
        if a.keep_workdir:
            log(f"workdir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    rows = comparison(results)
    report = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "params": {"quick": a.quick, "count": a.count, "tx_count": a.tx_count, "size": a.size,
                   "payload": a.payload,
                   "window": a.window, "publishers": a.publishers, "warmup": a.warmup,
                   "prefetch": a.prefetch, "ack_every": a.ack_every, "consume": not a.no_consume,
                   "persistent": True, "durable_queue": True},
        "brokers": results,
        "comparison": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(rows)
    for name, entry in results.items():
        if "error" in entry:
            print(f"! {name}: {entry['error']}")
        elif "confirms_over_tx" in entry.get("scenarios", {}):
            print(f"{name}: streaming confirms are {entry['scenarios']['confirms_over_tx']}x "
                  f"tx.commit-each (S21 asks >= 100x)")
    print(f"results: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
