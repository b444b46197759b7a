#!/usr/bin/env python3
"""The backlog benchmark of issue 27: mirrorq vs RabbitMQ 4.3.6 and 3.10.8 holding a large
queue nobody consumes, one broker at a time.

    flock /work/wt/heavy.lock .venv/bin/python bench/backlog.py --messages 100000 \\
        --large-count 5000 --targets 1node --out /tmp/backlog.json        # a small run
    flock /work/wt/heavy.lock .venv/bin/python bench/backlog.py          # the full sitting:
        # 10M x 1 KiB on each 1-node target, 5M on each 3-node one, 200,000 x 64 KiB on 1 node

For every (case, target), on a fresh data dir, the broker alone on the machine:
  fill     N random persistent bodies into one durable queue (RabbitMQ: a quorum queue), no
           consumer, streaming publisher confirms with a window (--window), in --slices equal
           slices: each slice is one bench/java/Bench.java confirms run (its own publisher
           numbers, so ids and bodies never repeat); after each slice the queue depth is
           checked and the broker's RSS and data-dir disk usage recorded.
  restart  stop the broker (gracefully), start it on the same data; restart time = from the
           start command until a client on it sees the queue with all N messages (passive
           declare) AND a basic.get returns one (which goes back unacked).
  drain    one consumer (Bench.java consume, prefetch --prefetch, ack multiple every
           prefetch/2) takes all N; every body is compared with what its publisher sent
           (--verify), ids exactly once, at most the probe's one redelivery, queue empty.
           Disk and RSS right after, and after --settle seconds.
Cases: `backlog` (--size, default 1 KiB: --messages on 1-node targets, --three-node-messages
on 3-node ones) and `large` (--large-count x --large-size, 1-node targets only).

RSS is the sum of PSS over the broker's process tree per node: mirrorq's node process and
its children (a forked snapshot writer: pages it shares with the node count once),
RabbitMQ's beam.smp and its children (erl_child_setup, inet_gethost). Disk is the blocks allocated under each node's data dir.

Writes --out (JSON: every slice, phase and raw generator result) and the same name with .md
(the tables, ratios against RabbitMQ 4.3.6 with the same node count). Exit status 0 only if
every run passed its checks.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from cluster import MirrorqCluster, RabbitCluster  # noqa: E402
from run import (  # noqa: E402
    RABBITMQ_SERVER,
    MirrorqNode,
    RabbitNode,
    amqp_ready,
    compile_bench,
    epmd_pids,
    log,
    tail,
)
from suite import machine_info, stop_new_epmd, versions  # noqa: E402

RMQ4_DIR = Path(os.environ.get("RMQ4_SCRIPTS", "/work/shared/rabbitmq4"))
RMQ4_SUITE = "forky"  # RabbitMQ 4.3.6 (see RMQ4_DIR/README.md)
RMQ4_PORTS = {"single": [5780], "cluster": [5781, 5782, 5783]}

TARGETS = ["mirrorq-1", "rabbitmq4-1", "rabbitmq310-1", "mirrorq-3", "rabbitmq4-3", "rabbitmq310-3"]
LABELS = {
    "mirrorq-1": "mirrorq 1 node",
    "rabbitmq4-1": "RabbitMQ 4.3.6 1 node (quorum queue)",
    "rabbitmq310-1": "RabbitMQ 3.10.8 1 node (quorum queue)",
    "mirrorq-3": "mirrorq 3 nodes",
    "rabbitmq4-3": "RabbitMQ 4.3.6 3 nodes (quorum queue)",
    "rabbitmq310-3": "RabbitMQ 3.10.8 3 nodes (quorum queue)",
}
SHORT = {"mirrorq-1": "mirrorq", "rabbitmq4-1": "RMQ 4.3.6", "rabbitmq310-1": "RMQ 3.10.8",
         "mirrorq-3": "mirrorq", "rabbitmq4-3": "RMQ 4.3.6", "rabbitmq310-3": "RMQ 3.10.8"}
REFERENCE = {1: "rabbitmq4-1", 3: "rabbitmq4-3"}  # ratios are against RabbitMQ 4.3.6
GROUPS = {"all": TARGETS, "1node": TARGETS[:3], "3node": TARGETS[3:],
          "mirrorq": ["mirrorq-1", "mirrorq-3"], "rabbitmq": [t for t in TARGETS if "rabbit" in t]}


@dataclass
class Endpoint:
    host: str
    port: int
    vhost: str = "/"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/{self.vhost.replace('/', '%2F')}"


# --------------------------------------------------------------------------- processes

def _ppid_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def process_tree(root: int) -> list[int]:
    kids = _ppid_map()
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def find_beam(root: int) -> int | None:
    """The beam.smp below a rabbitmq-server wrapper (the script execs or forks into it)."""
    return next((p for p in process_tree(root) if comm(p) == "beam.smp"), None)


def rss_bytes(root: int | None) -> int | None:
    """Resident memory of `root` and its descendants: the sum of their PSS
    (smaps_rollup), so pages a forked child shares with its parent (mirrorq's
    snapshot writer, copy-on-write) count once, not twice as a sum of VmRSS
    did (a 10M backlog read 932 MB right after a restart while a snapshot
    child ran, 466 MB without it). VmRSS where smaps_rollup is not readable."""
    if root is None:
        return None
    total, seen = 0, False
    for pid in process_tree(root):
        for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
            try:
                lines = Path(path).read_text().splitlines()
            except OSError:
                continue
            got = next((ln for ln in lines if ln.startswith(key)), None)
            if got is not None:
                total += int(got.split()[1]) * 1024
                seen = True
                break
    return total if seen else None


def disk_bytes(path: Path) -> int:
    """Blocks allocated under `path` (what du reports), not apparent sizes."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


class RssSampler(threading.Thread):
    """Peak RSS per node while a phase runs (sampled every `every` s)."""

    def __init__(self, target: Target, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.every = every
        self.peak: list[int] = []
        self._stop_ev = threading.Event()

    def run(self) -> None:
        while not self._stop_ev.is_set():
            try:
                cur = [r or 0 for r in self.target.rss()]
            except Exception:  # noqa: BLE001 - a sample lost to a restart
                cur = []
            if len(cur) > len(self.peak):
                self.peak += [0] * (len(cur) - len(self.peak))
            self.peak = [max(a, b) for a, b in zip(self.peak, cur + [0] * (len(self.peak) - len(cur)),
                                                   strict=True)]
            self._stop_ev.wait(self.every)

    def finish(self) -> list[int]:
        """The peaks, the state at the end included."""
        self._stop_ev.set()
        self.join(10)
        end = [r or 0 for r in self.target.rss()]
        return [max(a, b) for a, b in zip(self.peak + [0] * (len(end) - len(self.peak)),
                                          end + [0] * (len(self.peak) - len(end)), strict=True)]


# --------------------------------------------------------------------------- targets

class Target:
    key: str
    nodes: int = 1
    queue_type: str | None = None  # Bench.java --queue-type
    version: str = ""

    def start(self) -> None:
        """Start on a fresh data dir; return once clients can use it."""
        raise NotImplementedError

    def restart_start(self) -> None:
        """Start again on the data the last stop() left (blocks until started)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def wipe(self) -> None:
        raise NotImplementedError

    def client(self) -> Endpoint:
        """Where the publisher, the consumer and the restart probe connect."""
        raise NotImplementedError

    def declare_at(self) -> Endpoint:
        return self.client()

    def probe_at(self) -> Endpoint:
        """Where the restart probe connects: known before the broker is up."""
        return self.client()

    def broker_pids(self) -> list[int | None]:
        """Per node: the root of the broker's process tree (mirrorq node, beam.smp)."""
        raise NotImplementedError

    def data_dirs(self) -> list[Path]:
        raise NotImplementedError

    def rss(self) -> list[int | None]:
        return [rss_bytes(p) for p in self.broker_pids()]

    def disk(self) -> list[int]:
        return [disk_bytes(d) if d.exists() else 0 for d in self.data_dirs()]

    def log_tail(self) -> str:
        return ""


class MirrorqOneT(Target):
    def __init__(self, workdir: Path, ready_timeout: float) -> None:
        self.key = "mirrorq-1"
        self.node = MirrorqNode(workdir)
        self.node.ready_timeout = ready_timeout
        self.node.log_level = "INFO"  # the start phases' timings, in the node's log
        self.version = "base " + git_head()

    def start(self) -> None:
        self.node.start()

    restart_start = start

    def stop(self) -> None:
        self.node.stop()

    def wipe(self) -> None:
        shutil.rmtree(self.node.workdir / "mirrorq-data", ignore_errors=True)

    def client(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.node.port)

    def broker_pids(self) -> list[int | None]:
        p = self.node.proc
        return [p.pid if p is not None and p.poll() is None else None]

    def data_dirs(self) -> list[Path]:
        return [self.node.workdir / "mirrorq-data"]

    def log_tail(self) -> str:
        return tail(self.node.logfile, 20)


class MirrorqThreeT(Target):
    """Clients on a follower of the queue's (the cluster's) leader, as bench/suite.py does."""

    nodes = 3

    def __init__(self, workdir: Path) -> None:
        self.key = "mirrorq-3"
        self.cluster = MirrorqCluster(workdir)
        self.cluster.log_level = "INFO"
        self.version = "base " + git_head()

    def start(self) -> None:
        self.cluster.start()

    restart_start = start

    def stop(self) -> None:
        self.cluster.stop()

    def wipe(self) -> None:
        for nd in self.cluster.nodes:
            shutil.rmtree(self.cluster.dir / nd["id"], ignore_errors=True)

    def client(self) -> Endpoint:
        leader = self.cluster.leader(timeout=60)
        return Endpoint("127.0.0.1", self.cluster.nodes[(leader + 1) % 3]["amqp"])

    def probe_at(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.cluster.nodes[0]["amqp"])

    def broker_pids(self) -> list[int | None]:
        return [nd["proc"].pid if nd["proc"] is not None and nd["proc"].poll() is None else None
                for nd in self.cluster.nodes]

    def data_dirs(self) -> list[Path]:
        return [self.cluster.dir / nd["id"] for nd in self.cluster.nodes]

    def log_tail(self) -> str:
        return "\n".join(f"---- {nd['id']}\n{tail(nd['log'], 10)}" for nd in self.cluster.nodes)


class Rabbit310OneT(Target):
    queue_type = "quorum"

    def __init__(self, workdir: Path, ready_timeout: float) -> None:
        self.key = "rabbitmq310-1"
        self.node = RabbitNode(workdir)
        self.node.ready_timeout = ready_timeout
        self.epmd_before = epmd_pids()

    def start(self) -> None:
        self.node.start()
        self.version = rabbit310_version()

    restart_start = start

    def stop(self) -> None:
        self.node.stop()
        stop_new_epmd(self.epmd_before)

    def wipe(self) -> None:
        shutil.rmtree(self.node.dir / "mnesia", ignore_errors=True)

    def client(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.node.port)

    def broker_pids(self) -> list[int | None]:
        p = self.node.proc
        return [find_beam(p.pid) if p is not None and p.poll() is None else None]

    def data_dirs(self) -> list[Path]:
        return [self.node.dir / "mnesia"]

    def log_tail(self) -> str:
        return tail(self.node.logfile, 20)


class _Rabbit310Cluster(RabbitCluster):
    """bench/cluster.py's 3.10 cluster in the default vhost (Bench.java declares the queue
    with x-queue-type=quorum); restart() starts the joined nodes again, all at once (a
    clustered node waits for its peers), without joining them again."""

    def url(self, i: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.nodes[i]['port']}/%2F"

    def restart(self, timeout: float) -> None:
        self.epmd_before = epmd_pids()
        for nd in self.nodes:
            with open(nd["dir"] / "stdout.log", "ab") as out:
                nd["proc"] = subprocess.Popen([RABBITMQ_SERVER], cwd=str(nd["dir"]), env=self._env(nd),
                                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True, **self._as_rabbitmq())
        deadline = time.monotonic() + timeout
        for nd in self.nodes:
            while not amqp_ready("127.0.0.1", nd["port"]):
                if nd["proc"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"RabbitMQ {nd['name']} did not restart:\n"
                                       f"{tail(nd['dir'] / 'stdout.log')}")
                time.sleep(0.2)


class Rabbit310ThreeT(Target):
    """The queue is declared over node A (its leader there), clients on node B (suite.py)."""

    nodes = 3
    queue_type = "quorum"

    def __init__(self, workdir: Path, ready_timeout: float) -> None:
        self.key = "rabbitmq310-3"
        self.cluster = _Rabbit310Cluster(workdir)
        self.ready_timeout = ready_timeout
        self.epmd_before = epmd_pids()

    def start(self) -> None:
        self.cluster.start()
        self.version = rabbit310_version()

    def restart_start(self) -> None:
        self.cluster.restart(self.ready_timeout)

    def stop(self) -> None:
        self.cluster.stop()
        stop_new_epmd(self.epmd_before)

    def wipe(self) -> None:
        shutil.rmtree(self.cluster.dir, ignore_errors=True)

    def client(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.cluster.nodes[1]["port"])

    def declare_at(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.cluster.nodes[0]["port"])

    def broker_pids(self) -> list[int | None]:
        return [find_beam(nd["proc"].pid) if nd["proc"] is not None and nd["proc"].poll() is None
                else None for nd in self.cluster.nodes]

    def data_dirs(self) -> list[Path]:
        return [nd["dir"] / "mnesia" for nd in self.cluster.nodes]

    def log_tail(self) -> str:
        return "\n".join(f"---- {nd['name']}\n{tail(nd['dir'] / 'stdout.log', 10)}"
                         for nd in self.cluster.nodes)


class Rabbit4T(Target):
    """RabbitMQ 4.3.6 from Debian forky in a chroot, through ../shared/rabbitmq4's scripts
    (fixed ports 5780 / 5781-5783: only one such run on the machine at a time)."""

    queue_type = "quorum"

    def __init__(self, workdir: Path, nodes: int) -> None:
        self.key = f"rabbitmq4-{nodes}"
        self.nodes = nodes
        self.base = workdir
        self.names = ["r4single"] if nodes == 1 else ["r4c1", "r4c2", "r4c3"]
        self.ports = RMQ4_PORTS["single" if nodes == 1 else "cluster"]
        self.script = RMQ4_DIR / ("rmq4_single.sh" if nodes == 1 else "rmq4_cluster.sh")
        built = Path(f"/var/cache/rmq4/rootfs-{RMQ4_SUITE}/.rmq4-built")
        info = dict(ln.split("=", 1) for ln in built.read_text().split() if "=" in ln) if built.exists() else {}
        self.version = f"{info.get('rabbitmq_server', '?')} (OTP {info.get('otp', '?')}, {RMQ4_SUITE} chroot)"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PERF_BASE": str(self.base), "RMQ4_SUITE": RMQ4_SUITE}

    def _run(self, *args: str, timeout: float = 300) -> str:
        p = subprocess.run(["bash", str(self.script), *args], env=self._env(), capture_output=True,
                           text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{self.script.name} {' '.join(args)}: rc {p.returncode}: "
                               f"{p.stdout[-1500:]} {p.stderr[-1500:]}")
        return p.stdout

    def start(self) -> None:
        busy = [p for p in self.ports if amqp_ready("127.0.0.1", p)]
        if busy:
            raise RuntimeError(f"port(s) {busy} already serve AMQP: another RabbitMQ 4 run is on")
        self.base.mkdir(parents=True, exist_ok=True)
        self._run("start")

    def restart_start(self) -> None:
        if self.nodes == 1:
            self._run("start")
            return
        # all three at once: a restarted cluster member waits for its peers (Khepri needs a
        # majority), so the script's one-after-the-other start would time out on the first
        lib = RMQ4_DIR / "rmq4_lib.sh"
        starts = " & ".join(f"start_node {n} {p} {p + 20000}" for n, p in zip(self.names, self.ports,
                                                                             strict=True))
        p = subprocess.run(["bash", "-c", f". {lib}; {starts} & wait"], env=self._env(),
                           capture_output=True, text=True, timeout=900, cwd=str(RMQ4_DIR))
        if p.returncode != 0:
            raise RuntimeError(f"restart: {p.stdout[-1500:]} {p.stderr[-1500:]}")

    def stop(self) -> None:
        self._run("stop")

    def wipe(self) -> None:
        for n in self.names:
            shutil.rmtree(self.base / n, ignore_errors=True)

    def client(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.ports[0] if self.nodes == 1 else self.ports[1])

    def declare_at(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.ports[0])

    def broker_pids(self) -> list[int | None]:
        out: list[int | None] = []
        for n in self.names:
            try:
                pid = int((self.base / n / f"{n}.pid").read_text().strip())
                out.append(pid if Path(f"/proc/{pid}").exists() else None)
            except (OSError, ValueError):
                out.append(None)
        return out

    def data_dirs(self) -> list[Path]:
        return [self.base / n / "mnesia" for n in self.names]

    def log_tail(self) -> str:
        return "\n".join(f"---- {n}\n" + "\n".join(tail(f, 10) for f in (self.base / n / "log").glob("*.log"))
                         for n in self.names)


def make_target(key: str, workdir: Path, ready_timeout: float) -> Target:
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)  # RabbitMQ runs as user rabbitmq below it
    if key == "mirrorq-1":
        return MirrorqOneT(workdir, ready_timeout)
    if key == "mirrorq-3":
        return MirrorqThreeT(workdir)
    if key == "rabbitmq310-1":
        return Rabbit310OneT(workdir, ready_timeout)
    if key == "rabbitmq310-3":
        return Rabbit310ThreeT(workdir, ready_timeout)
    if key in ("rabbitmq4-1", "rabbitmq4-3"):
        return Rabbit4T(workdir, int(key[-1]))
    raise ValueError(key)


def git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def rabbit310_version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        return out or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


# --------------------------------------------------------------------------- clients

def run_java(cp: str, ep: Endpoint, timeout: float, *args: str, heap: str = "1g") -> dict[str, Any]:
    cmd = ["java", f"-Xmx{heap}", "-XX:+UseParallelGC", "-cp", cp, "Bench", "--uri", ep.url, *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        so, se = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout}s"}
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    lines = [ln for ln in so.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"no JSON output (rc={proc.returncode}): {se[-1500:]}"}
    res: dict[str, Any] = json.loads(lines[-1])
    if proc.returncode != 0 and "error" not in res:
        res["error"] = f"exit status {proc.returncode}"
    res["wall_s"] = round(time.monotonic() - t0, 2)
    return res


def _pika_params(ep: Endpoint, timeout: float = 5.0) -> Any:
    import pika
    return pika.ConnectionParameters(ep.host, ep.port, virtual_host=ep.vhost, heartbeat=0,
                                     socket_timeout=timeout, blocked_connection_timeout=timeout,
                                     connection_attempts=1)


def queue_depth(ep: Endpoint, queue: str) -> int | None:
    import pika
    try:
        conn = pika.BlockingConnection(_pika_params(ep))
    except Exception:  # noqa: BLE001 - not up (yet)
        return None
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    except Exception:  # noqa: BLE001 - the queue is not there (yet)
        return None
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


def wait_depth(ep: Endpoint, queue: str, want: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    n = queue_depth(ep, queue)
    while n != want and time.monotonic() < deadline:
        time.sleep(0.2)
        n = queue_depth(ep, queue)
    return n


def probe_served(ep: Endpoint, queue: str, want: int, size: int, state: dict[str, Any]) -> bool:
    """One try: does the broker serve `queue` with all `want` messages? A passive declare
    must report `want` and a basic.get return a body of `size` bytes; the connection is
    closed without an ack, so that message goes back (one redelivery in the drain)."""
    import pika
    try:
        conn = pika.BlockingConnection(_pika_params(ep, 2.0))
    except Exception:  # noqa: BLE001 - not listening yet
        return False
    state.setdefault("amqp_s", round(time.monotonic() - state["t0"], 2))
    try:
        ch = conn.channel()
        n = int(ch.queue_declare(queue, passive=True).method.message_count)
        state["last_count"] = n
        if n != want:
            return False
        state.setdefault("count_ok_s", round(time.monotonic() - state["t0"], 2))
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        if method is None:
            return False
        if len(body) != size:
            state["probe_error"] = f"basic.get returned {len(body)} bytes, expected {size}"
        return True
    except Exception as exc:  # noqa: BLE001 - queue not recovered yet, channel closed: again
        state["last_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return False
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


# --------------------------------------------------------------------------- one run

def mb(v: int | None) -> float | None:
    return None if v is None else round(v / 1e6, 1)


def snapshot(t: Target) -> dict[str, Any]:
    rss, disk = t.rss(), t.disk()
    return {"rss_mb": [mb(r) for r in rss], "disk_mb": [mb(d) for d in disk]}


def run_case(cp: str, t: Target, case: str, count: int, size: int, a: argparse.Namespace) -> dict[str, Any]:
    """Fill, restart, drain one queue on a started target; every figure into the result."""
    res: dict[str, Any] = {"case": case, "target": t.key, "label": LABELS[t.key], "nodes": t.nodes,
                           "count": count, "size": size, "window": a.window, "prefetch": a.prefetch,
                           "version": t.version, "slices": []}
    q = f"backlog-{uuid.uuid4().hex[:8]}"
    res["queue"] = q
    res["fresh"] = snapshot(t)
    slices = max(1, min(a.slices, count))
    common = ["--size", str(size), "--timeout", str(int(a.stall)), "--queue", q]
    if t.queue_type:
        common += ["--queue-type", t.queue_type]
    done = 0
    fill_s = 0.0
    sampler = RssSampler(t)
    sampler.start()
    for k in range(slices):
        n = count // slices + (1 if k < count % slices else 0)
        ep = t.client()
        r = run_java(cp, ep, n / 500 + 600, "--mode", "confirms", "--count", str(n), "--window", str(a.window),
                     "--publishers", "1", "--publisher-offset", str(k), "--keep", "--warmup", "0",
                     "--declare-uri", t.declare_at().url, *common)
        sl: dict[str, Any] = {"slice": k + 1, "messages": n,
                              **{f: r.get(f) for f in ("msg_per_s", "elapsed_ms", "confirm_p50_ms",
                                                       "confirm_p99_ms", "confirm_max_ms", "acked",
                                                       "nacked", "wall_s", "error")
                                 if r.get(f) is not None}}
        if "error" in r:
            res["slices"].append(sl)
            res["error"] = f"fill slice {k + 1}: {r['error']}"
            sampler.finish()
            return res
        done += n
        fill_s += float(r["elapsed_ms"]) / 1000.0
        depth = wait_depth(ep, q, done, 60)
        sl["depth"] = depth
        sl["total"] = done
        sl.update(snapshot(t))
        res["slices"].append(sl)
        log(f"  {t.key} {case} slice {k + 1}/{slices}: {r['msg_per_s']:,.0f} msg/s, depth {depth}, "
            f"RSS {sl['rss_mb']} MB, disk {sl['disk_mb']} MB")
        if depth != done:
            res["error"] = f"after slice {k + 1} the queue holds {depth}, expected {done}"
            sampler.finish()
            return res
    res["fill"] = {"msg_per_s": round(count / fill_s, 1) if fill_s else None,
                   "first_slice_msg_per_s": res["slices"][0]["msg_per_s"],
                   "last_slice_msg_per_s": res["slices"][-1]["msg_per_s"],
                   "peak_rss_mb": [mb(x) for x in sampler.finish()], **snapshot(t)}
    # restart: time from the start command until the queue is served with all of them
    t.stop()
    res["stopped_disk_mb"] = [mb(d) for d in t.disk()]
    state: dict[str, Any] = {}
    errors: list[str] = []

    def starter() -> None:
        try:
            t.restart_start()
        except Exception as exc:  # noqa: BLE001 - the probe decides; reported
            errors.append(f"{type(exc).__name__}: {exc}")

    state["t0"] = t0 = time.monotonic()
    th = threading.Thread(target=starter, daemon=True)
    th.start()
    served = False
    probe = t.probe_at()
    gave_up = None
    while time.monotonic() - t0 < a.restart_timeout:
        if probe_served(probe, q, count, size, state):
            served = True
            break
        if not th.is_alive() and errors and not any(t.broker_pids()):
            gave_up = "the broker exited while starting"  # nothing will serve it: stop waiting
            break
        time.sleep(0.1)
    restart_s = time.monotonic() - t0
    th.join(a.restart_timeout)
    res["restart"] = {"served": served, "served_s": round(restart_s, 2) if served else None,
                      "amqp_s": state.get("amqp_s"), "count_ok_s": state.get("count_ok_s"),
                      "start_command_s": round(time.monotonic() - t0, 2),
                      "start_errors": errors, "last_count": state.get("last_count"),
                      "last_error": state.get("last_error"), **snapshot(t)}
    log(f"  {t.key} {case} restart: served after {res['restart']['served_s']} s "
        f"(AMQP after {state.get('amqp_s')} s), RSS {res['restart']['rss_mb']} MB")
    if not served or "probe_error" in state:
        res["error"] = (f"restart: {gave_up or f'not served within {a.restart_timeout}s'} "
                        f"({'; '.join(errors)[:600]})" if not served else state["probe_error"])
        res["restart"]["log_tail"] = t.log_tail()
        return res
    # drain: one consumer, every body checked
    sampler = RssSampler(t)
    sampler.start()
    ep = t.client()
    d = run_java(cp, ep, count / 300 + 600, "--mode", "consume", "--queue", q, "--count", str(count),
                 "--prefetch", str(a.prefetch), "--ack-every", str(max(1, a.prefetch // 2)), "--verify",
                 "--allow-redelivered", "1", "--timeout", str(int(a.stall)), heap="2g")
    res["drain"] = {f: d.get(f) for f in ("msg_per_s", "elapsed_ms", "consumed", "redelivered", "duplicates",
                                          "damaged", "verified", "remaining", "wall_s", "error")
                    if d.get(f) is not None}
    res["drain"]["peak_rss_mb"] = [mb(x) for x in sampler.finish()]
    res["drain"].update(snapshot(t))
    log(f"  {t.key} {case} drain: {d.get('msg_per_s')} msg/s, damaged {d.get('damaged')}, "
        f"disk {res['drain']['disk_mb']} MB, RSS {res['drain']['rss_mb']} MB")
    if "error" in d:
        res["error"] = f"drain: {d['error']}"
        return res
    if a.settle > 0:
        time.sleep(a.settle)  # space some brokers give back a little later (segment cleanup)
        res["settled"] = {"after_s": a.settle, **snapshot(t)}
    return res


def run_target(cp: str, key: str, case: str, count: int, size: int, base: Path,
               a: argparse.Namespace) -> dict[str, Any]:
    workdir = base / f"{case}-{key}"
    t: Target | None = None
    t_start = time.monotonic()
    res: dict[str, Any] = {"case": case, "target": key, "label": LABELS[key], "count": count, "size": size}
    try:
        t = make_target(key, workdir, a.restart_timeout)
        log(f"== {case} on {key}: {count:,} x {size:,} B")
        t.start()
        res = run_case(cp, t, case, count, size, a)
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
    finally:
        if t is not None:
            if "error" in res:
                log(f"{key}: {res['error']}\n{t.log_tail()}")
            try:
                t.stop()
            except Exception as exc:  # noqa: BLE001
                log(f"{key}: stop: {exc}")
            if not a.keep_workdir:
                t.wipe()  # only one broker's data on the disk at a time
        if not a.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    res["elapsed_s"] = round(time.monotonic() - t_start, 1)
    return res


# --------------------------------------------------------------------------- report

def _max(v: list[Any] | None) -> float | None:
    vals = [x for x in (v or []) if x is not None]
    return max(vals) if vals else None


def metrics(r: dict[str, Any]) -> dict[str, float | None]:
    """The headline figures of one run (RSS and disk: the largest node)."""
    fill, rs, dr, st = r.get("fill", {}), r.get("restart", {}), r.get("drain", {}), r.get("settled", {})
    n = r.get("count") or 1
    rss_full = _max(fill.get("rss_mb"))
    return {
        "fill_msg_per_s": fill.get("msg_per_s"),
        "first_slice_msg_per_s": fill.get("first_slice_msg_per_s"),
        "last_slice_msg_per_s": fill.get("last_slice_msg_per_s"),
        "rss_fresh_mb": _max(r.get("fresh", {}).get("rss_mb")),
        "rss_full_mb": rss_full,
        "rss_bytes_per_msg": round(rss_full * 1e6 / n) if rss_full is not None else None,
        "peak_rss_fill_mb": _max(fill.get("peak_rss_mb")),
        "disk_full_mb": _max(fill.get("disk_mb")),
        "restart_served_s": rs.get("served_s"),
        "rss_after_restart_mb": _max(rs.get("rss_mb")),
        "drain_msg_per_s": dr.get("msg_per_s"),
        "rss_after_drain_mb": _max(st.get("rss_mb") or dr.get("rss_mb")),
        "disk_after_drain_mb": _max(dr.get("disk_mb")),
        "disk_after_drain_settled_mb": _max(st.get("disk_mb")),
    }


METRIC_ROWS = [
    ("fill_msg_per_s", "fill, msg/s (all of N)", True),
    ("first_slice_msg_per_s", "fill, first slice msg/s", True),
    ("last_slice_msg_per_s", "fill, last slice msg/s", True),
    ("rss_fresh_mb", "RSS of the fresh broker, MB", False),
    ("rss_full_mb", "RSS holding N, MB", False),
    ("rss_bytes_per_msg", "RSS / N, bytes per message", False),
    ("peak_rss_fill_mb", "peak RSS during the fill, MB", False),
    ("disk_full_mb", "disk holding N, MB", False),
    ("restart_served_s", "restart until served with N, s", False),
    ("rss_after_restart_mb", "RSS after the restart, MB", False),
    ("drain_msg_per_s", "drain (1 consumer, prefetch), msg/s", True),
    ("rss_after_drain_mb", "RSS after the drain + settle, MB", False),
    ("disk_after_drain_mb", "disk right after the drain, MB", False),
    ("disk_after_drain_settled_mb", "disk after the drain + settle, MB", False),
]


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def markdown(report: dict[str, Any]) -> str:
    out = [f"# Backlog benchmark (issue 27), {report['generated_at']}", "",
           f"mirrorq at {report['mirrorq_commit']}; RabbitMQ 4.3.6 (Debian forky chroot) and 3.10.8 "
           f"(Debian); {report['machine'].get('cores')} cores, {report['machine'].get('memory_mib')} MiB; "
           f"window {report['params']['window']}, prefetch {report['params']['prefetch']}, "
           f"{report['params']['slices']} slices; RSS and disk: the largest node. "
           "Ratio: target / RabbitMQ 4.3.6 with the same node count.", ""]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in report["runs"]:
        groups.setdefault((r["case"], int(r["target"][-1])), []).append(r)
    for (case, nodes), runs in groups.items():
        ref = next((r for r in runs if r["target"] == REFERENCE[nodes]), None)
        refm = metrics(ref) if ref and "error" not in ref else {}
        c, s = runs[0]["count"], runs[0]["size"]
        out += [f"## {case}: {c:,} x {s:,} B on {nodes} node{'s' if nodes > 1 else ''}", ""]
        head = ["metric"] + [SHORT[r["target"]] for r in runs]
        others = [r for r in runs if r is not ref]
        head += [f"{SHORT[r['target']]} / 4.3.6" for r in others if ref is not None]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        ms = {r["target"]: metrics(r) for r in runs}
        for k, label, _higher in METRIC_ROWS:
            row = [label] + [fmt(ms[r["target"]][k]) for r in runs]
            if ref is not None:
                for r in others:
                    v, rv = ms[r["target"]][k], refm.get(k)
                    row.append(f"{v / rv:.2f}" if v is not None and rv else "-")
            out.append("| " + " | ".join(row) + " |")
        for r in runs:
            if "error" in r:
                out.append(f"\n! {r['target']}: {r['error']}")
        out += ["", f"Per slice ({c // max(1, report['params']['slices']):,} messages each): "
                "msg/s, RSS MB (largest node), disk MB (largest node)", ""]
        head = ["slice"] + [f"{SHORT[r['target']]} msg/s, RSS, disk" for r in runs]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for i in range(max(len(r.get("slices", [])) for r in runs)):
            row = [str(i + 1)]
            for r in runs:
                sl = r.get("slices", [])
                if i < len(sl):
                    x = sl[i]
                    row.append(f"{fmt(x.get('msg_per_s'))}, {fmt(_max(x.get('rss_mb')))}, "
                               f"{fmt(_max(x.get('disk_mb')))}")
                else:
                    row.append("-")
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


def combine(paths: list[Path], out: Path) -> int:
    """Merge the runs of several result files (e.g. a target measured again later)."""
    reports = [json.loads(x.read_text()) for x in paths]
    merged = dict(reports[0])
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for r in reports:
        for run in r["runs"]:
            runs[(run["case"], run["target"])] = run
    order = {k: i for i, k in enumerate(TARGETS)}
    merged["runs"] = sorted(runs.values(), key=lambda x: (x["case"] != "backlog", order[x["target"]]))
    merged["combined_from"] = [{"file": str(x), "generated_at": r["generated_at"],
                                "mirrorq_commit": r.get("mirrorq_commit")} for x, r in zip(paths, reports, strict=True)]
    merged["summary"] = {f"{r['case']}/{r['target']}": metrics(r) for r in merged["runs"]}
    out.write_text(json.dumps(merged, indent=2) + "\n")
    md = markdown(merged)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)
    return 1 if any("error" in r for r in merged["runs"]) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="all",
                   help=f"comma list of {', '.join(TARGETS)} or {', '.join(GROUPS)} (default all)")
    p.add_argument("--cases", default="backlog,large", help="backlog, large (default both)")
    p.add_argument("--messages", type=int, default=10_000_000, help="backlog on 1-node targets")
    p.add_argument("--three-node-messages", type=int, default=5_000_000, help="backlog on 3-node targets")
    p.add_argument("--size", type=int, default=1024, help="backlog body bytes")
    p.add_argument("--large-count", type=int, default=200_000, help="large case messages (1-node targets)")
    p.add_argument("--large-size", type=int, default=65536, help="large case body bytes")
    p.add_argument("--slices", type=int, default=10, help="fill in this many slices (figures after each)")
    p.add_argument("--window", type=int, default=500, help="unconfirmed publishes at most")
    p.add_argument("--prefetch", type=int, default=500, help="drain consumer prefetch (acks every half)")
    p.add_argument("--stall", type=float, default=120, help="a client fails after this long without progress")
    p.add_argument("--restart-timeout", type=float, default=900, help="s until served after a restart")
    # (a node trims malloc's free pages after 20 idle s: 15 s saw the drain's peak)
    p.add_argument("--settle", type=float, default=30, help="s after the drain before the last disk and RSS figures")
    p.add_argument("--workdir", help="where the data dirs go (default a temp dir in /tmp)")
    p.add_argument("--keep-workdir", action="store_true")
    p.add_argument("--out", default=str(BENCH / "results" / "backlog.json"))
    p.add_argument("--combine", nargs="+", metavar="JSON",
                   help="run nothing: merge these results (a later file's run of a case and target "
                   "replaces an earlier one's) into --out and its .md")
    a = p.parse_args(argv)
    if a.combine:
        return combine([Path(x) for x in a.combine], Path(a.out))

    keys: list[str] = []
    for item in filter(None, (x.strip() for x in a.targets.split(","))):
        for k in GROUPS.get(item, [item]):
            if k not in TARGETS:
                raise SystemExit(f"unknown target {k}")
            if k not in keys:
                keys.append(k)
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    for c in cases:
        if c not in ("backlog", "large"):
            raise SystemExit(f"unknown case {c}")

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    base = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="mirrorq-backlog-"))
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    report: dict[str, Any] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mirrorq_commit": git_head(),
        "params": {"targets": keys, "cases": cases, "messages": a.messages,
                   "three_node_messages": a.three_node_messages, "size": a.size,
                   "large_count": a.large_count, "large_size": a.large_size, "slices": a.slices,
                   "window": a.window, "prefetch": a.prefetch, "ack_every": max(1, a.prefetch // 2),
                   "persistent": True, "rabbitmq_queue_type": "quorum",
                   "generator": "bench/java/Bench.java (RabbitMQ Java client), random bodies, "
                                "every drained body compared with what was sent"},
        "machine": machine_info(), "versions": versions(), "runs": [],
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        cp = compile_bench(base / "classes")
        for case in cases:
            for key in keys:
                nodes = 3 if key.endswith("-3") else 1
                if case == "large" and nodes != 1:
                    continue
                count = (a.large_count if case == "large" else
                         a.messages if nodes == 1 else a.three_node_messages)
                size = a.large_size if case == "large" else a.size
                res = run_target(cp, key, case, count, size, base, a)
                res["nodes"] = nodes
                report["runs"].append(res)
                failed |= "error" in res
                out.write_text(json.dumps(report, indent=2) + "\n")  # what is done so far
    finally:
        if not a.keep_workdir:
            shutil.rmtree(base, ignore_errors=True)
        report["machine"]["loadavg_at_end"] = list(os.getloadavg())
        report["summary"] = {f"{r['case']}/{r['target']}": metrics(r) for r in report["runs"]}
        out.write_text(json.dumps(report, indent=2) + "\n")
        md = markdown(report)
        out.with_suffix(".md").write_text(md + "\n")
        print(md)
        print(f"results: {out}, {out.with_suffix('.md')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
