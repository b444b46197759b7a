"""One AMQP connection as a state machine without I/O.

Bytes go in through data_received(), time through tick(); outgoing bytes
accumulate until take_output(), and `close_transport` tells the shell to
close the socket once those bytes are written. Broker state changes are
proposals to the Proposer; their outcome comes back via apply_effect().
"""
from __future__ import annotations

import hmac
import itertools
import platform
import time
from collections.abc import Callable, Iterable
from typing import Any

from node.amqp import frame
from node.amqp.channel import (
    CLOSING_CLIENT,
    CLOSING_LOCAL,
    OPEN,
    AmqpError,
    ChannelException,
    ConnectionException,
    WireChannel,
)
from node.amqp.config import WireConfig
from node.amqp.throttle import LoginGate
from node.broker.ids import ChanId, ConnId
from node.broker.limit import (
    MAX_CHANNELS,
    MAX_CONNECTIONS,
    over,
    user_channels_refused,
    user_connections_refused,
    vhost_connections_refused,
)
from node.broker.loopback import is_loopback
from node.broker.password import check_password
from node.broker.permission import FULL, KIND_NAMES, permitted
from node.broker.vhost import DEFAULT_VHOST
from node.replication.command import (
    BasicCredit,
    ChannelClose,
    ChannelOpen,
    ConnectionClose,
    ConnectionOpen,
)
from node.replication.effect import (
    ChannelError,
    Confirm,
    ConnectionFailure,
    ConsumerCancelled,
    ConsumerTimedOut,
    Deliver,
    Effect,
    GetOk,
    Reply,
    Return,
)
from node.replication.port import Proposer

VERSION = "0.1.0"

# Node-unique serials for connections and channels; starting from the start
# time in ns means a restarted node never reuses an id of its earlier life.
FIRST_SERIAL = time.time_ns()
_serials = itertools.count(FIRST_SERIAL)


def next_serial() -> int:
    return next(_serials)


SERVER_PROPERTIES: dict[str, Any] = {
    "product": "mirrorq",
    "version": VERSION,
    "platform": f"Python {platform.python_version()}",
    "copyright": "mirrorq authors",
    "information": "Raft-mirrored AMQP 0-9-1 broker",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "exchange_exchange_bindings": True,
        "per_consumer_qos": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    },
}

# phases
AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, RUNNING, CLOSING, CLOSED = range(7)


# Connection.Blocked's reason when a connection's own buffer is over its share
# (the node-wide alarms say "low on memory" / "low on disk", as RabbitMQ)
BUFFER_FULL = "low on memory (connection buffer full)"


class HeldBytes:
    """Node-wide sum of the bytes connections hold in unfinished message bodies
    and open transactions: shared by every Connection of a server, read by the
    memory watermark check."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


class Connection:
    def __init__(self, proposer: Proposer, conn_id: ConnId, config: WireConfig,
                 clock: Callable[[], float] = time.monotonic, peer_host: str | None = None,
                 login_gate: LoginGate | None = None,
                 open_gate: Callable[[], str | None] | None = None,
                 gauge: HeldBytes | None = None,
                 peers: Callable[[], Iterable[Connection]] | None = None) -> None:
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

    # ------------------------------------------------------------ input

    def data_received(self, data: bytes) -> None:
        if self.phase == CLOSED or self.close_transport:
            return
        self.last_recv = self.clock()
        reader = self.reader
        reader.feed(data)
        if self.phase == AWAIT_HEADER:
            head = reader.take_protocol_header()
            if head is None:
                return
            if head != frame.PROTOCOL_HEADER:
                self.write(frame.PROTOCOL_HEADER)
                self._finish()
                return
            self.phase = AWAIT_START_OK
            self.write(frame.encode_method(0, "Connection.Start", {
                "version_major": 0, "version_minor": 9,
                "server_properties": SERVER_PROPERTIES,
                "mechanisms": "PLAIN AMQPLAIN", "locales": "en_US"}))
        frames = reader.frames(self._hold_frame)
        try:
            for ftype, chan, payload in frames:
                try:
                    self._frame(ftype, chan, payload)
                except AmqpError as err:  # keep parsing: only Close/CloseOk matter now
                    self.connection_error(err.code, err.text, err.class_id, err.method_id)
                if self.close_transport or self.phase == CLOSED:
                    break
        except frame.FrameError as err:
            self._fatal(501, str(err))
        finally:
            frames.close()  # drops the consumed bytes from the buffer
        if self.buffer_limit:
            self._update_blocked()

    # ------------------------------------------------------------ held bytes

    def count_held(self, delta: int) -> None:
        """Body bytes this connection starts (+) or stops (-) holding."""
        self.held_bytes += delta
        self.gauge.total += delta

    def over_buffer(self) -> bool:
        return bool(self.buffer_limit) and self.held_bytes > self.buffer_limit

    @property
    def input_held(self) -> bool:
        """Frames wait unread in the buffer (the shell stops reading the socket)."""
        return self.reader.held

    def _hold_frame(self, ftype: int, chan: int, payload: bytes) -> bool:
        """Under a node-wide alarm or over its own buffer, a connection is not
        read past its next publish, as RabbitMQ blocks a publishing connection:
        acks, consumes and a Tx.Commit/Rollback ahead of it still go through.
        The content of a message already started goes on, so that it can finish;
        over its buffer only while it is the only one: content frames while
        several messages are unfinished at once wait too (only closing frees them)."""
        over = bool(self.buffer_limit) and self.held_bytes > self.buffer_limit
        if (self.alarm is None and not over) or self.phase != RUNNING:
            return False  # the common case: one call, two comparisons
        if ftype == frame.FRAME_METHOD:
            return frame.method_ids(payload) == (60, 40)
        if over and ftype in (frame.FRAME_HEADER, frame.FRAME_BODY):
            started = [n for n, ch in self.channels.items() if ch.pending is not None]
            return started != [chan]
        return False

    def retry_input(self) -> None:
        """Process frames held back once what held them may have ended (an alarm
        cleared, a channel error freed the connection's bytes)."""
        if self.reader.held:
            self.data_received(b"")

    def _frame(self, ftype: int, chan: int, payload: bytes) -> None:
        if ftype not in frame.FRAME_TYPES:
            # the stream itself is wrong, whatever the channel: 501 before any
            # channel check (RabbitMQ), not 504 for a channel that is not open
            raise frame.FrameError(f"FRAME_ERROR - unknown frame type {ftype}")
        phase = self.phase
        if phase == RUNNING and chan:
            ch = self.channels.get(chan)
            if ch is not None and ch.state == OPEN:
                try:
                    if ftype == frame.FRAME_BODY:
                        ch.on_body(payload)
                    elif ftype == frame.FRAME_METHOD:
                        method = self._decode(payload)
                        cid, mid = frame.method_ids(payload)
                        if cid == 10:
                            raise ConnectionException(503, "COMMAND_INVALID - unimplemented method",
                                                      cid, mid)
                        ch.on_method(method, cid, mid)
                    elif ftype == frame.FRAME_HEADER:
                        ch.on_header(payload)
                    elif ftype == frame.FRAME_HEARTBEAT:
                        raise ConnectionException(501, "FRAME_ERROR - heartbeat on a channel")
                    else:
                        raise frame.FrameError(f"FRAME_ERROR - unknown frame type {ftype}")
                except ChannelException as err:
                    self.channel_error(ch, err)
                return
            self._frame_other_channel(ftype, chan, payload, ch)
            return
        if ftype == frame.FRAME_HEARTBEAT:
            return
        if phase == CLOSING:
            self._closing_frame(ftype, chan, payload)
            return
        if ftype != frame.FRAME_METHOD:
            if ftype in (frame.FRAME_HEADER, frame.FRAME_BODY):
                raise ConnectionException(
                    505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead")
            raise frame.FrameError(f"FRAME_ERROR - unknown frame type {ftype}")
        method = self._decode(payload)
        if chan:  # handshake not finished
            raise ConnectionException(504, "CHANNEL_ERROR - channel used before connection.open",
                                      *frame.method_ids(payload))
        self._connection_method(method, payload)

    def _decode(self, payload: bytes) -> frame.Method:
        try:
            return frame.decode_method(payload)
        except frame.UnknownMethod as err:
            raise ConnectionException(540, f"NOT_IMPLEMENTED - unknown method {err.class_id}.{err.method_id}",
                                      err.class_id, err.method_id) from err
        except frame.BadArguments as err:
            raise ConnectionException(502, str(err), err.class_id, err.method_id) from err

    def _frame_other_channel(self, ftype: int, chan: int, payload: bytes,
                             ch: WireChannel | None) -> None:
        if ch is None:
            if ftype == frame.FRAME_METHOD:
                method = self._decode(payload)
                if method.name == "Channel.Open":
                    self._open_channel(chan)
                    return
            elif ftype == frame.FRAME_HEARTBEAT:
                raise ConnectionException(501, "FRAME_ERROR - heartbeat on a channel")
            raise ConnectionException(504, "CHANNEL_ERROR - expected 'channel.open'",
                                      *(frame.method_ids(payload) if ftype == frame.FRAME_METHOD
                                        else (0, 0)))
        # closing channel: drop everything but Channel.Close / Channel.CloseOk
        if ftype != frame.FRAME_METHOD:
            return
        cid, mid = frame.method_ids(payload)
        if cid != 20:
            return
        if mid == 40:  # Channel.Close
            self.write(frame.encode_method(chan, "Channel.CloseOk"))
            if ch.state == CLOSING_CLIENT:
                self._drop_channel(ch)
        elif mid == 41 and ch.state == CLOSING_LOCAL:  # Channel.CloseOk
            self._drop_channel(ch)

    def _open_channel(self, number: int) -> None:
        # channel_max bounds how many are open, not their numbers (RabbitMQ's rule):
        # channel 65535 is fine while fewer than channel_max channels are open
        if len(self.channels) >= self.channel_max:
            raise ConnectionException(530, f"NOT_ALLOWED - number of channels opened "
                                      f"({len(self.channels)}) has reached the negotiated "
                                      f"channel_max ({self.channel_max})", 20, 10)
        refused = self._channel_limit_refusal()
        if refused is not None:  # a connection error without a method, as RabbitMQ's
            raise ConnectionException(530, refused, 0, 0)
        ch = WireChannel(self, number, ChanId(self.id.node, self.id.serial, next_serial()))
        self.channels[number] = ch
        self.by_id[ch.id] = ch
        self.opened_in_log = True
        self.proposer.propose(ChannelOpen(ch.id, self.vhost))
        # later commands of the channel are ordered after ChannelOpen (FIFO)
        self.write(frame.encode_method(number, "Channel.OpenOk"))

    def _drop_channel(self, ch: WireChannel) -> None:
        if self.channels.get(ch.number) is ch:
            del self.channels[ch.number]
        self.by_id.pop(ch.id, None)
        self.dirty.discard(ch)

    # ------------------------------------------------------------ handshake

    def _connection_method(self, m: frame.Method, payload: bytes) -> None:
        name = m.name
        phase = self.phase
        if name == "Connection.Close":
            self.write(frame.encode_method(0, "Connection.CloseOk"))
            self._linger()
            return
        if phase == AWAIT_START_OK and name == "Connection.StartOk":
            self._start_ok(m)
        elif phase == AWAIT_TUNE_OK and name == "Connection.TuneOk":
            self._tune_ok(m)
        elif phase == AWAIT_OPEN and name == "Connection.Open":
            vhost = m.virtual_host or DEFAULT_VHOST
            if vhost not in self.proposer.read_model().vhosts:
                raise ConnectionException(530, f"NOT_ALLOWED - vhost {vhost} not found", 10, 40)
            self.vhost = vhost
            refused = self._connection_limit_refusal()
            if refused is not None:  # RabbitMQ checks limits before access
                raise ConnectionException(530, refused, 10, 40)
            if self._patterns() is None:
                raise ConnectionException(530, f"NOT_ALLOWED - access to vhost '{vhost}' refused "
                                          f"for user '{self.user}'", 10, 40)
            full = self.open_gate() if self.open_gate is not None else None
            if full is not None:
                raise ConnectionException(530, f"NOT_ALLOWED - {full}", 10, 40)
            self.phase = RUNNING
            self.record_open()
            self.write(frame.encode_method(0, "Connection.OpenOk"))
        elif phase == RUNNING and name in ("Connection.CloseOk", "Connection.Blocked",
                                           "Connection.Unblocked"):
            pass
        elif phase == RUNNING and name == "Connection.UpdateSecret":
            self.write(frame.encode_method(0, "Connection.UpdateSecretOk"))
        else:
            cid, mid = frame.method_ids(payload)
            if phase == RUNNING:
                raise ConnectionException(
                    504, "CHANNEL_ERROR - unexpected method in connection state running", cid, mid)
            raise ConnectionException(503, f"COMMAND_INVALID - unexpected {name} during handshake",
                                      cid, mid)

    def record_open(self) -> None:
        """Put this open connection in the replicated connection table (that
        limits count and topic permissions read the user from) once the
        cluster's machine version has one: at connection.open, or at the
        switch for a connection opened before it (the server calls this)."""
        if self.in_table or self.phase != RUNNING or not self.proposer.read_model().limits_on:
            return
        self.in_table = True
        self.opened_in_log = True  # ConnectionClose owed at the end
        self.proposer.propose(ConnectionOpen(self.id, self.vhost, self.user))

    def _count(self, kind: str, name: str, local: int) -> int:
        """How many `kind` ("vhost"/"user" connections, "chan" channels) of
        `name` the cluster has: this node's counted here (`local`: exact,
        applied or not), the others' from the read model."""
        node = self.id.node
        return local + sum(n for (k, owner, where), n in self.proposer.read_model().counts.items()
                           if k == kind and owner == name and where != node)

    def _local(self) -> list[Connection]:
        peers = self.peers() if self.peers is not None else ()
        return [c for c in peers if c is not self and c.phase == RUNNING]

    def _connection_limit_refusal(self) -> str | None:
        """Why the vhost's or the user's max-connections refuses this
        connection (RabbitMQ's is_over_vhost/user_connection_limit), or None."""
        model = self.proposer.read_model()
        vlimits, ulimits = model.vhost_limits.get(self.vhost), model.user_limits.get(self.user)
        if vlimits is None and ulimits is None:
            return None
        local = self._local()
        if vlimits is not None:
            n = self._count("vhost", self.vhost, sum(1 for c in local if c.vhost == self.vhost))
            limit = over(vlimits, MAX_CONNECTIONS, n)
            if limit is not None:
                return vhost_connections_refused(self.vhost, self.user, limit)
        if ulimits is not None:
            n = self._count("user", self.user, sum(1 for c in local if c.user == self.user))
            limit = over(ulimits, MAX_CONNECTIONS, n)
            if limit is not None:
                return user_connections_refused(self.user, limit)
        return None

    def _channel_limit_refusal(self) -> str | None:
        """Why the user's max-channels (across the cluster) refuses one more."""
        ulimits = self.proposer.read_model().user_limits.get(self.user)
        if ulimits is None or MAX_CHANNELS not in ulimits:
            return None
        local = len(self.channels) + sum(len(c.channels) for c in self._local()
                                         if c.user == self.user)
        limit = over(ulimits, MAX_CHANNELS, self._count("chan", self.user, local))
        return None if limit is None else user_channels_refused(self.user, limit)

    def _start_ok(self, m: frame.Method) -> None:
        props = m.client_properties or {}
        self.client_properties = props
        caps = props.get("capabilities") or {}
        if isinstance(caps, dict):
            self.cancel_notify = bool(caps.get("consumer_cancel_notify"))
            self.blocked_notify = bool(caps.get("connection.blocked"))
            self.auth_failure_close = bool(caps.get("authentication_failure_close"))
        mech = m.mechanism
        user, password = "", None
        response = m.response or ""
        if mech == "PLAIN":
            raw = response.encode("utf-8") if isinstance(response, str) else bytes(response)
            parts = raw.split(b"\x00")
            if len(parts) == 3:
                user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        elif mech == "AMQPLAIN":
            table = frame.decode_amqplain(response)
            login, pw = table.get("LOGIN"), table.get("PASSWORD")
            if isinstance(login, bytes):
                login = login.decode("utf-8", "replace")
            if isinstance(pw, bytes):
                pw = pw.decode("utf-8", "replace")
            if isinstance(login, str) and isinstance(pw, str):
                user, password = login, pw
        gate, host, now = self.login_gate, self.peer_host or "", self.clock()
        wait = gate.wait(host, now) if gate is not None else 0.0
        if wait is None:  # this address's queue of held answers is full: not even checked
            self.connection_error(403, f"ACCESS_REFUSED - too many login attempts from {host}, "
                                       "retry later", 10, 11)
            return
        if wait > 0:
            self.hold_until = now + wait
            self.handshake_deadline += wait
        if password is not None and user in self.config.loopback_users \
                and not is_loopback(self.peer_host, peer=True):
            # RabbitMQ's loopback_users rule: guest only from this machine
            self.connection_error(403, f"ACCESS_REFUSED - user '{user}' can only connect via localhost",
                                  10, 11)
            return
        ok = password is not None and self._authenticate(user, password)
        if gate is not None:
            gate.record(host, ok, now)
        if not ok:
            if self.auth_failure_close:
                self.connection_error(
                    403, f"ACCESS_REFUSED - Login was refused using authentication mechanism {mech}.",
                    10, 11)
            else:
                self._finish()
            return
        self.user = user
        self.phase = AWAIT_TUNE_OK
        self.write(frame.encode_method(0, "Connection.Tune", {
            "channel_max": self.config.channel_max, "frame_max": self.config.frame_max,
            "heartbeat": self.config.heartbeat}))

    def _authenticate(self, user: str, password: str) -> bool:
        """The replicated users when the cluster has any, else this node's
        configured ones (a cluster bootstrapped before users were replicated)."""
        users = self.proposer.read_model().users
        if users:
            entry = users.get(user)
            return entry is not None and check_password(entry[0], password)
        expected = self.config.users.get(user)
        return expected is not None and hmac.compare_digest(expected.encode(), password.encode())

    def _patterns(self) -> tuple[str, str, str] | None:
        """The user's permission patterns on the connection's vhost; before the
        cluster has replicated users, configured users get full access to "/"."""
        model = self.proposer.read_model()
        if not model.users:
            return FULL if self.vhost == DEFAULT_VHOST and self.user in self.config.users else None
        return model.permissions.get((self.user, self.vhost))

    def check(self, kind: int, rtype: str, name: str, class_id: int, method_id: int) -> None:
        """403 ACCESS_REFUSED (a channel error) unless the user may `kind`
        (CONFIGURE / WRITE / READ) the resource, as RabbitMQ checks it."""
        model = self.proposer.read_model()
        if model.permissions is not self._perm_source or model.users is not self._perm_users:
            self._perm_source, self._perm_users = model.permissions, model.users
            self._perm_cache = {}
        key = (kind, rtype, name)
        ok = self._perm_cache.get(key)
        if ok is None:
            patterns = self._patterns()
            ok = patterns is not None and permitted(patterns, kind, name)
            if len(self._perm_cache) < 4096:  # bounded: names are client-chosen
                self._perm_cache[key] = ok
        if not ok:
            raise ChannelException(403, f"ACCESS_REFUSED - {KIND_NAMES[kind]} access to {rtype} "
                                        f"'{name}' in vhost '{self.vhost}' refused for user "
                                        f"'{self.user}'", class_id, method_id)

    def _tune_ok(self, m: frame.Method) -> None:
        def neg(ours: int, theirs: int) -> int:  # 0 means "no limit"
            if ours == 0:
                return theirs
            if theirs == 0:
                return ours
            return min(ours, theirs)

        self.channel_max = neg(self.config.channel_max, int(m.channel_max)) or 65535
        fmax = neg(self.config.frame_max, int(m.frame_max)) or 131072
        if fmax < 4096:
            raise ConnectionException(530, f"NOT_ALLOWED - frame_max={fmax} < 4096", 10, 31)
        self.frame_max = fmax
        self.reader.frame_max = fmax
        # The client's TuneOk heartbeat is the agreed value (it already saw ours);
        # taking a min here could time out a client that beats slower.
        self.heartbeat = int(m.heartbeat)
        self.phase = AWAIT_OPEN

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

    def _closing_frame(self, ftype: int, chan: int, payload: bytes) -> None:
        if ftype != frame.FRAME_METHOD or chan != 0:
            return
        cid, mid = frame.method_ids(payload)
        if cid == 10 and mid == 50:  # Close crossing ours (its CloseOk for ours may follow)
            self.write(frame.encode_method(0, "Connection.CloseOk"))
            self._linger()
        elif cid == 10 and mid == 51:
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

    def revoked(self) -> str | None:
        """Why an open connection may no longer stay (its user or vhost was
        deleted, as RabbitMQ closes them), or None."""
        if self.phase != RUNNING:
            return None
        model = self.proposer.read_model()
        if model.users and self.user not in model.users:
            return f"user '{self.user}' was deleted"
        if self.vhost not in model.vhosts:
            return f"vhost '{self.vhost}' was deleted"
        return None

    def force_close(self, code: int = 320, text: str = "CONNECTION_FORCED - broker shutdown") -> None:
        self.hold_until = 0.0  # drain or shutdown: no login answer is worth waiting for
        if self.phase in (RUNNING, AWAIT_OPEN, AWAIT_TUNE_OK, AWAIT_START_OK):
            self.write(frame.encode_method(0, "Connection.Close", {
                "reply_code": code, "reply_text": text, "class_id": 0, "method_id": 0}))
        self._finish()

    def connection_lost(self) -> None:
        self._release()
        self.phase = CLOSED

    def tick(self) -> None:
        """Heartbeats and timeouts; call about once a second."""
        now = self.clock()
        if now < self.hold_until:  # a held login answer: its deadlines start once it is out
            return
        phase = self.phase
        if phase == CLOSED:
            if self.linger_until and now >= self.linger_until:
                self.close_transport = True
            return
        if phase == CLOSING:
            if now >= self.close_deadline:
                self._finish()
            return
        if phase != RUNNING:
            if now > self.handshake_deadline:
                self._finish()
            return
        hb = self.heartbeat
        if hb <= 0:
            return
        # not while its frames wait unread: the peer's heartbeats are behind them
        if now - self.last_recv > 2 * hb and not self.reader.held:  # peer dead (S08)
            self._finish()
            return
        if now - self.last_send >= hb / 2 and not self.out:
            self.write(frame.HEARTBEAT)

    # ------------------------------------------------------------ effects

    def delivers_to(self, chan: ChanId) -> bool:
        """A delivery to `chan` would be written (the channel is open here):
        only then does the shell read a stored message's bytes for it."""
        ch = self.by_id.get(chan)
        return ch is not None and ch.state == OPEN

    def apply_effect(self, e: Effect) -> None:
        if isinstance(e, ConnectionFailure):
            # The state closed the connection when it applied the failing command,
            # but commands proposed after it (same or later batches in flight, e.g.
            # a ChannelOpen or BasicConsume) applied after that close and left
            # channels/consumers of a dead connection in the state for good. So
            # ConnectionClose is still proposed: FIFO puts it after them (found by
            # tests/fuzz).
            self.connection_error(e.reply_code, e.reply_text, e.class_id, e.method_id)
            return
        ch = self.by_id.get(e.chan)
        if ch is None:
            return  # old incarnation or connection gone
        if isinstance(e, Deliver):
            if ch.state != OPEN:
                return
            # a message in the log: read by the shell before (server.read_stored)
            assert e.props is not None and e.body is not None, "unread stored message"
            self.out += frame.encode_deliver(ch.number, e.consumer_tag, e.delivery_tag,
                                             e.redelivered, e.exchange, e.routing_key,
                                             e.props, e.body, self.frame_max)
            owed = ch.owed_credit
            owed[e.consumer_tag] = owed.get(e.consumer_tag, 0) + 1
            self.dirty.add(ch)
        elif isinstance(e, Confirm):
            if ch.state != OPEN:
                return
            ch.confirms.add(e.seq, e.ack)
            self.dirty.add(ch)
        elif isinstance(e, Reply):
            self._reply(ch, e)
        elif isinstance(e, GetOk):
            if ch.state == OPEN:
                assert e.props is not None and e.body is not None, "unread stored message"
                self.out += frame.encode_get_ok(ch.number, e.delivery_tag, e.redelivered,
                                                e.exchange, e.routing_key, e.message_count,
                                                e.props, e.body, self.frame_max)
        elif isinstance(e, Return):
            if ch.state == OPEN:
                self.out += frame.encode_return(ch.number, e.reply_code, e.reply_text, e.exchange,
                                                e.routing_key, e.props, e.body, self.frame_max)
        elif isinstance(e, ChannelError):
            if ch.state == CLOSING_CLIENT:  # client closed it anyway
                self.write(frame.encode_method(ch.number, "Channel.CloseOk"))
                self._drop_channel(ch)
            else:
                self.channel_error(ch, ChannelException(e.reply_code, e.reply_text, e.class_id,
                                                        e.method_id), propose=False)
        elif isinstance(e, ConsumerCancelled):
            ch.owed_credit.pop(e.consumer_tag, None)
            if ch.state == OPEN and self.cancel_notify:
                self.write(frame.encode_method(ch.number, "Basic.Cancel", {
                    "consumer_tag": e.consumer_tag, "nowait": True}))
        elif isinstance(e, ConsumerTimedOut):
            ch.owed_credit.pop(e.consumer_tag, None)
            if ch.state != OPEN:
                return
            if e.consumer_tag and self.cancel_notify:
                self.write(frame.encode_method(ch.number, "Basic.Cancel", {
                    "consumer_tag": e.consumer_tag, "nowait": True}))
            else:  # rabbit_channel's fallback, its text (the timeout shown as -1) included
                self.channel_error(ch, ChannelException(
                    406, f"PRECONDITION_FAILED - delivery acknowledgement on channel {ch.number} "
                         "timed out. Timeout value used: -1 ms. This timeout value can be "
                         "configured, see consumers doc guide to learn more", 0, 0))

    def _reply(self, ch: WireChannel, e: Reply) -> None:
        method = e.method
        if method == "Channel.CloseOk":
            if ch.state == CLOSING_CLIENT:
                self.write(frame.encode_method(ch.number, "Channel.CloseOk"))
                self._drop_channel(ch)
            return
        if ch.state != OPEN:
            return
        if method == "Basic.RecoverOk" and ch.swallow_recover_ok:
            ch.swallow_recover_ok -= 1
            return
        if method == "Basic.CancelOk":
            ch.owed_credit.pop(e.fields.get("consumer_tag", ""), None)
        self.write(frame.encode_method(ch.number, method, e.fields))

    def end_dispatch(self) -> None:
        """After a dispatch: coalesced confirms, then credit grants."""
        if not self.dirty:
            return
        for ch in self.dirty:
            ch.flush_confirms()
        if not self.writing_paused:
            self.grant_credit()
            self.dirty.clear()
        else:  # keep channels with owed credit for resume_writing
            self.dirty = {ch for ch in self.dirty if ch.owed_credit}

    def grant_credit(self) -> None:
        """Give back credit for deliveries written (one proposal per consumer)."""
        for ch in list(self.by_id.values()):
            if ch.owed_credit and ch.state == OPEN:
                for tag, n in ch.owed_credit.items():
                    self.proposer.propose(BasicCredit(ch.id, tag, n))
                ch.owed_credit = {}

    # ------------------------------------------------------------ flow control

    def set_blocked(self, reason: str | None) -> bool:
        """A node-wide alarm (reason) or its end: Connection.Blocked/Unblocked
        to clients that asked. True when something was written."""
        self.alarm = reason
        return self._update_blocked()

    def _update_blocked(self) -> bool:
        """Blocked while a node-wide alarm is on or this connection's own buffer
        is over its share."""
        reason = self.alarm or (BUFFER_FULL if self.over_buffer() else None)
        blocked = reason is not None
        if blocked == self.blocked_sent or self.phase != RUNNING:
            return False
        self.blocked_sent = blocked
        if not self.blocked_notify:
            return False
        if blocked:
            self.write(frame.encode_method(0, "Connection.Blocked", {"reason": reason}))
        else:
            self.write(frame.encode_method(0, "Connection.Unblocked"))
        return True

