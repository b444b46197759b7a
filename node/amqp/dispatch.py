"""How a Connection carries out the effects the log sends it (a mixin of
node/amqp/connection.py): deliveries, get-oks and returns written to their
channel, confirms and credit coalesced until the end of a dispatch, replies,
channel errors, cancellations and consumer timeouts. A delivery whose bytes
are in the log arrives here already read (node/amqp/server.py, read_stored):
the connection does no log I/O.
"""
from __future__ import annotations

from node.amqp import frame
from node.amqp.channel import CLOSING_CLIENT, OPEN, ChannelException, WireChannel
from node.amqp.endpoint import Endpoint
from node.broker.ids import ChanId
from node.replication.command import BasicCredit
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


class Dispatch(Endpoint):
    """Connection's handling of the log's effects."""

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
