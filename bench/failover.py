#!/usr/bin/env python3
"""Failover under streaming publisher confirms: SIGKILL a node, time the gap to the next confirm.

    .venv/bin/python -m bench.failover --rounds 10 --kinds leader,follower --systems mirrorq,rabbitmq
    .venv/bin/python -m bench.failover --rounds 2 --systems mirrorq --json /tmp/failover.json

For each system a 3-node cluster on loopback (bench/cluster.py's MirrorqCluster / RabbitCluster,
ports below the ephemeral range), one durable replicated queue per kind (mirrorq: every queue;
RabbitMQ: x-queue-type=quorum), then `--rounds` rounds of:

  1. find the leader (mirrorq: the Raft leader the admin Status of every node agrees on;
     RabbitMQ: the queue's leader from `rabbitmqctl list_queues name leader`) and pick the
     victim: `--kind leader` the leader, `--kind follower` a follower (alternating);
  2. one confirm-tracking publisher (harness.publisher.StreamPublisher: persistent, random
     1 KiB bodies, `--window` unconfirmed, paced at `--rate` msg/s) on EACH surviving node,
     warmed up to `--warmup` confirms each;
  3. SIGKILL the victim (RabbitMQ: its whole process group), then measure
       next_confirm_s   kill -> first confirm of a message PUBLISHED after the kill, for the
                        slower publisher (the time until every survivor's publisher gets
                        confirms again; a confirm of a message that was already safe before
                        the kill may still arrive a few ms after it: that one is
                        `any_confirm_s`, reported but not the key figure);
       longest_gap_s    the longest gap between consecutive confirms from the kill until the
                        publisher stops (`--after` seconds after confirms resumed), the kill
                        itself counting as the first "confirm";
       leader_agreed_s  kill -> the end of the first poll in which every survivor names the
                        same leader among the survivors (mirrorq: admin Status, polled every
                        20 ms; RabbitMQ: `rabbitmqctl list_queues name leader` on each survivor,
                        ~1 s of CPU per call, so this is coarse and the calls compete for the
                        CPUs); leader_agreed_after_s, the start of the last poll that did not
                        see it, is a lower bound (the table's [>=]);
  4. stop the publishers (outstanding messages settle), restart the victim on its data dir and
     wait until it is back: mirrorq: the leader's Status lists it in `in_sync`; RabbitMQ: it
     is in the queue's `online` members and its Ra member's commit index equals the leader's
     (`rabbitmq-queues quorum_status`). `rejoin_s` = restart -> back.

After the last round of a kind the queue is drained and every confirmed message id checked
against what was delivered (harness.client.check_delivered): `lost` must be 0.

Prints a line per round and a summary table per (system, kind); `--json PATH` writes every
raw figure. Every process started is stopped by pid / process group (an epmd only if this
run started it), also on Ctrl-C or SIGTERM. Exit status 1 on any failed round or lost message.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.cluster import (  # noqa: E402
    RABBITMQ_SERVER,
    MirrorqCluster,
    RabbitCluster,
    amqp_ready,
    delete,
    log,
    tail,
)
from harness.client import check_delivered, declare, drain  # noqa: E402
from harness.process import free_port  # noqa: E402
from harness.publisher import StreamPublisher  # noqa: E402

RABBITMQ_QUEUES = "/usr/lib/rabbitmq/bin/rabbitmq-queues"
KINDS = ("leader", "follower")
SYSTEMS = ("mirrorq", "rabbitmq")


# --------------------------------------------------------------------------- figures (pure)

def confirm_gaps(t_kill: float, times: list[float]) -> list[tuple[float, float]]:
    """Gaps between consecutive confirms at or after `t_kill`, the kill itself counting as
    the first: [(start relative to the kill, length)], longest first."""
    after = sorted(t for t in times if t >= t_kill)
    gaps = [(a - t_kill, b - a) for a, b in zip([t_kill, *after], after, strict=False)]
    return sorted(gaps, key=lambda g: g[1], reverse=True)


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(rounds: list[dict[str, Any]], lost: int | None) -> dict[str, Any]:
    """Summary of one (system, kind): rounds run / ok, and min / median / max of the figures
    over the rounds that measured them."""
    def vals(key: str) -> list[float]:
        return [float(r[key]) for r in rounds if r.get(key) is not None]
    nxt, gap = vals("next_confirm_s"), vals("longest_gap_s")
    agreed, rejoin = vals("leader_agreed_s"), vals("rejoin_s")
    agreed_lo = vals("leader_agreed_after_s")
    return {
        "rounds": len(rounds),
        "rounds_ok": sum(1 for r in rounds if "error" not in r),
        "next_confirm_min_s": _r(min(nxt, default=None)),
        "next_confirm_median_s": _r(_median(nxt)),
        "next_confirm_max_s": _r(max(nxt, default=None)),
        "longest_gap_median_s": _r(_median(gap)),
        "longest_gap_max_s": _r(max(gap, default=None)),
        "leader_agreed_median_s": _r(_median(agreed)),
        "leader_agreed_lower_median_s": _r(_median(agreed_lo)),
        "rejoin_median_s": _r(_median(rejoin)),
        "lost": lost,
    }


def _cell(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.2f}"
    return str(x)


def table(rows: list[tuple[str, str, dict[str, Any]]]) -> str:
    head = ("system", "kind", "rounds", "kill->next confirm s min/med/max",
            "longest gap s med/max", "leader agreed s med [>=]", "rejoin s med", "lost")
    lines = [head]
    for system, kind, s in rows:
        rounds = f"{s['rounds_ok']}/{s['rounds']}" if s["rounds_ok"] != s["rounds"] else str(s["rounds"])
        lines.append((system, kind, rounds,
                      " / ".join(_cell(s[k]) for k in ("next_confirm_min_s", "next_confirm_median_s",
                                                        "next_confirm_max_s")),
                      " / ".join(_cell(s[k]) for k in ("longest_gap_median_s", "longest_gap_max_s")),
                      f"{_cell(s['leader_agreed_median_s'])} [{_cell(s['leader_agreed_lower_median_s'])}]",
                      _cell(s["rejoin_median_s"]),
                      _cell(s["lost"])))
    widths = [max(len(ln[i]) for ln in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(ln, widths, strict=True)).rstrip()
                     for ln in lines)


# --------------------------------------------------------------------------- publisher

class _Target:
    """What StreamPublisher / drain / declare need of a node."""
    user = "guest"
    password = "guest"

    def __init__(self, node_id: str, amqp_port: int) -> None:
        self.node_id = node_id
        self.host = "127.0.0.1"
        self.amqp_port = amqp_port


class _StampedBodies:
    """Wraps the publisher's body maker: records when each id was (last) published."""

    def __init__(self, inner: Any, published_at: dict[int, float]) -> None:
        self.inner = inner
        self.published_at = published_at

    def make(self, tag: str, msg_id: int, size: int | None = None) -> bytes:
        self.published_at[msg_id] = time.monotonic()
        return bytes(self.inner.make(tag, msg_id, size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _ConfirmedSet(set[int]):
    """StreamPublisher.confirmed that reports each confirmed id as it is added."""

    def __init__(self, on_add: Callable[[int], None]) -> None:
        super().__init__()
        self.on_add = on_add

    def add(self, mid: int) -> None:
        super().add(mid)
        self.on_add(mid)


class FailoverPublisher(StreamPublisher):
    """StreamPublisher that knows when each id was published, notes the first confirms after
    `kill_time` (any / of an id published after it) and paces new ids at `rate` msg/s
    (0 = as fast as the window allows; republishes are never held back)."""

    def __init__(self, *args: Any, rate: float = 0.0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.published_at: dict[int, float] = {}
        self.bodies = _StampedBodies(self.bodies, self.published_at)  # type: ignore[assignment,has-type]
        self.confirmed = _ConfirmedSet(self._on_confirm)
        self.kill_time: float | None = None
        self.first_any_confirm: float | None = None
        self.first_new_confirm: float | None = None
        self.rate = float(rate)
        self._burst = max(1.0, self.rate * 0.02)
        self._tokens = self._burst
        self._last_fill: float | None = None

    def _on_confirm(self, mid: int) -> None:
        kt = self.kill_time
        if kt is None:
            return
        now = time.monotonic()
        if self.first_any_confirm is None:
            self.first_any_confirm = now
        if self.first_new_confirm is None and self.published_at.get(mid, 0.0) >= kt:
            self.first_new_confirm = now

    def _take_id(self) -> int | None:
        if self.rate > 0 and not self._retry and not self._stop_ev.is_set():
            now = time.monotonic()
            if self._last_fill is not None:
                self._tokens = min(self._burst, self._tokens + (now - self._last_fill) * self.rate)
            self._last_fill = now
            if self._tokens < 1.0:
                if self._next_id > len(self.confirmed):
                    return None  # the publisher reads confirms (waits <= 0.2 s), then asks again
                # nothing outstanding: StreamPublisher would idle 0.2 s in a read, which would
                # show as a confirm gap; wait for the next token instead (< 1/rate s)
                time.sleep((1.0 - self._tokens) / self.rate)
                self._tokens = 1.0
                self._last_fill = time.monotonic()
            self._tokens -= 1.0
        return super()._take_id()

    def times_snapshot(self) -> list[float]:
        with self._lock:
            return list(self.confirm_times)


# --------------------------------------------------------------------------- systems

class FailoverMirrorq(MirrorqCluster):
    """MirrorqCluster plus what the rounds need: restart one node, wait for it in in_sync."""

    system = "mirrorq"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        # bench/run.free_port binds port 0, i.e. inside the ephemeral range: a node's
        # outgoing dial may take such a port as its source before the node binds it.
        for nd in self.nodes:
            for k in ("amqp", "raft", "admin", "metrics"):
                nd[k] = free_port()

    def node_name(self, i: int) -> str:
        return str(self.nodes[i]["id"])

    def target(self, i: int) -> _Target:
        return _Target(self.node_name(i), int(self.nodes[i]["amqp"]))

    def alive(self, i: int) -> bool:
        p = self.nodes[i]["proc"]
        return p is not None and p.poll() is None

    def declare_queue(self, q: str) -> None:
        declare(self.target(self.leader()), q)

    def queue_leader(self, q: str, timeout: float) -> int:
        return self.leader(timeout=timeout)

    def poll_leader(self, q: str, survivors: list[int]) -> int | None:
        return self.agreed_leader(survivors)

    def restart(self, i: int, timeout: float) -> None:
        nd = self.nodes[i]
        with open(nd["log"], "ab") as out:
            out.write(f"\n==== restart {time.strftime('%H:%M:%S')}\n".encode())
            out.flush()
            nd["proc"] = subprocess.Popen(self.argv(nd), cwd=str(REPO), stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        deadline = time.monotonic() + timeout
        while not amqp_ready("127.0.0.1", nd["amqp"]):
            if nd["proc"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mirrorq {nd['id']} did not come back:\n{tail(nd['log'])}")
            time.sleep(0.05)

    def sync_view(self, q: str, among: list[int]) -> list[str] | None:
        """The in-sync set as the leader among `among` reports it."""
        leader = self.agreed_leader(among)
        st = self.status(leader) if leader is not None else None
        return list(st.get("in_sync") or []) if st else None

    def rejoined(self, i: int, q: str) -> tuple[bool, str]:
        everyone = list(range(len(self.nodes)))
        leader = self.agreed_leader(everyone)
        if leader is None:
            return False, "no agreed leader among all nodes"
        st = self.status(leader) or {}
        in_sync = st.get("in_sync") or []
        if self.node_name(i) not in in_sync:
            return False, f"leader {self.node_name(leader)}: in_sync {in_sync}"
        return True, ""

    def log_tail(self, i: int, n: int = 15) -> str:
        return tail(self.nodes[i]["log"], n)


class FailoverRabbit(RabbitCluster):
    """RabbitCluster plus: the queue's leader and members (rabbitmqctl), kill -9 of one node's
    process group, restart of that node on its own mnesia dir, rejoin check."""

    system = "rabbitmq"
    QVHOST = "/"  # StreamPublisher and drain connect to "/"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        for nd in self.nodes:  # below the ephemeral range (see FailoverMirrorq)
            nd["port"] = free_port()
            nd["dist"] = free_port()
        self.poll_durations: list[float] = []

    def node_name(self, i: int) -> str:
        return str(self.nodes[i]["name"]).split("@", 1)[0]

    def target(self, i: int) -> _Target:
        return _Target(self.node_name(i), int(self.nodes[i]["port"]))

    def index_of(self, name: str | None) -> int | None:
        for i, nd in enumerate(self.nodes):
            if name == nd["name"]:
                return i
        return None

    def alive(self, i: int) -> bool:
        p = self.nodes[i]["proc"]
        return p is not None and p.poll() is None

    def _tool(self, tool: str, i: int, *args: str, timeout: float = 30) -> str:
        proc = subprocess.run([tool, "-n", self.nodes[i]["name"], *args], env=self._env(None),
                              cwd=str(self.home), capture_output=True, text=True, timeout=timeout,
                              **self._as_rabbitmq())
        if proc.returncode != 0:
            raise RuntimeError(f"{os.path.basename(tool)} -n {self.nodes[i]['name']} {' '.join(args)}: "
                               f"{proc.stdout[-800:]} {proc.stderr[-800:]}")
        return proc.stdout

    def queue_info(self, i: int, q: str, timeout: float = 15) -> dict[str, Any]:
        out = self.ctl(i, "list_queues", "-p", self.QVHOST, "name", "type", "leader", "members",
                       "online", "--formatter", "json", "--quiet", timeout=timeout)
        for row in json.loads(out[out.index("["):]):
            if row.get("name") == q:
                return dict(row)
        raise RuntimeError(f"queue {q} not listed by {self.nodes[i]['name']}")

    def declare_queue(self, q: str) -> None:
        declare(self.target(0), q, arguments={"x-queue-type": "quorum"})
        info = self.queue_info(0, q)
        if info.get("type") != "quorum" or len(info.get("members") or []) != len(self.nodes):
            raise RuntimeError(f"{q} is not a {len(self.nodes)}-member quorum queue: {info}")

    def queue_leader(self, q: str, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for i in range(len(self.nodes)):
                if not self.alive(i):
                    continue
                try:
                    last = self.queue_info(i, q)
                except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                    last = exc
                    continue
                leader = self.index_of(last.get("leader"))
                if leader is not None and self.alive(leader):
                    return leader
            time.sleep(0.5)
        raise RuntimeError(f"no leader for {q} within {timeout}s: {last!r}")

    def poll_leader(self, q: str, survivors: list[int]) -> int | None:
        """One poll: the leader every survivor names, if it is a survivor."""
        t0 = time.monotonic()
        try:
            views = set()
            for i in survivors:
                leader = self.index_of(self.queue_info(i, q, timeout=10).get("leader"))
                if leader not in survivors:
                    return None
                views.add(leader)
            return views.pop() if len(views) == 1 else None
        except (RuntimeError, ValueError, subprocess.TimeoutExpired):
            return None
        finally:
            self.poll_durations.append(time.monotonic() - t0)

    def kill9(self, i: int) -> None:
        p = self.nodes[i]["proc"]
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # beam.smp and its helpers (epmd is not in it)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)

    def restart(self, i: int, timeout: float) -> None:
        nd = self.nodes[i]
        with open(nd["dir"] / "stdout.log", "ab") as out:
            nd["proc"] = subprocess.Popen([RABBITMQ_SERVER], cwd=str(nd["dir"]), env=self._env(nd),
                                          stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, **self._as_rabbitmq())
        deadline = time.monotonic() + timeout
        while not amqp_ready("127.0.0.1", nd["port"]):
            if nd["proc"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ {nd['name']} did not come back:\n"
                                   f"{tail(nd['dir'] / 'stdout.log')}")
            time.sleep(0.2)

    def sync_view(self, q: str, among: list[int]) -> list[str] | None:
        """The queue's online members (node names) as a live node reports them."""
        try:
            return [str(x).split("@", 1)[0] for x in self.queue_info(among[0], q).get("online") or []]
        except (RuntimeError, ValueError, subprocess.TimeoutExpired):
            return None

    def rejoined(self, i: int, q: str) -> tuple[bool, str]:
        name = self.nodes[i]["name"]
        try:
            info = self.queue_info(i, q)
            if name not in (info.get("online") or []):
                return False, f"online {info.get('online')}"
            out = self._tool(RABBITMQ_QUEUES, i, "quorum_status", q, "-p", self.QVHOST,
                             "--formatter", "json", "--quiet")
            rows = json.loads(out[out.index("["):])
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            return False, repr(exc)
        by_node = {r.get("Node Name"): r for r in rows}
        mine = by_node.get(name)
        leaders = [r for r in rows if r.get("Raft State") == "leader"]
        if mine is None or not leaders:
            return False, f"quorum_status {rows}"
        if mine.get("Raft State") not in ("follower", "leader") or \
                mine.get("Commit Index") != leaders[0].get("Commit Index"):
            return False, f"quorum_status {rows}"
        return True, ""

    def log_tail(self, i: int, n: int = 15) -> str:
        return tail(self.nodes[i]["dir"] / "stdout.log", n)


# --------------------------------------------------------------------------- rounds

def wait_rejoined(c: Any, i: int, q: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    why = "?"
    while time.monotonic() < deadline:
        if not c.alive(i):
            raise RuntimeError(f"{c.node_name(i)} exited after its restart:\n{c.log_tail(i)}")
        ok, why = c.rejoined(i, q)
        if ok:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{c.node_name(i)} not back in sync within {timeout}s: {why}")


def one_round(c: Any, q: str, kind: str, r: int, a: argparse.Namespace) -> dict[str, Any]:
    n = len(c.nodes)
    leader = c.queue_leader(q, timeout=60)
    followers = [i for i in range(n) if i != leader]
    victim = leader if kind == "leader" else followers[r % len(followers)]
    survivors = [i for i in range(n) if i != victim]
    res: dict[str, Any] = {"round": r + 1, "killed": c.node_name(victim),
                           "killed_role": "leader" if victim == leader else "follower",
                           "leader_before": c.node_name(leader),
                           "publishers_on": [c.node_name(i) for i in survivors]}
    pubs: list[FailoverPublisher] = []
    killed = False
    for i in survivors:
        tgt = c.target(i)
        pubs.append(FailoverPublisher(f"{kind}{r + 1}-{tgt.node_id}", q, (lambda t=tgt: [t]),
                                      total=None, window=a.window, size=a.size,
                                      stall_timeout=a.stall, deadline=a.round_timeout + 300,
                                      rate=a.rate))
    try:
        for p in pubs:
            p.start()
        t0 = time.monotonic()
        while any(len(p.confirmed) < a.warmup for p in pubs):
            bad = [p for p in pubs if p.error or not p.is_alive()]
            if bad or time.monotonic() - t0 > 60:
                raise RuntimeError(f"publishers did not warm up: {[p.summary() for p in pubs]}")
            time.sleep(0.05)
        res["warmup_s"] = _r(time.monotonic() - t0)

        t_kill = time.monotonic()
        for p in pubs:
            p.kill_time = t_kill
        killed = True
        c.kill9(victim)
        res["kill_call_s"] = _r(time.monotonic() - t_kill)
        deadline = t_kill + a.round_timeout
        t_agreed: float | None = None
        new_leader: int | None = None
        polls = 0
        t_not_yet = t_kill  # start of the last poll that found no agreed leader
        while time.monotonic() < deadline:
            if t_agreed is None:
                polls += 1
                t_poll = time.monotonic()
                got = c.poll_leader(q, survivors)
                if got is not None:
                    t_agreed, new_leader = time.monotonic(), got
                else:
                    t_not_yet = t_poll
            firsts = [p.first_new_confirm for p in pubs]
            if t_agreed is not None and all(f is not None for f in firsts) and \
                    time.monotonic() >= max(f for f in firsts if f is not None) + a.after:
                break
            if any(p.error or not p.is_alive() for p in pubs):
                break
            time.sleep(0.02)
        t_end = time.monotonic()
        res["leader_polls"] = polls
        if t_agreed is not None and new_leader is not None:
            res["leader_agreed_s"] = _r(t_agreed - t_kill)
            # agreement happened after the last poll that did not see it began: a lower bound
            res["leader_agreed_after_s"] = _r(t_not_yet - t_kill)
            res["leader_after"] = c.node_name(new_leader)
        for p in pubs:
            p.stop()
        for p in pubs:
            p.join(60)
            if p.is_alive():
                p.abandon()
                p.join(10)

        per: list[dict[str, Any]] = []
        for p in pubs:
            gaps = confirm_gaps(t_kill, [t for t in p.times_snapshot() if t <= t_end])
            per.append({
                "tag": p.tag, "node": p.connected_to,
                "next_confirm_s": _r(p.first_new_confirm - t_kill) if p.first_new_confirm else None,
                "any_confirm_s": _r(p.first_any_confirm - t_kill) if p.first_any_confirm else None,
                "longest_gap_s": _r(gaps[0][1]) if gaps else None,
                "top_gaps": [{"at_s": _r(s), "len_s": _r(g)} for s, g in gaps[:5]],
                "confirmed": len(p.confirmed), "nacked": p.nacked, "uncertain": p.uncertain,
                "republished": p.republished,
                "reconnects": [(_r(t - t_kill), nd, why) for t, nd, why in p.reconnects],
                "error": p.error,
            })
        res["publishers"] = per
        nexts = [x["next_confirm_s"] for x in per]
        if all(x is not None for x in nexts):
            res["next_confirm_s"] = max(nexts)
            res["next_confirm_first_publisher_s"] = min(nexts)
        anys = [x["any_confirm_s"] for x in per if x["any_confirm_s"] is not None]
        res["any_confirm_s"] = min(anys) if anys else None
        res["longest_gap_s"] = max((x["longest_gap_s"] or 0.0) for x in per)
        errors = [f"{x['tag']}: {x['error']}" for x in per if x["error"]]
        if t_agreed is None:
            errors.append(f"survivors did not agree on a leader within {a.round_timeout}s")
        if "next_confirm_s" not in res:
            errors.append(f"no confirm of a message published after the kill within {a.round_timeout}s")
        if errors:
            res["error"] = "; ".join(errors)
    except (KeyboardInterrupt, SystemExit):
        killed = False  # interrupted: no restart, the caller stops the cluster
        raise
    finally:
        for p in pubs:
            if p.is_alive():
                p.abandon()
        if killed:  # also when the measurement failed: the next round needs all 3 nodes
            res["in_sync_before_restart"] = c.sync_view(q, survivors)
            t_restart = time.monotonic()
            c.restart(victim, timeout=a.rejoin_timeout)
            wait_rejoined(c, victim, q,
                          timeout=max(1.0, a.rejoin_timeout - (time.monotonic() - t_restart)))
            res["rejoin_s"] = _r(time.monotonic() - t_restart)
    res["_confirmed"] = {p.tag: set(p.confirmed) for p in pubs}
    return res


def round_line(system: str, kind: str, rounds: int, res: dict[str, Any]) -> str:
    s = (f"{system} {kind} round {res['round']}/{rounds}: killed {res['killed']} "
         f"({res['killed_role']}); leader {res.get('leader_after', '?')} agreed after "
         f"{_cell(res.get('leader_agreed_s'))} s; next confirm {_cell(res.get('next_confirm_s'))} s "
         f"(first publisher {_cell(res.get('next_confirm_first_publisher_s'))} s, any confirm "
         f"{_cell(res.get('any_confirm_s'))} s); longest gap {_cell(res.get('longest_gap_s'))} s; "
         f"back in sync {_cell(res.get('rejoin_s'))} s after restart; confirmed "
         f"{sum(p['confirmed'] for p in res.get('publishers', []))}")
    if "error" in res:
        s += f"; ERROR {res['error']}"
    return s


def run_kind(c: Any, kind: str, a: argparse.Namespace) -> dict[str, Any]:
    q = f"bench-failover-{kind}-{uuid.uuid4().hex[:8]}"
    c.declare_queue(q)
    rounds: list[dict[str, Any]] = []
    confirmed: dict[str, set[int]] = {}
    out: dict[str, Any] = {"queue": q, "rounds": rounds}
    interrupted = False
    try:
        for r in range(a.rounds):
            try:
                res = one_round(c, q, kind, r, a)
            except Exception as exc:  # noqa: BLE001 - the round fails, the kind stops
                rounds.append({"round": r + 1, "error": f"{type(exc).__name__}: {exc}"})
                log(f"{c.system} {kind} round {r + 1}/{a.rounds}: ERROR {rounds[-1]['error']}")
                for i in range(len(c.nodes)):
                    log(f"---- {c.node_name(i)} log tail\n{c.log_tail(i, 10)}")
                out["error"] = rounds[-1]["error"]
                break
            confirmed.update(res.pop("_confirmed"))
            rounds.append(res)
            log(round_line(c.system, kind, a.rounds, res))
    except (KeyboardInterrupt, SystemExit):
        interrupted = True
        raise
    finally:
        total = sum(len(v) for v in confirmed.values())
        live = next((i for i in range(len(c.nodes)) if c.alive(i)), None)
        if live is not None and not interrupted:
            try:
                t0 = time.monotonic()
                got = drain(c.target(live), q, idle=2.0, timeout=max(120.0, total / 500))
                chk = check_delivered(confirmed, got)
                out["check"] = {"confirmed": total, "delivered": chk["delivered"],
                                "lost": chk["lost_count"], "duplicates": chk["duplicates"],
                                "lost_ids": {t: v[:20] for t, v in chk["lost"].items()},
                                "drain_s": _r(time.monotonic() - t0)}
                log(f"{c.system} {kind}: drained {chk['delivered']} for {total} confirmed: "
                    f"lost {chk['lost_count']}, duplicates {chk['duplicates']}")
            except Exception as exc:  # noqa: BLE001
                out["check"] = {"confirmed": total, "error": f"{type(exc).__name__}: {exc}"}
                log(f"{c.system} {kind}: drain failed: {out['check']['error']}")
            delete("127.0.0.1", c.target(live).amqp_port, q, "/")
    out["summary"] = summarize(rounds, (out.get("check") or {}).get("lost"))
    return out


def run_system(system: str, workdir: Path, a: argparse.Namespace) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    c: Any
    if system == "mirrorq":
        c = FailoverMirrorq(workdir)
    else:
        c = FailoverRabbit(workdir)
    try:
        log(f"starting a 3-node {system} cluster")
        t0 = time.monotonic()
        c.start()
        entry["start_s"] = _r(time.monotonic() - t0)
        if system == "rabbitmq":
            entry["version"] = c.ctl(0, "version").strip()
        for kind in a.kinds:
            log(f"{system}: {a.rounds} round(s) of --kind {kind}")
            entry[kind] = run_kind(c, kind, a)
            if "error" in entry[kind] and not all(c.alive(i) for i in range(len(c.nodes))):
                raise RuntimeError(f"--kind {kind} left a node down: {entry[kind]['error']}")
        if system == "rabbitmq":
            d = c.poll_durations
            entry["leader_poll_s"] = {"n": len(d), "median": _r(_median(d)), "max": _r(max(d, default=None))}
    except Exception as exc:  # noqa: BLE001
        entry["error"] = f"{type(exc).__name__}: {exc}"
        log(f"{system}: {entry['error']}")
    finally:
        log(f"stopping the {system} cluster")
        c.stop()
    return entry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="kills per (system, kind)")
    p.add_argument("--kinds", default="leader,follower", help="leader,follower")
    p.add_argument("--systems", default="mirrorq,rabbitmq", help="mirrorq,rabbitmq")
    p.add_argument("--size", type=int, default=1024, help="body bytes (random)")
    p.add_argument("--window", type=int, default=200, help="max unconfirmed per publisher")
    p.add_argument("--rate", type=float, default=1000.0,
                   help="new messages per second per publisher (0 = as fast as the window allows)")
    p.add_argument("--warmup", type=int, default=1000, help="confirms per publisher before the kill")
    p.add_argument("--after", type=float, default=2.0,
                   help="keep publishing this long after confirms resumed (later gaps count too)")
    p.add_argument("--round-timeout", type=float, default=60.0,
                   help="max seconds from the kill to leader agreement + resumed confirms")
    p.add_argument("--rejoin-timeout", type=float, default=180.0,
                   help="max seconds from the restart until the node is back in sync")
    p.add_argument("--stall", type=float, default=30.0,
                   help="a publisher without a confirm this long reconnects and republishes")
    p.add_argument("--json", metavar="PATH", help="write every raw figure here")
    p.add_argument("--keep-workdir", action="store_true")
    a = p.parse_args(argv)
    a.kinds = [k for k in a.kinds.split(",") if k]
    a.systems = [s for s in a.systems.split(",") if s]
    for k in a.kinds:
        if k not in KINDS:
            p.error(f"unknown kind {k!r} (leader, follower)")
    for s in a.systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r} (mirrorq, rabbitmq)")
    if a.rounds < 1:
        p.error("--rounds must be >= 1")

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # run the finally blocks: stop every process started
    signal.signal(signal.SIGTERM, on_term)

    workdir = Path(tempfile.mkdtemp(prefix="mirrorq-failover-"))
    results: dict[str, Any] = {}
    t_start = time.monotonic()
    try:
        for system in a.systems:
            if system == "rabbitmq" and (not os.path.exists(RABBITMQ_SERVER) or os.geteuid() != 0):
                results[system] = {"error": "needs root and Debian's rabbitmq-server "
                                            "(bash bench/install-deps.sh)"}
                log(f"rabbitmq: {results[system]['error']}")
                continue
            results[system] = run_system(system, workdir, a)
    finally:
        if a.keep_workdir:
            log(f"workdir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    rows: list[tuple[str, str, dict[str, Any]]] = []
    failed = False
    for system, entry in results.items():
        if "error" in entry:
            failed = True
        for kind in a.kinds:
            k = entry.get(kind)
            if not k:
                continue
            rows.append((system, kind, k["summary"]))
            s = k["summary"]
            if "error" in k or s["rounds_ok"] != s["rounds"] or s["lost"] != 0:
                failed = True
    elapsed = time.monotonic() - t_start
    if a.json:
        report = {
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                     "python": platform.python_version()},
            "params": {"nodes": 3, "rounds": a.rounds, "kinds": a.kinds, "systems": a.systems,
                       "size": a.size, "window": a.window, "rate_per_publisher": a.rate,
                       "warmup": a.warmup, "after_s": a.after, "persistent": True,
                       "payload": "random", "rabbitmq_queue_type": "quorum"},
            "elapsed_s": round(elapsed, 1),
            "results": results,
        }
        out = Path(a.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=sorted) + "\n")
    print(f"failover: SIGKILL under streaming confirms, {a.size} B random persistent, window "
          f"{a.window}, {a.rate:g} msg/s per publisher (one per surviving node); {elapsed:.0f} s")
    if rows:
        print(table(rows))
    for system, entry in results.items():
        if "error" in entry:
            print(f"! {system}: {entry['error']}")
        for kind in a.kinds:
            k = entry.get(kind) or {}
            for r in k.get("rounds", []):
                if "error" in r:
                    print(f"! {system} {kind} round {r['round']}: {r['error']}")
            chk = k.get("check") or {}
            if chk.get("error"):
                print(f"! {system} {kind} drain: {chk['error']}")
            elif chk.get("lost"):
                print(f"! {system} {kind}: {chk['lost']} confirmed messages lost: {chk['lost_ids']}")
    if a.json:
        print(f"results: {a.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
