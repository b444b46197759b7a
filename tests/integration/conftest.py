"""Shared helpers for the integration suite: pika connections that clean up
after themselves, and a tiny raw-frame AMQP client (pamqp) for the cases
where a client library would hide what the broker really sent."""
from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

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
        """basic.get (no-ack) everything ready: [(body, redelivered)]."""
        ch = self._aux().channel()
        out = []
        try:
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


@pytest.fixture
def amqp(broker: Broker) -> Iterator[Amqp]:
    h = Amqp(broker)
    try:
        yield h
    finally:
        h.cleanup()


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


# ---------------------------------------------------------------- raw frames

class Closed(Exception):
    """The peer closed the TCP connection."""


class RawClient:
    """Speaks AMQP frames over a plain socket, so tests see exactly what arrives."""

    def __init__(self, broker: Broker, rcvbuf: int | None = None) -> None:
        self.broker = broker
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # like real clients: no Nagle, or every request/reply pair waits for a delayed ACK
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(IO_TIMEOUT)
        self.sock.connect((broker.host, broker.amqp_port))
        self.buf = bytearray()
        self.frame_max = 131072

    # -- bytes
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, value: Any, channel: int = 0) -> None:
        self.send(pframe.marshal(value, channel))

    def _fill(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        finally:
            self.sock.settimeout(IO_TIMEOUT)
        if not data:
            raise Closed()
        self.buf += data

    def read_raw(self, n: int, timeout: float = IO_TIMEOUT) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self.buf) < n:
            self._fill(max(0.01, deadline - time.monotonic()))
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def try_frame(self) -> tuple[int, Any] | None:
        buf = self.buf
        if len(buf) < 7:
            return None
        _ftype, _ch, size = struct.unpack_from(">BHI", buf, 0)
        end = 8 + size
        if len(buf) < end:
            return None
        _n, ch, value = pframe.unmarshal(bytes(buf[:end]))
        del buf[:end]
        return ch, value

    def read_frame(self, timeout: float = IO_TIMEOUT) -> tuple[int, Any]:
        deadline = time.monotonic() + timeout
        while True:
            f = self.try_frame()
            if f is not None:
                if isinstance(f[1], pheartbeat.Heartbeat):
                    continue
                return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame within timeout")
            self._fill(left)

    def poll_frames(self) -> list[tuple[int, Any]]:
        """Frames readable right now, without blocking."""
        while True:
            r, _, _ = select.select([self.sock], [], [], 0)
            if not r:
                break
            data = self.sock.recv(1 << 20)
            if not data:
                raise Closed()
            self.buf += data
        out = []
        while True:
            f = self.try_frame()
            if f is None:
                return out
            if not isinstance(f[1], pheartbeat.Heartbeat):
                out.append(f)

    def expect(self, cls: type, timeout: float = IO_TIMEOUT) -> tuple[int, Any]:
        ch, v = self.read_frame(timeout)
        assert isinstance(v, cls), f"expected {cls.__name__}, got {v!r} on channel {ch}"
        return ch, v

    def read_until_closed(self, timeout: float = IO_TIMEOUT) -> list[tuple[int, Any]]:
        """Frames until the peer closes the socket (fails if it doesn't)."""
        out: list[tuple[int, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                ch, v = self.read_frame(max(0.01, deadline - time.monotonic()))
                out.append((ch, v))
                if isinstance(v, spec.Connection.Close):
                    self.send_frame(spec.Connection.CloseOk(), 0)
            except (Closed, BrokenPipeError):
                return out
            except ConnectionResetError:
                return out
            except TimeoutError as exc:
                raise AssertionError(f"peer did not close within {timeout}s; got {out!r}") from exc

    # -- protocol
    def handshake(self, frame_max: int = 131072, heartbeat: int = 0) -> None:
        self.send(pframe.marshal(pheader.ProtocolHeader(), 0))
        self.expect(spec.Connection.Start)
        self.send_frame(spec.Connection.StartOk(
            client_properties={"product": "mirrorq-tests",
                               "capabilities": {"publisher_confirms": True,
                                                "consumer_cancel_notify": True,
                                                "basic.nack": True,
                                                "connection.blocked": True}},
            mechanism="PLAIN",
            response=f"\0{self.broker.user}\0{self.broker.password}", locale="en_US"))
        _, tune = self.expect(spec.Connection.Tune)
        self.frame_max = min(frame_max, tune.frame_max or frame_max)
        self.send_frame(spec.Connection.TuneOk(channel_max=tune.channel_max or 2047,
                                               frame_max=self.frame_max, heartbeat=heartbeat))
        self.send_frame(spec.Connection.Open(virtual_host="/"))
        self.expect(spec.Connection.OpenOk)

    def open_channel(self, ch: int = 1) -> None:
        self.send_frame(spec.Channel.Open(), ch)
        got, _ = self.expect(spec.Channel.OpenOk)
        assert got == ch

    def call(self, method: Any, reply: type, ch: int = 1) -> Any:
        self.send_frame(method, ch)
        while True:
            got, v = self.read_frame()
            if isinstance(v, spec.Channel.Close | spec.Connection.Close):
                raise AssertionError(f"closed instead of {reply.__name__}: {v!r}")
            if isinstance(v, reply):
                return v

    def publish_bytes(self, exchange: str, routing_key: str, body: bytes, ch: int = 1,
                      mandatory: bool = False, persistent: bool = False,
                      headers: dict | None = None) -> bytes:
        props = spec.Basic.Properties(delivery_mode=2 if persistent else 1, headers=headers)
        data = pframe.marshal(spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                 mandatory=mandatory), ch)
        data += pframe.marshal(pheader.ContentHeader(0, len(body), props), ch)
        step = self.frame_max - 8
        for i in range(0, len(body), step):
            data += pframe.marshal(pbody.ContentBody(body[i:i + step]), ch)
        return data

    def publish(self, exchange: str, routing_key: str, body: bytes, **kw: Any) -> None:
        self.send(self.publish_bytes(exchange, routing_key, body, **kw))

    def abort(self) -> None:
        """TCP abort: RST instead of a clean close."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            self.sock.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


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


@pytest.fixture
def raw(broker: Broker) -> Iterator[Any]:
    """Factory of RawClients, all closed at teardown."""
    made: list[RawClient] = []

    def make(handshake: bool = True, channel: bool = True, **kw: Any) -> RawClient:
        c = RawClient(broker, **kw)
        made.append(c)
        if handshake:
            c.handshake()
            if channel:
                c.open_channel(1)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()


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
