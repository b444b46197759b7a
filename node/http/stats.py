"""The management API's figures that are not rows: message rates
(RateSampler), confirm-latency percentiles (LatencyWindow), the Raft
members' view (/api/mirrorq/cluster) and quorum criticality from the node
status, and this process's OS figures (/proc)."""
from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.replication.read_model import Management
    from node.replication.status import NodeStatus


SAMPLE_INTERVAL = 5.0  # seconds between rate samples (RabbitMQ's default)
LATENCY_WINDOW = 30.0  # seconds of confirms the cluster view's p50/p99 cover
LATENCY_SAMPLE = 1.0  # seconds between snapshots of the confirm-latency histogram


def quorum_critical(status: NodeStatus) -> str | None:
    """Why losing this node would leave fewer than a majority of the members
    in sync (None: it would not). What a rolling upgrade asks before stopping
    a node."""
    members = list(status.members or [])
    in_sync = list(status.in_sync or members)
    me = status.node_id
    majority = len(members) // 2 + 1
    if len(members) <= 1:
        return None  # RabbitMQ: a single node cluster is never quorum critical
    left = [m for m in in_sync if m != me]
    if len(left) < majority:
        return (f"losing node {me} leaves {len(left)} in-sync member(s) of {len(members)}, "
                f"fewer than a majority ({majority})")
    return None


def latency_percentile(hist: Mapping[str, Any], q: float) -> float | None:
    """The q-quantile (0..1) in ms from a cumulative histogram snapshot
    (upper bound of the bucket that holds it). Since node start: a figure
    that moves in steps; cluster_json reports the windowed one."""
    count = int(hist.get("count") or 0)
    if not count:
        return None
    want = q * count
    for le, cum in zip(hist.get("le") or [], hist.get("cumulative") or [], strict=False):
        if cum >= want:
            return None if le == "+Inf" else round(float(le) * 1000, 3)
    return None


def interpolated_percentile(bounds: Sequence[float], counts: Sequence[int],
                            q: float) -> float | None:
    """The q-quantile (0..1) in ms of per-bucket counts (`counts[i]` in
    (bounds[i-1], bounds[i]], the last one +Inf), interpolated linearly
    within its bucket as Prometheus' histogram_quantile does; the +Inf
    bucket answers its lower bound."""
    total = sum(counts)
    if total <= 0:
        return None
    want = q * total
    below = 0
    for i, c in enumerate(counts):
        if c > 0 and below + c >= want:
            lower = float(bounds[i - 1]) if i > 0 else 0.0
            if i >= len(bounds):
                return round(lower * 1000, 3)
            upper = float(bounds[i])
            return round((lower + (upper - lower) * (want - below) / c) * 1000, 3)
        below += c
    return None


class LatencyWindow:
    """Snapshots of this node's cumulative confirm-latency histogram; the
    percentiles of the last `window` seconds come from the difference between
    the newest snapshot and the latest one at least `window` old (or the
    oldest kept, while the node is younger than that)."""

    def __init__(self, window: float = LATENCY_WINDOW) -> None:
        self.window = window
        self.samples: deque[tuple[float, tuple[int, ...]]] = deque()

    @staticmethod
    def _cum(hist: Mapping[str, Any]) -> tuple[int, ...]:
        return tuple(int(c) for c in hist.get("cumulative") or ())

    def add(self, now: float, hist: Mapping[str, Any]) -> None:
        cum = self._cum(hist)
        if self.samples and len(self.samples[-1][1]) != len(cum):
            self.samples.clear()
        self.samples.append((now, cum))
        # keep one sample at or before the window's start
        while len(self.samples) >= 2 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()

    def summary(self, now: float, hist: Mapping[str, Any]) -> dict[str, Any]:
        """p50/p99 (ms) and count of the confirms of the last `window`
        seconds, with `hist` the histogram now."""
        cum = self._cum(hist)
        kept = [(t, c) for t, c in self.samples if len(c) == len(cum)]
        old = [c for t, c in kept if t <= now - self.window]
        base = old[-1] if old else kept[0][1] if kept else (0,) * len(cum)
        counts = [max(0, (a - (cum[i - 1] if i else 0)) - (b - (base[i - 1] if i else 0)))
                  for i, (a, b) in enumerate(zip(cum, base, strict=True))]
        bounds = [float(x) for x in (hist.get("le") or [])[:-1]]
        return {"p50_ms": interpolated_percentile(bounds, counts, 0.5),
                "p99_ms": interpolated_percentile(bounds, counts, 0.99),
                "count": sum(counts), "window_seconds": self.window}


def cluster_json(status: NodeStatus, latency: LatencyWindow | None = None,
                 now: float | None = None,
                 http_urls: Mapping[str, str] | None = None) -> dict[str, Any]:
    """/api/mirrorq/cluster: the Raft members as this node sees them.

    `match_index` of another member is known to the leader only (a follower
    answers null); `http_url` is a member's management URL where this node
    knows it ([http] member_urls). `confirm_latency` is this node's (a
    confirm leaves the node its publisher is connected to): p50/p99 of the
    last LATENCY_WINDOW seconds, interpolated within the histogram bucket,
    and the since-start bucket edges under `since_start`."""
    me = status.node_id
    leader = status.leader
    leading = status.role == "leader"
    in_sync = list(status.in_sync or [])
    draining = list(status.draining or [])
    addresses = dict(status.member_addresses or {})
    urls = dict(http_urls or {})
    peers = {p.member: p for p in status.peers}
    members = []
    for name in status.members or []:
        peer = peers.get(name)
        mine = name == me
        if mine:
            match = status.last_applied
        elif leading and peer is not None:
            match = peer.match_index
        else:
            match = None  # only the leader tracks its followers' match index
        members.append({
            "name": name, "address": addresses.get(name),
            "in_sync": name in in_sync, "draining": name in draining,
            "leader": name == leader, "self": mine,
            "reachable": True if mine else bool(peer and peer.connected),
            "match_index": match,
            "http_url": urls.get(name),
        })
    hist = status.confirm_latency or {}
    since_start = {"p50_ms": latency_percentile(hist, 0.5),
                   "p99_ms": latency_percentile(hist, 0.99),
                   "count": hist.get("count", 0)}
    if latency is not None and hist:
        recent = latency.summary(time.monotonic() if now is None else now, hist)
    else:
        recent = dict(since_start, window_seconds=None)
    return {"node": me, "members": members, "leader": leader, "term": status.term,
            "role": status.role, "in_sync": in_sync, "draining": draining,
            "commit_index": status.commit_index,
            "last_applied": status.last_applied,
            "mirrored_index": status.mirrored_index,
            "has_quorum": status.has_quorum,
            "machine_version": status.machine_version,
            "runs_machine_version": status.runs_machine_version,
            "confirm_latency": {**recent, "since_start": since_start}}


# ------------------------------------------------------------------ rates


class RateSampler:
    """Samples the replicated per-queue counters every SAMPLE_INTERVAL
    seconds on this node; a rate is the change between the last two samples
    per second (RabbitMQ's basic rates mode). The per-queue counters are
    applied from the log, so their rates are cluster-wide (every node counts
    every publish, delivery and ack). Confirms are not in the log (a confirm
    leaves the node its publisher is connected to): `confirmed` is this
    node's own counter, sampled alongside, so the confirm rate is this
    node's."""

    def __init__(self) -> None:
        self.prev: tuple[float, dict[tuple[str, str], tuple[int, ...]], int] | None = None
        self.cur: tuple[float, dict[tuple[str, str], tuple[int, ...]], int] | None = None
        # the counters at the last reset (DELETE /api/reset): what is shown
        # counts from there
        self.base: dict[tuple[str, str], tuple[int, ...]] = {}
        self.base_confirmed = 0
        self.generation = 0  # moves with every sample and reset (what is derived from it is stale)

    def reset(self, m: Management, confirmed: int = 0) -> None:
        """RabbitMQ's rabbit_mgmt_storage:reset: the statistics start over.
        The rates are 0 until two new samples are taken, and the message
        counters (each queue's and the overview's, this node's confirms) count
        from the values they have now (the replicated counters themselves
        are not changed: every node keeps its own baseline)."""
        self.prev = self.cur = None
        self.generation += 1
        self.base = {(q.vhost, q.name): q.stats for q in m.queues}
        self.base_confirmed = int(confirmed)

    def counted(self, key: tuple[str, str], stats: tuple[int, ...]) -> tuple[int, ...]:
        """A queue's counters since the last reset (a counter below its
        baseline: the queue was deleted and declared again since; its own)."""
        base = self.base.get(key)
        if base is None or any(n < b for n, b in zip(stats, base, strict=True)):
            return stats
        return tuple(n - b for n, b in zip(stats, base, strict=True))

    def confirmed(self, n: int) -> int:
        """This node's confirms since the last reset."""
        return n - self.base_confirmed if n >= self.base_confirmed else n

    def add(self, now: float, m: Management, confirmed: int = 0) -> None:
        self.prev = self.cur
        self.generation += 1
        self.cur = (now, {(q.vhost, q.name): q.stats for q in m.queues}, int(confirmed))

    def rates(self, key: tuple[str, str]) -> tuple[float, ...]:
        if self.prev is None or self.cur is None:
            return (0.0,) * 4
        (t0, a, _), (t1, b, _) = self.prev, self.cur
        dt = t1 - t0
        new, old = b.get(key), a.get(key)
        if dt <= 0 or new is None:
            return (0.0,) * 4
        old = old or (0,) * 4
        return tuple(max(0, n - o) / dt for n, o in zip(new, old, strict=True))

    def totals(self, vhosts: Iterable[str] | None = None) -> tuple[float, ...]:
        """Sum of the queues' rates (of those in `vhosts`, None: all)."""
        if self.cur is None:
            return (0.0,) * 4
        keep = None if vhosts is None else set(vhosts)
        out = [0.0] * 4
        for key in self.cur[1]:
            if keep is not None and key[0] not in keep:
                continue
            for i, r in enumerate(self.rates(key)):
                out[i] += r
        return tuple(out)

    def confirm_rate(self) -> float:
        """This node's confirms per second between the last two samples."""
        if self.prev is None or self.cur is None:
            return 0.0
        dt = self.cur[0] - self.prev[0]
        return max(0, self.cur[2] - self.prev[2]) / dt if dt > 0 else 0.0


STARTED = time.monotonic()


def process_stats() -> dict[str, int]:
    """This process as RabbitMQ reports its node (Linux /proc; what cannot be
    read is left out): mem_used (resident set size, bytes), fd_used/fd_total,
    sockets_used (the open fds that are sockets; sockets_total = fd_total, the
    only bound), proc_used/proc_total (OS threads here, Erlang processes in
    RabbitMQ; the bound is the kernel's threads-max)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/statm") as f:
            out["mem_used"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        fds = os.listdir("/proc/self/fd")
        sockets = 0
        for fd in fds:
            try:
                sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:  # closed meanwhile (the listing's own fd)
                pass
        total = int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        out.update({"fd_used": len(fds), "fd_total": total,
                    "sockets_used": sockets, "sockets_total": total})
    except (OSError, ImportError, ValueError):
        pass
    try:
        out["proc_used"] = len(os.listdir("/proc/self/task"))
        with open("/proc/sys/kernel/threads-max") as f:
            out["proc_total"] = int(f.read())
    except (OSError, ValueError):
        pass
    return out
