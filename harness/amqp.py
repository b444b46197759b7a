"""The one hand-written AMQP 0-9-1 client (pamqp frames over a plain socket), for the
cases where a client library would hide what the broker really sent or what we send.

- RawClient: nothing happens on construction; handshake(), open_channel(), call(),
  read_frame()/expect() (strict: the next frame must be the expected one) - the
  integration tests' client.
- RawConn: a RawClient opened on construction (handshake, channel 1) whose socket
  errors are all ConnLost and whose expect() skips frames before the awaited one - the
  cluster tests', chaos workload's, soak's and StreamPublisher's client.
"""
from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Protocol

from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

IO_TIMEOUT = 10.0
FRAME_END = b"\xce"


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    """One raw frame (type 1 method, 2 header, 3 body, 8 heartbeat) around `payload`."""
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + FRAME_END


class Endpoint(Protocol):
    """Where a RawClient connects: a Broker/NodeProcess of the tests, a ClusterNode, an Address."""

    host: str
    amqp_port: int
    user: str
    password: str


@dataclass
class Address:
    host: str
    amqp_port: int
    user: str = "guest"
    password: str = "guest"


class Closed(Exception):
    """The peer closed the TCP connection."""


class ConnLost(Exception):
    pass


class RawClient:
    """Speaks AMQP frames over a plain socket, so tests see exactly what arrives."""

    def __init__(self, broker: Endpoint, rcvbuf: int | None = None) -> None:
        self.broker = broker
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # like real clients: no Nagle, or every request/reply pair waits for a delayed ACK
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(IO_TIMEOUT)
        self.sock.connect((broker.host, broker.amqp_port))
        self._init_state(IO_TIMEOUT)

    def _init_state(self, timeout: float) -> None:
        self.timeout = timeout
        self.buf = bytearray()
        self.frame_max = 131072
        self.blocked = False  # connection.blocked seen by frames() and not yet unblocked
        self.blocked_reason = ""
        self.close_reason: str | None = None

    # -- bytes
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, value: Any, channel: int = 0) -> None:
        self.send(pframe.marshal(value, channel))

    def send_method(self, method: Any, channel: int = 1) -> None:
        self.send(pframe.marshal(method, channel))

    def _fill(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        finally:
            self.sock.settimeout(self.timeout)
        if not data:
            raise Closed()
        self.buf += data

    def fill(self, timeout: float) -> bool:
        """Read what arrives within `timeout` into the buffer: False if nothing did."""
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not r:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except OSError as exc:
            raise ConnLost(f"recv: {exc!r}") from exc
        if not data:
            raise ConnLost(self.close_reason or "EOF")
        self.buf += data
        return True

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

    def frames(self) -> list[tuple[int, Any]]:
        """The whole frames in the buffer, tracking connection.blocked/unblocked; a
        connection.close (answered) or channel.close raises ConnLost."""
        out = []
        while len(self.buf) >= 8:
            size = struct.unpack_from(">I", self.buf, 3)[0]
            end = 8 + size
            if len(self.buf) < end:
                break
            _n, ch, value = pframe.unmarshal(bytes(self.buf[:end]))
            del self.buf[:end]
            if isinstance(value, spec.Connection.Blocked):
                self.blocked = True
                self.blocked_reason = value.reason
            elif isinstance(value, spec.Connection.Unblocked):
                self.blocked = False
            elif isinstance(value, spec.Connection.Close):
                self.close_reason = f"connection.close {value.reply_code} {value.reply_text}"
                try:
                    self.send_method(spec.Connection.CloseOk(), 0)
                except ConnLost:
                    pass
                raise ConnLost(self.close_reason)
            elif isinstance(value, spec.Channel.Close):
                self.close_reason = f"channel.close {value.reply_code} {value.reply_text}"
                raise ConnLost(self.close_reason)
            out.append((ch, value))
        return out

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
        out: list[tuple[int, Any]] = []
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
    def handshake(self, frame_max: int | None = 131072, heartbeat: int = 0,
                  product: str = "mirrorq-tests", cancel_notify: bool = True,
                  vhost: str = "/") -> None:
        """Protocol header to connection.open-ok. frame_max None: take the server's.
        cancel_notify False: a client without the consumer_cancel_notify capability."""
        self.send(pframe.marshal(pheader.ProtocolHeader(), 0))
        self.expect(spec.Connection.Start)
        self.send_frame(spec.Connection.StartOk(
            client_properties={"product": product,
                               "capabilities": {"publisher_confirms": True,
                                                "consumer_cancel_notify": cancel_notify,
                                                "basic.nack": True,
                                                "connection.blocked": True}},
            mechanism="PLAIN",
            response=f"\0{self.broker.user}\0{self.broker.password}", locale="en_US"))
        _, tune = self.expect(spec.Connection.Tune)
        if frame_max is None:
            self.frame_max = tune.frame_max or 131072
        else:
            self.frame_max = min(frame_max, tune.frame_max or frame_max)
        self.send_frame(spec.Connection.TuneOk(channel_max=tune.channel_max or 2047,
                                               frame_max=self.frame_max, heartbeat=heartbeat))
        self.send_frame(spec.Connection.Open(virtual_host=vhost))
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


class RawConn(RawClient):
    """A RawClient opened on construction: handshake (the server's frame_max) and channel 1.
    Every socket error is ConnLost, and expect() skips frames before the awaited one."""

    def __init__(self, host: str, port: int, user: str = "guest", password: str = "guest",
                 timeout: float = 10.0, vhost: str = "/") -> None:
        self.broker = Address(host, port, user, password)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._init_state(timeout)
        self.handshake(frame_max=None, product="mirrorq-cluster-tests", vhost=vhost)
        self.open_channel(1)

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ConnLost(f"send: {exc!r}") from exc

    def expect(self, cls: type, timeout: float | None = None) -> tuple[int, Any]:
        deadline = time.monotonic() + (timeout or self.timeout)
        pending: list[tuple[int, Any]] = []
        while True:
            for ch, v in self.frames():
                if isinstance(v, cls):
                    return ch, v
                pending.append((ch, v))
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnLost(f"no {cls.__name__} within timeout (got {pending[-3:]!r})")
            self.fill(left)
