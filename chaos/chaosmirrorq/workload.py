"""The chaos workload: publishers with streaming confirms and consumers with manual
acks spread over the nodes and over queues of several kinds, each client writing its own
JSONL history file in the format of chaos/HISTORY.md; then a drain of every queue (phase
"drain") and `drain_done`.

    plan = queue_plan(["chaos-a", "chaos-b"], kinds=KINDS)
    declare_plan(node, plan)
    wl = Workload(run_dir, run_id, nodes=lambda: cluster.nodes, plan=plan, windows=[None, 100, 100])
    wl.start(); ...faults...; wl.stop_and_drain()

Publishers talk raw AMQP (pamqp frames over harness.amqp.RawConn) so that every
publish attempt gets exactly one recorded outcome: `ack` / `nack` from the broker,
`timeout` (no outcome within `publish_timeout`: the connection is dropped and the
publisher moves on) or `connection-lost` (the socket died with it outstanding).
Each attempt has its own msg_id (`<publisher>-<k>`, in message_id; the body starts with
`<publisher>:<k>:`); nothing is republished, so a `recovered` message is one whose
uncertain publish made it. A publisher either keeps at most `window` confirms
outstanding or has no window (None: paced only by its rate, any number outstanding).

Queues (queue_plan): the classic durable queues, plus by default
- `ttl`: x-message-ttl (3 s) dead-lettering (x-dead-letter-exchange `chaos-dlx`) into
  the `dlx` queue `chaos-dlq`, which is consumed and drained too. Its one consumer stalls
  now and then for longer than the TTL, so some messages expire: they are delivered from
  `chaos-dlq` with the same message_id (delivered, not lost);
- `maxlen`: x-max-length (20) with x-overflow reject-publish; its one consumer stalls now
  and then, the queue fills up and publishes are nacked (outcome `nack`: not confirmed,
  so never counted as lost);
- `priority`: x-max-priority 9, publishes with random priorities 0-9, two consumers;
- `sac`: a quorum queue with x-single-active-consumer, two consumers (one active).
Publishers spread their messages over the queues by weight (each classic queue 3, each
other kind 1: 60 % on the classic queues with the default plan).

Bodies are what real payloads look like to the broker: random bytes that do not compress,
of mixed sizes (log-uniform between `min_size` and `max_size`, default 1 KiB..256 KiB, from
`seed`; bodies above frame_max go out as several body frames), with a crc32 of the content
after the id (harness.body.RandomBodies / make_body's format). Every consumer and
the drain verify each body (checksum, declared size, id against message_id); a damaged one
is recorded with `corrupted: true` on its `deliver` event, which the history checker counts
as corrupted (a failure like lost).

Consumers: manual acks, ~`nack_ratio` nack-requeue, and "crashers" that now and then hold
a few deliveries unacked and close their socket (settle action `crash`): the last classic
consumer and one consumer of the ttl, priority and sac queues. Every client reconnects to
the next node when its node fails (kill, pause, removal).

`nodes` is a callable returning objects with `node_id`, `host`, `amqp_port` (ClusterNode,
or Endpoint for a cluster reached through addresses, e.g. a Kubernetes Service).
"""
from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from harness.amqp import ConnLost, RawConn
from harness.body import RandomBodies, body_frames, body_id, body_ok
from harness.publisher import confirmed_tags

# msg/s per publisher (3 publishers: 180 msg/s, ~8.5 MB/s of 1-256 KiB bodies, mean
# ~46 KiB), about 70 % of what a 3-node cluster sustained on the 2-core development
# machine with the default queue plan: 90 msg/s per publisher (270 msg/s, 13 MB/s) with
# the consumers keeping up; at 100 the confirms fell behind the offered rate and the
# consumers behind the confirms (chaos/README.md, "Workload"). The rest is room for
# catch-up after a fault.
DEFAULT_RATE = 60.0
DEFAULT_MIN_SIZE = 1024
DEFAULT_MAX_SIZE = 256 * 1024
DEFAULT_SEED = 1
DEFAULT_WINDOW = 100

# queue kinds besides the classic queues (queue_plan); "ttl" brings its DLX queue
KINDS = ("ttl", "maxlen", "priority", "sac")
DEFAULT_TTL_MS = 3000
DEFAULT_MAX_LENGTH = 20
DEFAULT_MAX_PRIORITY = 9
DLX_EXCHANGE = "chaos-dlx"
DLX_ROUTING_KEY = "dead"
CLASSIC_WEIGHT = 3  # each classic queue; every other kind 1


@dataclass(frozen=True)
class ConsumerSpec:
    """One consumer of a queue: crash_every > 0 makes it a crasher (every that many
    deliveries it holds 5 unacked and closes its socket); stall_every > 0 makes it stop
    reading for stall_seconds about every stall_every seconds (a slow downstream)."""
    crash_every: int = 0
    stall_every: float = 0.0
    stall_seconds: float = 0.0
    prefetch: int = 20


@dataclass(frozen=True)
class QueueSpec:
    """A queue of the plan: its declare arguments, its share of the publishes (`weight`,
    0 = never published to: the DLX queue), `priorities` (publish with a random priority
    0..n), its consumers, the exchange/key it is bound with (the DLX queue), and the
    queues whose drain must finish before its own (the DLX queue after the TTL queue)."""
    name: str
    kind: str = "classic"
    arguments: dict[str, Any] = field(default_factory=dict)
    weight: int = CLASSIC_WEIGHT
    priorities: int = 0
    consumers: tuple[ConsumerSpec, ...] = ()
    bind: tuple[str, str] | None = None
    drain_after: tuple[str, ...] = ()


def parse_kinds(spec_: str | Sequence[str] | None) -> list[str]:
    """CHAOS_QUEUE_KINDS: comma-separated kinds of KINDS (default: all of them);
    "classic" or "none": the classic queues only."""
    if spec_ is None:
        return list(KINDS)
    items = spec_.split(",") if isinstance(spec_, str) else list(spec_)
    kinds = [x.strip().lower() for x in items if x.strip()]
    if isinstance(spec_, str) and not kinds:
        return list(KINDS)
    if kinds in (["none"], ["classic"]):
        return []
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown queue kind(s) {bad}: expected some of {', '.join(KINDS)} (or classic)")
    return [k for k in KINDS if k in kinds]


def parse_windows(spec_: str | Sequence[Any] | None, publishers: int,
                  window: int = DEFAULT_WINDOW) -> list[int | None]:
    """Each publisher's window (None: no window, only the rate paces it). spec: e.g.
    "none,100,100" (CHAOS_WINDOWS; `none`, `unbounded`, `inf` or 0 = no window; a
    shorter list repeats); default (None or ""): the first publisher has no window, the
    others `window`."""
    if spec_ is None or (isinstance(spec_, str) and not spec_.strip()):
        return [None if i == 0 else window for i in range(publishers)]
    items = spec_.split(",") if isinstance(spec_, str) else list(spec_)
    out: list[int | None] = []
    for x in items:
        if x is None:
            out.append(None)
            continue
        t = str(x).strip().lower()
        if not t:
            continue
        if t in ("none", "unbounded", "inf", "no", "null"):
            out.append(None)
            continue
        n = int(float(t))
        if n < 0:
            raise ValueError(f"window {x!r} < 0")
        out.append(n or None)
    if not out:
        raise ValueError(f"no window in {spec_!r}")
    return [out[i % len(out)] for i in range(publishers)]


def queue_plan(classic: Sequence[str] = ("chaos-a", "chaos-b"), kinds: Sequence[str] = KINDS,
               consumers: int = 3, crash_every: int = 150, ttl_ms: int = DEFAULT_TTL_MS,
               max_length: int = DEFAULT_MAX_LENGTH, max_priority: int = DEFAULT_MAX_PRIORITY,
               prefix: str = "chaos-") -> list[QueueSpec]:
    """The queues of a run. `consumers` consumers spread over the classic queues (the
    last one a crasher, when crash_every); each other kind has its own consumers (see
    the module doc). The stalls are sized from the TTL: the ttl consumer stalls longer
    than the TTL (so messages expire), the maxlen consumer long enough for the queue to
    fill up under load."""
    kinds = list(kinds)
    plan: list[QueueSpec] = []
    n_classic = len(classic)
    per: list[list[ConsumerSpec]] = [[] for _ in classic]
    for i in range(consumers if n_classic else 0):
        crasher = crash_every and i == consumers - 1
        per[i % n_classic].append(ConsumerSpec(crash_every=crash_every if crasher else 0))
    for q, cs in zip(classic, per, strict=True):
        plan.append(QueueSpec(q, "classic", {}, CLASSIC_WEIGHT, consumers=tuple(cs)))
    ttl_s = ttl_ms / 1000.0
    if "ttl" in kinds:
        ttl_q, dlq = f"{prefix}ttl", f"{prefix}dlq"
        plan.append(QueueSpec(ttl_q, "ttl", {"x-message-ttl": int(ttl_ms),
                                             "x-dead-letter-exchange": DLX_EXCHANGE,
                                             "x-dead-letter-routing-key": DLX_ROUTING_KEY}, 1,
                              consumers=(ConsumerSpec(crash_every=crash_every,
                                                      stall_every=max(4.0, 2.5 * ttl_s),
                                                      stall_seconds=ttl_s + 1.5),)))
        plan.append(QueueSpec(dlq, "dlx", {}, 0, consumers=(ConsumerSpec(),),
                              bind=(DLX_EXCHANGE, DLX_ROUTING_KEY), drain_after=(ttl_q,)))
    if "maxlen" in kinds:
        plan.append(QueueSpec(f"{prefix}maxlen", "maxlen", {"x-max-length": int(max_length),
                                                            "x-overflow": "reject-publish"}, 1,
                              consumers=(ConsumerSpec(stall_every=6.0, stall_seconds=2.5),)))
    if "priority" in kinds:
        plan.append(QueueSpec(f"{prefix}prio", "priority", {"x-max-priority": int(max_priority)}, 1,
                              priorities=int(max_priority),
                              consumers=(ConsumerSpec(), ConsumerSpec(crash_every=crash_every))))
    if "sac" in kinds:
        # x-delivery-limit -1: a quorum queue drops (or dead-letters) a message after
        # 20 failed deliveries by default (RabbitMQ 4.3, S27); crashing consumers
        # return messages, and the checker must see every confirmed one delivered
        plan.append(QueueSpec(f"{prefix}sac", "sac", {"x-queue-type": "quorum",
                                                      "x-single-active-consumer": True,
                                                      "x-delivery-limit": -1}, 1,
                              consumers=(ConsumerSpec(crash_every=crash_every), ConsumerSpec())))
    return plan


def publish_cycle(plan: Sequence[QueueSpec]) -> list[QueueSpec]:
    """The queues a publisher sends to in turn: each queue `weight` times per cycle,
    spread out (smooth weighted round robin: no queue twice in a row unless it must)."""
    pubs = [q for q in plan if q.weight > 0]
    total = sum(q.weight for q in pubs)
    cur = [0] * len(pubs)
    out: list[QueueSpec] = []
    for _ in range(total):
        for i, q in enumerate(pubs):
            cur[i] += q.weight
        best = max(range(len(pubs)), key=lambda i: cur[i])
        cur[best] -= total
        out.append(pubs[best])
    return out


def plan_summary(plan: Sequence[QueueSpec]) -> list[dict[str, Any]]:
    """The plan as JSON (run.json "workload" -> "queues")."""
    return [{"name": q.name, "kind": q.kind, "arguments": q.arguments, "weight": q.weight,
             "consumers": [asdict(c) for c in q.consumers],
             **({"bind": list(q.bind)} if q.bind else {}),
             **({"drain_after": list(q.drain_after)} if q.drain_after else {})} for q in plan]


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


@dataclass(frozen=True, slots=True)
class Delivered:
    """One whole delivery, its body checked (check_body)."""

    tag: int
    redelivered: bool
    msg_id: str
    corrupted: bool
    body_len: int
    extra: dict[str, Any]  # for the history: corrupted (and its detail), dead_lettered


class DeliveryAssembler:
    """Basic.Deliver, its content header and body frames -> whole deliveries (the
    workload's consumers and the drain read the same way)."""

    def __init__(self) -> None:
        self._cur: dict[str, Any] | None = None

    def feed(self, v: Any) -> Delivered | None | bool:
        """A delivery once its body is whole; None while one is incomplete; False
        for a frame that is not part of a delivery."""
        cur = self._cur
        if isinstance(v, spec.Basic.Deliver):
            self._cur = {"tag": v.delivery_tag, "red": bool(v.redelivered), "body": b"",
                         "size": None, "mid": None, "dead": None}
            return None
        if isinstance(v, pheader.ContentHeader) and cur is not None:
            cur["size"], cur["mid"] = v.body_size, v.properties.message_id
            cur["dead"] = death_reason(v.properties)
        elif isinstance(v, ContentBody) and cur is not None:
            cur["body"] += v.value
        else:
            return False
        if cur["size"] is None or len(cur["body"]) < cur["size"]:
            return None
        self._cur = None
        mid, bad = check_body(cur["body"], cur["size"], cur["mid"])
        extra = _corrupt_detail(cur["body"], cur["size"]) if bad else {"corrupted": False}
        if cur["dead"] is not None:
            extra["dead_lettered"] = cur["dead"]
        return Delivered(cur["tag"], cur["red"], mid, bad, len(cur["body"]), extra)


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
    def __init__(self, name: str, run: str, queues: Sequence[str | QueueSpec],
                 nodes: Callable[[], list[Any]], writer: HistoryWriter, start_index: int,
                 rate: float = DEFAULT_RATE, window: int | None = DEFAULT_WINDOW,
                 min_size: int = DEFAULT_MIN_SIZE, max_size: int = DEFAULT_MAX_SIZE,
                 seed: int = DEFAULT_SEED, publish_timeout: float = 15.0,
                 deadline: float = 3600.0) -> None:
        """queues: queue names (the default exchange, equal shares) or QueueSpecs (by
        weight, see publish_cycle); window None: no limit on outstanding confirms."""
        super().__init__(name=f"pub-{name}", daemon=True)
        self.pname = name
        self.run_id = run
        specs = [q if isinstance(q, QueueSpec) else QueueSpec(q) for q in queues]
        self.cycle = publish_cycle(specs)
        # start each publisher at another place of the cycle
        off = start_index % len(self.cycle) if self.cycle else 0
        self.cycle = self.cycle[off:] + self.cycle[:off]
        self.queues = [q.name for q in specs]
        self.nodes = nodes
        self.writer = writer
        self.index = start_index
        self.rate = rate
        self.window = window if window else None
        self.bodies = RandomBodies(min_size, max_size, seed=f"{seed}:{name}", pool_seed=seed)
        self.rng = random.Random(f"{seed}:{name}:priority")
        self.body_bytes = 0  # body bytes sent
        self.publish_timeout = publish_timeout
        self.deadline = time.monotonic() + deadline
        self.stop_ev = threading.Event()
        self.counts = {"ack": 0, "nack": 0, "timeout": 0, "connection-lost": 0}
        self.by_queue: dict[str, dict[str, int]] = {}
        self.max_outstanding = 0
        self.reconnects: list[str] = []
        self.error: str | None = None
        self._k = 0
        self._first = True

    def stop(self) -> None:
        self.stop_ev.set()

    def _record(self, item: tuple[str, int, str, float, str, int], outcome: str, ts: float | None) -> None:
        mid, seq, node_id, send_ts, queue, size = item
        self.counts[outcome] += 1
        qc = self.by_queue.setdefault(queue, {})
        qc[outcome] = qc.get(outcome, 0) + 1
        ev = {"type": "publish", "run": self.run_id, "msg_id": mid, "publisher": self.pname,
              "seq": seq, "node": node_id, "send_ts": send_ts, "outcome": outcome,
              "outcome_ts": ts, "queue": queue, "size": size}
        if self._first:  # the publisher's settings, once (chaos/HISTORY.md)
            ev["window"] = self.window
            ev["rate"] = self.rate
            self._first = False
        self.writer.write(ev)

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported via .error
            self.error = f"{type(exc).__name__}: {exc}"

    def _run(self) -> None:
        tokens, last_fill = 0.0, time.monotonic()
        burst = float(self.window or DEFAULT_WINDOW)  # token bucket depth
        limit = self.window or float("inf")
        while not self.stop_ev.is_set() and time.monotonic() < self.deadline:
            try:
                conn, node, self.index = _connect(self.nodes, self.index, self.stop_ev, self.deadline)
            except ConnLost as exc:
                if not self.stop_ev.is_set():
                    self.error = str(exc)
                return
            # seq -> (mid, seq, node, send_ts, queue, body size), in seq order
            outstanding: dict[int, tuple[str, int, str, float, str, int]] = {}
            seq = 0
            try:
                conn.send_method(spec.Confirm.Select(), 1)
                conn.expect(spec.Confirm.SelectOk, timeout=5.0)
                while True:
                    now = time.monotonic()
                    tokens = min(burst, tokens + (now - last_fill) * self.rate)
                    last_fill = now
                    if self.stop_ev.is_set():
                        if not outstanding:
                            conn.close()
                            return
                    else:
                        out = bytearray()
                        while tokens >= 1 and not conn.blocked and len(outstanding) < limit:
                            tokens -= 1
                            self._k += 1
                            mid = f"{self.pname}-{self._k}"
                            q = self.cycle[self._k % len(self.cycle)]
                            props = spec.Basic.Properties(
                                delivery_mode=2, message_id=mid,
                                priority=self.rng.randint(0, q.priorities) if q.priorities else None)
                            body = self.bodies.make(self.pname, self._k)
                            seq += 1
                            outstanding[seq] = (mid, seq, node.node_id, time.time(), q.name, len(body))
                            out += pframe.marshal(spec.Basic.Publish(exchange="", routing_key=q.name), 1)
                            out += pframe.marshal(pheader.ContentHeader(0, len(body), props), 1)
                            out += body_frames(1, body, conn.frame_max)
                            self.body_bytes += len(body)
                            if len(out) >= 256 * 1024:
                                conn.send(bytes(out))
                                out.clear()
                        if out:
                            conn.send(bytes(out))
                        self.max_outstanding = max(self.max_outstanding, len(outstanding))
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
                        oldest = next(iter(outstanding.values()))
                        if time.time() - oldest[3] > self.publish_timeout:
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


def death_reason(props: Any) -> str | None:
    """The reason of a delivered message's latest dead-lettering (x-death), or None."""
    headers = getattr(props, "headers", None) or {}
    deaths = headers.get("x-death") if isinstance(headers, dict) else None
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        r = deaths[0].get("reason")
        return r.decode() if isinstance(r, bytes) else str(r) if r is not None else "unknown"
    return None


class WorkloadConsumer(threading.Thread):
    def __init__(self, name: str, run: str, queue: str, nodes: Callable[[], list[Any]],
                 writer: HistoryWriter, start_index: int, nack_ratio: float = 0.05,
                 crash_every: int = 0, prefetch: int = 20, seed: int = 0,
                 stall_every: float = 0.0, stall_seconds: float = 0.0) -> None:
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
        self.stall_every = stall_every
        self.stall_seconds = stall_seconds
        self.rng = random.Random(seed)
        self.stop_ev = threading.Event()
        self.counts = {"deliver": 0, "ack": 0, "nack-requeue": 0, "crash": 0, "corrupted": 0,
                       "dead-lettered": 0, "stalls": 0}
        self.body_bytes = 0  # body bytes received
        self.reconnects: list[str] = []
        self.error: str | None = None
        self.deadline = time.monotonic() + 3600
        self._next_stall = time.monotonic() + self._stall_gap()

    def _stall_gap(self) -> float:
        return self.stall_every * self.rng.uniform(0.8, 1.2) if self.stall_every > 0 else float("inf")

    def _maybe_stall(self) -> None:
        """A slow downstream: stop reading (deliveries up to the prefetch stay unacked,
        the rest waits in the queue: it expires, or fills a max-length queue)."""
        now = time.monotonic()
        if now < self._next_stall:
            return
        self.counts["stalls"] += 1
        self.stop_ev.wait(self.stall_seconds)
        self._next_stall = now + self._stall_gap()

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
                assembler = DeliveryAssembler()
                while not self.stop_ev.is_set():
                    if self.stall_every:
                        self._maybe_stall()
                    if not stash and not conn.fill(0.1):
                        continue
                    frames, stash = stash + conn.frames(), []
                    for _ch, v in frames:
                        d = assembler.feed(v)
                        if d is False and isinstance(v, spec.Basic.Cancel):
                            raise ConnLost("consumer cancelled by the broker")
                        if not isinstance(d, Delivered):
                            continue
                        if "dead_lettered" in d.extra:
                            self.counts["dead-lettered"] += 1
                        tag, mid = d.tag, d.msg_id
                        self.body_bytes += d.body_len
                        self.counts["deliver"] += 1
                        self.counts["corrupted"] += d.corrupted
                        self._ev("deliver", msg_id=mid, consumer=self.cname, node=node.node_id,
                                 redelivered=d.redelivered, ts=time.time(), phase="workload",
                                 queue=self.queue, **d.extra)
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


def declare_queues(node: Any, queues: Sequence[str | QueueSpec], timeout: float = 30.0) -> None:
    """Declare queue names (durable classic) or a plan's QueueSpecs (their arguments; the
    DLX exchange and the binding of the DLX queue)."""
    conn = RawConn(node.host, node.amqp_port, node.user, node.password, timeout=timeout)
    try:
        specs = [q if isinstance(q, QueueSpec) else QueueSpec(q) for q in queues]
        for x in sorted({q.bind[0] for q in specs if q.bind}):
            conn.send_method(spec.Exchange.Declare(exchange=x, exchange_type="direct", durable=True), 1)
            conn.expect(spec.Exchange.DeclareOk, timeout=timeout)
        for q in specs:
            conn.send_method(spec.Queue.Declare(queue=q.name, durable=True,
                                                arguments=dict(q.arguments) or None), 1)
            conn.expect(spec.Queue.DeclareOk, timeout=timeout)
            if q.bind:
                conn.send_method(spec.Queue.Bind(queue=q.name, exchange=q.bind[0], routing_key=q.bind[1]), 1)
                conn.expect(spec.Queue.BindOk, timeout=timeout)
    finally:
        conn.close()


declare_plan = declare_queues


def drain_queue(run: str, node: Any, queue: str, writer: HistoryWriter, idle: float = 3.0,
                min_time: float = 6.0, timeout: float = 180.0, prefetch: int = 500,
                after: Sequence[threading.Event] = ()) -> int:
    """Consume `queue` on `node` (manual acks, batched) until nothing arrived for `idle`
    seconds, at least `min_time` passed and, with the consumer cancelled, the queue
    reports 0 ready and no consumer; with `after` (events set when the drains of the
    queues that feed this one, e.g. through dead-lettering, are done) only once they are
    all set and then checked again. Every delivery is recorded with phase "drain".
    Returns the number of deliveries.

    Why cancel before checking: the broker hands a consumer more messages as its
    credit comes back, so a last batch can reach the socket while the check runs.
    The check used to read the depth on a second connection and then close this one
    with those deliveries unread in the socket: the close requeued them, nobody
    drained them, and the checker called them lost (14 messages in one kubelet
    leader-pod-kill run, delivered about 8 s late after a leader change). Every
    delivery to a consumer comes before its CancelOk, and the depth is then read on
    this channel after our acks, so nothing is left in flight."""
    conn = RawConn(node.host, node.amqp_port, node.user, node.password, timeout=10.0)
    tag = f"drain-{queue}"
    n = 0
    t0 = last = time.monotonic()
    upstream_done_at: float | None = None if after else t0
    assembler = DeliveryAssembler()
    last_tag, unacked = 0, 0

    def take(frames: list[tuple[int, Any]]) -> list[Any]:
        """Record the deliveries among `frames`; returns the other methods."""
        nonlocal last_tag, unacked, n, last
        others: list[Any] = []
        for _ch, v in frames:
            d = assembler.feed(v)
            if d is False:
                others.append(v)
            if not isinstance(d, Delivered):
                continue
            writer.write({"type": "deliver", "run": run, "msg_id": d.msg_id, "consumer": tag,
                          "node": node.node_id, "redelivered": d.redelivered, "ts": time.time(),
                          "phase": "drain", "queue": queue, **d.extra})
            last_tag, unacked, n = d.tag, unacked + 1, n + 1
            last = time.monotonic()
        return others

    def ack_all() -> None:
        nonlocal unacked
        if unacked:
            conn.send_method(spec.Basic.Ack(delivery_tag=last_tag, multiple=True), 1)
            unacked = 0

    def until(cls: type) -> Any:
        """Read (recording deliveries) until a `cls` method arrives."""
        deadline = time.monotonic() + 60.0
        while True:
            for v in take(conn.frames()):
                if isinstance(v, cls):
                    return v
            if time.monotonic() > deadline:
                raise AssertionError(f"drain of {queue} on {node.node_id}: no {cls.__name__} in 60 s")
            conn.fill(0.2)

    try:
        stash: list[tuple[int, Any]] = []
        conn.send_method(spec.Basic.Qos(prefetch_count=prefetch), 1)
        _expect(conn, spec.Basic.QosOk, stash)
        conn.send_method(spec.Basic.Consume(queue=queue, consumer_tag=tag), 1)
        _expect(conn, spec.Basic.ConsumeOk, stash)
        while True:
            now = time.monotonic()
            if now - t0 > timeout:
                raise AssertionError(f"drain of {queue} on {node.node_id} not done in {timeout}s ({n} received)")
            if upstream_done_at is None and all(e.is_set() for e in after):
                upstream_done_at = now
            if stash or conn.fill(0.1):
                frames, stash = stash + conn.frames(), []
                take(frames)
                if unacked >= prefetch // 4:
                    ack_all()
                continue
            ack_all()
            if (now - last > idle and now - t0 > min_time and upstream_done_at is not None
                    and now - upstream_done_at > min(idle, 1.0)):
                conn.send_method(spec.Basic.Cancel(consumer_tag=tag), 1)
                until(spec.Basic.CancelOk)
                ack_all()
                conn.send_method(spec.Queue.Declare(queue=queue, passive=True), 1)
                ok = until(spec.Queue.DeclareOk)
                # empty, and no consumer at all: every other consumer's unacked
                # deliveries have been requeued (and reached us)
                if ok.message_count == 0 and ok.consumer_count == 0:
                    break
                print(f"drain of {queue} on {node.node_id}: {ok.message_count} ready, "
                      f"{ok.consumer_count} consumer(s) after cancelling: consuming again",
                      file=sys.stderr, flush=True)
                conn.send_method(spec.Basic.Consume(queue=queue, consumer_tag=tag), 1)
                until(spec.Basic.ConsumeOk)
                last = time.monotonic()
        return n
    finally:
        conn.close()


class Workload:
    """Publishers and consumers over the nodes and the queues of a plan, writing
    RUN_DIR/{pub,con}-*.jsonl."""

    def __init__(self, run_dir: Path, run_id: str, nodes: Callable[[], list[Any]],
                 queues: list[str] | None = None, publishers: int = 3, consumers: int = 3,
                 rate: float = DEFAULT_RATE, window: int | None = DEFAULT_WINDOW,
                 publish_timeout: float = 15.0,
                 nack_ratio: float = 0.05, crash_every: int = 150,
                 min_size: int = DEFAULT_MIN_SIZE, max_size: int = DEFAULT_MAX_SIZE,
                 seed: int = DEFAULT_SEED, size: int | None = None,
                 pin_publishers_to: str | None = None, plan: list[QueueSpec] | None = None,
                 windows: Sequence[int | None] | None = None) -> None:
        """rate: msg/s per publisher; bodies of min_size..max_size bytes (log-uniform,
        from `seed`); size: a fixed body size instead (min_size = max_size = size).
        plan: the queues with their consumers (queue_plan); default: the classic
        `queues` only, `consumers` spread over them. windows: each publisher's window
        (None: none); default `window` for all."""
        if size is not None:
            min_size = max_size = size
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.nodes = nodes
        if plan is None:
            plan = queue_plan(queues or ["chaos-a", "chaos-b"], kinds=(), consumers=consumers,
                              crash_every=crash_every)
        self.plan = plan
        self.queues = [q.name for q in plan]
        if publishers and not any(q.weight > 0 for q in plan):
            raise ValueError("no queue to publish to")
        self.windows: list[int | None] = (list(windows) if windows is not None
                                          else [window] * publishers)
        if len(self.windows) < publishers:
            raise ValueError(f"{len(self.windows)} windows for {publishers} publishers")
        self.writers: list[HistoryWriter] = []
        self.publishers: list[Publisher] = []
        self.consumers: list[WorkloadConsumer] = []
        pub_nodes = nodes
        if pin_publishers_to is not None:
            def pub_nodes() -> list[Any]:  # the pinned node first, the others as fallback
                ns = list(nodes())
                return sorted(ns, key=lambda n: n.node_id != pin_publishers_to)
        for i in range(publishers):
            w = self._writer(f"pub-p{i + 1}.jsonl")
            self.publishers.append(Publisher(f"p{i + 1}", run_id, plan, pub_nodes, w,
                                             0 if pin_publishers_to else i, rate=rate,
                                             window=self.windows[i], min_size=min_size, max_size=max_size,
                                             seed=seed, publish_timeout=publish_timeout))
        k = 0
        for q in plan:
            for cs in q.consumers:
                k += 1
                w = self._writer(f"con-c{k}.jsonl")
                self.consumers.append(WorkloadConsumer(f"c{k}", run_id, q.name, nodes, w, k,
                                               nack_ratio=nack_ratio, crash_every=cs.crash_every,
                                               prefetch=cs.prefetch, seed=k - 1,
                                               stall_every=cs.stall_every,
                                               stall_seconds=cs.stall_seconds))
        self.started = 0.0
        self.drained: dict[str, int] = {}  # per queue, after drain()

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
        """Drain every queue of the plan at once (one connection each); a queue fed by
        another (the DLX queue by the TTL queue) finishes only after that one's drain:
        then nothing can be dead-lettered into it any more."""
        w = self._writer("drain.jsonl")
        done = {q.name: threading.Event() for q in self.plan}
        counts: dict[str, int] = {}
        errors: list[str] = []

        def one(q: QueueSpec) -> None:
            try:
                counts[q.name] = drain_queue(self.run_id, node, q.name, w, idle=idle, min_time=min_time,
                                             after=[done[x] for x in q.drain_after if x in done])
            except Exception as exc:  # noqa: BLE001 - raised below
                errors.append(f"{q.name}: {type(exc).__name__}: {exc}")
            finally:
                done[q.name].set()

        threads = [threading.Thread(target=one, args=(q,), name=f"drain-{q.name}", daemon=True)
                   for q in self.plan]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.drained = counts
        if errors:
            raise AssertionError("drain failed: " + "; ".join(errors))
        w.write({"type": "drain_done", "run": self.run_id, "ts": time.time()})
        return sum(counts.values())

    def close(self) -> None:
        for w in self.writers:
            w.close()

    def config(self) -> dict[str, Any]:
        """What the run was made of (run.json "workload")."""
        p0 = self.publishers[0] if self.publishers else None
        return {"publishers": {p.pname: {"window": p.window, "rate": p.rate} for p in self.publishers},
                "bodies": ({"min_size": p0.bodies.min_size, "max_size": p0.bodies.max_size}
                           if p0 else None),
                "queues": plan_summary(self.plan),
                "consumers": {c.cname: {"queue": c.queue, "crash_every": c.crash_every,
                                        "stall_every": c.stall_every, "stall_seconds": c.stall_seconds,
                                        "prefetch": c.prefetch} for c in self.consumers}}

    def summary(self) -> dict[str, Any]:
        pubs = {p.pname: dict(p.counts, body_bytes=p.body_bytes, reconnects=len(p.reconnects),
                              window=p.window, max_outstanding=p.max_outstanding,
                              error=p.error, alive=p.is_alive()) for p in self.publishers}
        cons = {c.cname: dict(c.counts, queue=c.queue, body_bytes=c.body_bytes, reconnects=len(c.reconnects),
                              error=c.error, alive=c.is_alive()) for c in self.consumers}
        by_queue: dict[str, dict[str, int]] = {}
        for p in self.publishers:
            for q, cnt in p.by_queue.items():
                d = by_queue.setdefault(q, {})
                for k, v in cnt.items():
                    d[k] = d.get(k, 0) + v
        for c in self.consumers:
            d = by_queue.setdefault(c.queue, {})
            d["deliver"] = d.get("deliver", 0) + c.counts["deliver"]
        for q, n in self.drained.items():
            by_queue.setdefault(q, {})["drained"] = n
        return {"publishers": pubs, "consumers": cons, "queues": by_queue}
