"""Helpers for state machine tests: a Harness that folds batches through
apply_batch, builders for the commonest commands and filters for effects.
"""
from __future__ import annotations

from typing import Any

from node.broker.ids import ChanId
from node.replication.command import (
    BasicAck,
    BasicConsume,
    BasicGet,
    BasicNack,
    BasicPublish,
    Batch,
    ChannelOpen,
    Command,
    ExchangeBind,
    ExchangeDeclare,
    QueueBind,
    QueueDeclare,
)
from node.replication.effect import (
    ChannelError,
    Confirm,
    ConnectionFailure,
    Deliver,
    Effect,
    GetOk,
    Reply,
)
from node.replication.machine import BrokerState, apply_batch, default_state


def chan(serial: int = 1, conn: int = 1, node: str = "n1") -> ChanId:
    return ChanId(node, conn, serial)


class Harness:
    """A fresh state plus a batch counter; `run` applies one batch."""

    def __init__(self, now: float = 1000.0) -> None:
        self.state: BrokerState = default_state()
        self.now = now
        self.seqs: dict[tuple[str, int], int] = {}  # each proposer numbers its batches
        self.batches: list[Batch] = []

    def run(self, *cmds: Command, node: str = "n1", incarnation: int = 1) -> list[Effect]:
        seq = self.seqs[(node, incarnation)] = self.seqs.get((node, incarnation), 0) + 1
        b = Batch(node, incarnation, seq, self.now, list(cmds))
        self.batches.append(b)
        return apply_batch(self.state, b)

    def open(self, c: ChanId) -> ChanId:
        self.run(ChannelOpen(c))
        return c


def qdecl(c: ChanId, name: str, durable: bool = False, exclusive: bool = False,
          auto_delete: bool = False, passive: bool = False,
          arguments: dict[str, Any] | None = None) -> QueueDeclare:
    return QueueDeclare(c, name, passive, durable, exclusive, auto_delete, arguments or {},
                        False)


def xdecl(c: ChanId, name: str, type_: str = "direct", durable: bool = False,
          internal: bool = False, auto_delete: bool = False, passive: bool = False
          ) -> ExchangeDeclare:
    return ExchangeDeclare(c, name, type_, passive, durable, auto_delete, internal, {}, False)


def qbind(c: ChanId, q: str, x: str, rk: str = "",
          arguments: dict[str, Any] | None = None) -> QueueBind:
    return QueueBind(c, q, x, rk, arguments or {}, False)


def xbind(c: ChanId, dest: str, src: str, rk: str = "") -> ExchangeBind:
    return ExchangeBind(c, dest, src, rk, {}, False)


def pub(c: ChanId, rk: str, body: bytes = b"m", exchange: str = "", seq: int = 0,
        mandatory: bool = False, props: dict[str, Any] | None = None) -> BasicPublish:
    return BasicPublish(c, seq, exchange, rk, mandatory, props or {}, body)


def consume(c: ChanId, q: str, tag: str = "", no_ack: bool = False, exclusive: bool = False,
            credit: int = 1000, nowait: bool = False) -> BasicConsume:
    return BasicConsume(c, q, tag, False, no_ack, exclusive, {}, nowait, credit)


def ack(c: ChanId, tag: int, multiple: bool = False) -> BasicAck:
    return BasicAck(c, tag, multiple)


def nack(c: ChanId, tag: int, multiple: bool = False, requeue: bool = True) -> BasicNack:
    return BasicNack(c, tag, multiple, requeue, False)


def reject(c: ChanId, tag: int, requeue: bool = True) -> BasicNack:
    return BasicNack(c, tag, False, requeue, True)


def get(c: ChanId, q: str, no_ack: bool = False) -> BasicGet:
    return BasicGet(c, q, no_ack)


def delivers(fx: list[Effect]) -> list[Deliver]:
    return [e for e in fx if isinstance(e, Deliver)]


def gets(fx: list[Effect]) -> list[GetOk]:
    return [e for e in fx if isinstance(e, GetOk)]


def bodies(fx: list[Effect]) -> list[bytes]:
    return [e.body for e in fx if isinstance(e, Deliver | GetOk)]


def replies(fx: list[Effect]) -> list[Reply]:
    return [e for e in fx if isinstance(e, Reply)]


def errors(fx: list[Effect]) -> list[ChannelError | ConnectionFailure]:
    return [e for e in fx if isinstance(e, ChannelError | ConnectionFailure)]


def confirms(fx: list[Effect]) -> list[Confirm]:
    return [e for e in fx if isinstance(e, Confirm)]
