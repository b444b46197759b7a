"""Per-channel delivery bookkeeping: tags, unacked deliveries, consumers, prefetch."""
from __future__ import annotations

from typing import TYPE_CHECKING

from node.broker.ids import DeliveryTag

if TYPE_CHECKING:
    from node.broker.ids import ChanId
    from node.broker.queue import Message, Queue


class Consumer:
    __slots__ = ("chan", "channel", "tag", "queue", "no_ack", "exclusive", "prefetch",
                 "unacked", "credit", "priority", "timeout")

    def __init__(self, channel: Channel, tag: str, queue: Queue, no_ack: bool,
                 exclusive: bool, credit: int, priority: int = 0,
                 timeout: int | None = None) -> None:
        self.chan = channel.id
        self.channel = channel
        self.tag = tag
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        # per-consumer prefetch is fixed at consume time (basic.qos global=false)
        self.prefetch = channel.prefetch
        self.unacked = 0
        self.credit = credit
        # x-priority: higher-priority consumers are served while they can take
        self.priority = priority
        # ms a delivery may stay unacked (a quorum queue's consumer timeout, S29)
        self.timeout = timeout

    def can_take(self) -> bool:
        ch = self.channel
        if not ch.flow or self.credit <= 0:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return not (ch.global_prefetch and ch.limited_unacked >= ch.global_prefetch)


# An outstanding delivery: (queue it came from, message, consumer or None for basic.get)
Unacked = tuple["Queue", "Message", "Consumer | None"]


class Channel:
    __slots__ = ("id", "next_tag", "unacked", "consumers", "prefetch", "global_prefetch",
                 "limited_unacked", "flow", "vhost", "released", "next_deadline")

    def __init__(self, chan: ChanId, vhost: str = "/") -> None:
        self.id = chan
        self.vhost = vhost  # where the names of its commands resolve
        self.next_tag = DeliveryTag(1)  # S01
        # tag -> delivery, in tag order (tags only grow, so insertion order is tag order)
        self.unacked: dict[DeliveryTag, Unacked] = {}
        self.consumers: dict[str, Consumer] = {}
        self.prefetch = 0
        self.global_prefetch = 0
        # unacked deliveries made to consumers (what global prefetch counts)
        self.limited_unacked = 0
        self.flow = True
        # tags whose delivery timed out and went back to its queue (S29): an
        # ack, nack or reject of one is no error and does nothing
        self.released: dict[DeliveryTag, None] = {}
        # the earliest deadline of its unacked deliveries, or None (derived)
        self.next_deadline: float | None = None
