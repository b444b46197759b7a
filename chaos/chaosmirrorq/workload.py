"""The chaos workload: publishers with streaming confirms and consumers with manual
acks spread over the nodes, each writing its own JSONL history file in the format of
chaos/HISTORY.md; then a drain of every queue (phase "drain") and `drain_done`.

    wl = Workload(run_dir, run_id, nodes=lambda: cluster.nodes, queues=["chaos-a", "chaos-b"])
    wl.start(); ...faults...; wl.stop_and_drain()

Publishers talk raw AMQP (pamqp frames over chaosmirrorq.cluster.RawConn) so that every
publish attempt gets exactly one recorded outcome: `ack` / `nack` from the broker,
`timeout` (no outcome within `publish_timeout`: the connection is dropped and the
publisher moves on) or `connection-lost` (the socket died with it outstanding).
Each attempt has its own msg_id (`<publisher>-<k>`, in message_id; the body starts with
`<publisher>:<k>:`); nothing is republished, so a `recovered` message is one whose
uncertain publish made it.

Bodies are what real payloads look like to the broker: random bytes that do not compress,
of mixed sizes (log-uniform between `min_size` and `max_size`, default 1 KiB..64 KiB, from
`seed`), with a crc32 of the content after the id (chaosmirrorq.cluster.RandomBodies /
make_body's format). Every consumer and the drain verify each body (checksum, declared
size, id against message_id); a damaged one is recorded with `corrupted: true` on its
`deliver` event, which the history checker counts as corrupted (a failure like lost).

Consumers: manual acks, ~`nack_ratio` nack-requeue, and one "crasher" that now and then
holds a few deliveries unacked and closes its socket (settle action `crash`). Every
client reconnects to the next node when its node fails (kill, pause, removal).

`nodes` is a callable returning objects with `node_id`, `host`, `amqp_port` (ClusterNode,
or Endpoint for a cluster reached through addresses, e.g. a Kubernetes Service).
"""
from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from chaosmirrorq.cluster import (
    ConnLost,
    RandomBodies,
    RawConn,
    body_frames,
    body_id,
    body_ok,
    confirmed_tags,
)

# msg/s per publisher (3 publishers: ~1,050 msg/s, ~16 MB/s of 1-64 KiB bodies), about
# 70 % of what a 3-node cluster sustained on the 2-core development machine: 1,500 msg/s
# (23 MB/s) with the consumers keeping up; at 1,800 msg/s offered the consumers fell
# behind (chaos/README.md, "Workload"). The rest is room for catch-up after a fault.
DEFAULT_RATE = 350.0
DEFAULT_MIN_SIZE = 1024
DEFAULT_MAX_SIZE = 64 * 1024
DEFAULT_SEED = 1


@dataclass
class Endpoint:
    """An AMQP address that is not a ClusterNode we started."""
    node_id: str
    host: str
    amqp_port: int = 5672
    user: str = "guest"
    password: str = "guest"


def endpoints_fn(spec_list: list[str] | str) -> Callable[[], list[Endpoint]]:
    """parse_endpoints as a function of now: "k8s:NS/CLUSTER" looks the pods up again at
    every call (their IPs change when they are recreated); anything else is fixed."""
    if isinstance(spec_list, str) and spec_list.startswith("k8s:"):
        ns, _, name = spec_list[4:].partition("/")
        from chaosmirrorq import k8s
        return lambda: k8s.endpoints(ns, name)
    eps = parse_endpoints(spec_list)
    return lambda: eps


def parse_endpoints(spec_list: list[str] | str) -> list[Endpoint]:
    """["host:port", "id=host:port", ...] (or a comma-separated string) -> Endpoints."""
    if isinstance(spec_list, str) and spec_list.startswith("k8s:"):
        return endpoints_fn(spec_list)()
    items = spec_list.split(",") if isinstance(spec_list, str) else list(spec_list)
    out = []
    for i, item in enumerate(x.strip() for x in items if x.strip()):
        nid, _, addr = item.rpartition("=")
        host, _, port = addr.rpartition(":")
        if not host:
            host, port = addr, "5672"
        out.append(Endpoint(nid or f"ep{i + 1}", host, int(port)))
    return out


class HistoryWriter:
    """One JSONL file, one writer (thread-safe), line-buffered."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()
        self.count = 0

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            if not self._f.closed:
                self._f.write(line + "\n")
                self.count += 1

    def close(self) -> None:
        with self._lock:
            self._f.close()


def _rotation(nodes: Callable[[], list[Any]], start: int) -> list[Any]:
    ns = list(nodes())
    if not ns:
        return []
    k = start % len(ns)
    return ns[k:] + ns[:k]


def _connect(nodes: Callable[[], list[Any]], start: int, stop: threading.Event,
             deadline: float, timeout: float = 3.0) -> tuple[RawConn, Any, int]:
    """Connect to the first reachable node of the rotation from `start`; keep trying
    (next node each time) until `stop` or `deadline`. Returns (conn, node, index)."""
    attempt = start
    last = "no node"
    while not stop.is_set() and time.monotonic() < deadline:
        cands = _rotation(nodes, attempt)
        for i, node in enumerate(cands):
            try:
                conn = RawConn(node.host, node.amqp_port, node.user, node.password, timeout=timeout)
                conn.sock.settimeout(timeout)
                return conn, node, attempt + i
            except (OSError, ConnLost) as exc:
                last = f"{node.node_id}: {exc}"
        attempt += 1
        stop.wait(0.2)
    raise ConnLost(f"cannot connect: {last}")


def check_body(body: bytes, size: int | None, message_id: str | None) -> tuple[str, bool]:
    """(msg_id, corrupted) of a delivered body: msg_id from message_id, else from the
    body's `<publisher>:<k>:` head; corrupted when the checksum does not match, the body
    is not `size` bytes long or its id is not message_id."""
    try:
        tag, k = body_id(body)
        from_body: str | None = f"{tag}-{k}"
    except (ValueError, UnicodeDecodeError):
        from_body = None
    mid = message_id or from_body or body[:40].decode("utf-8", "replace")
    bad = (not body_ok(body) or (size is not None and len(body) != size)
           or (message_id is not None and from_body != message_id))
    return mid, bad


def _corrupt_detail(body: bytes, size: int | None) -> dict[str, Any]:
    return {"corrupted": True, "body_len": len(body), "body_size": size, "body_head": body[:48].hex()}


def _expect(conn: RawConn, cls: type, stash: list[tuple[int, Any]], timeout: float = 5.0) -> Any:
    """Like RawConn.expect, but frames read past the awaited one (e.g. deliveries right
    after consume-ok) are kept in `stash` instead of being dropped."""
    deadline = time.monotonic() + timeout
    while True:
        frames = conn.frames()
        for i, (_ch, v) in enumerate(frames):
            if isinstance(v, cls):
                stash.extend(frames[i + 1:])
                return v
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConnLost(f"no {cls.__name__} within {timeout}s")
        conn.fill(min(left, 0.2))


class Publisher(threading.Thread):
    def __init__(self, name: str, run: str, queues: list[str], nodes: Callable[[], list[Any]],
                 writer: HistoryWriter, start_index: int, rate: float = DEFAULT_RATE, window: int = 100,
                 min_size: int = DEFAULT_MIN_SIZE, max_size: int = DEFAULT_MAX_SIZE,
                 seed: int = DEFAULT_SEED, publish_timeout: float = 15.0,
                 deadline: float = 3600.0) -> None:
        super().__init__(name=f"pub-{name}", daemon=True)
        self.pname = name
        self.run_id = run
        self.queues = queues
        self.nodes = nodes
        self.writer = writer
        self.index = start_index
        self.rate = rate
        self.window = window
        self.bodies = RandomBodies(min_size, max_size, seed=f"{seed}:{name}", pool_seed=seed)
        self.body_bytes = 0  # body bytes sent
        self.publish_timeout = publish_timeout
        self.deadline = time.monotonic() + deadline
        self.stop_ev = threading.Event()
        self.counts = {"ack": 0, "nack": 0, "timeout": 0, "connection-lost": 0}
        self.reconnects: list[str] = []
        self.error: str | None = None
        self._k = 0

    def stop(self) -> None:
        self.stop_ev.set()

    def _record(self, item: tuple[str, int, str, float], outcome: str, ts: float | None) -> None:
        mid, seq, node_id, send_ts = item
        self.counts[outcome] += 1
        self.writer.write({"type": "publish", "run": self.run_id, "msg_id": mid,
                           "publisher": self.pname, "seq": seq, "node": node_id,
                           "send_ts": send_ts, "outcome": outcome, "outcome_ts": ts})

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported via .error
            self.error = f"{type(exc).__name__}: {exc}"

    def _run(self) -> None:
        tokens, last_fill = 0.0, time.monotonic()
        while not self.stop_ev.is_set() and time.monotonic() < self.deadline:
            try:
                conn, node, self.index = _connect(self.nodes, self.index, self.stop_ev, self.deadline)
            except ConnLost as exc:
                if not self.stop_ev.is_set():
                    self.error = str(exc)
                return
            outstanding: dict[int, tuple[str, int, str, float]] = {}  # seq -> (mid, seq, node, send_ts)
            seq = 0
            try:
                conn.send_method(spec.Confirm.Select(), 1)
                conn.expect(spec.Confirm.SelectOk, timeout=5.0)
                while True:
                    now = time.monotonic()
                    tokens = min(self.window, tokens + (now - last_fill) * self.rate)
                    last_fill = now
                    if self.stop_ev.is_set():
                        if not outstanding:
                            conn.close()
                            return
                    else:
                        out = bytearray()
                        while tokens >= 1 and not conn.blocked and len(outstanding) < self.window:
                            tokens -= 1
                            self._k += 1
                            mid = f"{self.pname}-{self._k}"
                            queue = self.queues[self._k % len(self.queues)]
                            props = spec.Basic.Properties(delivery_mode=2, message_id=mid)
                            body = self.bodies.make(self.pname, self._k)
                            seq += 1
                            outstanding[seq] = (mid, seq, node.node_id, time.time())
                            out += pframe.marshal(spec.Basic.Publish(exchange="", routing_key=queue), 1)
                            out += pframe.marshal(pheader.ContentHeader(0, len(body), props), 1)
                            out += body_frames(1, body, conn.frame_max)
                            self.body_bytes += len(body)
                            if len(out) >= 256 * 1024:
                                conn.send(bytes(out))
                                out.clear()
                        if out:
                            conn.send(bytes(out))
                    if conn.fill(0.02):
                        ts = time.time()
                        for _ch, v in conn.frames():
                            if isinstance(v, spec.Basic.Ack | spec.Basic.Nack):
                                tags = confirmed_tags(outstanding, v)
                                outcome = "ack" if isinstance(v, spec.Basic.Ack) else "nack"
                                for t in sorted(tags):
                                    item = outstanding.pop(t, None)
                                    if item is not None:
                                        self._record(item, outcome, ts)
                    if outstanding:
                        oldest = min(outstanding)
                        if time.time() - outstanding[oldest][3] > self.publish_timeout:
                            ts = time.time()
                            for t in sorted(outstanding):
                                self._record(outstanding[t], "timeout", ts)
                            outstanding.clear()
                            raise ConnLost(f"no outcome within {self.publish_timeout}s")
            except (ConnLost, OSError) as exc:
                conn.close()
                ts = time.time()
                for t in sorted(outstanding):
                    self._record(outstanding[t], "connection-lost", ts)
                self.reconnects.append(f"{node.node_id}: {exc}")
                self.index += 1  # next node first
                self.stop_ev.wait(0.1)


class Consumer(threading.Thread):
    def __init__(self, name: str, run: str, queue: str, nodes: Callable[[], list[Any]],
                 writer: HistoryWriter, start_index: int, nack_ratio: float = 0.05,
                 crash_every: int = 0, prefetch: int = 20, seed: int = 0) -> None:
        super().__init__(name=f"con-{name}", daemon=True)
        self.cname = name
        self.run_id = run
        self.queue = queue
        self.nodes = nodes
        self.writer = writer
        self.index = start_index
        self.nack_ratio = nack_ratio
        self.crash_every = crash_every
        self.prefetch = prefetch
        self.rng = random.Random(seed)
        self.stop_ev = threading.Event()
        self.counts = {"deliver": 0, "ack": 0, "nack-requeue": 0, "crash": 0, "corrupted": 0}
        self.body_bytes = 0  # body bytes received
        self.reconnects: list[str] = []
        self.error: str | None = None
        self.deadline = time.monotonic() + 3600

    def stop(self) -> None:
        self.stop_ev.set()

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001
            self.error = f"{type(exc).__name__}: {exc}"

    def _ev(self, typ: str, **kw: Any) -> None:
        self.writer.write({"type": typ, "run": self.run_id, **kw})

    def _run(self) -> None:
        since_crash = 0
        while not self.stop_ev.is_set():
            try:
                conn, node, self.index = _connect(self.nodes, self.index, self.stop_ev, self.deadline)
            except ConnLost:
                return
            held: list[tuple[int, str]] = []
            holding = False
            try:
                stash: list[tuple[int, Any]] = []
                conn.send_method(spec.Basic.Qos(prefetch_count=self.prefetch), 1)
                _expect(conn, spec.Basic.QosOk, stash)
                conn.send_method(spec.Basic.Consume(queue=self.queue, consumer_tag=self.cname), 1)
                _expect(conn, spec.Basic.ConsumeOk, stash)
                cur: dict[str, Any] | None = None
                while not self.stop_ev.is_set():
                    if not stash and not conn.fill(0.1):
                        continue
                    frames, stash = stash + conn.frames(), []
                    for _ch, v in frames:
                        if isinstance(v, spec.Basic.Deliver):
                            cur = {"tag": v.delivery_tag, "red": bool(v.redelivered), "body": b"",
                                   "size": None, "mid": None}
                        elif isinstance(v, pheader.ContentHeader) and cur is not None:
                            cur["size"] = v.body_size
                            cur["mid"] = v.properties.message_id
                        elif isinstance(v, ContentBody) and cur is not None:
                            cur["body"] += v.value
                        elif isinstance(v, spec.Basic.Cancel):
                            raise ConnLost("consumer cancelled by the broker")
                        else:
                            continue
                        if cur is None or cur["size"] is None or len(cur["body"]) < cur["size"]:
                            continue
                        mid, bad = check_body(cur["body"], cur["size"], cur["mid"])
                        extra = _corrupt_detail(cur["body"], cur["size"]) if bad else {"corrupted": False}
                        tag, red = cur["tag"], cur["red"]
                        self.body_bytes += len(cur["body"])
                        cur = None
                        now = time.time()
                        self.counts["deliver"] += 1
                        self.counts["corrupted"] += bad
                        self._ev("deliver", msg_id=mid, consumer=self.cname, node=node.node_id,
                                 redelivered=red, ts=now, phase="workload", **extra)
                        since_crash += 1
                        if self.crash_every and since_crash >= self.crash_every:
                            holding = True
                        if holding:
                            held.append((tag, mid))
                            if len(held) >= min(5, self.prefetch):
                                raise _Crash()
                            continue
                        if self.rng.random() < self.nack_ratio:
                            conn.send_method(spec.Basic.Nack(delivery_tag=tag, multiple=False,
                                                             requeue=True), 1)
                            action = "nack-requeue"
                        else:
                            conn.send_method(spec.Basic.Ack(delivery_tag=tag), 1)
                            action = "ack"
                        self.counts[action] += 1
                        self._ev("settle", msg_id=mid, consumer=self.cname, node=node.node_id,
                                 ts=time.time(), action=action)
                # clean stop: everything delivered so far is settled; close properly
                try:
                    conn.send_method(spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)
                    _expect(conn, spec.Connection.CloseOk, [], timeout=2.0)
                except (ConnLost, OSError):
                    pass
                conn.close()
                return
            except _Crash:
                conn.sock.close()  # die holding `held`, unacked
                ts = time.time()
                for _tag, mid in held:
                    self.counts["crash"] += 1
                    self._ev("settle", msg_id=mid, consumer=self.cname, node=node.node_id, ts=ts,
                             action="crash")
                since_crash = 0
                self.reconnects.append(f"{node.node_id}: crashed holding {len(held)}")
                self.index += 1
                self.stop_ev.wait(0.2)
            except (ConnLost, OSError) as exc:
                conn.close()
                ts = time.time()
                for _tag, mid in held:
                    self.counts["crash"] += 1
                    self._ev("settle", msg_id=mid, consumer=self.cname, node=node.node_id, ts=ts,
                             action="crash")
                self.reconnects.append(f"{node.node_id}: {exc}")
                self.index += 1
                self.stop_ev.wait(0.2)


class _Crash(Exception):
    pass


def queue_depth(node: Any, queue: str, timeout: float = 5.0) -> tuple[int, int]:
    """(ready messages, consumers) of `queue` (passive queue.declare)."""
    conn = RawConn(node.host, node.amqp_port, node.user, node.password, timeout=timeout)
    try:
        conn.send_method(spec.Queue.Declare(queue=queue, passive=True), 1)
        _, ok = conn.expect(spec.Queue.DeclareOk, timeout=timeout)
        return int(ok.message_count), int(ok.consumer_count)
    finally:
        conn.close()


def declare_queues(node: Any, queues: list[str], timeout: float = 10.0) -> None:
    conn = RawConn(node.host, node.amqp_port, node.user, node.password, timeout=timeout)
    try:
        for q in queues:
            conn.send_method(spec.Queue.Declare(queue=q, durable=True), 1)
            conn.expect(spec.Queue.DeclareOk, timeout=timeout)
    finally:
        conn.close()


def drain_queue(run: str, node: Any, queue: str, writer: HistoryWriter, idle: float = 3.0,
                min_time: float = 6.0, timeout: float = 180.0, prefetch: int = 500) -> int:
    """Consume `queue` on `node` (manual acks, batched) until nothing arrived for `idle`
    seconds, at least `min_time` passed and the queue reports 0 ready; every delivery is
    recorded with phase "drain". Returns the number of deliveries."""
    conn = RawConn(node.host, node.amqp_port, node.user, node.password, timeout=10.0)
    n = 0
    t0 = last = time.monotonic()
    try:
        stash: list[tuple[int, Any]] = []
        conn.send_method(spec.Basic.Qos(prefetch_count=prefetch), 1)
        _expect(conn, spec.Basic.QosOk, stash)
        conn.send_method(spec.Basic.Consume(queue=queue, consumer_tag=f"drain-{queue}"), 1)
        _expect(conn, spec.Basic.ConsumeOk, stash)
        cur: dict[str, Any] | None = None
        last_tag, unacked = 0, 0
        while True:
            now = time.monotonic()
            if now - t0 > timeout:
                raise AssertionError(f"drain of {queue} on {node.node_id} not done in {timeout}s ({n} received)")
            if stash or conn.fill(0.1):
                frames, stash = stash + conn.frames(), []
                for _ch, v in frames:
                    if isinstance(v, spec.Basic.Deliver):
                        cur = {"tag": v.delivery_tag, "red": bool(v.redelivered), "body": b"",
                               "size": None, "mid": None}
                        continue
                    if isinstance(v, pheader.ContentHeader) and cur is not None:
                        cur["size"], cur["mid"] = v.body_size, v.properties.message_id
                    elif isinstance(v, ContentBody) and cur is not None:
                        cur["body"] += v.value
                    else:
                        continue
                    if cur is None or cur["size"] is None or len(cur["body"]) < cur["size"]:
                        continue
                    mid, bad = check_body(cur["body"], cur["size"], cur["mid"])
                    extra = _corrupt_detail(cur["body"], cur["size"]) if bad else {"corrupted": False}
                    writer.write({"type": "deliver", "run": run, "msg_id": mid, "consumer": f"drain-{queue}",
                                  "node": node.node_id, "redelivered": cur["red"], "ts": time.time(),
                                  "phase": "drain", **extra})
                    last_tag, unacked, n = cur["tag"], unacked + 1, n + 1
                    cur = None
                    last = time.monotonic()
                if unacked >= prefetch // 4:
                    conn.send_method(spec.Basic.Ack(delivery_tag=last_tag, multiple=True), 1)
                    unacked = 0
                continue
            if unacked:
                conn.send_method(spec.Basic.Ack(delivery_tag=last_tag, multiple=True), 1)
                unacked = 0
            if now - last > idle and now - t0 > min_time:
                # empty, and no consumer but us: every other consumer's unacked
                # deliveries have been requeued (and would have reached us)
                ready, consumers = queue_depth(node, queue)
                if ready == 0 and consumers <= 1:
                    break
                last = now
        return n
    finally:
        conn.close()


class Workload:
    """Publishers and consumers over the nodes, writing RUN_DIR/{pub,con}-*.jsonl."""

    def __init__(self, run_dir: Path, run_id: str, nodes: Callable[[], list[Any]],
                 queues: list[str] | None = None, publishers: int = 3, consumers: int = 3,
                 rate: float = DEFAULT_RATE, window: int = 100, publish_timeout: float = 15.0,
                 nack_ratio: float = 0.05, crash_every: int = 150,
                 min_size: int = DEFAULT_MIN_SIZE, max_size: int = DEFAULT_MAX_SIZE,
                 seed: int = DEFAULT_SEED, size: int | None = None,
                 pin_publishers_to: str | None = None) -> None:
        """rate: msg/s per publisher; bodies of min_size..max_size bytes (log-uniform,
        from `seed`); size: a fixed body size instead (min_size = max_size = size)."""
        if size is not None:
            min_size = max_size = size
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.nodes = nodes
        self.queues = queues or ["chaos-a", "chaos-b"]
        self.writers: list[HistoryWriter] = []
        self.publishers: list[Publisher] = []
        self.consumers: list[Consumer] = []
        pub_nodes = nodes
        if pin_publishers_to is not None:
            def pub_nodes() -> list[Any]:  # the pinned node first, the others as fallback
                ns = list(nodes())
                return sorted(ns, key=lambda n: n.node_id != pin_publishers_to)
        for i in range(publishers):
            w = self._writer(f"pub-p{i + 1}.jsonl")
            self.publishers.append(Publisher(f"p{i + 1}", run_id, self.queues, pub_nodes, w,
                                             0 if pin_publishers_to else i, rate=rate,
                                             window=window, min_size=min_size, max_size=max_size,
                                             seed=seed, publish_timeout=publish_timeout))
        for i in range(consumers):
            w = self._writer(f"con-c{i + 1}.jsonl")
            crasher = i == consumers - 1
            self.consumers.append(Consumer(f"c{i + 1}", run_id, self.queues[i % len(self.queues)],
                                           nodes, w, i + 1, nack_ratio=nack_ratio,
                                           crash_every=crash_every if crasher else 0, seed=i))
        self.started = 0.0

    def _writer(self, name: str) -> HistoryWriter:
        w = HistoryWriter(self.run_dir / name)
        self.writers.append(w)
        return w

    def start(self) -> None:
        self.started = time.time()
        for t in [*self.consumers, *self.publishers]:
            t.start()

    def stop_publishers(self, timeout: float = 60.0) -> None:
        for p in self.publishers:
            p.stop()
        for p in self.publishers:
            p.join(timeout)

    def stop_consumers(self, timeout: float = 30.0) -> None:
        for c in self.consumers:
            c.stop()
        for c in self.consumers:
            c.join(timeout)

    def drain(self, node: Any, idle: float = 3.0, min_time: float = 6.0) -> int:
        w = self._writer("drain.jsonl")
        n = 0
        for q in self.queues:
            n += drain_queue(self.run_id, node, q, w, idle=idle, min_time=min_time)
        w.write({"type": "drain_done", "run": self.run_id, "ts": time.time()})
        return n

    def close(self) -> None:
        for w in self.writers:
            w.close()

    def summary(self) -> dict[str, Any]:
        pubs = {p.pname: dict(p.counts, body_bytes=p.body_bytes, reconnects=len(p.reconnects),
                              error=p.error, alive=p.is_alive()) for p in self.publishers}
        cons = {c.cname: dict(c.counts, body_bytes=c.body_bytes, reconnects=len(c.reconnects),
                              error=c.error, alive=c.is_alive()) for c in self.consumers}
        return {"publishers": pubs, "consumers": cons}
