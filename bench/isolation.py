#!/usr/bin/env python3
"""Isolation benchmark (issue 42): can one tenant stall another's publishes?

    .venv/bin/python bench/isolation.py                           # every bench/attack_*.py
    .venv/bin/python bench/isolation.py --attacks topic-bindings  # by NAME (or module: topic)
    .venv/bin/python bench/isolation.py --quiet 10 --seconds 20

Starts a 3-node mirrorq cluster (bench/cluster.py's MirrorqCluster, plus each
node's management API), then a victim: one pika publisher with confirms, one
message at a time, on a vhost of its own, through the whole run. After a
quiet phase, each attack (a module bench/attack_*.py, interface in
bench/attack_target.py) sets itself up, then attacks for --seconds while
the victim keeps publishing; one attack at a time.

Per attack: the victim's confirm latency p50/p99/max quiet and under attack,
the p99 ratio to quiet, the elections during the attack (term changes in the
nodes' admin Status) and the attack's own figures. Prints a Markdown table,
writes bench/results/isolation.json; exits 1 if under any attack the victim's
p99 exceeds 2x its quiet p99 or 1 s, or an election happened (the issue's
"What must hold").
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

import pika  # noqa: E402
import requests  # noqa: E402
from cluster import MirrorqCluster  # noqa: E402
from run import free_port, log  # noqa: E402

from bench.attack_target import Target  # noqa: E402

VICTIM_VHOST = "isolation-victim"
ADMIN = ("guest", "guest")  # the seeded administrator (loopback only, as RabbitMQ's)


class HttpCluster(MirrorqCluster):
    """MirrorqCluster with each node's management API on a free port."""

    def __init__(self, workdir: Path, n: int = 3) -> None:
        super().__init__(workdir, n)
        for nd in self.nodes:
            nd["http"] = free_port()

    def argv(self, nd: dict[str, Any]) -> list[str]:
        return super().argv(nd) + ["--http-port", str(nd["http"])]

    def http_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.nodes[i]['http']}"

    def terms(self) -> list[int]:
        out = []
        for i in range(len(self.nodes)):
            st = self.status(i, timeout=5.0)
            if st is not None and st.get("term") is not None:
                out.append(int(st["term"]))
        return out


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/api/overview", auth=ADMIN, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


def discover(names: list[str] | None) -> list[types.ModuleType]:
    """The attack modules: bench/attack_*.py but attack_target.py, or the named
    ones (by NAME or by module suffix)."""
    mods = [importlib.import_module(f"bench.{p.stem}") for p in sorted(BENCH.glob("attack_*.py"))
            if p.stem != "attack_target"]
    if not names:
        return mods
    picked = []
    for name in names:
        hit = [m for m in mods if name in (m.NAME, m.__name__.split(".")[-1],
                                           m.__name__.split(".")[-1].removeprefix("attack_"))]
        if not hit:
            raise SystemExit(f"no attack {name!r} (have: {', '.join(m.NAME for m in mods)})")
        picked += hit
    return picked


class Victim:
    """One publisher with confirms, one message at a time; (sent at, latency) pairs."""

    def __init__(self, host: str, port: int) -> None:
        self.params = pika.ConnectionParameters(host, port, VICTIM_VHOST,
                                                pika.PlainCredentials(*ADMIN), heartbeat=0)
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with pika.BlockingConnection(self.params) as conn:
                ch = conn.channel()
                # bounded: the victim's queue must not grow through the run
                ch.queue_declare("victim", arguments={"x-max-length": 1000})
                ch.confirm_delivery()
                while not self.stop.is_set():
                    t0 = time.monotonic()
                    ch.basic_publish("", "victim", b"v" * 64)  # returns once confirmed
                    self.samples.append((t0, time.monotonic() - t0))
        except BaseException as e:  # noqa: BLE001 - reported with the results
            self.error = e

    def between(self, start: float, end: float) -> list[float]:
        return [lat for t0, lat in list(self.samples) if start <= t0 < end]


def stats(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    s = sorted(xs)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, int(p * len(s)))] * 1000, 2)

    return {"n": len(s), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(s[-1] * 1000, 2)}


def verdict(quiet: dict[str, Any], under: dict[str, Any], elections: int | None,
            error: str | None) -> list[str]:
    """What failed of the issue's bar (empty: it holds): the victim's p99 within
    2x quiet and under 1 s, no election, and the attack ran to its end."""
    failed = []
    p99, q99 = under["p99_ms"], quiet["p99_ms"]
    if p99 is None or (q99 and p99 > 2 * q99):
        failed.append("p99 > 2x quiet")
    if p99 is None or p99 > 1000:
        failed.append("p99 > 1 s")
    if elections is None or elections > 0:
        failed.append("election")
    if error:
        failed.append(error)
    return failed


def run_attack(c: HttpCluster, target: Target, mod: types.ModuleType, victim: Victim,
               seconds: float, quiet: dict[str, Any]) -> dict[str, Any]:
    log(f"attack {mod.NAME}: setup")
    t0 = time.monotonic()
    mod.setup(target)
    setup_s = time.monotonic() - t0
    terms_before = c.terms()
    stop = threading.Event()
    figures: dict[str, float] = {}
    error: list[BaseException] = []

    def attack() -> None:
        try:
            figures.update(mod.run(target, stop))
        except BaseException as e:  # noqa: BLE001 - reported with the results
            error.append(e)

    log(f"attack {mod.NAME}: {seconds:.0f} s")
    th = threading.Thread(target=attack, daemon=True)
    start = time.monotonic()
    th.start()
    stop.wait(seconds)
    stop.set()
    th.join(120)
    end = time.monotonic()  # the attack's last in-flight requests count too
    terms_after = c.terms()
    under = stats(victim.between(start, end))
    elections = (max(terms_after) - max(terms_before)) if terms_before and terms_after else None
    ratio = (round(under["p99_ms"] / quiet["p99_ms"], 2)
             if under["p99_ms"] is not None and quiet["p99_ms"] else None)
    failed = verdict(quiet, under, elections,
                     f"attack error: {error[0]!r}" if error
                     else "attack did not stop" if th.is_alive() else None)
    return {"attack": mod.NAME, "setup_s": round(setup_s, 1), "seconds": round(end - start, 1),
            "victim": under, "p99_ratio": ratio, "elections": elections,
            "terms": [terms_before, terms_after], "figures": figures, "failed": failed}


def table(quiet: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    def lat(d: dict[str, Any]) -> str:
        return f"{d['p50_ms']} / {d['p99_ms']} / {d['max_ms']}"

    out = ["| attack | victim quiet p50 / p99 / max ms | victim under attack p50 / p99 / max ms "
           "| p99 ratio | elections | attack figures | verdict |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        figs = ", ".join(f"{k} {v:g}" for k, v in r["figures"].items())
        out.append(f"| {r['attack']} | {lat(quiet)} | {lat(r['victim'])} | {r['p99_ratio']} | "
                   f"{r['elections']} | {figs} | {'; '.join(r['failed']) or 'holds'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attacks", help="comma-separated NAMEs or module names (default: all)")
    ap.add_argument("--quiet", type=float, default=10.0, help="seconds of quiet baseline")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of each attack")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--out", default=str(BENCH / "results" / "isolation.json"))
    a = ap.parse_args(argv)
    mods = discover(a.attacks.split(",") if a.attacks else None)
    work = Path(tempfile.mkdtemp(prefix="mirrorq-isolation-"))
    c = HttpCluster(work, a.nodes)
    rows: list[dict[str, Any]] = []
    try:
        log(f"starting {a.nodes} nodes in {work}")
        c.start()
        for i in range(a.nodes):
            wait_http(c.http_url(i))
        api = c.http_url(0) + "/api"
        for path, body in ((f"vhosts/{VICTIM_VHOST}", None),
                           (f"permissions/{VICTIM_VHOST}/guest",
                            {"configure": ".*", "write": ".*", "read": ".*"})):
            r = requests.put(f"{api}/{path}", json=body, auth=ADMIN, timeout=30)
            r.raise_for_status()
        target = Target(amqp=tuple(("127.0.0.1", nd["amqp"]) for nd in c.nodes),
                        http=tuple(c.http_url(i) for i in range(a.nodes)),
                        user=ADMIN[0], password=ADMIN[1])
        # the victim on another node than the one the attacks use first
        victim = Victim("127.0.0.1", c.nodes[1 % a.nodes]["amqp"])
        victim.thread.start()
        log(f"quiet: {a.quiet:.0f} s")
        q0 = time.monotonic()
        time.sleep(a.quiet)  # the baseline is a measured interval, not a wait for a condition
        quiet = stats(victim.between(q0, time.monotonic()))
        for mod in mods:
            rows.append(run_attack(c, target, mod, victim, a.seconds, quiet))
            log(f"  {rows[-1]['attack']}: victim {rows[-1]['victim']} elections "
                f"{rows[-1]['elections']} {rows[-1]['figures']}")
        victim.stop.set()
        victim.thread.join(30)
        if victim.error is not None:
            for r in rows:
                r["failed"].append(f"victim error: {victim.error!r}")
    finally:
        c.stop()
    result = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
              "nodes": a.nodes, "quiet_s": a.quiet, "attack_s": a.seconds, "quiet": quiet,
              "attacks": rows}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(quiet, rows))
    print(f"\nwritten: {out}")
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
