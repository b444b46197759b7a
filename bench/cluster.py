#!/usr/bin/env python3
"""3-node mirrorq cluster vs 3-node RabbitMQ cluster (quorum queue), same machine, same run.

    .venv/bin/python bench/cluster.py                    # 20,000 x 1 KiB, 2 publishers
    .venv/bin/python bench/cluster.py --count 4000 --skip-rabbitmq
    .venv/bin/python bench/cluster.py --skip-failover

Scenario (the same on both clusters, one cluster at a time so they never share the CPUs):
  confirms  N persistent 1 KiB messages into one durable, replicated queue (mirrorq: every
            queue; RabbitMQ: x-queue-type=quorum declared before the load, 3 members), from 2
            publishers on 2 different nodes, each a bench/java/Bench.java process (streaming
            confirms, bounded window). Aggregate msg/s = N / the longer of the two publishers'
            first-publish -> last-confirm times (both are started together); p50/p99 are the
            worse of the two publishers' confirm latencies. The queue depth is checked
            afterwards (= N).
  failover  (mirrorq only) a confirm-tracking publisher (harness.publisher.StreamPublisher)
            on a follower; SIGKILL the leader; measure the time until the survivors' admin
            Status agree on a new leader among them, the time until the first confirm that
            leaves after that, and the longest gap between confirms after the kill.

Prints a table and writes bench/results/cluster.json. Every process is stopped by pid /
process group; an epmd is stopped only if this run started it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import pwd
import secrets
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from run import (  # noqa: E402
    RABBITMQ_SERVER,
    amqp_ready,
    compile_bench,
    epmd_pids,
    free_port,
    log,
    tail,
)

RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


# --------------------------------------------------------------------------- helpers

def java_cmd(cp: str, url: str, *args: str) -> list[str]:
    return ["java", "-Xmx512m", "-XX:+UseParallelGC", "-cp", cp, "Bench", "--uri", url, *args]


def run_parallel_bench(cp: str, urls: list[str], timeout: float, *args: str) -> list[dict[str, Any]]:
    """One Bench process per URL, started together; their parsed JSON results."""
    procs = [subprocess.Popen(java_cmd(cp, u, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for u in urls]
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    for p, u in zip(procs, urls, strict=True):
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            out.append({"error": f"timed out after {timeout}s", "uri": u})
            continue
        lines = [ln for ln in so.splitlines() if ln.startswith("{")]
        if not lines:
            out.append({"error": f"no JSON (rc={p.returncode}): {se[-1500:]}", "uri": u})
            continue
        res: dict[str, Any] = json.loads(lines[-1])
        res["uri"] = u
        if p.returncode != 0 and "error" not in res:
            res["error"] = f"exit status {p.returncode}"
        out.append(res)
    return out


def aggregate(parts: list[dict[str, Any]], count: int) -> dict[str, Any]:
    agg: dict[str, Any] = {"publishers": parts}
    errors = [p["error"] for p in parts if "error" in p]
    if errors:
        agg["error"] = "; ".join(errors)
        return agg
    elapsed = max(float(p["elapsed_ms"]) for p in parts) / 1000.0
    agg["count"] = sum(int(p.get("acked", 0)) + int(p.get("nacked", 0)) for p in parts)
    agg["acked"] = sum(int(p.get("acked", 0)) for p in parts)
    agg["nacked"] = sum(int(p.get("nacked", 0)) for p in parts)
    agg["elapsed_s"] = round(elapsed, 3)
    agg["msg_per_s"] = round(count / elapsed, 1) if elapsed > 0 else None
    agg["sum_of_publisher_rates"] = round(sum(float(p["msg_per_s"]) for p in parts), 1)
    for k in ("confirm_p50_ms", "confirm_p95_ms", "confirm_p99_ms", "confirm_max_ms"):
        agg[k] = max(float(p[k]) for p in parts)
    return agg


def params(host: str, port: int, vhost: str) -> Any:
    import pika
    return pika.ConnectionParameters(host, port, virtual_host=vhost, heartbeat=0, socket_timeout=10)


def passive_count(host: str, port: int, queue: str, vhost: str = "/") -> int:
    import pika
    conn = pika.BlockingConnection(params(host, port, vhost))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def declare(host: str, port: int, queue: str, arguments: dict[str, Any] | None = None,
            vhost: str = "/") -> None:
    import pika
    conn = pika.BlockingConnection(params(host, port, vhost))
    try:
        conn.channel().queue_declare(queue, durable=True, arguments=arguments)
    finally:
        conn.close()


def delete(host: str, port: int, queue: str, vhost: str = "/") -> None:
    import pika
    try:
        conn = pika.BlockingConnection(params(host, port, vhost))
        try:
            conn.channel().queue_delete(queue)
        finally:
            conn.close()
    except Exception as exc:  # noqa: BLE001 - best effort
        log(f"delete {queue}: {exc!r}")


# --------------------------------------------------------------------------- mirrorq

class MirrorqCluster:
    name = "mirrorq"
    log_level = "WARNING"  # bench/backlog.py: INFO (the start phases' timings)

    def __init__(self, workdir: Path, n: int = 3) -> None:
        self.dir = workdir / "mirrorq"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "cluster.toml"
        self.admin_token = secrets.token_hex(16)  # nodes refuse an admin port without one
        self.config.write_text(f'[raft]\npassword = "{secrets.token_hex(16)}"\n'
                               f'[admin]\ntoken = "{self.admin_token}"\n')
        self.config.chmod(0o600)
        self.nodes: list[dict[str, Any]] = []
        for i in range(n):
            self.nodes.append({"id": f"m{i + 1}", "amqp": free_port(), "raft": free_port(),
                               "admin": free_port(), "metrics": free_port(), "proc": None,
                               "log": self.dir / f"m{i + 1}.log"})

    def url(self, i: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.nodes[i]['amqp']}/%2F"

    def argv(self, nd: dict[str, Any]) -> list[str]:
        peers = ",".join(f"{o['id']}=127.0.0.1:{o['raft']}" for o in self.nodes if o is not nd)
        return [sys.executable, "-m", "node.app", "serve", "--node-id", nd["id"], "--host", "127.0.0.1",
                "--amqp-port", str(nd["amqp"]), "--raft-port", str(nd["raft"]),
                "--admin-port", str(nd["admin"]), "--metrics-port", str(nd["metrics"]),
                "--data-dir", str(self.dir / nd["id"]), "--peers", peers,
                "--config", str(self.config), "--log-level", self.log_level]

    def start(self) -> None:
        for nd in self.nodes:
            with open(nd["log"], "ab") as out:
                nd["proc"] = subprocess.Popen(self.argv(nd), cwd=str(REPO), stdout=out,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True)
        deadline = time.monotonic() + 90
        for nd in self.nodes:
            while not amqp_ready("127.0.0.1", nd["amqp"]):
                if nd["proc"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mirrorq {nd['id']} did not start:\n{tail(nd['log'])}")
                time.sleep(0.1)
        self.leader(timeout=30)

    def status(self, i: int, timeout: float = 1.0) -> dict[str, Any] | None:
        from node.admin.client import call_status
        nd = self.nodes[i]
        if nd["proc"] is None or nd["proc"].poll() is not None:
            return None
        try:
            return call_status("127.0.0.1", nd["admin"], timeout=timeout, token=self.admin_token)
        except Exception:  # noqa: BLE001 - unreachable
            return None

    def index_of(self, ref: str | None) -> int | None:
        for i, nd in enumerate(self.nodes):
            if ref in (nd["id"], f"127.0.0.1:{nd['raft']}"):
                return i
        return None

    def agreed_leader(self, among: list[int]) -> int | None:
        views = set()
        for i in among:
            st = self.status(i)
            if st is None:
                return None
            views.add(self.index_of(st.get("leader")))
        if len(views) != 1:
            return None
        leader = views.pop()
        if leader is None or leader not in among:
            return None
        st = self.status(leader)
        return leader if st is not None and st.get("role") == "leader" else None

    def leader(self, timeout: float = 30.0, among: list[int] | None = None) -> int:
        among = among if among is not None else list(range(len(self.nodes)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.agreed_leader(among)
            if leader is not None:
                return leader
            time.sleep(0.02)
        raise RuntimeError(f"no agreed leader among {[self.nodes[i]['id'] for i in among]}")

    def kill9(self, i: int) -> None:
        p = self.nodes[i]["proc"]
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def stop(self) -> None:
        for nd in self.nodes:
            p = nd["proc"]
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for nd in self.nodes:
            p = nd["proc"]
            if p is None:
                continue
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
            try:  # the node's own process group: a forked snapshot child left behind
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def mirrorq_failover(c: MirrorqCluster) -> dict[str, Any]:
    from harness.publisher import StreamPublisher

    class _Target:  # what StreamPublisher needs of a node
        def __init__(self, i: int) -> None:
            self.node_id = c.nodes[i]["id"]
            self.host = "127.0.0.1"
            self.amqp_port = c.nodes[i]["amqp"]

    leader = c.leader()
    survivors = [i for i in range(len(c.nodes)) if i != leader]
    q = f"bench-failover-{uuid.uuid4().hex[:8]}"
    declare("127.0.0.1", c.nodes[survivors[0]]["amqp"], q)
    targets = [_Target(i) for i in survivors]
    pub = StreamPublisher("fo", q, lambda: targets, total=None, window=200, deadline=240)
    pub.start()
    t0 = time.monotonic()
    while len(pub.confirmed) < 2000 and pub.error is None and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    if pub.error is not None or len(pub.confirmed) < 2000:
        pub.abandon()
        return {"error": f"publisher did not warm up: {pub.summary()}"}
    old_term = (c.status(leader) or {}).get("term")
    t_kill = time.monotonic()
    c.kill9(leader)
    t_first_view: float | None = None
    new_leader: int | None = None
    deadline = t_kill + 60
    while time.monotonic() < deadline:
        views = [c.status(i, timeout=0.5) for i in survivors]
        named = {c.index_of(v.get("leader")) for v in views if v}
        if t_first_view is None and any(x in survivors for x in named):
            t_first_view = time.monotonic()
        agreed = c.agreed_leader(survivors)
        if agreed is not None:
            new_leader = agreed
            break
        time.sleep(0.02)
    t_agreed = time.monotonic()
    if new_leader is None:
        pub.abandon()
        return {"error": "no new leader within 60 s"}
    while pub.progress_since(t_agreed) == 0 and pub.error is None and time.monotonic() < t_agreed + 60:
        time.sleep(0.01)
    after = sorted(t for t in pub.confirm_times if t >= t_agreed)
    resumed = after[0] - t_kill if after else None
    time.sleep(2.0)
    pub.stop()
    pub.join(60)
    times = sorted(t for t in pub.confirm_times if t >= t_kill)
    gaps = [b - a for a, b in zip([t_kill, *times], times, strict=False)]
    res = {
        "killed": c.nodes[leader]["id"], "old_term": old_term,
        "new_leader": c.nodes[new_leader]["id"],
        "new_term": (c.status(new_leader) or {}).get("term"),
        "first_survivor_names_new_leader_s": round(t_first_view - t_kill, 3) if t_first_view else None,
        "new_leader_agreed_s": round(t_agreed - t_kill, 3),
        "confirms_resumed_s": round(resumed, 3) if resumed is not None else None,
        "longest_confirm_gap_after_kill_s": round(max(gaps, default=0.0), 3),
        "publisher": pub.summary(),
    }
    if pub.error:
        res["error"] = pub.error
    return res


# --------------------------------------------------------------------------- rabbitmq

class RabbitCluster:
    name = "rabbitmq"

    def __init__(self, workdir: Path, n: int = 3) -> None:
        self.dir = workdir / "rabbitmq"
        self.home = self.dir / "home"
        tag = uuid.uuid4().hex[:6]
        self.nodes: list[dict[str, Any]] = []
        for i in range(n):
            letter = "ABCDEFGH"[i]
            dist = free_port()
            while dist > 50000:  # rabbitmqctl uses dist+10000.. for itself
                dist = free_port()
            self.nodes.append({"name": f"rmq{letter}{tag}@localhost", "port": free_port(), "dist": dist,
                               "dir": self.dir / f"rmq{letter}", "proc": None})
        self.epmd_before: set[int] = set()
        self.rmq = pwd.getpwnam("rabbitmq")

    # Bench.java redeclares the queue without arguments, which RabbitMQ refuses for a
    # quorum queue (inequivalent x-queue-type) unless the vhost's default queue type is
    # quorum: the load runs in such a vhost.
    VHOST = "bench-quorum"

    def url(self, i: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.nodes[i]['port']}/{self.VHOST}"

    def _chown_tree(self, root: Path) -> None:
        for r, _dirs, files in os.walk(root):
            os.chown(r, self.rmq.pw_uid, self.rmq.pw_gid)
            for f in files:
                os.chown(os.path.join(r, f), self.rmq.pw_uid, self.rmq.pw_gid)

    def _env(self, nd: dict[str, Any] | None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": str(self.home)}
        if nd is not None:
            d = nd["dir"]
            env.update({
                "RABBITMQ_NODE_PORT": str(nd["port"]), "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_DIST_PORT": str(nd["dist"]), "RABBITMQ_NODENAME": nd["name"],
                "RABBITMQ_MNESIA_BASE": str(d / "mnesia"), "RABBITMQ_LOG_BASE": str(d / "log"),
                "RABBITMQ_FEATURE_FLAGS_FILE": str(d / "feature_flags"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            })
        return env

    def _as_rabbitmq(self) -> dict[str, Any]:
        return {"user": self.rmq.pw_uid, "group": self.rmq.pw_gid, "extra_groups": []}

    def ctl(self, i: int, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run([RABBITMQCTL, "-n", self.nodes[i]["name"], *args], env=self._env(None),
                              cwd=str(self.home), capture_output=True, text=True, timeout=timeout,
                              **self._as_rabbitmq())
        if proc.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {self.nodes[i]['name']} {' '.join(args)}: "
                               f"{proc.stdout[-800:]} {proc.stderr[-800:]}")
        return proc.stdout

    def start(self) -> None:
        if not os.path.exists(RABBITMQ_SERVER) or os.geteuid() != 0:
            raise RuntimeError("starting a RabbitMQ cluster needs root and Debian's rabbitmq-server")
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text("".join(secrets.choice(string.ascii_uppercase) for _ in range(20)))
        for nd in self.nodes:
            for sub in ("mnesia", "log"):
                (nd["dir"] / sub).mkdir(parents=True, exist_ok=True)
            (nd["dir"] / "enabled_plugins").write_text("[].\n")
        os.chmod(self.dir.parent, 0o755)
        os.chown(self.dir.parent, self.rmq.pw_uid, self.rmq.pw_gid)
        self._chown_tree(self.dir)
        os.chmod(cookie, 0o400)
        self.epmd_before = epmd_pids()
        for nd in self.nodes:
            log(f"starting RabbitMQ {nd['name']} on port {nd['port']}")
            with open(nd["dir"] / "stdout.log", "ab") as out:
                nd["proc"] = subprocess.Popen([RABBITMQ_SERVER], cwd=str(nd["dir"]), env=self._env(nd),
                                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True, **self._as_rabbitmq())
        deadline = time.monotonic() + 120
        for nd in self.nodes:
            while not amqp_ready("127.0.0.1", nd["port"]):
                if nd["proc"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"RabbitMQ {nd['name']} did not start:\n"
                                       f"{tail(nd['dir'] / 'stdout.log')}")
                time.sleep(0.2)
        for i in range(1, len(self.nodes)):
            self.ctl(i, "stop_app")
            self.ctl(i, "join_cluster", self.nodes[0]["name"])
            self.ctl(i, "start_app")
        status = self.ctl(0, "cluster_status")
        running = sum(1 for nd in self.nodes if nd["name"] in status.split("Running Nodes", 1)[-1]
                      .split("Versions", 1)[0])
        if running != len(self.nodes):
            raise RuntimeError(f"cluster has {running} running nodes:\n{status}")
        self.ctl(0, "add_vhost", self.VHOST, "--default-queue-type", "quorum")
        self.ctl(0, "set_permissions", "-p", self.VHOST, "guest", ".*", ".*", ".*")
        for nd in self.nodes:
            deadline = time.monotonic() + 60
            while not amqp_ready("127.0.0.1", nd["port"]):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{nd['name']} not accepting AMQP after joining")
                time.sleep(0.2)

    def stop(self) -> None:
        for nd in self.nodes:
            p = nd["proc"]
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for nd in self.nodes:
            p = nd["proc"]
            if p is None:
                continue
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if not self.epmd_before:  # we started epmd: stop exactly the one(s) that appeared
            for pid in epmd_pids() - self.epmd_before:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


# --------------------------------------------------------------------------- main

def confirms_scenario(cp: str, cluster: Any, a: argparse.Namespace, qargs: dict[str, Any] | None) -> dict[str, Any]:
    q = f"bench-cluster-{uuid.uuid4().hex[:8]}"
    port0 = cluster.nodes[0]["amqp" if isinstance(cluster, MirrorqCluster) else "port"]
    port1 = cluster.nodes[1]["amqp" if isinstance(cluster, MirrorqCluster) else "port"]
    vhost = getattr(cluster, "VHOST", "/")
    declare("127.0.0.1", port0, q, qargs, vhost)
    if isinstance(cluster, RabbitCluster):
        listing = cluster.ctl(0, "list_queues", "-p", vhost, "name", "type", "--no-table-headers")
        line = next((ln for ln in listing.splitlines() if ln.startswith(q)), "")
        if "quorum" not in line:
            raise RuntimeError(f"{q} is not a quorum queue: {listing!r}")
    share = a.count // 2
    log(f"  confirms: {a.count} x {a.size} B persistent to {q}, 2 publishers on 2 nodes, window {a.window}")
    parts = run_parallel_bench(cp, [cluster.url(0), cluster.url(1)], a.timeout,
                               "--mode", "confirms", "--count", str(share), "--size", str(a.size),
                               "--window", str(a.window), "--publishers", "1", "--queue", q, "--keep",
                               "--timeout", str(int(a.stall)), "--warmup", str(a.warmup))
    res = aggregate(parts, 2 * share)
    res["queue"] = q
    if "error" not in res:
        try:
            depth = passive_count("127.0.0.1", port1, q, vhost)
            res["depth_after"] = depth
            if depth != 2 * share:
                res["error"] = f"queue holds {depth}, expected {2 * share}"
        except Exception as exc:  # noqa: BLE001
            res["error"] = f"depth check: {exc!r}"
    if qargs:
        res["queue_type"] = qargs.get("x-queue-type")
    delete("127.0.0.1", port0, q, vhost)
    log(f"    -> {res.get('msg_per_s')} msg/s, p50 {res.get('confirm_p50_ms')} ms, "
        f"p99 {res.get('confirm_p99_ms')} ms" + (f"; ERROR {res['error']}" if "error" in res else ""))
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=20_000, help="messages in total (split over 2 publishers)")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--window", type=int, default=1000, help="max unconfirmed per publisher")
    p.add_argument("--warmup", type=int, default=2000, help="untimed warm-up confirms per publisher")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--stall", type=float, default=60)
    p.add_argument("--skip-mirrorq", action="store_true")
    p.add_argument("--skip-rabbitmq", action="store_true")
    p.add_argument("--skip-failover", action="store_true")
    p.add_argument("--out", default=str(BENCH / "results" / "cluster.json"))
    p.add_argument("--keep-workdir", action="store_true")
    a = p.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="mirrorq-cbench-"))
    results: dict[str, Any] = {}
    failed = False
    try:
        cp = compile_bench(workdir / "classes")
        if not a.skip_mirrorq:
            entry: dict[str, Any] = results.setdefault("mirrorq", {})
            mc = MirrorqCluster(workdir)
            try:
                log("starting a 3-node mirrorq cluster")
                mc.start()
                entry["confirms"] = confirms_scenario(cp, mc, a, None)
                if not a.skip_failover:
                    log("  failover: SIGKILL the leader under confirmed load")
                    entry["failover"] = mirrorq_failover(mc)
                    log(f"    -> {entry['failover']}")
            except Exception as exc:  # noqa: BLE001
                entry["error"] = f"{type(exc).__name__}: {exc}"
                log(f"mirrorq: {entry['error']}")
                for nd in mc.nodes:
                    log(f"---- {nd['id']} log tail\n{tail(nd['log'], 15)}")
            finally:
                mc.stop()
        if not a.skip_rabbitmq:
            entry = results.setdefault("rabbitmq", {})
            rc = RabbitCluster(workdir)
            try:
                log("starting a 3-node RabbitMQ cluster")
                rc.start()
                entry["version"] = rc.ctl(0, "version").strip()
                entry["confirms"] = confirms_scenario(cp, rc, a, {"x-queue-type": "quorum"})
            except Exception as exc:  # noqa: BLE001
                entry["error"] = f"{type(exc).__name__}: {exc}"
                log(f"rabbitmq: {entry['error']}")
            finally:
                rc.stop()
    finally:
        if a.keep_workdir:
            log(f"workdir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    for entry in results.values():
        if "error" in entry or any(isinstance(v, dict) and "error" in v for v in entry.values()):
            failed = True
    m = results.get("mirrorq", {}).get("confirms", {})
    r = results.get("rabbitmq", {}).get("confirms", {})
    ratio = (round(m["msg_per_s"] / r["msg_per_s"], 3)
             if m.get("msg_per_s") and r.get("msg_per_s") and "error" not in m and "error" not in r else None)
    report = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "params": {"nodes": 3, "count": a.count, "size": a.size, "window": a.window, "warmup": a.warmup,
                   "publishers": 2, "publishers_on_distinct_nodes": True, "persistent": True,
                   "durable_queue": True, "rabbitmq_queue_type": "quorum"},
        "results": results,
        "ratio_mirrorq_over_rabbitmq": ratio,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")

    def cell(d: dict[str, Any], k: str) -> str:
        if not d:
            return "-"
        if "error" in d:
            return "ERROR"
        v = d.get(k)
        return f"{v:,.1f}" if isinstance(v, float) else str(v)
    print(f"{'3-node cluster, 1 KiB persistent, confirms':<44}{'mirrorq':>14}{'RabbitMQ (quorum)':>20}")
    for label, k in (("confirmed msg/s", "msg_per_s"), ("confirm p50 ms", "confirm_p50_ms"),
                     ("confirm p99 ms", "confirm_p99_ms")):
        print(f"{label:<44}{cell(m, k):>14}{cell(r, k):>20}")
    print(f"{'ratio mirrorq / RabbitMQ':<44}{(str(ratio) if ratio is not None else '-'):>14}")
    fo = results.get("mirrorq", {}).get("failover")
    if fo:
        if "error" in fo:
            print(f"! failover: {fo['error']}")
        print(f"failover (SIGKILL leader {fo.get('killed')}): new leader {fo.get('new_leader')} agreed after "
              f"{fo.get('new_leader_agreed_s')} s (first survivor named it after "
              f"{fo.get('first_survivor_names_new_leader_s')} s); confirms resumed "
              f"{fo.get('confirms_resumed_s')} s after the kill; longest confirm gap "
              f"{fo.get('longest_confirm_gap_after_kill_s')} s")
    for name, entry in results.items():
        for k, v in entry.items():
            if k == "error":
                print(f"! {name}: {v}")
            elif isinstance(v, dict) and "error" in v and k != "failover":
                print(f"! {name} {k}: {v['error']}")
    print(f"results: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
