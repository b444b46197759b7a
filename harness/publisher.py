"""Publishing with confirms: StreamPublisher (a thread that keeps every confirmed id
across node loss) and ConfirmTracker (the bookkeeping of a raw client's confirms)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from harness.amqp import ConnLost, RawConn
from harness.body import RandomBodies, body_frames


def confirmed_tags(outstanding: dict[int, Any], confirm: Any) -> list[int]:
    """The publish seqs a basic.ack / basic.nack settles, in order (S05/S14:
    multiple covers every outstanding seq up to its tag)."""
    if confirm.multiple:
        return sorted(t for t in outstanding if t <= confirm.delivery_tag)
    return [confirm.delivery_tag]


class ConfirmTracker:
    """Bookkeeping of publisher confirms: each seq acked or nacked exactly once."""

    def __init__(self) -> None:
        self.published = 0
        self.settled: dict[int, str] = {}
        self.errors: list[str] = []
        self.order: list[tuple[str, int, bool]] = []
        self.confirm_time: dict[int, float] = {}
        self.low = 1   # every seq below `low` is settled

    def on_frame(self, v: Any) -> None:
        if isinstance(v, spec.Basic.Ack):
            self._settle("ack", v.delivery_tag, v.multiple)
        elif isinstance(v, spec.Basic.Nack):
            self._settle("nack", v.delivery_tag, v.multiple)

    def _settle(self, kind: str, tag: int, multiple: bool) -> None:
        now = time.monotonic()
        self.order.append((kind, tag, multiple))
        if tag < 1 or tag > self.published:
            self.errors.append(f"{kind} of seq {tag} never published (published {self.published})")
            return
        if tag in self.settled:
            self.errors.append(f"{kind} of seq {tag} already {self.settled[tag]}ed")
            return
        if multiple:
            for t in range(self.low, tag + 1):
                if t not in self.settled:
                    self.settled[t] = kind
                    self.confirm_time[t] = now
        else:
            self.settled[tag] = kind
            self.confirm_time[tag] = now
        while self.low in self.settled:
            self.low += 1

    def pending(self) -> int:
        return self.published - len(self.settled)


class StreamPublisher(threading.Thread):
    """Publishes persistent messages with streaming confirms to `queue`, tracking each
    message id by delivery seq. Bodies are random and checksummed (RandomBodies,
    make_body's format): `size` bytes (default 1 KiB), or with `max_size` log-uniform
    sizes between `size` and `max_size` (`seed` for the sizes). Nacked ids and ids outstanding
    when a connection dies (uncertain) are republished, on another node if
    ours is gone. Stops after `total` ids are confirmed, or (total=None) when
    stop() is called and what is outstanding has settled."""

    def __init__(self, tag: str, queue: str, nodes: Callable[[], list[Any]], total: int | None,
                 window: int = 200, size: int = 1024, persistent: bool = True,
                 stall_timeout: float = 20.0, deadline: float = 240.0,
                 max_size: int | None = None, seed: int | str | None = None,
                 priorities: int = 0, rate: float | None = None) -> None:
        super().__init__(name=f"publisher-{tag}", daemon=True)
        self.tag = tag
        self.queue = queue
        self.nodes = nodes  # candidates, preferred first; called at each (re)connect
        self.total = total
        self.window = window
        self.size = size
        self.bodies = RandomBodies(size, max_size, seed=seed)
        self.body_bytes = 0  # bytes of bodies sent (republishes included)
        self.persistent = persistent
        self.priorities = priorities  # > 0: message id mid goes with priority mid % (priorities + 1)
        self.stall_timeout = stall_timeout
        self.deadline = time.monotonic() + deadline
        # new messages per second at most (None: as fast as the window allows); a
        # long change under load then leaves a backlog a test can drain in bounded time
        self.rate = rate
        self._t0 = time.monotonic()
        self.confirmed: set[int] = set()
        self.confirm_times: list[float] = []  # monotonic time of each ack frame's effect
        self.nacked = 0
        self.uncertain = 0
        self.republished = 0
        self.reconnects: list[tuple[float, str, str]] = []  # (time, node, reason)
        self.connected_to: str | None = None
        self.error: str | None = None
        self.events: list[str] = []
        self._next_id = 0
        self._retry: list[int] = []
        self._stop_ev = threading.Event()
        self._abandon_ev = threading.Event()
        self._lock = threading.Lock()

    # -- control
    def stop(self) -> None:
        """Publish nothing new; finish once what is outstanding has settled."""
        self._stop_ev.set()

    def abandon(self) -> None:
        """Give up now (e.g. every node is dead): outstanding ids stay unconfirmed."""
        self._abandon_ev.set()
        self._stop_ev.set()

    def progress_since(self, t: float) -> int:
        with self._lock:
            return sum(1 for x in self.confirm_times if x >= t)

    def finish(self, timeout: float = 120.0) -> None:
        self.stop()
        self.join(timeout)
        assert not self.is_alive(), f"publisher {self.tag} did not finish within {timeout}s: {self.summary()}"

    def summary(self) -> str:
        return (f"{self.tag}: confirmed={len(self.confirmed)} nacked={self.nacked} "
                f"uncertain={self.uncertain} republished={self.republished} "
                f"reconnects={[(round(t, 2), n, r) for t, n, r in self.reconnects]} error={self.error}")

    # -- work
    def _take_id(self) -> int | None:
        if self._retry:
            self.republished += 1
            return self._retry.pop(0)
        if self._stop_ev.is_set():
            return None
        if self.total is not None and self._next_id >= self.total:
            return None
        if self.rate is not None and self._next_id >= self.rate * (time.monotonic() - self._t0):
            return None
        self._next_id += 1
        return self._next_id

    def _connect(self) -> tuple[RawConn, Any]:
        last = "no candidate node"
        while time.monotonic() < self.deadline:
            for node in self.nodes():
                try:
                    conn = RawConn(node.host, node.amqp_port, node.user, node.password,
                                   timeout=5.0)
                    conn.send_method(spec.Confirm.Select(), 1)
                    conn.expect(spec.Confirm.SelectOk)
                    return conn, node
                except (OSError, ConnLost) as exc:
                    last = f"{node.node_id}: {exc}"
            if self._abandon_ev.is_set():
                raise ConnLost(f"abandoned while disconnected ({last})")
            time.sleep(0.1)
        raise ConnLost(f"cannot connect anywhere before the deadline: {last}")

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported through .error
            self.error = f"{type(exc).__name__}: {exc}"

    def _done(self, outstanding: dict[int, int]) -> bool:
        if outstanding or self._retry:
            return False
        if self.total is not None:
            return len(self.confirmed) >= self.total
        return self._stop_ev.is_set()

    def _run(self) -> None:
        self._t0 = time.monotonic()
        mode = 2 if self.persistent else 1
        levels = self.priorities + 1
        props = [spec.Basic.Properties(delivery_mode=mode, priority=p if self.priorities else None)
                 for p in range(levels)]
        method = pframe.marshal(spec.Basic.Publish(exchange="", routing_key=self.queue), 1)
        headers: dict[tuple[int, int], bytes] = {}  # (body size, priority) -> marshalled content header
        while time.monotonic() < self.deadline:
            try:
                conn, node = self._connect()
            except ConnLost as exc:
                if not self._abandon_ev.is_set():
                    self.error = str(exc)
                return
            self.connected_to = node.node_id
            seq = 0
            outstanding: dict[int, int] = {}  # seq -> id
            last_progress = time.monotonic()
            try:
                while True:
                    if self._done(outstanding) or self._abandon_ev.is_set():
                        conn.close()
                        return
                    if time.monotonic() > self.deadline:
                        raise ConnLost("deadline")
                    out = bytearray()
                    while not conn.blocked and len(outstanding) < self.window:
                        mid = self._take_id()
                        if mid is None:
                            break
                        body = self.bodies.make(self.tag, mid)
                        hk = (len(body), mid % levels)
                        header = headers.get(hk)
                        if header is None:
                            header = headers[hk] = pframe.marshal(
                                pheader.ContentHeader(0, len(body), props[hk[1]]), 1)
                        seq += 1
                        outstanding[seq] = mid
                        self.body_bytes += len(body)
                        out += method + header + body_frames(1, body, conn.frame_max)
                        if len(out) > 64 * 1024:
                            conn.send(bytes(out))
                            out.clear()
                    if out:
                        conn.send(bytes(out))
                    if conn.fill(0.2):
                        now = time.monotonic()
                        for _ch, v in conn.frames():
                            if isinstance(v, spec.Basic.Ack | spec.Basic.Nack):
                                tags = confirmed_tags(outstanding, v)
                                for t in tags:
                                    mid = outstanding.pop(t, None)
                                    if mid is None:
                                        continue
                                    if isinstance(v, spec.Basic.Ack):
                                        self.confirmed.add(mid)
                                        with self._lock:
                                            self.confirm_times.append(now)
                                    else:
                                        self.nacked += 1
                                        self._retry.append(mid)
                                last_progress = now
                    if outstanding and time.monotonic() - last_progress > self.stall_timeout:
                        raise ConnLost(f"no confirm for {self.stall_timeout}s "
                                       f"(blocked={conn.blocked})")
                    if not outstanding:
                        last_progress = time.monotonic()
            except ConnLost as exc:
                conn.close()
                self.reconnects.append((time.monotonic(), node.node_id, str(exc)))
                self.uncertain += len(outstanding)
                self._retry[:0] = sorted(outstanding.values())
        self.error = f"deadline passed: {self.summary()}"
