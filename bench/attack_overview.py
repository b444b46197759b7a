"""Isolation attack (issue 42 item 2): a `monitoring` user loops management
list reads on a node with thousands of queues.

setup: a vhost and a monitoring user of its own, QUEUES queues in that vhost
(declared pipelined over AMQP by that user, a few seconds). run: CONNECTIONS
keep-alive HTTP connections, spread over the nodes, loop GET /api/overview
(every fourth request GET /api/queues) until stopped. Before issue 42 each
request built the whole management rows on the raft thread: 48 such
connections on 3,000 queues held another vhost's confirms for seconds.

Run alone against a node: python -m bench.attack_overview --http URL --amqp
HOST:PORT [--user guest --password guest] [--seconds 10]; prints its
figures as JSON (`--no-setup` attacks objects made by an earlier run).
bench/isolation.py discovers it by its interface (bench/attack_target.py).
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import threading
import time
from typing import Any
from urllib.parse import quote, urlsplit

import requests
from pamqp import commands as spec
from pamqp import frame as pframe

from bench.attack_target import Target
from harness.amqp import RawConn

NAME = "management-overview"
VHOST = "attack-overview"
USER = "attack-overview"
PASSWORD = "attack-overview-pw"
QUEUES = 3000
CONNECTIONS = 48
# what each connection loops, in turn
PATHS = ("/api/overview", "/api/overview", "/api/overview", "/api/queues")
TIMEOUT = 30.0


def _admin(t: Target, method: str, path: str, body: Any = None) -> None:
    r = requests.request(method, t.http[0].rstrip("/") + path, auth=(t.user, t.password),
                         json=body, timeout=TIMEOUT)
    if r.status_code not in (200, 201, 204):
        raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:200]}")


def setup(t: Target, queues: int = QUEUES) -> None:
    """The attacker's vhost, its monitoring user (with permissions there only)
    and `queues` queues in it."""
    v = quote(VHOST, safe="")
    _admin(t, "PUT", f"/api/vhosts/{v}")
    _admin(t, "PUT", f"/api/users/{USER}", {"password": PASSWORD, "tags": "monitoring"})
    _admin(t, "PUT", f"/api/permissions/{v}/{USER}",
           {"configure": ".*", "write": ".*", "read": ".*"})
    host, port = t.amqp[0]
    c = RawConn(host, port, USER, PASSWORD, timeout=TIMEOUT, vhost=VHOST)
    try:
        # pipelined without answers, then one answered declare behind them (one channel:
        # in order), so thousands take seconds, not one round trip each
        c.send(b"".join(pframe.marshal(spec.Queue.Declare(queue=f"ov-{i}", nowait=True), 1)
                        for i in range(queues)))
        c.send(pframe.marshal(spec.Queue.Declare(queue="ov-last"), 1))
        c.expect(spec.Queue.DeclareOk, timeout=120)
    finally:
        c.close()


def _loop(base: str, stop: threading.Event, counts: dict[int, int], lock: threading.Lock) -> None:
    url = urlsplit(base)
    auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    def connect() -> http.client.HTTPConnection:
        if url.scheme == "https":
            return http.client.HTTPSConnection(url.hostname or "127.0.0.1", url.port or 15671,
                                               timeout=TIMEOUT)
        return http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 15672,
                                          timeout=TIMEOUT)
    conn = connect()
    n = 0
    while not stop.is_set():
        path = PATHS[n % len(PATHS)]
        n += 1
        try:
            conn.request("GET", path, headers={"Authorization": auth})
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = connect()
            status = 0
        with lock:
            counts[status] = counts.get(status, 0) + 1
    conn.close()


def run(t: Target, stop: threading.Event, connections: int = CONNECTIONS,
        counts: dict[int, int] | None = None) -> dict[str, float]:
    """Loop the reads on `connections` keep-alive connections until `stop`
    (`counts`: answers by HTTP status as they come, 0 for a failed request)."""
    counts = {} if counts is None else counts
    lock = threading.Lock()
    began = time.monotonic()
    threads = [threading.Thread(target=_loop, args=(t.http[i % len(t.http)], stop, counts, lock),
                                daemon=True) for i in range(connections)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = max(time.monotonic() - began, 1e-9)
    total = sum(counts.values())
    return {"requests": float(total), "ok": float(counts.get(200, 0)),
            "refused_429": float(counts.get(429, 0)), "errors": float(total - counts.get(200, 0)
                                                                       - counts.get(429, 0)),
            "requests_per_s": total / took, "seconds": took}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--http", action="append", required=True, help="management base URL (repeat)")
    ap.add_argument("--amqp", action="append", required=True, help="HOST:PORT (repeat)")
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=CONNECTIONS)
    ap.add_argument("--queues", type=int, default=QUEUES)
    ap.add_argument("--no-setup", action="store_true")
    args = ap.parse_args()
    amqp = tuple((h, int(p)) for h, _, p in (a.rpartition(":") for a in args.amqp))
    t = Target(amqp, tuple(args.http), args.user, args.password)
    if not args.no_setup:
        setup(t, args.queues)
    stop = threading.Event()
    timer = threading.Timer(args.seconds, stop.set)
    timer.start()
    print(json.dumps(run(t, stop, args.connections)), flush=True)


if __name__ == "__main__":
    main()
