"""Handlers for exchanges, queues and bindings: declare, delete, bind,
unbind, purge.
"""
from __future__ import annotations

from typing import Any

from node.broker.binding_limit import count_refused, key_refused
from node.broker.channel import Channel
from node.broker.exchange import EXCHANGE_TYPES, Binding, BindKey, Exchange, freeze
from node.broker.queue import Queue, uses_levels
from node.broker.reply import (
    EXCHANGE_BIND,
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    EXCHANGE_UNBIND,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_PURGE,
    QUEUE_UNBIND,
)
from node.broker.vhost import split_key
from node.replication.command import (
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeUnbind,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
)
from node.replication.effect import ConsumerCancelled, Effect
from node.replication.machine.arguments import _EQUIV_ARGS, _check_queue_type, _validate_queue_args
from node.replication.machine.errors import (
    _b,
    _ChanErr,
    _ConnErr,
    _default_x,
    _fmt_arg,
    _locked,
    _not_found,
    _type_name,
    _where,
)
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.policy import forget_exchange, refresh_exchange
from node.replication.machine.state import _gen_name, count_binding
from node.replication.machine.version import (
    BINDING_LIMITS,
    DEAD_LETTER_STORE,
    NO_LEGACY_QUEUE_CAP,
    QUORUM_SEMANTICS,
    TYPE_ARGUMENTS,
)


class TopologyHandlers(ApplierBase):
    __slots__ = ()

    # -- exchanges ----------------------------------------------------------

    @handles(ExchangeDeclare, reply=lambda c: None if c.nowait else EXCHANGE_DECLARE)
    def exchange_declare(self, cmd: ExchangeDeclare) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        name = cmd.exchange
        key = self.key(ch, name, EXCHANGE_DECLARE)
        x = s.exchanges.get(key)
        if cmd.passive:
            if name == "":
                raise _default_x(EXCHANGE_DECLARE)
            if x is None:
                raise _not_found("exchange", key, EXCHANGE_DECLARE)
        else:
            if cmd.exchange_type not in EXCHANGE_TYPES:
                raise _ConnErr(503, f"COMMAND_INVALID - invalid exchange type "
                                    f"'{cmd.exchange_type}'", EXCHANGE_DECLARE)
            if name == "":
                raise _default_x(EXCHANGE_DECLARE)
            if x is None:
                if name.startswith("amq."):
                    raise _ChanErr(403, f"ACCESS_REFUSED - exchange name '{name}' contains "
                                        f"reserved prefix 'amq.*'", EXCHANGE_DECLARE)
                s.exchanges[key] = x = Exchange(key, cmd.exchange_type, cmd.durable,
                                                 cmd.auto_delete, cmd.internal,
                                                 dict(cmd.arguments), home=cmd.chan.node)
                refresh_exchange(s, x)
            else:
                for arg, got, cur in (("type", cmd.exchange_type, x.type),
                                      ("durable", cmd.durable, x.durable),
                                      ("auto_delete", cmd.auto_delete, x.auto_delete),
                                      ("internal", cmd.internal, x.internal)):
                    if got != cur:
                        g = _b(got) if isinstance(got, bool) else got
                        c = _b(cur) if isinstance(cur, bool) else cur
                        raise _ChanErr(406, f"PRECONDITION_FAILED - inequivalent arg '{arg}' "
                                            f"for exchange {_where(key)}: received "
                                            f"'{g}' but current is '{c}'", EXCHANGE_DECLARE)
        if not cmd.nowait:
            self.reply(cmd.chan, "Exchange.DeclareOk")

    @handles(ExchangeDelete, reply=lambda c: None if c.nowait else EXCHANGE_DELETE)
    def exchange_delete(self, cmd: ExchangeDelete) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        name = cmd.exchange
        key = self.key(ch, name, EXCHANGE_DELETE)
        if name == "":
            raise _default_x(EXCHANGE_DELETE)
        if name.startswith("amq."):
            raise _ChanErr(403, f"ACCESS_REFUSED - deletion of system exchange {_where(key)} "
                                f"not allowed", EXCHANGE_DELETE)
        x = s.exchanges.get(key)
        if x is not None:
            if cmd.if_unused and x.bindings:
                raise _ChanErr(406, f"PRECONDITION_FAILED - exchange {_where(key)} in use",
                               EXCHANGE_DELETE)
            self.delete_exchange(x)
        if not cmd.nowait:
            self.reply(cmd.chan, "Exchange.DeleteOk")

    def delete_exchange(self, x: Exchange) -> None:
        s = self.s
        if s.exchanges.get(x.name) is not x:
            return
        del s.exchanges[x.name]
        forget_exchange(s, x.name)
        for key, b in list(x.bindings.items()):
            self._remove_binding(x, key)
            self._dest_incoming(b.dest).pop((x.name, key), None)
        for src_name, key in list(x.incoming):
            src = s.exchanges.get(src_name)
            if src is not None:
                self._remove_binding(src, key)
                self._maybe_autodelete_exchange(src)
        x.incoming.clear()

    def _dest_incoming(self, dest: tuple[bool, str]) -> dict[tuple[str, Any], None]:
        if dest[0]:
            x = self.s.exchanges.get(dest[1])
            return x.incoming if x is not None else {}
        q = self.s.queues.get(dest[1])
        return q.incoming if q is not None else {}

    def _maybe_autodelete_exchange(self, x: Exchange) -> None:
        if x.auto_delete and not x.bindings:
            self.delete_exchange(x)

    def _bind(self, src: Exchange, dest: tuple[bool, str], rk: str,
              args: dict[str, Any], ids: tuple[int, int]) -> None:
        key: BindKey = (dest[0], dest[1], rk, freeze(args))
        if key in src.bindings:
            return  # binding again is a no-op, never refused
        # issue 42: bounded here too (deterministic on every member)
        s = self.s
        vhost, name = split_key(src.name)
        b = Binding(src.name, dest, rk, dict(args))
        if s.machine_version >= BINDING_LIMITS:
            why = key_refused(s.binding_limits, src.type, rk) or count_refused(
                s.binding_limits, name, vhost, len(src.bindings), s.vhost_bindings.get(vhost, 0),
                s.vhost_wild_nodes.get(vhost, 0),
                src.topic_wild_added(b.words) if src.type == "topic" else 0)
            if why is not None:
                raise _ChanErr(406, why, ids)
        wild = src.topic_wild()
        src.add_binding(b, key)
        count_binding(s, src.name, 1, src.topic_wild() - wild)
        self._dest_incoming(dest)[(src.name, key)] = None

    def _remove_binding(self, src: Exchange, key: BindKey) -> Binding | None:
        wild = src.topic_wild()
        b = src.remove_binding(key)
        if b is not None:
            count_binding(self.s, src.name, -1, src.topic_wild() - wild)
        return b

    def _unbind(self, src: Exchange, dest: tuple[bool, str], rk: str,
                args: dict[str, Any]) -> None:
        key: BindKey = (dest[0], dest[1], rk, freeze(args))
        if self._remove_binding(src, key) is not None:
            self._dest_incoming(dest).pop((src.name, key), None)
            self._maybe_autodelete_exchange(src)

    @handles(ExchangeBind, reply=lambda c: None if c.nowait else EXCHANGE_BIND)
    def exchange_bind(self, cmd: ExchangeBind) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        if cmd.source == "" or cmd.destination == "":
            raise _default_x(EXCHANGE_BIND)
        skey = self.key(ch, cmd.source, EXCHANGE_BIND)
        dkey = self.key(ch, cmd.destination, EXCHANGE_BIND)
        src = s.exchanges.get(skey)
        if src is None:
            raise _not_found("exchange", skey, EXCHANGE_BIND)
        self.check_topic(ch, src, cmd.routing_key, False, EXCHANGE_BIND)
        if dkey not in s.exchanges:
            raise _not_found("exchange", dkey, EXCHANGE_BIND)
        self._bind(src, (True, dkey), cmd.routing_key, cmd.arguments, EXCHANGE_BIND)
        if not cmd.nowait:
            self.reply(cmd.chan, "Exchange.BindOk")

    @handles(ExchangeUnbind, reply=lambda c: None if c.nowait else EXCHANGE_UNBIND)
    def exchange_unbind(self, cmd: ExchangeUnbind) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        if cmd.source == "" or cmd.destination == "":
            raise _default_x(EXCHANGE_UNBIND)
        src = s.exchanges.get(self.key(ch, cmd.source, EXCHANGE_UNBIND))
        if src is not None:
            self.check_topic(ch, src, cmd.routing_key, False, EXCHANGE_UNBIND)
            self._unbind(src, (True, self.key(ch, cmd.destination, EXCHANGE_UNBIND)),
                         cmd.routing_key, cmd.arguments)
        if not cmd.nowait:
            self.reply(cmd.chan, "Exchange.UnbindOk")

    # -- queues -------------------------------------------------------------

    def _queue_for(self, ch: Channel, name: str, ids: tuple[int, int]) -> Queue:
        """Look a queue up for a command that needs exclusive access."""
        key = self.key(ch, name, ids)
        q = self.s.queues.get(key)
        if q is None:
            raise _not_found("queue", key, ids)
        if q.owner is not None and q.owner != ch.id.conn_id:
            raise _locked(key, ids)
        return q

    @handles(QueueDeclare, reply=lambda c: None if c.nowait else QUEUE_DECLARE)
    def queue_declare(self, cmd: QueueDeclare) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        name = cmd.queue
        generated = False
        if name == "" and not cmd.passive:
            s.counter += 1
            name = _gen_name("amq.gen-", cmd.chan, s.counter)
            generated = True
        key = self.key(ch, name, QUEUE_DECLARE)
        q = s.queues.get(key)
        if q is None:
            if cmd.passive:
                raise _not_found("queue", key, QUEUE_DECLARE)
            if name.startswith("amq.") and not generated:
                raise _ChanErr(403, f"ACCESS_REFUSED - queue name '{name}' contains reserved "
                                    f"prefix 'amq.*'", QUEUE_DECLARE)
            args = _validate_queue_args(key, cmd.arguments,
                                        s.machine_version >= QUORUM_SEMANTICS,
                                        s.machine_version >= DEAD_LETTER_STORE)
            quorum43 = s.machine_version >= QUORUM_SEMANTICS
            _check_queue_type(key, args, cmd.durable, cmd.exclusive, cmd.auto_delete, quorum43,
                              s.machine_version >= TYPE_ARGUMENTS)
            self.check_queue_limit(ch, name, QUEUE_DECLARE)
            owner = cmd.chan.conn_id if cmd.exclusive else None
            q = Queue(key, cmd.durable, owner, cmd.auto_delete, args, cmd.chan.node, s.now)
            q.levels = uses_levels(args, quorum43)
            if cmd.default_max_length and "x-max-length" not in args \
                    and s.machine_version < NO_LEGACY_QUEUE_CAP:
                # the proposing node's default bound (builds before issue 27
                # item 6); publishers past it are nacked (not drop-head: a
                # confirmed message must never vanish silently). Only before
                # machine version 2: those builds cannot be members after it
                q.max_length = cmd.default_max_length
                if "x-overflow" not in args:
                    q.overflow = "reject-publish"
            s.queues[key] = q
            self.apply_policies(q)
            if owner is not None:
                s.exclusive.setdefault(owner, {})[key] = None
            if q.expires is not None:
                s.expires_index[key] = None
        else:
            if q.owner is not None and q.owner != cmd.chan.conn_id:
                raise _locked(key, QUEUE_DECLARE)
            if not cmd.passive:
                if cmd.exclusive != q.exclusive:  # either way round, like RabbitMQ
                    raise _locked(key, QUEUE_DECLARE)
                self._check_equivalent(q, cmd)
                q.last_used = s.now
        if not cmd.nowait:
            self.reply(cmd.chan, "Queue.DeclareOk",
                       {"queue": name, "message_count": q.ready_count(),
                        "consumer_count": _consumer_count(q)})

    def _check_equivalent(self, q: Queue, cmd: QueueDeclare) -> None:
        def ineq(arg: str, why: str) -> _ChanErr:
            return _ChanErr(406, f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue "
                                 f"{_where(q.name)}: {why}", QUEUE_DECLARE)

        for arg, got, cur in (("durable", cmd.durable, q.durable),
                              ("auto_delete", cmd.auto_delete, q.auto_delete)):
            if got != cur:
                raise ineq(arg, f"received '{_b(got)}' but current is '{_b(cur)}'")
        new = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
               for k, v in cmd.arguments.items()}  # not UTF-8: see _validate_queue_args
        for arg in _EQUIV_ARGS:
            got_v, cur_v = new.get(arg), q.arguments.get(arg)
            if freeze(got_v) != freeze(cur_v):
                if got_v is not None and _type_name(got_v) == _type_name(cur_v):
                    raise ineq(arg, f"received '{got_v}' but current is '{cur_v}'")
                raise ineq(arg, f"received {_fmt_arg(got_v)} but current is {_fmt_arg(cur_v)}")

    @handles(QueueBind, reply=lambda c: None if c.nowait else QUEUE_BIND)
    def queue_bind(self, cmd: QueueBind) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        if cmd.exchange == "":
            raise _default_x(QUEUE_BIND)
        xkey = self.key(ch, cmd.exchange, QUEUE_BIND)
        x = s.exchanges.get(xkey)
        if x is None:
            raise _not_found("exchange", xkey, QUEUE_BIND)
        self.check_topic(ch, x, cmd.routing_key, False, QUEUE_BIND)
        q = self._queue_for(ch, cmd.queue, QUEUE_BIND)
        self._bind(x, (False, q.name), cmd.routing_key, cmd.arguments, QUEUE_BIND)
        if not cmd.nowait:
            self.reply(cmd.chan, "Queue.BindOk")

    @handles(QueueUnbind, reply=lambda c: QUEUE_UNBIND)
    def queue_unbind(self, cmd: QueueUnbind) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        if cmd.exchange == "":
            raise _default_x(QUEUE_UNBIND)
        qkey = self.key(ch, cmd.queue, QUEUE_UNBIND)
        q = s.queues.get(qkey)
        if q is not None and q.owner is not None and q.owner != cmd.chan.conn_id:
            raise _locked(qkey, QUEUE_UNBIND)
        x = s.exchanges.get(self.key(ch, cmd.exchange, QUEUE_UNBIND))
        if x is not None:
            self.check_topic(ch, x, cmd.routing_key, False, QUEUE_UNBIND)
            self._unbind(x, (False, qkey), cmd.routing_key, cmd.arguments)
        self.reply(cmd.chan, "Queue.UnbindOk")

    @handles(QueuePurge, reply=lambda c: None if c.nowait else QUEUE_PURGE)
    def queue_purge(self, cmd: QueuePurge) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        q = self._queue_for(ch, cmd.queue, QUEUE_PURGE)
        msgs = q.take_all()
        for m in msgs:
            self.drop(m)
        n = len(msgs)
        store = s.dead_letters.get(q.name)
        if store is not None:  # rabbit_fifo's purge takes the dead letters too
            n += self.drop_kept(store)
        if not cmd.nowait:
            self.reply(cmd.chan, "Queue.PurgeOk", {"message_count": n})

    @handles(QueueDelete, reply=lambda c: None if c.nowait else QUEUE_DELETE)
    def queue_delete(self, cmd: QueueDelete) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        count = 0
        own: list[Effect] = []
        if self.key(ch, cmd.queue, QUEUE_DELETE) in s.queues:
            q = self._queue_for(ch, cmd.queue, QUEUE_DELETE)
            if cmd.if_unused and q.consumers:
                raise _ChanErr(406, f"PRECONDITION_FAILED - queue {_where(q.name)} in use",
                               QUEUE_DELETE)
            count = q.ready_count()
            if cmd.if_empty and count:
                raise _ChanErr(406, f"PRECONDITION_FAILED - queue {_where(q.name)} not empty",
                               QUEUE_DELETE)
            mark = len(self.fx)
            self.delete_queue(q)
            # RabbitMQ's order: the deleting channel gets its queue.delete-ok before
            # the basic.cancel of its own consumers (the queue's cancel reaches the
            # channel after the reply); kombu, waiting for delete-ok, raised
            # ConsumerCancelled on the cancel that came first (issue 14)
            own = [e for e in self.fx[mark:]
                   if isinstance(e, ConsumerCancelled) and e.chan == cmd.chan]
            if own:
                self.fx[mark:] = [e for e in self.fx[mark:] if e not in own]
        if not cmd.nowait:
            self.reply(cmd.chan, "Queue.DeleteOk", {"message_count": count})
        self.fx.extend(own)

    def delete_queue(self, q: Queue) -> None:
        """Remove a queue. Its consumers are cancelled by the broker; its unacked
        deliveries stay outstanding on their channels (a later ack is no error)."""
        s = self.s
        if q.deleted:
            return
        q.deleted = True
        del s.queues[q.name]
        s.policy_index.drop_object("queue", q.name)
        self.dirty.pop(q.name, None)
        for c in list(q.consumers.values()):
            c.channel.consumers.pop(c.tag, None)
            self.fx.append(ConsumerCancelled(c.chan, c.tag))
        q.consumers.clear()
        q.exclusive_consumer = None
        for src_name, key in list(q.incoming):
            x = s.exchanges.get(src_name)
            if x is not None:
                self._remove_binding(x, key)
                self._maybe_autodelete_exchange(x)
        q.incoming.clear()
        for m in q.take_all():
            self.drop(m)
        store = s.dead_letters.pop(q.name, None)
        if store is not None:
            self.drop_kept(store)
        if q.owner is not None:
            owned = s.exclusive.get(q.owner)
            if owned is not None:
                owned.pop(q.name, None)
                if not owned:
                    del s.exclusive[q.owner]
        s.ttl_index.pop(q.name, None)
        s.expires_index.pop(q.name, None)


def _consumer_count(q: Queue) -> int:
    """What queue.declare-ok reports: a quorum queue with single active
    consumer counts only the active one (RabbitMQ 3.10; a classic one, all)."""
    n = len(q.consumers)
    if q.single_active and q.arguments.get("x-queue-type") == "quorum":
        return min(n, 1)
    return n
