#!/usr/bin/env python3
"""Snapshot (full dump) and restart time of one mirrorq node holding a big durable queue.

    .venv/bin/python bench/snapshot.py                     # 200,000 x 1 KiB persistent messages
    .venv/bin/python bench/snapshot.py --count 20000       # smaller

1. start one node (throwaway data dir, free ports) whose config makes pysyncobj compact
   on time only ([raft] compaction_min_entries huge, compaction_min_time = --interval s),
   so that a snapshot is taken every --interval seconds once the queue is full;
2. fill a durable queue with N persistent messages of S bytes (Java generator, streaming
   confirms, bench/java/Bench.java);
3. watch <data-dir>/raft.dump: a snapshot starts when raft.dump.tmp or raft.dump.part
   appears and ends when raft.dump is replaced (polled every 2 ms; the node pickles with
   protocol 5, in a forked child); the first snapshot that starts after the fill is the one
   reported (time, size, bytes per message), next to the node's own figures from admin
   Status (last_snapshot_seconds / last_snapshot_bytes) when it reports them;
4. kill -9 the node, start it again on the same data dir, and time (a) until the AMQP port
   answers the protocol header with connection.start and (b) until a passive queue.declare
   reports all N messages.

Prints a table and writes bench/results/snapshot.json. Needs the project venv (pika).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from run import amqp_ready, bench, compile_bench, free_port, log, tail  # noqa: E402


class Node:
    def __init__(self, workdir: Path, interval: float) -> None:
        self.workdir = workdir
        self.data = workdir / "data"
        self.amqp_port = free_port()
        self.raft_port = free_port()
        self.admin_port = free_port()
        self.metrics_port = free_port()
        self.logfile = workdir / "node.log"
        self.config = workdir / "node.toml"
        self.admin_token = uuid.uuid4().hex  # nodes refuse an admin port without one
        self.config.write_text(
            "[raft]\n"
            f'password = "{uuid.uuid4().hex}"\n'
            "compaction_min_entries = 1000000000\n"
            f"compaction_min_time = {interval}\n"
            f'[admin]\ntoken = "{self.admin_token}"\n')
        self.config.chmod(0o600)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    def start(self) -> float:
        """Start; return the monotonic time of the spawn."""
        self.data.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "node.app", "serve", "--node-id", "s1",
                "--amqp-port", str(self.amqp_port), "--raft-port", str(self.raft_port),
                "--admin-port", str(self.admin_port), "--metrics-port", str(self.metrics_port),
                "--data-dir", str(self.data), "--config", str(self.config), "--log-level", "WARNING"]
        with open(self.logfile, "ab") as out:
            t0 = time.monotonic()
            self.proc = subprocess.Popen(argv, cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return t0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill9()
        try:  # the node's own process group: a forked snapshot child left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class DumpWatcher(threading.Thread):
    """Records every snapshot: (start, end, size) from raft.dump.tmp / raft.dump changes."""

    def __init__(self, data: Path) -> None:
        super().__init__(daemon=True)
        # pysyncobj's serializer target; the node may instead write <dump>.part (in a
        # forked child) and install it itself: either file marks a snapshot in progress
        self.tmps = [data / "raft.dump.tmp", data / "raft.dump.part"]
        self.dump = data / "raft.dump"
        self.events: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def _dump_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.dump)
            return (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            return None

    def run(self) -> None:
        last = self._dump_id()
        started: float | None = None
        while not self._halt.is_set():
            now = time.monotonic()
            if started is None and any(t.exists() for t in self.tmps):
                started = now
            cur = self._dump_id()
            if cur is not None and cur != last:
                size = 0
                try:
                    size = os.stat(self.dump).st_size
                except FileNotFoundError:
                    pass
                # a dump shorter than one poll interval may be missed at its start
                self.events.append({"start": started if started is not None else now, "end": now,
                                    "size_bytes": size, "start_seen": started is not None})
                started = None
                last = cur
            time.sleep(0.002)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def passive_count(port: int, queue: str) -> int | None:
    import pika
    try:
        params = pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5,
                                           blocked_connection_timeout=30)
        conn = pika.BlockingConnection(params)
    except Exception:  # noqa: BLE001 - not up yet
        return None
    try:
        ch = conn.channel()
        res = ch.queue_declare(queue, passive=True)
        return int(res.method.message_count)
    except Exception:  # noqa: BLE001 - queue not recovered yet
        return None
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--window", type=int, default=2000)
    p.add_argument("--publishers", type=int, default=2)
    p.add_argument("--interval", type=float, default=15.0,
                   help="raft.compaction_min_time: a snapshot every this many seconds (default 15)")
    p.add_argument("--snapshot-timeout", type=float, default=300.0)
    p.add_argument("--restart-timeout", type=float, default=600.0)
    p.add_argument("--out", default=str(BENCH / "results" / "snapshot.json"))
    p.add_argument("--keep-workdir", action="store_true")
    a = p.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="mirrorq-snap-"))
    node = Node(workdir, a.interval)
    queue = f"snap-{uuid.uuid4().hex[:8]}"
    result: dict[str, Any] = {"params": vars(a) | {"queue": queue}}
    ok = False
    watcher: DumpWatcher | None = None
    try:
        cp = compile_bench(workdir / "classes")
        node.start()
        deadline = time.monotonic() + 60
        while not amqp_ready("127.0.0.1", node.amqp_port):
            if not node.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"node did not start:\n{tail(node.logfile)}")
            time.sleep(0.1)
        watcher = DumpWatcher(node.data)
        watcher.start()

        log(f"fill: {a.count} x {a.size} B persistent into durable {queue}")
        fill = bench(cp, node.url, 1800, "--mode", "confirms", "--count", str(a.count),
                     "--size", str(a.size), "--window", str(a.window), "--publishers",
                     str(a.publishers), "--queue", queue, "--keep", "--timeout", "120")
        result["fill"] = fill
        if "error" in fill:
            raise RuntimeError(f"fill failed: {fill['error']}")
        fill_done = time.monotonic()
        log(f"  -> {fill.get('msg_per_s')} msg/s; snapshots during fill: {len(watcher.events)}")
        count = passive_count(node.amqp_port, queue)
        if count != a.count:
            raise RuntimeError(f"queue holds {count} after the fill, expected {a.count}")

        log(f"waiting for a snapshot that starts after the fill (every {a.interval}s)")
        snap: dict[str, Any] | None = None
        deadline = time.monotonic() + a.snapshot_timeout
        while snap is None and time.monotonic() < deadline:
            for ev in watcher.events:
                if ev["start_seen"] and ev["start"] > fill_done:
                    snap = ev
                    break
            if not node.alive():
                raise RuntimeError(f"node died:\n{tail(node.logfile)}")
            time.sleep(0.1)
        if snap is None:
            raise RuntimeError(f"no snapshot within {a.snapshot_timeout}s after the fill; "
                               f"events {watcher.events}")
        journal_files = [*node.data.glob("log/*.seg"), *node.data.glob("raft.journal")]
        result["snapshot"] = {
            "duration_s": round(snap["end"] - snap["start"], 3),
            "size_bytes": snap["size_bytes"],
            "size_mib": round(snap["size_bytes"] / 2**20, 1),
            "bytes_per_message": round(snap["size_bytes"] / a.count, 1),
            "payload_mib": round(a.count * a.size / 2**20, 1),
            "journal_bytes_after": sum(f.stat().st_size for f in journal_files) if journal_files else None,
            "snapshots_during_fill": sum(1 for e in watcher.events if e["end"] <= fill_done),
            "all_snapshots": [{"duration_s": round(e["end"] - e["start"], 3),
                               "size_bytes": e["size_bytes"],
                               "after_fill": e["start"] > fill_done} for e in watcher.events],
        }
        try:
            from node.admin.client import call_status
            st = call_status("127.0.0.1", node.admin_port, timeout=5, token=node.admin_token)
            result["snapshot"]["node_reported"] = {k: v for k, v in st.items() if "snapshot" in k}
        except Exception as exc:  # noqa: BLE001 - optional
            result["snapshot"]["node_reported"] = {"error": repr(exc)}
        log(f"  snapshot: {result['snapshot']['duration_s']} s, {result['snapshot']['size_mib']} MiB; "
            f"node says {result['snapshot']['node_reported']}")
        watcher.stop()
        watcher = None

        log("kill -9 and restart")
        node.kill9()
        t0 = node.start()
        t_amqp = t_count = None
        deadline = t0 + a.restart_timeout
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(f"node exited on restart:\n{tail(node.logfile)}")
            if t_amqp is None and amqp_ready("127.0.0.1", node.amqp_port):
                t_amqp = time.monotonic()
            if t_amqp is not None:
                c = passive_count(node.amqp_port, queue)
                if c == a.count:
                    t_count = time.monotonic()
                    break
                if c is not None and c > a.count:
                    raise RuntimeError(f"queue holds {c} > {a.count} after restart")
            time.sleep(0.05)
        if t_amqp is None or t_count is None:
            raise RuntimeError(f"restart did not recover {a.count} messages within {a.restart_timeout}s "
                               f"(amqp up: {t_amqp is not None})")
        result["restart"] = {"amqp_ready_s": round(t_amqp - t0, 3),
                             "queue_full_s": round(t_count - t0, 3),
                             "messages": a.count}
        log(f"  restart: AMQP after {result['restart']['amqp_ready_s']} s, "
            f"{a.count} messages after {result['restart']['queue_full_s']} s")
        ok = True
    except Exception as exc:  # noqa: BLE001 - report
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(result["error"])
    finally:
        if watcher is not None:
            watcher.stop()
        node.stop()
        if a.keep_workdir:
            log(f"workdir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    result["generated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["host"] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                      "python": platform.python_version()}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    rows = [("messages", f"{a.count:,} x {a.size} B persistent, durable queue")]
    if "fill" in result and "error" not in result["fill"]:
        rows.append(("fill (confirmed msg/s)", f"{result['fill'].get('msg_per_s')}"))
    if "snapshot" in result:
        s = result["snapshot"]
        rows += [("snapshot time", f"{s['duration_s']} s"),
                 ("snapshot size", f"{s['size_mib']} MiB ({s['bytes_per_message']} B/message, "
                                   f"payload {s['payload_mib']} MiB)")]
    if "restart" in result:
        r = result["restart"]
        rows += [("restart -> AMQP accepts", f"{r['amqp_ready_s']} s"),
                 (f"restart -> queue reports {a.count:,}", f"{r['queue_full_s']} s")]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(w)}  {v}")
    if "error" in result:
        print(f"! {result['error']}")
    print(f"results: {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
