"""pika BlockingConnections to the broker under test that clean up what a test
declared, and helpers that pump pika's events with deadlines."""
from __future__ import annotations

import os
import time
from typing import Any

import pika

from tests.broker_proc import Broker

ON_RABBIT = bool(os.environ.get("MIRRORQ_TARGET"))
IO_TIMEOUT = 10.0


class Amqp:
    """pika BlockingConnections to the broker plus cleanup of what a test declared."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.conns: list[pika.BlockingConnection] = []
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def params(self, **kw: Any) -> pika.ConnectionParameters:
        kw.setdefault("heartbeat", 0)
        kw.setdefault("socket_timeout", IO_TIMEOUT)
        kw.setdefault("blocked_connection_timeout", 30)
        kw.setdefault("connection_attempts", 1)
        return pika.ConnectionParameters(
            host=self.broker.host, port=self.broker.amqp_port,
            credentials=pika.PlainCredentials(self.broker.user, self.broker.password), **kw)

    def connect(self, **kw: Any) -> pika.BlockingConnection:
        conn = pika.BlockingConnection(self.params(**kw))
        self.conns.append(conn)
        return conn

    def channel(self, **kw: Any) -> Any:
        return self.connect(**kw).channel()

    def queue(self, ch: Any = None, name: str | None = None, prefix: str = "it",
              **kw: Any) -> str:
        """Declare a queue (unique name unless given) and delete it at teardown."""
        from tests.broker_proc import uniq
        ch = ch or self.channel()
        name = name if name is not None else uniq(prefix)
        res = ch.queue_declare(name, **kw)
        self.queues.append(res.method.queue)
        return res.method.queue

    def exchange(self, ch: Any, name: str, kind: str = "direct", **kw: Any) -> str:
        ch.exchange_declare(name, exchange_type=kind, **kw)
        self.exchanges.append(name)
        return name

    def count(self, queue: str) -> int:
        """Ready messages in `queue` (queue.declare passive, on a fresh channel)."""
        conn = self._aux()
        ch = conn.channel()
        try:
            return int(ch.queue_declare(queue, passive=True).method.message_count)
        finally:
            if ch.is_open:
                ch.close()

    def consumers(self, queue: str) -> int:
        ch = self._aux().channel()
        try:
            return int(ch.queue_declare(queue, passive=True).method.consumer_count)
        finally:
            if ch.is_open:
                ch.close()

    def wait_count(self, queue: str, n: int, timeout: float = 10.0) -> None:
        from tests.broker_proc import wait_for
        wait_for(lambda: self.count(queue) == n, timeout=timeout,
                 what=f"{queue} to hold {n} ready messages (has {self.count(queue)})")

    def drain(self, queue: str, limit: int = 100000) -> list[tuple[bytes, bool]]:
        """Take everything ready, in queue order: [(body, redelivered)]. What the
        queue holds at the start is consumed with a prefetch of exactly that many
        (so nothing past it is delivered to be requeued) and settled by one
        multiple ack: a basic.get per message costs a replicated command each
        (20,000 took 30 s). basic.get (no-ack) then takes whatever is left."""
        ch = self._aux().channel()
        out: list[tuple[bytes, bool]] = []
        try:
            ready = min(ch.queue_declare(queue, passive=True).method.message_count, limit, 65535)
            if ready > 1:
                ch.basic_qos(prefetch_count=ready)
                last = 0
                for m, _p, b in ch.consume(queue, inactivity_timeout=2.0):
                    if m is None:  # (some expired meanwhile): basic.get below
                        break
                    out.append((b, m.redelivered))
                    last = m.delivery_tag
                    if len(out) >= ready:
                        break
                ch.cancel()  # nothing past `ready` was delivered: none requeued
                if last:
                    ch.basic_ack(last, multiple=True)
            while len(out) < limit:
                m, _p, b = ch.basic_get(queue, auto_ack=True)
                if m is None:
                    break
                out.append((b, m.redelivered))
        finally:
            if ch.is_open:
                ch.close()
        return out

    def publish(self, queue: str, bodies: list[bytes], persistent: bool = False,
                exchange: str = "") -> None:
        """Publish with confirms (every message confirmed before returning)."""
        ch = self._aux().channel()
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2 if persistent else 1)
        for b in bodies:
            ch.basic_publish(exchange, queue, b, props)
        ch.close()

    _aux_conn: pika.BlockingConnection | None = None

    def _aux(self) -> pika.BlockingConnection:
        if self._aux_conn is None or not self._aux_conn.is_open:
            self._aux_conn = self.connect()
        return self._aux_conn

    def cleanup(self) -> None:
        for c in self.conns:
            try:
                if c.is_open:
                    c.close()
            except Exception:  # noqa: BLE001 - teardown must go on
                pass
        if not (self.queues or self.exchanges):
            return
        try:
            conn = pika.BlockingConnection(self.params())
        except Exception:  # noqa: BLE001 - broker may be gone (own_node tests)
            return
        try:
            for q in self.queues:
                try:
                    ch = conn.channel()
                    ch.queue_delete(q)
                    ch.close()
                except Exception:  # noqa: BLE001
                    pass
            for x in self.exchanges:
                try:
                    ch = conn.channel()
                    ch.exchange_delete(x)
                    ch.close()
                except Exception:  # noqa: BLE001
                    pass
        finally:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass


def events(conn: pika.BlockingConnection, seconds: float) -> None:
    """Let pika dispatch callbacks for a bounded window."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=min(0.05, max(0.0, deadline - time.monotonic())))


def pump_until(conn: pika.BlockingConnection, cond: Any, timeout: float = 10.0,
               what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        conn.process_data_events(time_limit=0.05)


def round_trip_ok(broker: Broker) -> None:
    """A fresh connection can declare, publish (confirmed) and get a message."""
    from tests.broker_proc import uniq
    h = Amqp(broker)
    try:
        ch = h.channel()
        q = h.queue(ch, exclusive=True)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"still-alive")
        m, _p, b = ch.basic_get(q, auto_ack=True)
        assert m is not None and b == b"still-alive", f"round trip failed: {m!r} {b!r}"
        _ = uniq
    finally:
        h.cleanup()
