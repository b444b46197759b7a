"""The state of one AMQP connection, its output and the ways it closes: the
base of the Connection's parts (handshake.py, access.py, dispatch.py) and of
Connection itself (connection.py), which reads its input.

Outgoing bytes accumulate until take_output(), and `close_transport` tells
the shell to close the socket once those bytes are written.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from node.amqp import frame
from node.amqp.channel import CLOSING_LOCAL, OPEN, AmqpError, WireChannel
from node.amqp.config import WireConfig
from node.amqp.throttle import LoginGate
from node.broker.ids import ChanId, ConnId
from node.broker.vhost import DEFAULT_VHOST
from node.replication.command import ChannelClose, ConnectionClose
from node.replication.port import Proposer

# the phases of a connection, in order: waiting for the protocol header, then
# for Connection.StartOk, TuneOk and Open (the handshake), running, closing
# (our Connection.Close is out: only Close/CloseOk count until the close
# timeout) and closed
AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, RUNNING, CLOSING, CLOSED = range(7)


class HeldBytes:
    """Node-wide sum of the bytes connections hold in unfinished message bodies
    and open transactions: shared by every Connection of a server, read by the
    memory watermark check."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


class Endpoint:
    """A Connection's state, output and closing (Connection adds its parts)."""

    def __init__(self, proposer: Proposer, conn_id: ConnId, config: WireConfig,
                 clock: Callable[[], float] = time.monotonic, peer_host: str | None = None,
                 login_gate: LoginGate | None = None,
                 open_gate: Callable[[], str | None] | None = None,
                 gauge: HeldBytes | None = None,
                 peers: Callable[[], Iterable[Endpoint]] | None = None) -> None:
        self.proposer = proposer
        self.gauge = gauge if gauge is not None else HeldBytes()
        # bytes of unfinished bodies and tx buffers of this connection's channels;
        # past buffer_limit, publishes are held unread (see _hold_frame)
        self.held_bytes = 0
        self.buffer_limit = config.connection_buffer_limit()
        self.alarm: str | None = None  # the node-wide alarm (set_blocked)
        self.peer_host = peer_host  # None: unknown (treated as remote)
        # asked at start-ok (the login throttle) and at connection.open (the node's
        # connection limit: why not, or None), not at accept: a client that opened
        # its sockets first is judged when it logs in
        self.login_gate = login_gate
        self.open_gate = open_gate
        # this node's connections (this one included): what vhost and user limits
        # count here, exactly; the read model counts the other nodes'
        self.peers = peers
        # output is withheld until then (a throttled login's answer); the shell
        # writes it out when the clock gets there
        self.hold_until = 0.0
        self.id = conn_id
        self.config = config
        self.clock = clock
        self.phase = AWAIT_HEADER
        # frame-min-size until tune-ok, as RabbitMQ: an unauthenticated peer
        # cannot make the node decode big field tables (pamqp decodes them in
        # quadratic time: 131 KB of tiny entries cost ~0.5 s of the event loop)
        self.reader = frame.FrameReader(frame.FRAME_MIN_SIZE)
        self.out: list[bytes] = []
        self.close_transport = False
        self.channels: dict[int, WireChannel] = {}
        self.by_id: dict[ChanId, WireChannel] = {}
        self.channel_max = config.channel_max or 65535
        self.frame_max = config.frame_max or 131072
        self.heartbeat = 0
        self.client_properties: dict[str, Any] = {}
        self.cancel_notify = False
        self.blocked_notify = False
        self.auth_failure_close = False
        self.user = ""
        self.vhost = DEFAULT_VHOST  # set by connection.open
        # permission decisions by (kind, resource type, name), valid while the
        # read model's permissions and users are the objects they were made
        # against (an unchanged part is the same object in the next model)
        self._perm_source: object = None
        self._perm_users: object = None
        self._perm_cache: dict[tuple[int, str, str], bool] = {}
        self.published = False  # has ever published: subject to publisher flow control
        self.blocked_sent = False
        self.writing_paused = False
        self.opened_in_log = False  # ChannelOpen proposed: ConnectionClose owed at the end
        self.in_table = False  # ConnectionOpen proposed
        self.dirty: set[WireChannel] = set()  # channels with confirms/credit to flush
        now = clock()
        self.created = now
        self.handshake_deadline = now + config.handshake_timeout  # pushed back by a hold
        self.last_recv = now
        self.last_send = now
        self.close_deadline = 0.0
        self.linger_until = 0.0  # CLOSED after our CloseOk: close the socket by then

    # ------------------------------------------------------------ output

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def held(self) -> bool:
        """A throttled login's answer (and the hang-up after a refusal) is still
        withheld: the shell writes nothing and closes nothing until hold_until."""
        return self.hold_until > 0.0 and self.clock() < self.hold_until

    def take_output(self) -> bytes:
        if not self.out or self.held():
            return b""
        data = b"".join(self.out)
        self.out = []
        self.last_send = self.clock()
        return data

    # ------------------------------------------------------------ held bytes

    def count_held(self, delta: int) -> None:
        """Body bytes this connection starts (+) or stops (-) holding."""
        self.held_bytes += delta
        self.gauge.total += delta

    def over_buffer(self) -> bool:
        return bool(self.buffer_limit) and self.held_bytes > self.buffer_limit

    # ------------------------------------------------------------ errors / close

    def channel_error(self, ch: WireChannel, err: AmqpError, propose: bool = True) -> None:
        """Channel-level exception: Channel.Close, then drop the channel's
        frames until Channel.CloseOk."""
        if ch.state != OPEN:
            return
        ch.flush_confirms()
        ch.state = CLOSING_LOCAL
        ch.release()
        self.dirty.discard(ch)
        self.write(frame.encode_method(ch.number, "Channel.Close", {
            "reply_code": err.code, "reply_text": err.text,
            "class_id": err.class_id, "method_id": err.method_id}))
        if propose:
            self.proposer.propose(ChannelClose(ch.id, False))

    def connection_error(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Connection-level exception: Connection.Close, ignore everything
        but Close/CloseOk, close the transport on CloseOk or timeout."""
        if self.phase in (CLOSING, CLOSED):
            return
        err = AmqpError(code, text, class_id, method_id)
        self.write(frame.encode_method(0, "Connection.Close", {
            "reply_code": code, "reply_text": err.text,
            "class_id": class_id, "method_id": method_id}))
        self.phase = CLOSING
        # from when the Close goes out (a throttled login's is held)
        self.close_deadline = max(self.clock(), self.hold_until) + self.config.close_timeout
        self._release()

    def _fatal(self, code: int, text: str) -> None:
        """The stream can no longer be parsed: send Close and hang up."""
        if self.phase not in (CLOSING, CLOSED):
            self.write(frame.encode_method(0, "Connection.Close", {
                "reply_code": code, "reply_text": AmqpError(code, text).text,
                "class_id": 0, "method_id": 0}))
        self._finish()

    def _release(self) -> None:
        """Tell the log this connection is gone (once)."""
        if self.opened_in_log:
            self.opened_in_log = False
            self.proposer.propose(ConnectionClose(self.id))
        self.count_held(-self.held_bytes)
        self.channels.clear()
        self.by_id.clear()
        self.dirty.clear()

    def _finish(self) -> None:
        self._release()
        self.phase = CLOSED
        self.close_transport = True

    def _linger(self) -> None:
        """After our Connection.CloseOk: the connection is gone, but the socket stays
        open, reading and dropping whatever the client still sends, until the client
        hangs up or close_timeout passes (RabbitMQ's `closed` state). Closing at once
        made the kernel answer frames still in flight (amqplib writes Connection.Close
        ahead of its buffered publishes) with a RST that could reach the client before
        the CloseOk: amqplib then never called close's callback and hung."""
        self._release()
        self.phase = CLOSED
        self.linger_until = self.clock() + self.config.close_timeout

    def force_close(self, code: int = 320, text: str = "CONNECTION_FORCED - broker shutdown") -> None:
        self.hold_until = 0.0  # drain or shutdown: no login answer is worth waiting for
        if self.phase in (RUNNING, AWAIT_OPEN, AWAIT_TUNE_OK, AWAIT_START_OK):
            self.write(frame.encode_method(0, "Connection.Close", {
                "reply_code": code, "reply_text": text, "class_id": 0, "method_id": 0}))
        self._finish()

    def connection_lost(self) -> None:
        self._release()
        self.phase = CLOSED

    if TYPE_CHECKING:  # what the parts call across modules; defined by the part named
        # access.Access
        def _connection_limit_refusal(self) -> str | None: ...
        def _patterns(self) -> tuple[str, str, str] | None: ...
        # connection.Connection
        def _drop_channel(self, ch: WireChannel) -> None: ...
