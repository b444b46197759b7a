"""Effects: what apply asks nodes to do, as data.

Every node applies every batch; a node carries out only the effects whose
`chan.node` (or `conn.node`) is its own id. Effects for one channel are
emitted in the order the client must see them (a Return before its
Confirm, S17).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from node.broker.ids import ChanId, ConnId, DeliveryTag, PublishSeq

Props = dict[str, Any]


class Reply(NamedTuple):
    """A synchronous reply: `method` is the pamqp class path under
    pamqp.commands ("Queue.DeclareOk", "Basic.ConsumeOk", "Channel.CloseOk",
    "Basic.GetEmpty", ...) and `fields` its constructor keyword arguments."""

    chan: ChanId
    method: str
    fields: dict[str, Any]


class Deliver(NamedTuple):
    """props/body None: read from the log through `stored` by the AMQP server
    before the connection gets it (node/amqp/server.py read_stored:
    message_store.load), then `delivery_count` >= 0 is added as the
    x-delivery-count header and `acquired_count` >= 0 as x-acquired-count.
    `stored` is (loc, size) as apply makes it, and (handle, props offset,
    props length, size) once the node resolved it (message_store.LogReader:
    it is the third last field of Deliver and GetOk)."""

    chan: ChanId
    consumer_tag: str
    delivery_tag: DeliveryTag
    redelivered: bool
    exchange: str
    routing_key: str
    props: Props | None
    body: bytes | None
    stored: Any = None
    delivery_count: int = -1
    acquired_count: int = -1


class GetOk(NamedTuple):
    chan: ChanId
    delivery_tag: DeliveryTag
    redelivered: bool
    exchange: str
    routing_key: str
    message_count: int
    props: Props | None  # as in Deliver
    body: bytes | None
    stored: Any = None
    delivery_count: int = -1
    acquired_count: int = -1


class Return(NamedTuple):
    chan: ChanId
    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str
    props: Props
    body: bytes


class Confirm(NamedTuple):
    """Outcome of publish `seq` on a confirm channel: ack=True basic.ack,
    False basic.nack. The wire coalesces consecutive acks (multiple=true)."""

    chan: ChanId
    seq: PublishSeq
    ack: bool


class ChannelError(NamedTuple):
    """A channel exception. The state machine has already closed the channel
    (unacked requeued, consumers gone); the wire sends Channel.Close with
    these values and waits for Channel.CloseOk."""

    chan: ChanId
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


class ConnectionFailure(NamedTuple):
    """A connection exception decided in apply (e.g. 530 NOT_ALLOWED). The
    state machine has already closed the connection's channels."""

    conn: ConnId
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


class ConsumerCancelled(NamedTuple):
    """Broker-initiated basic.cancel (queue deleted); the wire sends it to
    clients that announced consumer_cancel_notify."""

    chan: ChanId
    consumer_tag: str


class ConsumerTimedOut(NamedTuple):
    """A quorum queue's consumer timeout (S29): the state already cancelled
    the consumer and returned its timed-out deliveries. The wire sends
    basic.cancel to a client with consumer_cancel_notify; it closes the
    channel (406) for one without, and for an unacked basic.get
    (consumer_tag ""), as RabbitMQ 4.3's rabbit_channel does."""

    chan: ChanId
    consumer_tag: str


Effect = (Reply | Deliver | GetOk | Return | Confirm | ChannelError | ConnectionFailure
          | ConsumerCancelled | ConsumerTimedOut)


def effect_serial(effect: Effect) -> int:
    """The serial of the connection the effect is for."""
    if isinstance(effect, ConnectionFailure):
        return effect.conn.serial
    return effect.chan.conn


def effect_node(effect: Effect) -> str:
    """The node that must carry the effect out."""
    if isinstance(effect, ConnectionFailure):
        return effect.conn.node
    return effect.chan.node
