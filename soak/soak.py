#!/usr/bin/env python3
"""Soak run of a mirrorq cluster (`make soak`; soak/README.md).

Starts an N-node cluster on loopback (harness.process, the harness the tests and
chaos experiments use) and, concurrently for --duration seconds:
  * connection churn: >= --connections AMQP connections opened and closed (clean closes,
    dropped sockets with FIN or RST, handshakes abandoned half-way);
  * queue churn: >= --queues queues declared and deleted (durable / transient, exclusive,
    auto-delete, server-named, bound, some holding messages when deleted);
  * steady publishers (confirms, persistent; random, checksummed bodies of mixed sizes,
    1-64 KiB by default) and manual-ack consumers on durable queues, which verify every body.
Every node is sampled (VmRSS, open fds, AMQP connections) every --sample-interval seconds.
Verdicts: RSS flat, no fd leak, no connection leak, no lost confirmed message, no node
died, no queue or message bytes left behind, workload targets met. Exit 0 only if all pass.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for _p in (REPO, REPO / "chaos"):  # runnable from a checkout even without the editable install
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import pika  # noqa: E402
from pamqp import body as pbody  # noqa: E402
from pamqp import commands as spec  # noqa: E402
from pamqp import frame as pframe  # noqa: E402
from pamqp import header as pheader  # noqa: E402

from harness.amqp import ConnLost, RawConn  # noqa: E402
from harness.body import body_id, body_ok  # noqa: E402
from harness.client import drain  # noqa: E402
from harness.process import Cluster, ClusterNode  # noqa: E402
from harness.publisher import StreamPublisher  # noqa: E402

MIB = 1024 * 1024


# ---------------------------------------------------------------- small pieces

class Counts:
    """Thread-safe counters for the report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.c: Counter[str] = Counter()
        self.events: list[dict[str, Any]] = []

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.c[key] += n

    def event(self, t0: float, kind: str, detail: str) -> None:
        with self._lock:
            if len(self.events) < 500:  # a broken run must not bloat the report
                self.events.append({"t": round(time.monotonic() - t0, 2), "kind": kind,
                                    "detail": detail[:300]})


class Pacer:
    """Spreads `target` operations evenly over `window` seconds, then keeps that pace:
    the load is meant to be steady, not maximal."""

    def __init__(self, target: int, window: float, start: float) -> None:
        self.interval = window / max(1, target)
        self.start = start

    def wait(self, done: int, stop: threading.Event) -> bool:
        delay = self.start + done * self.interval - time.monotonic()
        if delay > 0:
            return not stop.wait(delay)
        return not stop.is_set()


class Gate:
    """Lets the main thread pause the churn workers for a quiet measurement point."""

    def __init__(self) -> None:
        self.paused = threading.Event()
        self._lock = threading.Lock()
        self.idle: set[str] = set()

    def checkpoint(self, name: str, release: Callable[[], None], stop: threading.Event) -> None:
        if not self.paused.is_set():
            return
        release()  # a paused worker holds no connection, so the quiet fd count is comparable
        with self._lock:
            self.idle.add(name)
        while self.paused.is_set() and not stop.is_set():
            time.sleep(0.05)
        with self._lock:
            self.idle.discard(name)


def node_rss_fds(pid: int) -> tuple[int | None, int | None]:
    rss = fds = None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
                break
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        pass
    return rss, fds


def pika_params(node: ClusterNode, heartbeat: int = 0) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host=node.host, port=node.amqp_port, heartbeat=heartbeat, socket_timeout=10,
        blocked_connection_timeout=60, connection_attempts=1,
        stack_timeout=15, credentials=pika.PlainCredentials(node.user, node.password))


def quiet_close(conn: Any) -> None:
    try:
        if conn is not None and conn.is_open:
            conn.close()
    except Exception:  # noqa: BLE001 - closing a broken connection
        pass


def raw_publish(conn: RawConn, exchange: str, key: str, body: bytes, persistent: bool = True) -> None:
    props = spec.Basic.Properties(delivery_mode=2 if persistent else 1)
    conn.send(pframe.marshal(spec.Basic.Publish(exchange=exchange, routing_key=key), 1)
              + pframe.marshal(pheader.ContentHeader(0, len(body), props), 1)
              + pframe.marshal(pbody.ContentBody(body), 1))


def raw_clean_close(conn: RawConn) -> None:
    conn.send_method(spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)
    conn.expect(spec.Connection.CloseOk)
    conn.close()


def raw_rst_close(conn: RawConn) -> None:
    # SO_LINGER 0: the close sends RST instead of FIN (a crashed client, a NAT timeout)
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def probe_queue(conn: pika.BlockingConnection, name: str) -> bool:
    """Does the queue exist? (passive declare on a throw-away channel: 404 = no)."""
    ch = conn.channel()
    try:
        ch.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return False
        if exc.reply_code == 405:  # exclusive to a connection that is still alive
            return True
        raise
    quiet_close(ch)
    return True


def wait_gone(conn: pika.BlockingConnection, name: str, timeout: float = 8.0) -> bool:
    """Implicit deletions (exclusive owner gone, last consumer of an auto-delete queue
    cancelled) are applied asynchronously: poll for a while."""
    deadline = time.monotonic() + timeout
    while True:
        if not probe_queue(conn, name):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


# ---------------------------------------------------------------- steady workload

class PacedPublisher(StreamPublisher):
    """The harness' confirm-tracking publisher (republishes nacked and uncertain ids,
    reconnects elsewhere) held to `rate` new messages per second."""

    def __init__(self, *args: Any, rate: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.rate = rate
        self._t_start: float | None = None

    def _take_id(self) -> int | None:
        if not self._retry and not self._stop_ev.is_set():
            if self._t_start is None:
                self._t_start = time.monotonic()
            if self._next_id >= (time.monotonic() - self._t_start) * self.rate:
                return None  # ahead of schedule: the send loop waits for confirms meanwhile
        return super()._take_id()

    @property
    def published(self) -> int:
        return self._next_id + self.republished


class SteadyConsumer(threading.Thread):
    """Manual-ack consumer of one steady queue; records (tag, id) of every acked body.
    Reconnects (to the next node) if its connection fails."""

    def __init__(self, queue: str, nodes: Callable[[], list[ClusterNode]], counts: Counts,
                 t0: float, prefetch: int = 100, requeue_every: int = 500) -> None:
        super().__init__(name=f"consumer-{queue}", daemon=True)
        self.queue = queue
        self.nodes = nodes
        self.counts = counts
        self.t0 = t0
        self.prefetch = prefetch
        self.requeue_every = requeue_every
        self.acked: Counter[tuple[str, int]] = Counter()
        self.foreign = 0  # bodies that are not ours (must stay 0)
        self.corrupted: list[str] = []  # bodies that failed their checksum (must stay empty)
        self.requeued = 0
        self.reconnects = 0
        self.error: str | None = None
        self.drained = threading.Event()
        self._drain_ev = threading.Event()
        self._stop_ev = threading.Event()
        self._last_msg = time.monotonic()
        self._seen = 0

    def drain_and_stop(self) -> None:
        self._drain_ev.set()

    def abort(self) -> None:
        self._stop_ev.set()

    def run(self) -> None:
        attempt = 0
        while not self._stop_ev.is_set() and not self.drained.is_set():
            nodes = self.nodes()
            node = nodes[attempt % len(nodes)]
            attempt += 1
            try:
                self._consume(node)
            except Exception as exc:  # noqa: BLE001 - reconnect and go on; reported
                self.reconnects += 1
                self.counts.event(self.t0, "consumer_reconnect",
                                  f"{self.queue} on {node.node_id}: {type(exc).__name__}: {exc}")
                time.sleep(0.5)
        if not self.drained.is_set() and self._drain_ev.is_set():
            self.error = "stopped before the queue was drained"

    def _consume(self, node: ClusterNode) -> None:
        conn = pika.BlockingConnection(pika_params(node, heartbeat=30))
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=self.prefetch)
            pending: list[tuple[str, int]] = []
            last_tag = [0]

            def on_msg(chan: Any, method: Any, _props: Any, body: bytes) -> None:
                self._last_msg = time.monotonic()
                self._seen += 1
                try:
                    mid = body_id(body)
                except ValueError:
                    self.foreign += 1
                    chan.basic_ack(method.delivery_tag)
                    return
                if not body_ok(body):
                    # damaged: not a delivery of the message (it counts as lost unless an
                    # intact copy comes), and a verdict of its own
                    self.corrupted.append(f"{mid[0]}:{mid[1]}")
                    self.counts.event(self.t0, "corrupted_body",
                                      f"{self.queue}: {mid[0]}:{mid[1]} len {len(body)} "
                                      f"head {body[:32].hex()}")
                    chan.basic_ack(method.delivery_tag)
                    return
                if self.requeue_every and self._seen % self.requeue_every == 0:
                    # exercise requeue + redelivery; the message comes back later
                    chan.basic_nack(method.delivery_tag, multiple=False, requeue=True)
                    self.requeued += 1
                    return
                pending.append(mid)
                last_tag[0] = method.delivery_tag
                if len(pending) >= 20:
                    flush()

            def flush() -> None:
                if pending:
                    ch.basic_ack(last_tag[0], multiple=True)
                    for mid in pending:
                        self.acked[mid] += 1
                    pending.clear()

            ch.basic_consume(self.queue, on_msg, auto_ack=False)
            while not self._stop_ev.is_set():
                conn.process_data_events(time_limit=0.2)
                flush()
                if self._drain_ev.is_set() and time.monotonic() - self._last_msg > 2.0:
                    probe = conn.channel()
                    ready = probe.queue_declare(self.queue, passive=True).method.message_count
                    quiet_close(probe)
                    if ready == 0:
                        self.drained.set()
                        return
                    self._last_msg = time.monotonic()
        finally:
            quiet_close(conn)


# ---------------------------------------------------------------- churn workers

class ConnChurn(threading.Thread):
    """Opens and closes AMQP connections round-robin over the nodes, in several ways."""

    KINDS = ("pika_clean", "pika_work", "raw_clean", "raw_drop_fin", "raw_drop_rst", "handshake_abort")
    WEIGHTS = (20, 25, 10, 20, 15, 10)

    def __init__(self, wid: int, nodes: list[ClusterNode], target: int, pacer: Pacer, gate: Gate,
                 stop: threading.Event, counts: Counts, t0: float, seed: int) -> None:
        super().__init__(name=f"conn-churn-{wid}", daemon=True)
        self.wid = wid
        self.nodes = nodes
        self.target = target
        self.pacer = pacer
        self.gate = gate
        self.stop_ev = stop
        self.counts = counts
        self.t0 = t0
        self.rng = random.Random(seed)
        self.done = 0

    def run(self) -> None:
        while self.pacer.wait(self.done, self.stop_ev):
            self.gate.checkpoint(self.name, lambda: None, self.stop_ev)
            node = self.nodes[(self.done + self.wid) % len(self.nodes)]
            kind = self.rng.choices(self.KINDS, self.WEIGHTS)[0]
            self.done += 1
            self.counts.add("connections_opened")
            self.counts.add(f"connections_{kind}")
            try:
                getattr(self, f"_{kind}")(node)
            except Exception as exc:  # noqa: BLE001 - counted; the broker's answer is what we test
                self.counts.add("connection_errors")
                self.counts.event(self.t0, "connection_error",
                                  f"{kind} on {node.node_id}: {type(exc).__name__}: {exc}")

    def _pika_clean(self, node: ClusterNode) -> None:
        conn = pika.BlockingConnection(pika_params(node))
        conn.close()
        self.counts.add("connections_closed_clean")

    def _pika_work(self, node: ClusterNode) -> None:
        conn = pika.BlockingConnection(pika_params(node))
        try:
            ch = conn.channel()
            q = ch.queue_declare("", exclusive=True).method.queue  # dies with the connection
            for i in range(3):
                ch.basic_publish("", q, f"churn:{i}".encode(),
                                 pika.BasicProperties(delivery_mode=2))
            method, _props, _body = ch.basic_get(q, auto_ack=False)
            if method is not None:
                ch.basic_ack(method.delivery_tag)
        finally:
            conn.close()
        self.counts.add("connections_closed_clean")

    def _raw_clean(self, node: ClusterNode) -> None:
        conn = RawConn(node.host, node.amqp_port, timeout=10)
        raw_clean_close(conn)
        self.counts.add("connections_closed_clean")

    def _raw_with_deliveries(self, node: ClusterNode) -> RawConn:
        """A connection holding an exclusive queue with messages and unacked deliveries."""
        conn = RawConn(node.host, node.amqp_port, timeout=10)
        conn.send_method(spec.Queue.Declare(queue="", exclusive=True), 1)
        _, ok = conn.expect(spec.Queue.DeclareOk)
        for i in range(3):
            raw_publish(conn, "", ok.queue, f"churn:{i}".encode())
        conn.send_method(spec.Basic.Consume(queue=ok.queue, consumer_tag="", no_ack=False), 1)
        # (expect() skips the consume-ok; a delivery may come in the same read as it)
        conn.expect(spec.Basic.Deliver, timeout=5.0)
        return conn

    def _raw_drop_fin(self, node: ClusterNode) -> None:
        self._raw_with_deliveries(node).close()
        self.counts.add("connections_closed_abrupt")

    def _raw_drop_rst(self, node: ClusterNode) -> None:
        raw_rst_close(self._raw_with_deliveries(node))
        self.counts.add("connections_closed_abrupt")

    def _handshake_abort(self, node: ClusterNode) -> None:
        with socket.create_connection((node.host, node.amqp_port), timeout=10) as s:
            if self.rng.random() < 0.7:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                s.recv(4096)  # connection.start, then gone without start-ok
        self.counts.add("connections_closed_abrupt")


class QueueChurn(threading.Thread):
    """Declares and deletes queues of many kinds on one node."""

    KINDS = ("plain", "durable_bound", "durable_args", "exclusive", "server_named",
             "auto_delete", "exclusive_owner_gone")
    WEIGHTS = (35, 20, 10, 10, 5, 10, 10)
    RECYCLE = 250  # queues per connection of this worker (more connection churn)

    def __init__(self, wid: int, node: ClusterNode, target: int, pacer: Pacer, gate: Gate,
                 stop: threading.Event, counts: Counts, t0: float, seed: int) -> None:
        super().__init__(name=f"queue-churn-{wid}", daemon=True)
        self.wid = wid
        self.node = node
        self.target = target
        self.pacer = pacer
        self.gate = gate
        self.stop_ev = stop
        self.counts = counts
        self.t0 = t0
        self.rng = random.Random(seed)
        self.declared = 0
        self.conn: pika.BlockingConnection | None = None
        self.ch: Any = None
        self.since_connect = 0
        self.sample: list[str] = []  # names checked for leftovers at the end

    def _release(self) -> None:
        quiet_close(self.conn)
        self.conn = self.ch = None

    def _channel(self) -> Any:
        if self.conn is None or not self.conn.is_open or self.since_connect >= self.RECYCLE:
            self._release()
            self.conn = pika.BlockingConnection(pika_params(self.node))
            self.counts.add("queue_worker_connections")
            self.since_connect = 0
        if self.ch is None or not self.ch.is_open:
            self.ch = self.conn.channel()
        return self.ch

    def run(self) -> None:
        i = 0
        while self.pacer.wait(self.declared, self.stop_ev):
            self.gate.checkpoint(self.name, self._release, self.stop_ev)
            kind = self.rng.choices(self.KINDS, self.WEIGHTS)[0]
            name = f"soak-{self.wid}-{i}-{kind}"
            i += 1
            try:
                getattr(self, f"_{kind}")(self._channel(), name)
            except Exception as exc:  # noqa: BLE001 - counted; reconnect and go on
                self.counts.add("queue_errors")
                self.counts.event(self.t0, "queue_error",
                                  f"{kind} {name} on {self.node.node_id}: {type(exc).__name__}: {exc}")
                self._release()
            if kind != "server_named" and self.rng.random() < 0.03 and len(self.sample) < 400:
                self.sample.append(name)
        self._release()

    def _declared(self, kind: str, n: int = 1) -> None:
        self.declared += n
        self.since_connect += n
        self.counts.add("queues_declared", n)
        self.counts.add(f"queues_{kind}", n)

    def _deleted(self, n: int = 1, implicit: bool = False) -> None:
        self.counts.add("queues_deleted", n)
        if implicit:
            self.counts.add("queues_deleted_implicitly", n)

    def _publish(self, ch: Any, exchange: str, key: str, n: int) -> None:
        for k in range(n):
            ch.basic_publish(exchange, key, f"queue-churn:{k}".encode() + b"x" * 200,
                             pika.BasicProperties(delivery_mode=2))

    def _plain(self, ch: Any, name: str) -> None:
        ch.queue_declare(name)
        self._declared("plain")
        ch.queue_delete(name)
        self._deleted()

    def _durable_bound(self, ch: Any, name: str) -> None:
        ch.queue_declare(name, durable=True)
        self._declared("durable_bound")
        ch.queue_bind(name, "amq.direct", routing_key=name)
        self._publish(ch, "amq.direct", name, self.rng.randint(1, 4))
        ch.queue_delete(name)  # deleted with its messages in it
        self._deleted()

    def _durable_args(self, ch: Any, name: str) -> None:
        ch.queue_declare(name, durable=True,
                         arguments={"x-message-ttl": 60000, "x-max-length": 3})
        self._declared("durable_args")
        key = f"soak.{self.wid}.{name}"
        ch.queue_bind(name, "amq.topic", routing_key="soak.#")
        ch.queue_bind(name, "amq.topic", routing_key=key)
        self._publish(ch, "amq.topic", key, 5)  # x-max-length drops the oldest two
        ch.queue_unbind(name, "amq.topic", routing_key="soak.#")
        ch.queue_delete(name)
        self._deleted()

    def _exclusive(self, ch: Any, name: str) -> None:
        ch.queue_declare(name, exclusive=True)
        self._declared("exclusive")
        self._publish(ch, "", name, 1)
        ch.queue_delete(name)
        self._deleted()

    def _server_named(self, ch: Any, _name: str) -> None:
        q = ch.queue_declare("", durable=self.rng.random() < 0.5).method.queue
        self._declared("server_named")
        ch.queue_delete(q)
        self._deleted()

    def _auto_delete(self, ch: Any, name: str) -> None:
        ch.queue_declare(name, auto_delete=True)
        self._declared("auto_delete")
        self._publish(ch, "", name, 2)
        tag = ch.basic_consume(name, lambda *_a: None, auto_ack=True)
        ch.basic_cancel(tag)  # last consumer gone: the broker deletes the queue
        assert self.conn is not None
        if wait_gone(self.conn, name):
            self._deleted(implicit=True)
        else:
            self.counts.add("queues_left_over")
            self.counts.event(self.t0, "queue_left_over", f"auto-delete {name} still there")

    def _exclusive_owner_gone(self, _ch: Any, name: str) -> None:
        """Three exclusive queues with a message each, owned by a short connection that
        is then closed cleanly, dropped (FIN) or reset (RST): the broker must delete them."""
        owner = RawConn(self.node.host, self.node.amqp_port, timeout=10)
        self.counts.add("queue_worker_connections")
        names = [f"{name}-{k}" for k in range(3)]
        try:
            for q in names:
                owner.send_method(spec.Queue.Declare(queue=q, exclusive=True), 1)
                owner.expect(spec.Queue.DeclareOk)
                self._declared("exclusive_owner_gone")
                raw_publish(owner, "", q, b"owned")
        finally:
            how = self.rng.choice(("clean", "fin", "rst"))
            try:
                if how == "clean":
                    raw_clean_close(owner)
                elif how == "rst":
                    raw_rst_close(owner)
                else:
                    owner.close()
            except (ConnLost, OSError):
                owner.close()
        assert self.conn is not None
        for q in names:
            if wait_gone(self.conn, q):
                self._deleted(implicit=True)
            else:
                self.counts.add("queues_left_over")
                self.counts.event(self.t0, "queue_left_over", f"exclusive {q} outlived its owner ({how})")


# ---------------------------------------------------------------- sampling

class Sampler(threading.Thread):
    def __init__(self, cluster: Cluster, interval: float, t0: float) -> None:
        super().__init__(name="sampler", daemon=True)
        self.cluster = cluster
        self.interval = interval
        self.t0 = t0
        self.samples: list[dict[str, Any]] = []
        self.deaths: dict[str, float] = {}
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()

    def sample_once(self, phase: str = "") -> list[dict[str, Any]]:
        t = round(time.monotonic() - self.t0, 2)
        rows = []
        for n in self.cluster.nodes:
            alive = n.alive()
            if not alive and n.node_id not in self.deaths:
                self.deaths[n.node_id] = t
            rss, fds = node_rss_fds(n.pid) if alive and n.pid else (None, None)
            st = n.try_status(timeout=3.0) if alive else None
            rows.append({"t": t, "node": n.node_id, "alive": alive, "rss": rss, "fds": fds,
                         "connections": st.get("connections") if st else None,
                         "log_len": st.get("log_len") if st else None,
                         "message_bytes": st.get("message_bytes") if st else None,
                         # size of the last snapshot: the replicated state (does it grow?)
                         "snapshot_bytes": st.get("last_snapshot_bytes") if st else None,
                         "snapshots": st.get("snapshots") if st else None,
                         "role": st.get("role") if st else None, "phase": phase})
        with self.lock:
            self.samples.extend(rows)
        return rows

    def run(self) -> None:
        while not self.stop_ev.is_set():
            start = time.monotonic()
            self.sample_once()
            self.stop_ev.wait(max(0.0, self.interval - (time.monotonic() - start)))


# ---------------------------------------------------------------- the run

class Soak:
    def __init__(self, args: argparse.Namespace, cluster: Cluster) -> None:
        self.args = args
        self.cluster = cluster
        self.nodes = list(cluster.nodes)
        self.counts = Counts()
        self.t0 = time.monotonic()
        self.marks: dict[str, float] = {}
        self.quiet: dict[str, dict[str, Any]] = {}
        self.publishers: list[PacedPublisher] = []
        self.consumers: list[SteadyConsumer] = []
        self.gate = Gate()
        self.churn_stop = threading.Event()
        self.churners: list[threading.Thread] = []
        self.queue_workers: list[QueueChurn] = []
        self.sampler = Sampler(cluster, args.sample_interval, self.t0)
        self.queues = [f"soak-steady-{i}" for i in range(args.steady_queues)]

    def now(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, name: str) -> None:
        self.marks[name] = round(self.now(), 2)
        print(f"[{self.now():7.1f}s] {name}", flush=True)

    def sleep_until(self, t: float) -> None:
        while self.now() < t:
            dead = [n.node_id for n in self.nodes if not n.alive()]
            if dead:
                raise RuntimeError(f"node(s) {dead} died during the run")
            time.sleep(min(1.0, max(0.0, t - self.now())))

    def rotated(self, i: int) -> Callable[[], list[ClusterNode]]:
        return lambda: self.nodes[i % len(self.nodes):] + self.nodes[:i % len(self.nodes)]

    # -- phases
    def start_steady(self) -> None:
        conn = pika.BlockingConnection(pika_params(self.nodes[0]))
        try:
            ch = conn.channel()
            for q in self.queues:
                ch.queue_declare(q, durable=True)
        finally:
            quiet_close(conn)
        per = self.args.rate / len(self.queues)
        for i, q in enumerate(self.queues):
            # consumer on the node after the publisher's: deliveries cross the cluster
            c = SteadyConsumer(q, self.rotated(i + 1), self.counts, self.t0,
                               requeue_every=self.args.requeue_every)
            c.start()
            self.consumers.append(c)
            p = PacedPublisher(f"p{i}", q, self.rotated(i), None, window=100,
                               size=self.args.min_size, max_size=self.args.max_size,
                               seed=f"{self.args.seed}:{i}", stall_timeout=30.0,
                               deadline=self.args.duration + 600.0, rate=per)
            p.start()
            self.publishers.append(p)

    def start_churn(self, churn_end: float) -> None:
        a = self.args
        # paced for 10% more than the targets, reached at 85% of the churn time: the quiet
        # point's pause and a slow moment on a loaded machine still leave the targets met
        pace_window = 0.85 * churn_end
        start = time.monotonic()
        n_conn = 2
        for w in range(n_conn):
            share = -(-a.connections // n_conn)
            t = ConnChurn(w, self.nodes, share, Pacer(int(share * 1.1) + 1, pace_window, start),
                          self.gate, self.churn_stop, self.counts, self.t0, a.seed * 100 + w)
            self.churners.append(t)
        for w, node in enumerate(self.nodes):
            share = -(-a.queues // len(self.nodes))
            qw = QueueChurn(w, node, share, Pacer(int(share * 1.1) + 1, pace_window, start), self.gate,
                            self.churn_stop, self.counts, self.t0, a.seed * 100 + 50 + w)
            self.churners.append(qw)
            self.queue_workers.append(qw)
        for worker in self.churners:
            worker.start()

    def quiet_point(self, name: str, pause_churn: bool) -> None:
        """Churn clients gone, steady clients connected: record fds and AMQP connections
        once they have settled (the same client population at both points)."""
        t_start = self.now()
        if pause_churn:
            self.gate.paused.set()
            deadline = time.monotonic() + 60
            live = {t.name for t in self.churners if t.is_alive()}
            while not live <= self.gate.idle and time.monotonic() < deadline:
                time.sleep(0.05)
                live = {t.name for t in self.churners if t.is_alive()}
        expected = self.quiet.get("after_warmup", {}).get("connections")
        deadline = time.monotonic() + self.args.settle_timeout
        last: list[tuple[Any, ...]] = []
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            rows = self.sampler.sample_once(phase=f"quiet:{name}")
            key = tuple((r["fds"], r["connections"]) for r in rows)
            last = (last + [key])[-3:]
            conns = {r["node"]: r["connections"] for r in rows}
            settled = len(last) == 3 and len(set(last)) == 1
            if settled and (expected is None or conns == expected):
                break
            time.sleep(0.5)
        self.quiet[name] = {
            "t": round(self.now(), 2), "settle_seconds": round(self.now() - t_start, 2),
            "fds": {r["node"]: r["fds"] for r in rows},
            "connections": {r["node"]: r["connections"] for r in rows},
            "rss": {r["node"]: r["rss"] for r in rows},
        }
        self.mark(f"quiet point {name}: fds {self.quiet[name]['fds']} "
                  f"connections {self.quiet[name]['connections']}")
        if pause_churn:
            self.gate.paused.clear()

    def finish_steady(self) -> dict[str, Any]:
        for p in self.publishers:
            p.stop()
        for p in self.publishers:
            p.join(120)
        self.mark("publishers stopped")
        for c in self.consumers:
            c.drain_and_stop()
        deadline = time.monotonic() + 180
        for c in self.consumers:
            c.drained.wait(max(0.0, deadline - time.monotonic()))
        for c in self.consumers:
            if not c.drained.is_set():
                c.abort()
            c.join(15)
        self.mark("consumers drained")
        # belt and braces: anything still in a steady queue counts as delivered too
        leftovers: list[tuple[bytes, bool]] = []
        for i, q in enumerate(self.queues):
            leftovers += drain(self.nodes[i % len(self.nodes)], q, idle=1.0, timeout=120)
        acked: Counter[tuple[str, int]] = Counter()
        for c in self.consumers:
            acked.update(c.acked)
        corrupted = [x for c in self.consumers for x in c.corrupted]
        for body, _red in leftovers:
            try:
                mid = body_id(body)
            except ValueError:
                continue
            if body_ok(body):
                acked[mid] += 1
            else:
                corrupted.append(f"{mid[0]}:{mid[1]}")
        confirmed = {(p.tag, m) for p in self.publishers for m in p.confirmed}
        lost = sorted(confirmed - set(acked))
        return {
            "published": sum(p.published for p in self.publishers),
            "published_body_bytes": sum(p.body_bytes for p in self.publishers),
            "confirmed": len(confirmed),
            "nacked": sum(p.nacked for p in self.publishers),
            "uncertain": sum(p.uncertain for p in self.publishers),
            "republished": sum(p.republished for p in self.publishers),
            "publisher_reconnects": sum(len(p.reconnects) for p in self.publishers),
            "publisher_errors": [p.error for p in self.publishers if p.error],
            "publishers_unfinished": [p.tag for p in self.publishers if p.is_alive()],
            "delivered": sum(acked.values()),
            "delivered_distinct": len(acked),
            "duplicates": sum(v - 1 for v in acked.values() if v > 1),
            "delivered_unconfirmed": len(set(acked) - confirmed),
            "left_in_queues_at_end": len(leftovers),
            "lost": len(lost),
            "lost_ids": [f"{t}:{m}" for t, m in lost[:50]],
            "requeued_by_consumers": sum(c.requeued for c in self.consumers),
            "foreign_bodies": sum(c.foreign for c in self.consumers),
            "corrupted": len(corrupted),
            "corrupted_ids": corrupted[:50],
            "consumer_reconnects": sum(c.reconnects for c in self.consumers),
            "consumers_undrained": [c.queue for c in self.consumers if not c.drained.is_set()],
        }

    def leftover_queues(self) -> list[str]:
        names = [n for w in self.queue_workers for n in w.sample]
        if not names:
            return []
        conn = pika.BlockingConnection(pika_params(self.nodes[-1]))
        try:
            found = []
            for name in names:
                variants = [f"{name}-{k}" for k in range(3)] if name.endswith("owner_gone") else [name]
                found += [v for v in variants if probe_queue(conn, v)]
            return found
        finally:
            quiet_close(conn)

    def execute(self) -> dict[str, Any]:
        a = self.args
        d = float(a.duration)
        warm = a.warmup_fraction * d
        churn_end = max(warm + 1.0, d - max(3.0, 0.05 * d))
        self.sampler.sample_once(phase="start")
        self.sampler.start()
        self.mark("cluster up, starting steady publishers and consumers")
        self.start_steady()
        self.start_churn(churn_end)
        self.mark(f"churn started: {a.connections} connections, {a.queues} queues (+10%) over "
                  f"~{0.85 * churn_end:.0f}s, then at the same pace until {churn_end:.0f}s")
        self.sleep_until(warm)
        self.quiet_point("after_warmup", pause_churn=True)
        self.sleep_until(churn_end)
        self.churn_stop.set()
        for t in self.churners:
            t.join(60)
        self.mark("churn stopped: " + ", ".join(f"{k}={self.counts.c[k]}" for k in (
            "connections_opened", "queues_declared", "queues_deleted")))
        self.sleep_until(d)
        self.quiet_point("end", pause_churn=False)
        self.marks["run_end"] = round(self.now(), 2)
        steady = self.finish_steady()
        self.mark(f"steady: confirmed {steady['confirmed']} delivered {steady['delivered']} "
                  f"lost {steady['lost']}")
        left = self.leftover_queues()
        self.sampler.stop_ev.set()
        self.sampler.join(10)
        final = self.sampler.sample_once(phase="final")
        self.mark("final checks done")
        return {"steady": steady, "leftover_queue_sample": left, "final": final,
                "churn_threads_alive": [t.name for t in self.churners if t.is_alive()]}


# ---------------------------------------------------------------- verdicts and report

def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def node_figures(samples: list[dict[str, Any]], run_end: float, warm_fraction: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in sorted({s["node"] for s in samples}):
        # periodic samples only: the quiet points sample densely and would bias the medians
        rows = [s for s in samples if s["node"] == node and s["rss"] is not None
                and s["t"] <= run_end and not s["phase"].startswith("quiet")]
        rss = [(s["t"], s["rss"]) for s in rows]
        early = [r for t, r in rss if warm_fraction * run_end <= t <= 2 * warm_fraction * run_end]
        late = [r for t, r in rss if t >= 0.8 * run_end]
        fds = [s["fds"] for s in rows if s["fds"] is not None]
        out[node] = {
            "rss_start": rss[0][1] if rss else None,
            "rss_after_warmup_median": _median(early),
            "rss_end_median": _median(late),
            "rss_last": rss[-1][1] if rss else None,
            "rss_max": max((r for _t, r in rss), default=None),
            "fds_start": fds[0] if fds else None,
            "fds_max": max(fds, default=None),
            "windows": {"after_warmup": [round(warm_fraction * run_end, 1), round(2 * warm_fraction * run_end, 1)],
                        "end": [round(0.8 * run_end, 1), round(run_end, 1)]},
        }
    return out


def verdicts(args: argparse.Namespace, res: dict[str, Any], nodes: dict[str, Any],
             quiet: dict[str, Any], counts: Counter[str], deaths: dict[str, float]) -> dict[str, Any]:
    v: dict[str, Any] = {}

    def put(name: str, ok: bool, detail: str) -> None:
        v[name] = {"pass": bool(ok), "detail": detail}

    grow = []
    ok = True
    for node, f in nodes.items():
        a, b = f["rss_after_warmup_median"], f["rss_end_median"]
        if a is None or b is None:
            ok = False
            grow.append(f"{node}: no samples")
            continue
        pct = 100.0 * (b - a) / a
        bad = pct > args.rss_max_growth_pct and (b - a) > args.rss_max_growth_mib * MIB
        ok &= not bad
        grow.append(f"{node}: {a / MIB:.1f} -> {b / MIB:.1f} MiB ({pct:+.1f}%)")
    put("rss_flat", ok, f"median of the last 20% vs 20-40% of the run; fails above "
        f"+{args.rss_max_growth_pct:g}% and +{args.rss_max_growth_mib:g} MiB: " + "; ".join(grow))

    qa, qe = quiet.get("after_warmup", {}), quiet.get("end", {})
    fd_ok = bool(qa) and bool(qe)
    parts = []
    for node in sorted(qa.get("fds", {})):
        x, y = qa["fds"].get(node), qe.get("fds", {}).get(node)
        good = x is not None and y is not None and y - x <= args.fd_slack
        fd_ok &= good
        parts.append(f"{node}: {x} -> {y}")
    put("no_fd_leak", fd_ok, f"open fds at the quiet points (churn clients gone), allowed growth "
        f"{args.fd_slack}: " + "; ".join(parts))

    ca, ce = qa.get("connections", {}), qe.get("connections", {})
    put("no_connection_leak", bool(ca) and ca == ce,
        f"AMQP connections per node at the quiet points: after warm-up {ca}, end {ce}")

    st = res["steady"]
    put("no_lost_confirms", st["lost"] == 0 and st["confirmed"] > 0 and not st["consumers_undrained"]
        and not st["publishers_unfinished"],
        f"confirmed {st['confirmed']}, lost {st['lost']}, duplicates {st['duplicates']}, "
        f"undrained {st['consumers_undrained']}, unfinished publishers {st['publishers_unfinished']}")

    put("bodies_intact", st["corrupted"] == 0 and st["foreign_bodies"] == 0,
        f"{st['corrupted']} delivered bodies failed their checksum {st['corrupted_ids'][:5]}, "
        f"{st['foreign_bodies']} were not ours; {st['published_body_bytes'] / MIB:.0f} MiB of bodies published")

    put("no_node_died", not deaths, f"deaths: {deaths or 'none'}")

    left = counts["queues_left_over"] + len(res["leftover_queue_sample"])
    mb = {r["node"]: r["message_bytes"] for r in res["final"]}
    put("nothing_left_behind", left == 0 and all(x == 0 for x in mb.values()),
        f"queues that outlived their deletion: {counts['queues_left_over']} during the run, "
        f"{res['leftover_queue_sample'][:10]} in the final sample; message bytes after the drain {mb}")

    ops = counts["connections_opened"] + counts["queues_declared"]
    errs = counts["connection_errors"] + counts["queue_errors"]
    put("few_churn_errors", errs <= args.max_error_pct / 100.0 * max(1, ops),
        f"{counts['connection_errors']} connection and {counts['queue_errors']} queue operations failed "
        f"of {ops} (allowed {args.max_error_pct:g}%; see events in the report)")

    put("targets_met", counts["connections_opened"] >= args.connections
        and counts["queues_deleted"] >= args.queues and counts["queues_declared"] >= args.queues,
        f"connections {counts['connections_opened']}/{args.connections}, queues declared "
        f"{counts['queues_declared']} deleted {counts['queues_deleted']}/{args.queues}")
    return v


def leader_changes(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Informational: when the node reporting itself leader changed (none is expected:
    the soak injects no fault)."""
    out: list[dict[str, Any]] = []
    by_t: dict[float, list[str]] = {}
    for r in samples:
        if r["role"] == "leader":
            by_t.setdefault(r["t"], []).append(r["node"])
    last: str | None = None
    for t in sorted(by_t):
        leaders = by_t[t]
        cur = leaders[0] if len(leaders) == 1 else None  # two claimants: a stale leader
        if cur is not None and cur != last:
            if last is not None:
                out.append({"t": t, "from": last, "to": cur})
            last = cur
    return out


def chart(path: Path, samples: list[dict[str, Any]], nodes: dict[str, Any], marks: dict[str, float],
          title: str, changes: list[dict[str, Any]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    for node in sorted(nodes):
        rows = [s for s in samples if s["node"] == node and s["rss"] is not None]
        t = [s["t"] for s in rows]
        axes[0].plot(t, [s["rss"] / MIB for s in rows], label=node)
        axes[1].plot(t, [s["fds"] for s in rows], label=node)
        conn_rows = [s for s in rows if s["connections"] is not None]
        axes[2].plot([s["t"] for s in conn_rows], [s["connections"] for s in conn_rows], label=node)
    any_node = next(iter(nodes.values()), None)
    if any_node:
        for (lo, hi), color in ((any_node["windows"]["after_warmup"], "tab:green"),
                                (any_node["windows"]["end"], "tab:red")):
            axes[0].axvspan(lo, hi, color=color, alpha=0.08)
    for name, at in marks.items():
        if name.startswith("quiet point") or name == "run_end":
            for ax in axes:
                ax.axvline(at, color="grey", linestyle=":", linewidth=0.8)
    from matplotlib.ticker import MaxNLocator
    for ax in axes[1:]:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for i, ch in enumerate(changes):
        axes[0].axvline(ch["t"], color="tab:red", linestyle="--", linewidth=0.8,
                        label="leader change" if i == 0 else None)
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].set_ylabel("open fds")
    axes[2].set_ylabel("AMQP connections")
    axes[2].set_xlabel("seconds since the cluster was up")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(report: dict[str, Any]) -> str:
    lines = ["", "node  RSS start  after warm-up  end (median)  max      fds warm-up  fds end"]
    for node, f in report["nodes"].items():
        qa = report["quiet"].get("after_warmup", {}).get("fds", {}).get(node)
        qe = report["quiet"].get("end", {}).get("fds", {}).get(node)

        def mib(x: float | None) -> str:
            return f"{x / MIB:7.1f}M" if x is not None else "      -"
        lines.append(f"{node:<5} {mib(f['rss_start']):>9} {mib(f['rss_after_warmup_median']):>14} "
                     f"{mib(f['rss_end_median']):>13} {mib(f['rss_max']):>8} {qa!s:>12} {qe!s:>8}")
    c, s = report["counts"], report["steady"]
    lines.append("")
    lines.append(f"connections opened {c.get('connections_opened', 0)} (clean {c.get('connections_closed_clean', 0)}, "
                 f"abrupt {c.get('connections_closed_abrupt', 0)}, errors {c.get('connection_errors', 0)}); "
                 f"queue-worker connections {c.get('queue_worker_connections', 0)}")
    lines.append(f"queues declared {c.get('queues_declared', 0)}, deleted {c.get('queues_deleted', 0)} "
                 f"(implicitly {c.get('queues_deleted_implicitly', 0)}), errors {c.get('queue_errors', 0)}")
    lines.append(f"published {s['published']} ({s.get('published_body_bytes', 0) / MIB:.0f} MiB of bodies), "
                 f"confirmed {s['confirmed']}, nacked {s['nacked']}, delivered {s['delivered']}, "
                 f"duplicates {s['duplicates']}, lost {s['lost']}, corrupted {s.get('corrupted', 0)}")
    changes = report.get("leader_changes", [])
    lines.append(f"leader changes (no fault injected; informational): {len(changes)} "
                 + " ".join(f"{c['from']}->{c['to']}@{c['t']:.0f}s" for c in changes))
    lines.append("")
    for name, v in report["verdicts"].items():
        lines.append(f"{'PASS' if v['pass'] else 'FAIL'}  {name:<20} {v['detail']}")
    lines.append(f"\nSOAK {'PASSED' if report['pass'] else 'FAILED'}")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--out", default=str(REPO / "soak" / "results"), help="report directory")
    p.add_argument("--connections", type=int, default=1000, help="churn connections to open and close")
    p.add_argument("--queues", type=int, default=10000, help="queues to declare and delete")
    p.add_argument("--rate", type=float, default=150.0, help="steady confirmed publishes per second, total")
    p.add_argument("--steady-queues", type=int, default=3)
    p.add_argument("--min-size", type=int, default=1024,
                   help="smallest steady message body, bytes (default 1 KiB)")
    p.add_argument("--max-size", type=int, default=64 * 1024,
                   help="largest steady message body, bytes (default 64 KiB); sizes are log-uniform "
                        "between the two (random, incompressible, checksummed bodies)")
    p.add_argument("--size", type=int, default=None,
                   help="one fixed steady body size instead (sets --min-size and --max-size)")
    p.add_argument("--requeue-every", type=int, default=500, help="a consumer nack-requeues every Nth delivery (0: never)")
    p.add_argument("--sample-interval", type=float, default=5.0)
    p.add_argument("--warmup-fraction", type=float, default=0.2,
                   help="warm-up share of the run; RSS 'after warm-up' = median of [f, 2f] of the run")
    p.add_argument("--rss-max-growth-pct", type=float, default=20.0)
    p.add_argument("--rss-max-growth-mib", type=float, default=30.0)
    p.add_argument("--fd-slack", type=int, default=8, help="allowed fd growth per node between the quiet points")
    p.add_argument("--settle-timeout", type=float, default=20.0, help="seconds a quiet point waits for fds to settle")
    p.add_argument("--max-error-pct", type=float, default=1.0,
                   help="churn operations that may fail (client timeouts on a loaded machine), percent")
    p.add_argument("--start-timeout", type=float, default=120.0,
                   help="seconds for the cluster to become healthy (per attempt)")
    p.add_argument("--seed", type=int, default=1, help="churn choices and steady body sizes")
    p.add_argument("--keep-data", action="store_true", help="keep the node data dirs and logs even on success")
    a = p.parse_args(argv)
    if a.nodes < 1 or a.duration < 5 or a.steady_queues < 1 or a.rate <= 0:
        p.error("need --nodes >= 1, --duration >= 5, --steady-queues >= 1, --rate > 0")
    if not 0.05 <= a.warmup_fraction <= 0.4:
        p.error("--warmup-fraction must be within 0.05..0.4")
    if a.size is not None:
        a.min_size = a.max_size = a.size
    if not 1 <= a.min_size <= a.max_size:
        p.error("need 1 <= --min-size <= --max-size")
    return a


def write_config(cluster: Cluster) -> None:
    """The node config: always a Raft password (nodes refuse cluster mode without one, and
    the Raft port speaks pickle)."""
    cluster.config_path.write_text(
        "# written by soak/soak.py\n"
        'loopback_users = ["guest"]\n'
        "[raft]\n"
        f'password = "{secrets.token_hex(16)}"\n')
    os.chmod(cluster.config_path, 0o600)


def scan_logs(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Informational: errors the nodes logged (a broker problem the verdicts may not show)."""
    out: dict[str, dict[str, Any]] = {}
    for n in cluster.nodes:
        try:
            lines = n.log_path.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        bad = [ln for ln in lines if " ERROR " in ln or " CRITICAL " in ln]
        out[n.node_id] = {"lines": len(lines), "errors": len(bad),
                          "tracebacks": sum(ln.startswith("Traceback") for ln in lines),
                          "first": bad[0][:300] if bad else None, "log": str(n.log_path)}
    return out


def start_cluster(work: Path, n: int, timeout: float, pids_file: Path, attempts: int = 3) -> Cluster:
    """Start a healthy cluster on fresh free ports. The harness picks a free port by binding
    port 0 and releasing it, so on a busy machine another process can take it before the
    node binds: a node that exits during start-up means a new attempt on new ports (the
    harness' own wait would keep polling a dead node until its timeout)."""
    for attempt in range(1, attempts + 1):
        cluster = Cluster(work / f"cluster{attempt}", n=n)
        write_config(cluster)
        try:
            for node in cluster.nodes:
                node.start(wait=False)
            # for a caller that must clean up after a killed soak (the smoke test): node pids
            pids_file.write_text(json.dumps({"workdir": str(work),
                                             "nodes": {x.node_id: x.pid for x in cluster.nodes}}) + "\n")
            deadline = time.monotonic() + timeout
            while True:
                dead = [x for x in cluster.nodes if not x.alive()]
                if dead:
                    raise RuntimeError(f"{dead[0].node_id} exited during start-up: "
                                       f"{dead[0].tail_log(1).strip()}")
                try:
                    cluster.wait_healthy(timeout=2.0)
                    return cluster
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
        except Exception as exc:
            cluster.kill_all()
            if attempt == attempts:
                raise
            print(f"soak: cluster start attempt {attempt} failed ({exc}); retrying on new ports",
                  flush=True)
    raise AssertionError("unreachable")


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a test timeout, make being stopped) unwinds like Ctrl-C, so the nodes are stopped."""
    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mirrorq-soak-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    cluster: Cluster | None = None
    pids_file = out / "pids.json"
    report: dict[str, Any] = {"started_at": started, "command": " ".join([sys.executable, *sys.argv]),
                              "params": vars(args), "workdir": str(work)}
    soak: Soak | None = None
    passed = False
    with terminate_as_interrupt():
        try:
            print(f"soak: starting a {args.nodes}-node cluster in {work}", flush=True)
            cluster = start_cluster(work, args.nodes, args.start_timeout, pids_file)
            soak = Soak(args, cluster)
            res = soak.execute()
            deaths = dict(soak.sampler.deaths)
            run_end = soak.marks["run_end"]
            nodes = node_figures(soak.sampler.samples, run_end, args.warmup_fraction)
            counts = soak.counts.c
            v = verdicts(args, res, nodes, soak.quiet, counts, deaths)
            passed = all(x["pass"] for x in v.values())
            report.update({"pass": passed, "verdicts": v, "nodes": nodes, "quiet": soak.quiet,
                           "counts": dict(sorted(counts.items())), "steady": res["steady"],
                           "leftover_queue_sample": res["leftover_queue_sample"],
                           "churn_threads_alive": res["churn_threads_alive"],
                           "marks": soak.marks, "events": soak.counts.events,
                           "cluster": {n.node_id: {"pid": n.pid, "amqp_port": n.amqp_port,
                                                   "raft_port": n.raft_port} for n in cluster.nodes},
                           "samples": sorted(soak.sampler.samples, key=lambda r: r["t"])})
        except BaseException as exc:  # noqa: BLE001 - the report records why the run failed
            report.update({"pass": False, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc()})
            if soak is not None:
                samples = sorted(soak.sampler.samples, key=lambda r: r["t"])
                report.update({"counts": dict(soak.counts.c), "events": soak.counts.events,
                               "samples": samples, "quiet": soak.quiet, "marks": soak.marks,
                               "deaths": dict(soak.sampler.deaths)})
                if samples:  # the curve up to the failure is the most useful part
                    report["nodes"] = node_figures(samples, samples[-1]["t"], args.warmup_fraction)
            sys.stderr.write(traceback.format_exc())
            if cluster is not None:
                cluster.dump_logs(20)
        finally:
            if soak is not None:
                soak.churn_stop.set()
                soak.sampler.stop_ev.set()
                for c in soak.consumers:
                    c.abort()
                for p in soak.publishers:
                    p.abandon()
            if cluster is not None:
                cluster.stop_all()  # SIGTERM, SIGKILL after 10 s, by pid
                cluster.kill_all()
    report["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    report["leader_changes"] = leader_changes(report.get("samples", []))
    if cluster is not None:
        report["node_logs"] = scan_logs(cluster)
        logs = out / "logs"  # small (start-up and warnings only): kept with the report
        logs.mkdir(exist_ok=True)
        for n in cluster.nodes:
            if n.log_path.exists():
                shutil.copyfile(n.log_path, logs / f"{n.node_id}.log")
    if "error" in report:
        print(f"\nSOAK FAILED: {report['error']}")
    (out / "soak.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    if "nodes" in report:
        title = (f"mirrorq soak {started}: {args.nodes} nodes, {args.duration:g}s, "
                 f"{'PASS' if passed else 'FAIL'}")
        chart(out / "soak.png", report["samples"], report["nodes"], report["marks"], title,
              report["leader_changes"])
        if "verdicts" in report:
            print(summary_table(report))
    for node, info in report.get("node_logs", {}).items():
        if info["errors"] or info["tracebacks"]:
            print(f"{node} log: {info['errors']} ERROR/CRITICAL lines, {info['tracebacks']} tracebacks; "
                  f"first: {info['first']}")
    print(f"\nreport: {out / 'soak.json'}" + (f", chart: {out / 'soak.png'}" if "nodes" in report else ""))
    if passed and not args.keep_data:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"node data and logs kept in {work}")
    pids_file.unlink(missing_ok=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
