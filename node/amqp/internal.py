"""An in-process AMQP session for the HTTP management API's writes (issue 15).

A management write (declare, bind, publish, get, purge, delete) is carried
out as the very AMQP methods a client would send, on a `Connection` state
machine of this node that has no socket: the bytes it would write are parsed
here instead. So a write goes through the same channel code, the same
permission checks, the same commands in the log and the same validation in
apply, and fails with the same reply code and text as for a client (406
PRECONDITION_FAILED - inequivalent arg ..., 404 NOT_FOUND - no queue ...).

The session is registered with the AmqpServer like a socket's protocol, so
the replicated effects addressed to it (replies, GetOk, confirms, returns,
channel errors) reach it through the ordinary dispatch. It logs in as the
HTTP request's (already authenticated) user; a bearer-token administrator
gets full permissions (`full_access`).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any

from node.amqp import frame
from node.amqp.connection import Connection, next_serial
from node.amqp.endpoint import RUNNING
from node.broker.ids import ConnId
from node.broker.permission import FULL

if TYPE_CHECKING:
    from node.amqp.server import AmqpServer

CHANNEL = 1
DEFAULT_TIMEOUT = 15.0


class AmqpReplyError(Exception):
    """A channel or connection error the broker answered with."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


class _SessionConnection(Connection):
    full_access = False

    def _patterns(self) -> tuple[str, str, str] | None:
        if self.full_access:
            return FULL
        return super()._patterns()

    def revoked(self) -> str | None:
        # the bearer-token administrator is no replicated user: only a deleted
        # vhost ends its session
        if self.full_access and self.vhost in self.proposer.read_model().vhosts:
            return None
        return super().revoked()


class _Port:
    """Stands in for a socket's protocol in AmqpServer.conns (duck-typed)."""

    def __init__(self, session: AmqpSession) -> None:
        self.session = session
        self.conn: Connection | None = session.conn
        self.transport = None
        self.reading_paused = False
        self.peer_host = "127.0.0.1"
        self.peer_cn = None

    def flush(self) -> None:
        self.session.pump()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


class Content:
    """A method with content (GetOk, Return, Deliver): props and body."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.props: dict[str, Any] = {}
        self.size = 0
        self.body = bytearray()


class AmqpSession:
    """One channel on an in-process connection. Use as an async context
    manager; every call raises AmqpReplyError on a channel/connection error
    and TimeoutError when the log does not answer in time."""

    def __init__(self, server: AmqpServer, user: str, vhost: str, full_access: bool = False,
                 client_properties: dict[str, Any] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.server = server
        self.timeout = timeout
        # peers: this node's connections, so the user's and vhost's limits count
        # them as they do for a socket's connection
        conn = _SessionConnection(server.proposer, ConnId(server.node_id, next_serial()),
                                  server.config, peer_host="127.0.0.1",
                                  peers=server.connections)
        conn.full_access = full_access
        conn.user = user
        conn.vhost = vhost
        conn.client_properties = client_properties or {"product": "mirrorq management API"}
        conn.phase = RUNNING
        conn.reader = frame.FrameReader(conn.frame_max + frame.FRAME_OVERHEAD)
        self.conn = conn
        self._reader = frame.FrameReader(1 << 30)
        self._events: deque[Any] = deque()
        self._partial: Content | None = None
        self._wake = asyncio.Event()
        self._error: AmqpReplyError | None = None
        self._opened = False

    async def __aenter__(self) -> AmqpSession:
        # a connection like any other (issue 42): the vhost's and the user's
        # max-connections refuse it as connection.open would (530; HTTP 403),
        # and its channel counts against the user's max-channels
        refused = self.conn._connection_limit_refusal()
        if refused is not None:
            raise AmqpReplyError(530, refused)
        self.server.conns[self.conn.id.serial] = _Port(self)  # type: ignore[assignment]
        # in the connection table: its user's topic permissions apply, as to
        # RabbitMQ's direct connections
        self.conn.record_open()
        try:
            await self.call("Channel.Open", {}, ("Channel.OpenOk",))
        except BaseException:
            self.close()  # what it put in the log is forgotten again
            raise
        self._opened = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the connection as a vanished socket would: ConnectionClose in
        the log requeues what it holds unacked."""
        with contextlib.suppress(Exception):
            self.conn.connection_lost()
        self.server.conns.pop(self.conn.id.serial, None)

    # ------------------------------------------------------------ wire
    def send(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        self.conn.data_received(data)
        self.pump()

    def pump(self) -> None:
        """Parse what the connection wrote (replies, content, errors)."""
        data = self.conn.take_output()
        if not data:
            return
        self._reader.feed(data)
        for ftype, _chan, payload in self._reader.frames():
            if ftype == frame.FRAME_METHOD:
                m = frame.decode_method(payload)
                name = m.name
                if name == "Channel.Close" or name == "Connection.Close":
                    self._error = AmqpReplyError(int(m.reply_code), str(m.reply_text))
                elif name in ("Basic.GetOk", "Basic.Return", "Basic.Deliver"):
                    self._partial = Content(m)
                else:
                    self._events.append(m)
            elif ftype == frame.FRAME_HEADER and self._partial is not None:
                _cid, size, props = frame.decode_header(payload)
                self._partial.props = props
                self._partial.size = size
                if size == 0:
                    self._events.append(self._partial)
                    self._partial = None
            elif ftype == frame.FRAME_BODY and self._partial is not None:
                self._partial.body += payload
                if len(self._partial.body) >= self._partial.size:
                    self._events.append(self._partial)
                    self._partial = None
        self._wake.set()

    async def next_event(self, deadline: float) -> Any:
        loop = asyncio.get_running_loop()
        while not self._events:
            if self._error is not None:
                raise self._error
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("the broker did not answer in time")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)
        return self._events.popleft()

    async def call(self, path: str, fields: dict[str, Any], expect: tuple[str, ...]) -> Any:
        """Send a method on the session's channel, return the first reply named
        in `expect` (content replies are Content objects)."""
        deadline = asyncio.get_running_loop().time() + self.timeout
        self.send(frame.encode_method(CHANNEL, path, fields))
        while True:
            ev = await self.next_event(deadline)
            name = ev.method.name if isinstance(ev, Content) else ev.name
            if name in expect:
                return ev

    # ------------------------------------------------------------ operations
    async def publish(self, exchange: str, routing_key: str, props: dict[str, Any],
                      body: bytes) -> bool:
        """Publish with mandatory and a confirm; True when it was routed to a
        queue (RabbitMQ's `routed`), once the confirm came."""
        await self.call("Confirm.Select", {}, ("Confirm.SelectOk",))
        deadline = asyncio.get_running_loop().time() + self.timeout
        self.send(frame.encode_publish(CHANNEL, exchange, routing_key, props, body,
                                       self.conn.frame_max, mandatory=True))
        routed = True
        while True:
            ev = await self.next_event(deadline)
            if isinstance(ev, Content):
                if ev.method.name == "Basic.Return":
                    routed = False
                continue
            if ev.name == "Basic.Ack":
                return routed
            if ev.name == "Basic.Nack":
                raise AmqpReplyError(500, "the broker refused the message (nack)")

    async def get(self, queue: str, no_ack: bool) -> Content | None:
        ev = await self.call("Basic.Get", {"queue": queue, "no_ack": no_ack},
                             ("Basic.GetOk", "Basic.GetEmpty"))
        return ev if isinstance(ev, Content) else None
