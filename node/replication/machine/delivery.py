"""Handlers for getting messages out: consumers (consume, qos, cancel,
credit), picking a consumer and delivering, requeueing, basic.get,
acks/nacks/recover, and expiry on Tick.
"""
from __future__ import annotations

from typing import Any

from node.broker.channel import Channel, Consumer
from node.broker.ids import DeliveryTag
from node.broker.policy import effective_definition
from node.broker.queue import Message, Queue
from node.broker.reply import (
    BASIC_ACK,
    BASIC_CANCEL,
    BASIC_CONSUME,
    BASIC_GET,
    BASIC_NACK,
    BASIC_QOS,
    BASIC_RECOVER,
    BASIC_REJECT,
)
from node.replication.command import (
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicCredit,
    BasicGet,
    BasicNack,
    BasicQos,
    BasicRecover,
    Tick,
)
from node.replication.effect import ConsumerTimedOut, Deliver, GetOk
from node.replication.machine.errors import _ChanErr, _ConnErr, _type_name, _where
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.policy import queue_policies
from node.replication.machine.state import _gen_name
from node.replication.machine.version import QUORUM_SEMANTICS
from node.replication.message_store import with_delivery_count


class DeliveryHandlers(ApplierBase):
    __slots__ = ()

    # -- consumers ----------------------------------------------------------

    @handles(BasicQos, reply=lambda c: BASIC_QOS)
    def basic_qos(self, cmd: BasicQos) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        if cmd.global_:
            ch.global_prefetch = cmd.prefetch_count
        else:
            ch.prefetch = cmd.prefetch_count
        self.reply(cmd.chan, "Basic.QosOk")
        self.mark_channel_queues(ch)

    @handles(BasicConsume, reply=lambda c: None if c.nowait else BASIC_CONSUME)
    def basic_consume(self, cmd: BasicConsume) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        tag = cmd.consumer_tag
        if tag in ch.consumers:
            raise _ConnErr(530, f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'",
                           BASIC_CONSUME)
        q = self._queue_for(ch, cmd.queue, BASIC_CONSUME)
        if tag == "":
            s.counter += 1
            tag = _gen_name("amq.ctag-", cmd.chan, s.counter)
        if q.exclusive_consumer is not None or (cmd.exclusive and q.consumers):
            raise _ChanErr(403, f"ACCESS_REFUSED - queue {_where(q.name)} in exclusive use",
                           BASIC_CONSUME)
        prio = cmd.arguments.get("x-priority", 0) if cmd.arguments else 0
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue "
                                f'{_where(q.name)}: "expected integer, got {_type_name(prio)}"',
                           BASIC_CONSUME)
        timeout = None
        if self.quorum43(q):
            timeout = self.consumer_timeout(q, cmd.arguments, cmd.timeout)
        c = Consumer(ch, tag, q, cmd.no_ack, cmd.exclusive, cmd.credit, prio, timeout)
        ch.consumers[tag] = c
        q.consumers[(cmd.chan, tag)] = c
        if prio:
            q.prio_consumers += 1
        if cmd.exclusive:
            q.exclusive_consumer = c
        if not cmd.nowait:
            self.reply(cmd.chan, "Basic.ConsumeOk", {"consumer_tag": tag})
        self.dirty[q.name] = q

    @handles(BasicCancel, reply=lambda c: None if c.nowait else BASIC_CANCEL)
    def basic_cancel(self, cmd: BasicCancel) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        c = ch.consumers.get(cmd.consumer_tag)
        if not cmd.nowait:
            self.reply(cmd.chan, "Basic.CancelOk", {"consumer_tag": cmd.consumer_tag})
        if c is not None:
            self.remove_consumer(c)

    def consumer_timeout(self, q: Queue, args: dict[str, Any] | None, node_ms: int
                         ) -> int | None:
        """A quorum queue consumer's timeout in ms (rabbit_queue_type:consume
        and get_consumer_timeout, 4.3): its x-consumer-timeout, else the
        queue's (the smaller of x-consumer-timeout and the policy's
        consumer-timeout), else the consuming node's consumer_timeout."""
        v = (args or {}).get("x-consumer-timeout")
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int):
                raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for "
                                    f'queue {_where(q.name)}: "expected integer, got '
                                    f'{_type_name(v)}"', BASIC_CONSUME)
            if v < 0:
                raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for "
                                    f"queue {_where(q.name)}: {{value_negative,{v}}}",
                               BASIC_CONSUME)
            return v
        return self.queue_timeout(q, node_ms)

    def queue_timeout(self, q: Queue, node_ms: int) -> int | None:
        """The queue's consumer timeout (argument and policy: the smaller),
        else the node's (-1: none)."""
        found = [t for t in (q.arguments.get("x-consumer-timeout"),
                             effective_definition(*queue_policies(self.s, q))
                             .get("consumer-timeout"))
                 if isinstance(t, int) and not isinstance(t, bool) and t >= 0]
        if found:
            return min(found)
        return node_ms if node_ms >= 0 else None

    def set_deadline(self, ch: Channel, m: Message, timeout_ms: int) -> None:
        """An unacked delivery of a quorum queue times out `timeout_ms` from now."""
        d = m.deadline = self.s.now + timeout_ms / 1000.0
        if ch.next_deadline is None or d < ch.next_deadline:
            ch.next_deadline = d
        self.s.deadline_chans[ch.id] = None

    def remove_consumer(self, c: Consumer) -> None:
        q = c.queue
        c.channel.consumers.pop(c.tag, None)
        if q.consumers.pop((c.chan, c.tag), None) is not None and c.priority:
            q.prio_consumers -= 1
        if q.single_active:
            self.dirty[q.name] = q  # the next consumer takes over (S-A-C)
        if q.exclusive_consumer is c:
            q.exclusive_consumer = None
        q.last_used = self.s.now
        if q.auto_delete and not q.consumers and not q.deleted:
            self.delete_queue(q)

    @handles(BasicCredit)
    def basic_credit(self, cmd: BasicCredit) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        c = ch.consumers.get(cmd.consumer_tag)
        if c is not None:
            c.credit += cmd.credit
            self.dirty[c.queue.name] = c.queue

    # -- delivery -----------------------------------------------------------

    def pick(self, q: Queue) -> Consumer | None:
        """The consumer to deliver the head to: with single active consumer the
        earliest registered one only; else round-robin among the consumers of
        the highest x-priority that can take a message (lower ones only get
        what the higher ones cannot take)."""
        cons = q.consumers
        if q.single_active:
            if q.prio_consumers and self.quorum43(q):
                return self._pick_active_by_priority(q)
            for c in cons.values():  # never rotated: registration order
                return c if c.can_take() else None
            return None
        best: tuple[tuple[Any, str], Consumer] | None = None
        for key, c in cons.items():
            if c.can_take():
                if not q.prio_consumers:
                    best = (key, c)
                    break
                if best is None or c.priority > best[1].priority:
                    best = (key, c)
        if best is None:
            return None
        key, c = best
        # rotate: the served consumer goes to the back
        del cons[key]
        cons[key] = c
        return c

    def _pick_active_by_priority(self, q: Queue) -> Consumer | None:
        """Single active consumer of a quorum queue with consumer priorities
        (RabbitMQ 4.0's rabbit_fifo activate_next_consumer): the active one
        is the first in q.consumers; a consumer of a higher priority (the
        earliest registered of the highest) takes over once the active one
        holds no unacked delivery, and until then the active one is
        quiescing: it gets nothing new (S30)."""
        cons = q.consumers
        active = next(iter(cons.values()), None)
        if active is None:
            return None
        best_key, best = None, active
        for key, c in cons.items():
            if c.priority > best.priority:
                best_key, best = key, c
        if best_key is not None:
            if active.unacked:
                return None  # quiescing
            items = list(cons.items())
            cons.clear()
            cons[best_key] = best
            for key, c in items:
                if key != best_key:
                    cons[key] = c
            active = best
        return active if active.can_take() else None

    def deliver(self, c: Consumer, q: Queue, m: Message) -> None:
        ch = c.channel
        tag = ch.next_tag
        ch.next_tag = DeliveryTag(tag + 1)
        c.credit -= 1
        if c.no_ack:
            self.drop(m)  # settled on delivery (S02)
        else:
            ch.unacked[tag] = (q, m, c)
            c.unacked += 1
            ch.limited_unacked += 1
            if c.timeout is not None:
                self.set_deadline(ch, m, c.timeout)
        stats = q.stats
        stats[1] += 1
        if m.redelivered:
            stats[2] += 1
        if self.quorum43(q):
            props, count, acquired, stored = _out43(m)
        else:
            props, count, stored = _out(m, bool(m.delivery_count and q.counts_deliveries))
            acquired = -1
        self.fx.append(Deliver(c.chan, c.tag, tag, m.redelivered, m.exchange, m.routing_key,
                               props, m.body, stored, count, acquired))
        m.redelivered = True

    def service(self, q: Queue) -> None:
        """Deliver ready messages while a consumer can take one; expire the head."""
        if q.deleted:
            return
        now = self.s.now
        cons = q.consumers
        while True:
            m = q.peek()
            if m is None:
                self.s.ttl_index.pop(q.name, None)
                return
            if m.expires_at is not None and m.expires_at <= now:
                q.pop()
                self.dead_letter(q, m, "expired")
                continue
            if not cons:
                return
            c = self.pick(q)
            if c is None:
                return
            q.pop()
            self.deliver(c, q, m)

    def quorum43(self, q: Queue) -> bool:
        """Does `q` follow RabbitMQ 4.3's quorum-queue semantics (a quorum
        queue, machine version 3 on)?"""
        return (self.s.machine_version >= QUORUM_SEMANTICS
                and q.arguments.get("x-queue-type") == "quorum")

    def requeue(self, q: Queue, m: Message, failed: bool = True) -> None:
        """Return a delivery to its original position (S04), or drop it if its
        queue is gone. `failed`: a failed delivery (reject with requeue, the
        channel gone), not a plain return (nack, recover)."""
        m.deadline = None
        if q.deleted:
            self.drop(m)
            return
        if self.quorum43(q):
            # rabbit_fifo (4.3) return_one: every return is an acquisition
            # (acquired_count), a failed one a delivery (delivery_count);
            # past the limit it is dead-lettered with reason delivery_limit
            # (a message returned before version 3 counted its returns as
            # delivery_count: those were acquisitions too)
            m.acquired_count = max(m.acquired_count, m.delivery_count) + 1
            if failed:
                m.delivery_count += 1
        else:
            # every return counts: past x-delivery-limit the message is
            # dead-lettered (dropped without a DLX) instead
            m.delivery_count += 1
        if q.delivery_limit is not None and m.delivery_count > q.delivery_limit:
            self.dead_letter(q, m, "delivery_limit")
            return
        q.requeue(m)
        if m.expires_at is not None:
            self.s.ttl_index[q.name] = None
        self.dirty[q.name] = q

    # -- acknowledgements ---------------------------------------------------

    def _collect(self, ch: Channel, tag: DeliveryTag, multiple: bool,
                 ids: tuple[int, int]) -> list[DeliveryTag]:
        """Tags covered by an ack/nack (S05); unknown tag -> 406 (S06). A tag
        whose delivery timed out (S29) is known and covers nothing."""
        released = ch.released
        if multiple and tag == 0:
            released.clear()
            return list(ch.unacked)
        if tag not in ch.unacked:
            if tag not in released:
                raise _ChanErr(406, f"PRECONDITION_FAILED - unknown delivery tag {tag}", ids)
            if not multiple:
                del released[tag]
                return []
        if released and multiple:
            for t in [t for t in released if t <= tag]:
                del released[t]
        if not multiple:
            return [tag]
        out = []
        for t in ch.unacked:
            if t > tag:
                break
            out.append(t)
        return out

    def _settle(self, ch: Channel, tag: DeliveryTag) -> tuple[Queue, Message]:
        q, m, c = ch.unacked.pop(tag)
        if c is not None:
            c.unacked -= 1
            ch.limited_unacked -= 1
        return q, m

    @handles(BasicAck)
    def basic_ack(self, cmd: BasicAck, ids: tuple[int, int] = BASIC_ACK) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        for tag in self._collect(ch, cmd.delivery_tag, cmd.multiple, ids):
            q, m = self._settle(ch, tag)
            q.stats[3] += 1
            self.drop(m)
        self.mark_channel_queues(ch)

    @handles(BasicNack)
    def basic_nack(self, cmd: BasicNack, ids: tuple[int, int] | None = None) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        if ids is None:
            ids = BASIC_REJECT if cmd.reject else BASIC_NACK
        multiple = cmd.multiple and not cmd.reject
        for tag in self._collect(ch, cmd.delivery_tag, multiple, ids):
            q, m = self._settle(ch, tag)
            if cmd.requeue:
                # 4.3: basic.reject requeue=true is a failed delivery
                # (rabbit_channel: {modify, DeliveryFailed=true}), basic.nack
                # requeue=true a plain return (rabbit_fifo_client:return)
                self.requeue(q, m, cmd.reject)
            elif q.deleted:
                self.drop(m)
            else:
                self.dead_letter(q, m, "rejected")  # S03
        self.mark_channel_queues(ch)

    @handles(BasicRecover, reply=lambda c: BASIC_RECOVER)
    def basic_recover(self, cmd: BasicRecover) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        ch.released.clear()  # requeued already: unknown from now on, as in RabbitMQ
        for tag in list(ch.unacked):  # S12
            q, m = self._settle(ch, tag)
            self.requeue(q, m, failed=False)  # 4.3: requeue, not a failed delivery
        self.reply(cmd.chan, "Basic.RecoverOk")
        self.mark_channel_queues(ch)

    @handles(BasicGet, reply=lambda c: BASIC_GET)
    def basic_get(self, cmd: BasicGet) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        q = self._queue_for(ch, cmd.queue, BASIC_GET)
        q.last_used = s.now
        now = s.now
        while True:
            m = q.peek()
            if m is None or m.expires_at is None or m.expires_at > now:
                break
            q.pop()
            self.dead_letter(q, m, "expired")
        if m is None:
            self.reply(cmd.chan, "Basic.GetEmpty")
            return
        q.pop()
        tag = ch.next_tag  # shared with consumer deliveries (S01); no prefetch (S10)
        ch.next_tag = DeliveryTag(tag + 1)
        if cmd.no_ack:
            self.drop(m)
        else:
            ch.unacked[tag] = (q, m, None)
            if self.quorum43(q):  # rabbit_fifo: a dequeue times out too (4.3)
                timeout = self.queue_timeout(q, cmd.timeout)
                if timeout is not None:
                    self.set_deadline(ch, m, timeout)
        stats = q.stats
        stats[1] += 1
        if m.redelivered:
            stats[2] += 1
        if self.quorum43(q):
            props, count, acquired, stored = _out43(m)
        else:
            # a quorum queue's basic.get always carries the count, 0 the first
            # time (RabbitMQ 3.x)
            props, count, stored = _out(m, q.counts_deliveries)
            acquired = -1
        self.fx.append(GetOk(cmd.chan, tag, m.redelivered, m.exchange, m.routing_key,
                             q.ready_count(), props, m.body, stored, count, acquired))
        m.redelivered = True

    # -- expiry (x-message-ttl, expiration, x-expires) ----------------------

    @handles(Tick)
    def tick(self, cmd: Tick) -> None:
        s = self.s
        now = s.now
        for name in list(s.ttl_index):
            q = s.queues.get(name)
            if q is None:
                s.ttl_index.pop(name, None)
            else:
                self.service(q)
        for name in list(s.expires_index):
            q = s.queues.get(name)
            if q is None:
                s.expires_index.pop(name, None)
            elif (not q.consumers and q.expires is not None
                  and now >= q.last_used + q.expires / 1000.0):
                self.delete_queue(q)
        for chan in list(s.deadline_chans):
            ch = s.channels.get(chan)
            if ch is None or ch.next_deadline is None:
                s.deadline_chans.pop(chan, None)
            elif ch.next_deadline <= now:
                self.time_out(ch)
        if s.dead_letters:  # at-least-once: retry what no queue took yet
            self.retry_all_dead_letters()

    def time_out(self, ch: Channel) -> None:
        """Consumer timeouts of a channel (S29, rabbit_fifo's
        evaluate_consumer_timeout in 4.3): a consumer with a delivery past its
        deadline is cancelled (basic.cancel, or the channel closed for a client
        without consumer_cancel_notify) and every delivery it holds returns to
        its queue, not as a failed delivery; their tags stay known. A timed-out
        basic.get, or a delivery of a consumer cancelled before, closes the
        channel (406), as RabbitMQ 4.3's channel does."""
        now = self.s.now
        timed_out: dict[str, None] = {}  # consumer tags in delivery order; "": the channel
        for _q, m, c in ch.unacked.values():
            if m.deadline is not None and m.deadline <= now:
                if c is not None and ch.consumers.get(c.tag) is c:
                    timed_out[c.tag] = None
                else:
                    timed_out[""] = None
        for dtag, (q, m, c) in list(ch.unacked.items()):
            mine = c is not None and c.tag in timed_out and ch.consumers.get(c.tag) is c
            if mine or (m.deadline is not None and m.deadline <= now):
                self._settle(ch, dtag)
                ch.released[dtag] = None
                self.requeue(q, m, failed=False)
        for ctag in timed_out:
            if ctag:
                self.remove_consumer(ch.consumers[ctag])
            self.fx.append(ConsumerTimedOut(ch.id, ctag))
        # what is left: deliveries of other consumers, not yet due
        nxt: float | None = None
        for _q, m, _c in ch.unacked.values():
            if m.deadline is not None and (nxt is None or m.deadline < nxt):
                nxt = m.deadline
        ch.next_deadline = nxt
        if nxt is None:
            self.s.deadline_chans.pop(ch.id, None)


def _out(m: Message, counted: bool) -> tuple[dict[str, Any] | None, int, tuple[int, int] | None]:
    """(props, delivery count to add as x-delivery-count or -1, (loc, size) when
    bytes are in the log) of a delivery. Properties in the log get the header
    where they are read (message_store.load, on the event loop)."""
    stored = None if m.loc is None or (m.props is not None and m.body is not None) else (m.loc, m.size)
    if m.props is None:
        return None, (m.delivery_count if counted else -1), stored
    return (with_delivery_count(m.props, m.delivery_count) if counted else m.props), -1, stored


def _out43(m: Message) -> tuple[dict[str, Any] | None, int, int, tuple[int, int] | None]:
    """(props, x-delivery-count or -1, x-acquired-count or -1, stored) of a
    delivery from a quorum queue at machine version 3 on, as RabbitMQ 4.3
    sets them (rabbit_fifo_client:add_delivery_count_header): x-acquired-count
    once the message came back, x-delivery-count once a delivery failed. A
    message returned before version 3 counted every return as delivery_count:
    those returns were acquisitions too (RabbitMQ patches a v3 header alike)."""
    acquired = max(m.acquired_count, m.delivery_count)
    count = m.delivery_count if m.delivery_count else -1
    stored = None if m.loc is None or (m.props is not None and m.body is not None) else (m.loc, m.size)
    if not acquired:
        return m.props, -1, -1, stored
    if m.props is None:
        return None, count, acquired, stored
    return with_delivery_count(m.props, count, acquired), -1, -1, stored
