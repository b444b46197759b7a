"""One AMQP channel: method -> Command mapping, content assembly, publisher
confirm numbering/coalescing and tx buffering. No I/O: output goes to the
owning connection's buffer, state changes go to the proposer.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.amqp import frame
from node.broker.ids import ChanId, DeliveryTag, PublishSeq
from node.broker.permission import CONFIGURE, READ, WRITE
from node.broker.reply import REPLY_NAMES
from node.replication.command import (
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicGet,
    BasicNack,
    BasicPublish,
    BasicQos,
    BasicRecover,
    ChannelClose,
    ChannelFlow,
    Command,
    Echo,
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeUnbind,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    TxCommit,
)

if TYPE_CHECKING:
    from node.amqp.connection import Connection


class AmqpError(Exception):
    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        name = REPLY_NAMES.get(code, "ERROR")
        full = text if text.startswith(name) else f"{name} - {text}"
        super().__init__(full)
        self.code = code
        # reply-text is a shortstr: 255 bytes, not characters. A text naming a
        # non-ASCII queue failed to encode and turned the close into a 541
        # (found by tests/fuzz).
        self.text = full.encode("utf-8")[:255].decode("utf-8", "ignore")
        self.class_id = class_id
        self.method_id = method_id


class ChannelException(AmqpError):
    """Closes the channel only (soft error)."""


class ConnectionException(AmqpError):
    """Closes the whole connection (hard error)."""


class ConfirmTracker:
    """Coalesces publisher confirm outcomes (S14, S15, S22).

    `low` is the lowest seq not yet reported; every seq below it has been
    reported. Outcomes beyond a still-pending `low` go out individually and
    are remembered in `reported` until `low` passes them. Per publish this is
    O(1) set/dict work plus the sort of one dispatch's outcomes.
    """

    __slots__ = ("low", "reported", "batch")

    def __init__(self) -> None:
        self.low = 1
        self.reported: set[int] = set()
        self.batch: dict[int, bool] = {}

    def add(self, seq: int, ack: bool) -> None:
        self.batch[seq] = ack

    def flush(self) -> list[tuple[int, bool, bool]]:
        """-> [(seq, ack, multiple)] in the order to send them."""
        batch = self.batch
        if not batch:
            return []
        out: list[tuple[int, bool, bool]] = []
        reported = self.reported
        low = self.low
        run_end = 0
        run_len = 0
        while True:
            if low in reported:  # reported out of order earlier: not outstanding
                reported.discard(low)
                batch.pop(low, None)
                low += 1
                continue
            ack = batch.pop(low, None)
            if ack is None:
                break
            if ack:
                run_end = low
                run_len += 1
            else:  # nacks go out one by one, ending the current ack run
                if run_len:
                    out.append((run_end, True, run_len > 1))
                    run_len = 0
                out.append((low, False, False))
            low += 1
        if run_len:
            out.append((run_end, True, run_len > 1))
        self.low = low
        if batch:  # beyond a pending seq: individually, never multiple
            for seq in sorted(batch):
                if seq < low or seq in reported:
                    continue  # duplicate outcome: report once only (S15)
                out.append((seq, batch[seq], False))
                reported.add(seq)
            batch.clear()
        return out


OPEN, CLOSING_LOCAL, CLOSING_CLIENT = 0, 1, 2

TxItem = BasicPublish | BasicAck | BasicNack


def _handler_name(method_name: str) -> str:
    cls, _, meth = method_name.partition(".")
    snake = "".join("_" + c.lower() if c.isupper() else c for c in meth).lstrip("_")
    return f"on_{cls.lower()}_{snake}"


class WireChannel:
    """State of one open channel number on a connection: the wire's side of a channel
    (node.broker.channel.Channel is the replicated model's)."""

    def __init__(self, conn: Connection, number: int, chan_id: ChanId) -> None:
        self.conn = conn
        self.number = number
        self.id = chan_id
        self.state = OPEN
        self.mode: str | None = None  # None, "confirm" or "tx"
        self.next_seq = 1
        self.confirms = ConfirmTracker()
        self.tx_buffer: list[TxItem] = []
        self.tx_bytes = 0  # bodies in tx_buffer (counted in conn.held_bytes)
        self.swallow_recover_ok = 0
        # content being assembled: publish method, props, declared size, parts
        self.pending: Any = None
        self.pending_props: dict[str, Any] = {}
        self.pending_size = -1  # -1: waiting for the content header
        self.pending_parts: list[bytes] = []
        self.pending_got = 0  # body bytes in pending_parts (counted in conn.held_bytes)
        self.owed_credit: dict[str, int] = {}

    # ------------------------------------------------------------ input

    def propose(self, cmd: Command, size: int = 0) -> None:
        self.conn.proposer.propose(cmd, size)

    def on_method(self, method: frame.Method, cid: int, mid: int) -> None:
        if self.pending is not None:
            raise ConnectionException(
                505, "UNEXPECTED_FRAME - expected content "
                + ("header" if self.pending_size < 0 else "body")
                + " for class 60, got method frame instead", 60, 40)
        handler = _HANDLERS.get(method.name)
        if handler is None:
            handler = _handler_name(method.name)
            _HANDLERS[method.name] = handler
        fn = getattr(self, handler, None)
        if fn is None:
            raise ConnectionException(540, f"NOT_IMPLEMENTED - {method.name}", cid, mid)
        fn(method)

    def on_header(self, payload: bytes) -> None:
        if self.pending is None or self.pending_size >= 0:
            raise ConnectionException(
                505, "UNEXPECTED_FRAME - expected method frame, got content header instead")
        try:
            cid, size, props = frame.decode_header(payload)
        except frame.BadArguments as err:
            raise ConnectionException(502, str(err), 60, 40) from err
        if cid != 60:
            raise ConnectionException(505, f"UNEXPECTED_FRAME - content header for class {cid}", 60, 40)
        limit = self.conn.config.max_message_size
        if size > limit:
            self.pending = None
            self.pending_size = -1
            raise ChannelException(
                406, f"PRECONDITION_FAILED - message size {size} is larger than configured max size {limit}",
                60, 40)
        self.pending_props = props
        self.pending_size = size
        if size == 0:
            self._complete(b"")

    def on_body(self, payload: bytes) -> None:
        if self.pending is None or self.pending_size < 0:
            raise ConnectionException(
                505, "UNEXPECTED_FRAME - expected method frame, got content body instead")
        got = self.pending_got + len(payload)
        if got > self.pending_size:
            raise ConnectionException(
                501, f"FRAME_ERROR - body of {got} bytes exceeds declared size {self.pending_size}",
                60, 40)
        if got == self.pending_size:
            if self.pending_parts:
                self.pending_parts.append(payload)
                body = b"".join(self.pending_parts)
            else:
                body = payload
            self._complete(body)
        else:
            self.pending_parts.append(payload)
            self.pending_got = got
            self.conn.count_held(len(payload))

    def _complete(self, body: bytes) -> None:
        m = self.pending
        self.pending = None
        self.pending_size = -1
        self.pending_parts = []
        if self.pending_got:
            self.conn.count_held(-self.pending_got)
            self.pending_got = 0
        seq = 0
        if self.mode == "confirm":
            seq = self.next_seq
            self.next_seq = seq + 1
        cmd = BasicPublish(self.id, PublishSeq(seq), m.exchange, m.routing_key, m.mandatory,
                           self.pending_props, body)
        self.conn.published = True
        if self.mode == "tx":
            self.tx_buffer.append(cmd)
            self.tx_bytes += len(body)
            self.conn.count_held(len(body))
        else:
            self.propose(cmd, len(body))

    def release(self) -> None:
        """Drop the unfinished message and the open transaction (channel closed or
        failed): the connection no longer holds their bytes."""
        self.conn.count_held(-(self.pending_got + self.tx_bytes))
        self.pending = None
        self.pending_size = -1
        self.pending_parts = []
        self.pending_got = 0
        self.tx_buffer = []
        self.tx_bytes = 0

    # ------------------------------------------------------------ channel class

    def on_channel_open(self, m: frame.Method) -> None:
        raise ConnectionException(504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)

    def on_channel_flow(self, m: frame.Method) -> None:
        if not m.active:  # RabbitMQ's answer (rabbit_channel), which clients' tests expect
            raise ConnectionException(540, "NOT_IMPLEMENTED - active=false", 20, 20)
        self.propose(ChannelFlow(self.id, True))

    def on_channel_flow_ok(self, m: frame.Method) -> None:
        pass  # answer to a server-initiated flow, which we never send

    def on_channel_close(self, m: frame.Method) -> None:
        self.state = CLOSING_CLIENT
        self.release()
        self.propose(ChannelClose(self.id, True))

    def on_channel_close_ok(self, m: frame.Method) -> None:
        # a CloseOk on an open channel: RabbitMQ ignores it too
        pass

    # ------------------------------------------------------------ exchange / queue

    # Permission checks follow RabbitMQ: configure to declare or delete, write
    # on what receives messages (publish target, binding destination), read on
    # what gives them (binding source, consumed queue). Passive declares need none.

    def on_exchange_declare(self, m: frame.Method) -> None:
        if not m.passive:
            self.conn.check(CONFIGURE, "exchange", m.exchange, 40, 10)
        self.propose(ExchangeDeclare(self.id, m.exchange, m.exchange_type, bool(m.passive),
                                     bool(m.durable), bool(m.auto_delete), bool(m.internal),
                                     dict(m.arguments or {}), bool(m.nowait)))

    def on_exchange_delete(self, m: frame.Method) -> None:
        self.conn.check(CONFIGURE, "exchange", m.exchange, 40, 20)
        self.propose(ExchangeDelete(self.id, m.exchange, bool(m.if_unused), bool(m.nowait)))

    def on_exchange_bind(self, m: frame.Method) -> None:
        self.conn.check(WRITE, "exchange", m.destination, 40, 30)
        self.conn.check(READ, "exchange", m.source, 40, 30)
        self.propose(ExchangeBind(self.id, m.destination, m.source, m.routing_key,
                                  dict(m.arguments or {}), bool(m.nowait)))

    def on_exchange_unbind(self, m: frame.Method) -> None:
        self.conn.check(WRITE, "exchange", m.destination, 40, 40)
        self.conn.check(READ, "exchange", m.source, 40, 40)
        self.propose(ExchangeUnbind(self.id, m.destination, m.source, m.routing_key,
                                    dict(m.arguments or {}), bool(m.nowait)))

    def on_queue_declare(self, m: frame.Method) -> None:
        if not m.passive:
            # a server-named queue is checked as RabbitMQ names them: amq.gen-...
            self.conn.check(CONFIGURE, "queue", m.queue or "amq.gen-", 50, 10)
            dlx = (m.arguments or {}).get("x-dead-letter-exchange")
            if isinstance(dlx, str | bytes):  # dead letters are published into the DLX
                name = dlx.decode("utf-8", "replace") if isinstance(dlx, bytes) else dlx
                self.conn.check(WRITE, "exchange", name or "amq.default", 50, 10)
        self.propose(QueueDeclare(self.id, m.queue, bool(m.passive), bool(m.durable),
                                  bool(m.exclusive), bool(m.auto_delete),
                                  dict(m.arguments or {}), bool(m.nowait)))

    def on_queue_bind(self, m: frame.Method) -> None:
        self.conn.check(WRITE, "queue", m.queue, 50, 20)
        self.conn.check(READ, "exchange", m.exchange, 50, 20)
        self.propose(QueueBind(self.id, m.queue, m.exchange, m.routing_key,
                               dict(m.arguments or {}), bool(m.nowait)))

    def on_queue_unbind(self, m: frame.Method) -> None:
        self.conn.check(WRITE, "queue", m.queue, 50, 50)
        self.conn.check(READ, "exchange", m.exchange, 50, 50)
        self.propose(QueueUnbind(self.id, m.queue, m.exchange, m.routing_key,
                                 dict(m.arguments or {})))

    def on_queue_purge(self, m: frame.Method) -> None:
        self.conn.check(READ, "queue", m.queue, 50, 30)
        self.propose(QueuePurge(self.id, m.queue, bool(m.nowait)))

    def on_queue_delete(self, m: frame.Method) -> None:
        self.conn.check(CONFIGURE, "queue", m.queue, 50, 40)
        self.propose(QueueDelete(self.id, m.queue, bool(m.if_unused), bool(m.if_empty),
                                 bool(m.nowait)))

    # ------------------------------------------------------------ basic

    def on_basic_qos(self, m: frame.Method) -> None:
        if m.prefetch_size:  # RabbitMQ 3.10 answers this with a 540 connection error
            raise ConnectionException(540, f"NOT_IMPLEMENTED - prefetch_size!=0 ({m.prefetch_size})",
                                      60, 10)
        self.propose(BasicQos(self.id, int(m.prefetch_count), bool(m.global_)))

    def on_basic_consume(self, m: frame.Method) -> None:
        self.conn.check(READ, "queue", m.queue, 60, 20)
        self.propose(BasicConsume(self.id, m.queue, m.consumer_tag, bool(m.no_local),
                                  bool(m.no_ack), bool(m.exclusive), dict(m.arguments or {}),
                                  bool(m.nowait), self.conn.config.consumer_credit,
                                  self._consumer_timeout()))

    def on_basic_cancel(self, m: frame.Method) -> None:
        self.propose(BasicCancel(self.id, m.consumer_tag, bool(m.nowait)))

    def on_basic_get(self, m: frame.Method) -> None:
        self.conn.check(READ, "queue", m.queue, 60, 70)
        self.propose(BasicGet(self.id, m.queue, bool(m.no_ack), self._consumer_timeout()))

    def _consumer_timeout(self) -> int:
        """This node's consumer_timeout for the command (S29): -1 for none, and
        before machine version 3 (builds before it cannot read the field)."""
        ms = self.conn.config.consumer_timeout
        if ms <= 0 or not self.conn.proposer.read_model().quorum_semantics:
            return -1
        return ms

    def on_basic_publish(self, m: frame.Method) -> None:
        if m.immediate:
            raise ConnectionException(540, "NOT_IMPLEMENTED - immediate=true", 60, 40)
        self.conn.check(WRITE, "exchange", m.exchange or "amq.default", 60, 40)
        self.pending = m
        self.pending_size = -1

    def _settle(self, cmd: BasicAck | BasicNack) -> None:
        if self.mode == "tx":
            self.tx_buffer.append(cmd)
        else:
            self.propose(cmd)

    def on_basic_ack(self, m: frame.Method) -> None:
        self._settle(BasicAck(self.id, DeliveryTag(int(m.delivery_tag)), bool(m.multiple)))

    def on_basic_nack(self, m: frame.Method) -> None:
        self._settle(BasicNack(self.id, DeliveryTag(int(m.delivery_tag)), bool(m.multiple),
                               bool(m.requeue), False))

    def on_basic_reject(self, m: frame.Method) -> None:
        self._settle(BasicNack(self.id, DeliveryTag(int(m.delivery_tag)), False, bool(m.requeue),
                               True))

    def on_basic_recover(self, m: frame.Method) -> None:
        if not m.requeue:
            raise ConnectionException(540, "NOT_IMPLEMENTED - requeue=false", 60, 110)
        self.propose(BasicRecover(self.id))

    def on_basic_recover_async(self, m: frame.Method) -> None:
        if not m.requeue:
            raise ConnectionException(540, "NOT_IMPLEMENTED - requeue=false", 60, 100)
        self.swallow_recover_ok += 1  # recover-async has no reply
        self.propose(BasicRecover(self.id))

    # ------------------------------------------------------------ confirm / tx

    def on_confirm_select(self, m: frame.Method) -> None:
        if self.mode == "tx":
            raise ChannelException(
                406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode", 85, 10)
        if self.mode is None:
            self.mode = "confirm"
            self.next_seq = 1
        if not m.nowait:
            self.propose(Echo(self.id, "Confirm.SelectOk", {}))

    def on_tx_select(self, m: frame.Method) -> None:
        if self.mode == "confirm":
            raise ChannelException(
                406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode", 90, 10)
        self.mode = "tx"
        self.propose(Echo(self.id, "Tx.SelectOk", {}))

    def on_tx_commit(self, m: frame.Method) -> None:
        if self.mode != "tx":
            raise ChannelException(406, "PRECONDITION_FAILED - channel is not transactional",
                                   90, 20)
        items = tuple(self.tx_buffer)
        size = self.tx_bytes
        self.tx_buffer = []
        self.tx_bytes = 0
        self.conn.count_held(-size)  # from here the proposer's in-flight bound counts them
        self.propose(TxCommit(self.id, items), size)

    def on_tx_rollback(self, m: frame.Method) -> None:
        if self.mode != "tx":
            raise ChannelException(406, "PRECONDITION_FAILED - channel is not transactional",
                                   90, 30)
        self.conn.count_held(-self.tx_bytes)
        self.tx_buffer = []
        self.tx_bytes = 0
        self.propose(Echo(self.id, "Tx.RollbackOk", {}))

    def on_access_request(self, m: frame.Method) -> None:
        self.conn.write(frame.encode_method(self.number, "Access.RequestOk", {"ticket": 1}))

    # ------------------------------------------------------------ output side

    def flush_confirms(self) -> None:
        outcomes = self.confirms.flush()
        if not outcomes:
            return
        write = self.conn.write
        n = self.number
        for seq, ack, multiple in outcomes:
            if ack:
                write(frame.encode_basic_ack(n, seq, multiple))
            else:
                write(frame.encode_basic_nack(n, seq, multiple))


_HANDLERS: dict[str, str] = {}
