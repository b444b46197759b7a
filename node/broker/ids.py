"""Identifier types shared by the wire, the replication layer and the model.

Ids are plain tuples/ints underneath (cheap to encode into Raft entries) but
get their own names so signatures say what they carry.
"""
from __future__ import annotations

from typing import NamedTuple, NewType

NodeId = NewType("NodeId", str)
DeliveryTag = NewType("DeliveryTag", int)  # per channel, from 1 (S01)
PublishSeq = NewType("PublishSeq", int)  # per confirm channel, from 1 (S14); 0 = unconfirmed


class ConnId(NamedTuple):
    """A client connection: the node it is on and a node-unique serial.

    Serials start from the node's start time in ns, so a restarted node never
    reuses the id of a connection from its previous life.
    """

    node: str
    serial: int


class ChanId(NamedTuple):
    """A channel incarnation: its connection plus a per-connection serial.

    The serial is not the AMQP channel number: reopening channel number 1
    after a close gives a fresh ChanId, so late commands of the old channel
    can never touch the new one.
    """

    node: str
    conn: int
    serial: int

    @property
    def conn_id(self) -> ConnId:
        return ConnId(self.node, self.conn)
