"""One AMQP connection as a state machine without I/O.

Bytes go in through data_received(), time through tick(); outgoing bytes
accumulate until take_output(), and `close_transport` tells the shell to
close the socket once those bytes are written. Broker state changes are
proposals to the Proposer; their outcome comes back via apply_effect().

Connection is made of parts, one concern each, on one base (endpoint.py:
the state, the output and the ways to close): the handshake and the
connection class's methods (handshake.py), what the user may do (access.py)
and the log's effects (dispatch.py). Here: the input, frames routed to
channels, channels opened and dropped, timers and flow control.
"""
from __future__ import annotations

import itertools
import time

from node.amqp import frame
from node.amqp.access import Access
from node.amqp.channel import (
    CLOSING_CLIENT,
    CLOSING_LOCAL,
    OPEN,
    AmqpError,
    ChannelException,
    ConnectionException,
    WireChannel,
)
from node.amqp.dispatch import Dispatch
from node.amqp.endpoint import AWAIT_HEADER, AWAIT_START_OK, CLOSED, CLOSING, RUNNING
from node.amqp.handshake import SERVER_PROPERTIES, Handshake
from node.broker.ids import ChanId
from node.replication.command import ChannelOpen

# Node-unique serials for connections and channels; starting from the start
# time in ns means a restarted node never reuses an id of its earlier life.
FIRST_SERIAL = time.time_ns()
_serials = itertools.count(FIRST_SERIAL)


def next_serial() -> int:
    return next(_serials)


# Connection.Blocked's reason when a connection's own buffer is over its share
# (the node-wide alarms say "low on memory" / "low on disk", as RabbitMQ)
BUFFER_FULL = "low on memory (connection buffer full)"


class Connection(Handshake, Access, Dispatch):
    """One AMQP connection (its constructor: endpoint.Endpoint)."""

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

    def _closing_frame(self, ftype: int, chan: int, payload: bytes) -> None:
        if ftype != frame.FRAME_METHOD or chan != 0:
            return
        cid, mid = frame.method_ids(payload)
        if cid == 10 and mid == 50:  # Close crossing ours (its CloseOk for ours may follow)
            self.write(frame.encode_method(0, "Connection.CloseOk"))
            self._linger()
        elif cid == 10 and mid == 51:
            self._finish()

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

