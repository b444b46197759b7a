"""One message as a queue holds it (the pure model's record)."""
from __future__ import annotations

from typing import Any


class Message:
    """One message as held by one queue. Its properties and body are either
    here (`props`, `body`: shared, never copied, between the queues a publish
    was routed to) or None, read back from the Raft log at `loc` when
    delivered (node/replication/message_store.py). A dead-lettered message
    has new properties here and its body still in the log."""

    __slots__ = ("seq", "exchange", "routing_key", "props", "body", "loc", "size", "priority",
                 "persistent", "expires_at", "redelivered", "delivery_count", "acquired_count",
                 "deadline")

    def __init__(self, seq: int, exchange: str, routing_key: str, props: dict[str, Any] | None,
                 body: bytes | None, persistent: bool, expires_at: float | None,
                 loc: int | None = None, size: int = -1, priority: int = -1) -> None:
        self.seq = seq
        self.exchange = exchange
        self.routing_key = routing_key
        self.props = props
        self.body = body
        self.loc = loc
        self.size = len(body) if size < 0 and body is not None else size
        # the priority property as published (0: absent or invalid)
        self.priority = priority if priority >= 0 else raw_priority(props or {})
        self.persistent = persistent
        self.expires_at = expires_at
        # True once delivered: any later delivery is a redelivery (S07)
        self.redelivered = False
        # times returned to the queue (x-delivery-count, x-delivery-limit); on
        # a quorum queue from machine version 3 on the failed deliveries only
        # (reject with requeue, its channel gone), as RabbitMQ 4.3 counts them
        self.delivery_count = 0
        # machine version 3 on, quorum queues: every return (x-acquired-count)
        self.acquired_count = 0
        # while unacked from a quorum queue with a consumer timeout (S29): when
        # it times out (the state's clock); None otherwise
        self.deadline: float | None = None


def raw_priority(props: dict[str, Any]) -> int:
    p = props.get("priority")
    if not isinstance(p, int) or p <= 0:
        return 0
    return p

