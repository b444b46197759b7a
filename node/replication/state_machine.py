"""The replicated broker state and its pure, deterministic transition function.

Every node folds the same batches through `apply_batch` and must reach the
same state and effects, so nothing here reads a clock, draws randomness,
iterates a `set` or depends on object identity for ordering. Time comes from
`Batch.now`. No asyncio or pysyncobj imports (unit-testable by folding).
"""
from __future__ import annotations

import base64
import datetime
import hashlib
from collections.abc import Callable
from typing import Any

from node.broker.channel import Channel, Consumer
from node.broker.exchange import EXCHANGE_TYPES, Binding, BindKey, Exchange, freeze, route
from node.broker.ids import ChanId, ConnId
from node.broker.queue import MAX_PRIORITY, Message, Queue
from node.broker.reply import (
    BASIC_ACK,
    BASIC_CANCEL,
    BASIC_CONSUME,
    BASIC_GET,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_QOS,
    BASIC_RECOVER,
    BASIC_REJECT,
    CHANNEL_CLOSE,
    CHANNEL_FLOW,
    CONFIRM_SELECT,
    EXCHANGE_BIND,
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    EXCHANGE_UNBIND,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_PURGE,
    QUEUE_UNBIND,
    TX_COMMIT,
    TX_ROLLBACK,
    TX_SELECT,
)
from node.broker.vhost import DEFAULT_VHOST, SEP, ResourceKey, resource_key, split_key
from node.replication.command import (
    APPLIED,
    DUPLICATE,
    GAP,
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicCredit,
    BasicGet,
    BasicNack,
    BasicPublish,
    BasicQos,
    BasicRecover,
    Batch,
    ChannelClose,
    ChannelFlow,
    ChannelOpen,
    Command,
    ConnectionClose,
    DropMember,
    Echo,
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeUnbind,
    MarkInSync,
    MarkOutOfSync,
    NodeDown,
    NodeUp,
    PermissionClear,
    PermissionSet,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    SetDraining,
    SetMember,
    Tick,
    TxCommit,
    UserDelete,
    UserPut,
    VhostDelete,
    VhostPut,
)
from node.replication.effect import (
    ChannelError,
    Confirm,
    ConnectionFailure,
    ConsumerCancelled,
    Deliver,
    Effect,
    GetOk,
    Reply,
    Return,
)

DEFAULT_EXCHANGES = (("", "direct"), ("amq.direct", "direct"), ("amq.fanout", "fanout"),
                     ("amq.topic", "topic"), ("amq.headers", "headers"),
                     ("amq.match", "headers"))

# queue arguments RabbitMQ compares on redeclare (others are ignored)
_EQUIV_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-expires",
               "x-max-length", "x-max-length-bytes", "x-message-ttl", "x-overflow",
               "x-max-priority", "x-queue-mode", "x-queue-type", "x-single-active-consumer",
               "x-delivery-limit")
_OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")


class _ChanErr(Exception):
    def __init__(self, code: int, text: str, ids: tuple[int, int]) -> None:
        super().__init__(text)
        self.code, self.text, self.ids = code, text, ids


class _ConnErr(_ChanErr):
    pass


def _where(key: ResourceKey) -> str:
    """How error texts name a resource: 'name' in vhost 'v'."""
    vhost, name = split_key(key)
    return f"'{name}' in vhost '{vhost}'"


def _not_found(kind: str, key: ResourceKey, ids: tuple[int, int]) -> _ChanErr:
    return _ChanErr(404, f"NOT_FOUND - no {kind} {_where(key)}", ids)


def _locked(key: ResourceKey, ids: tuple[int, int]) -> _ChanErr:
    return _ChanErr(405, f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue "
                         f"{_where(key)}. It could be originally declared on another "
                         f"connection or the exclusive property value does not match that of "
                         f"the original declaration.", ids)


def _default_x(ids: tuple[int, int]) -> _ChanErr:
    return _ChanErr(403, "ACCESS_REFUSED - operation not permitted on the default exchange", ids)


def _type_name(v: Any) -> str:
    """AMQP field type names as RabbitMQ prints them in error texts."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "signedint" if -(2**31) <= v < 2**31 else "long"
    if isinstance(v, float):
        return "double"
    if isinstance(v, str | bytes):
        return "longstr"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, list):
        return "array"
    if v is None:
        return "void"
    return type(v).__name__


def _fmt_arg(v: Any) -> str:
    if v is None:
        return "none"
    shown = v.decode("utf-8", "replace") if isinstance(v, bytes) else v  # may not be UTF-8
    if isinstance(v, bool):
        shown = str(v).lower()
    return f"the value '{shown}' of type '{_type_name(v)}'"


def _b(v: bool) -> str:
    return "true" if v else "false"


def _validate_queue_args(key: ResourceKey, args: dict[str, Any]) -> dict[str, Any]:
    """Check x-arguments like RabbitMQ and return them normalised (bytes -> str)."""
    def bad(arg: str, why: str) -> _ChanErr:
        return _ChanErr(406, f"PRECONDITION_FAILED - invalid arg '{arg}' for queue "
                             f"{_where(key)}: {why}", QUEUE_DECLARE)

    # "replace": pamqp gives a longstr that is not UTF-8 as bytes; a strict
    # decode raised out of apply_batch on every node (found by tests/fuzz)
    out = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
           for k, v in args.items()}
    for arg, zero_ok in (("x-message-ttl", True), ("x-expires", False),
                         ("x-max-length", True), ("x-max-length-bytes", True),
                         ("x-max-priority", True), ("x-delivery-limit", True)):
        if arg not in out:
            continue
        v = out[arg]
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(arg, f'"expected integer, got {_type_name(v)}"')
        if v < 0:
            raise bad(arg, f"{{value_negative,{v}}}")
        if v == 0 and not zero_ok:
            raise bad(arg, "{value_zero,0}")
    maxp = out.get("x-max-priority", 0)
    if isinstance(maxp, int) and maxp > MAX_PRIORITY:
        raise bad("x-max-priority", f"{{max_value_exceeded,{maxp}}}")
    sac = out.get("x-single-active-consumer")
    if sac is not None and not isinstance(sac, bool):
        raise bad("x-single-active-consumer", f"{{unacceptable_type,{_type_name(sac)}}}")
    if "x-overflow" in out and not isinstance(out["x-overflow"], str):
        raise bad("x-overflow", f"{{unacceptable_type,{_type_name(out['x-overflow'])}}}")
    for arg in ("x-dead-letter-exchange", "x-dead-letter-routing-key"):
        if arg in out and not isinstance(out[arg], str):
            raise _ChanErr(406, f"PRECONDITION_FAILED - invalid type '{_type_name(out[arg])}' "
                                f"for arg '{arg}' in queue {_where(key)}",
                           QUEUE_DECLARE)
        # a longstr, but dead-lettered messages carry it as exchange / routing
        # key, shortstrs in basic.deliver and get-ok: a longer one made every
        # delivery of them fail (found by tests/fuzz)
        if arg in out and len(out[arg].encode("utf-8")) > 255:
            raise bad(arg, "longer than 255 bytes")
    if "x-overflow" in out and out["x-overflow"] not in _OVERFLOW:
        raise bad("x-overflow", "invalid_overflow")
    if "x-dead-letter-routing-key" in out and "x-dead-letter-exchange" not in out:
        raise bad("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
    return out


# What clients declare (Celery, MassTransit, Spring AMQP: `quorum`): both map to
# mirrorq's one replicated queue; RabbitMQ's rules for a quorum queue apply
QUEUE_TYPES = ("classic", "quorum")


def _check_queue_type(key: ResourceKey, args: dict[str, Any], durable: bool, exclusive: bool,
                      auto_delete: bool) -> None:
    if "x-queue-type" not in args:
        return
    qtype = args["x-queue-type"]
    where = _where(key)
    if not isinstance(qtype, str):
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid type '{_type_name(qtype)}' for arg "
                            f"'x-queue-type' in queue {where}", QUEUE_DECLARE)
    if qtype == "stream":
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue "
                            f"{where}: streams are not supported by mirrorq (declare "
                            f"'quorum' or 'classic': every mirrorq queue is replicated)",
                       QUEUE_DECLARE)
    if qtype not in QUEUE_TYPES:
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue "
                            f"{where}: unknown queue type '{qtype}' (supported: "
                            f"{', '.join(QUEUE_TYPES)})", QUEUE_DECLARE)
    if qtype == "quorum":  # rabbit_quorum_queue:declare's checks, in its order
        for bad, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                          (not durable, "non-durable")):
            if bad:
                raise _ChanErr(406, f"PRECONDITION_FAILED - invalid property '{prop}' for "
                                    f"queue {where}", QUEUE_DECLARE)


def _gen_name(prefix: str, chan: ChanId, counter: int) -> str:
    digest = hashlib.md5(f"{chan.node}/{chan.conn}/{chan.serial}/{counter}".encode(),
                         usedforsecurity=False).digest()
    return prefix + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _expiration_ms(props: dict[str, Any]) -> int | None:
    exp = props.get("expiration")
    if exp is None:
        return None
    s = exp.decode() if isinstance(exp, bytes) else str(exp)
    try:
        ms = int(s)
    except ValueError:
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid expiration '{s}': no_integer",
                       BASIC_PUBLISH) from None
    if ms < 0:
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid expiration '{s}': "
                            f"{{value_negative,{ms}}}", BASIC_PUBLISH)
    return ms


class BrokerState:
    """The whole replicated state (picklable: plain objects, dicts as ordered sets)."""

    __slots__ = ("now", "exchanges", "queues", "channels", "conns", "exclusive",
                 "ttl_index", "expires_index", "dedup", "counter", "message_bytes",
                 "members", "in_sync", "draining", "users", "vhosts", "permissions",
                 "config_version")

    def __init__(self) -> None:
        self.now = 0.0
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.channels: dict[ChanId, Channel] = {}
        # connection -> its open channels (ordered set)
        self.conns: dict[ConnId, dict[ChanId, None]] = {}
        # connection -> exclusive queues it owns
        self.exclusive: dict[ConnId, dict[str, None]] = {}
        # queues that may hold expiring messages / that have x-expires (cheap Tick)
        self.ttl_index: dict[str, None] = {}
        self.expires_index: dict[str, None] = {}
        # (node, incarnation) -> which of its batches were applied
        # (node, incarnation) -> next batch seq to apply (seqs start at 1)
        self.dedup: dict[tuple[str, int], int] = {}
        # feeds server-generated names
        self.counter = 0
        # body bytes of messages held (ready + unacked)
        self.message_bytes = 0
        # Raft members: node id -> raft address, and the in-sync set (ordered, in
        # members order). Only the raft thread touches the state: the event loop
        # reads the immutable ReadModel built from it once per tick
        # (node/replication/read_model.py), so apply mutates these dicts in place.
        self.members: dict[str, str] = {}
        self.in_sync: dict[str, None] = {}
        # members in maintenance mode (SetDraining): out of the in-sync set for good
        self.draining: dict[str, None] = {}
        # user -> (password hash, tags)
        self.users: dict[str, tuple[str, tuple[str, ...]]] = {}
        # vhosts (ordered set) and (user, vhost) -> (configure, write, read) patterns
        self.vhosts: dict[str, None] = {}
        self.permissions: dict[tuple[str, str], tuple[str, str, str]] = {}
        # bumped whenever members, in_sync, draining, users, vhosts or
        # permissions change: the read model rebuilds those parts only then
        self.config_version = 0

    def __setstate__(self, state: Any) -> None:
        """Unpickle (snapshots): a snapshot written before a slot existed
        leaves it at its default."""
        self.config_version = 0
        if isinstance(state, tuple):  # (__dict__ or None, slots) as pickle gives it
            dict_state, slot_state = state
        else:
            dict_state, slot_state = state, None
        for part in (dict_state, slot_state):
            for name, value in (part or {}).items():
                setattr(self, name, value)


def _config_changed(s: BrokerState) -> None:
    s.config_version += 1


def _add_vhost(s: BrokerState, vhost: str) -> None:
    s.vhosts[vhost] = None
    _config_changed(s)
    for name, type_ in DEFAULT_EXCHANGES:
        key = resource_key(vhost, name)
        s.exchanges[key] = Exchange(key, type_, durable=True)


def default_state() -> BrokerState:
    s = BrokerState()
    _add_vhost(s, DEFAULT_VHOST)
    return s




def batch_verdict(state: BrokerState, batch: Batch) -> str:
    """What apply_batch makes of `batch`: APPLIED (next in its proposer's
    order), DUPLICATE (applied before: ignored) or GAP (an earlier batch of
    the same (node, incarnation) has not applied yet: ignored, and the
    proposer resends from the missing one). Each node's batches apply strictly
    in order so that a channel's commands never overtake each other. Pure,
    the same on every node."""
    expected = state.dedup.get((batch.node, batch.incarnation), 1)
    if batch.seq < expected:
        return DUPLICATE
    return GAP if batch.seq > expected else APPLIED


def apply_batch(state: BrokerState, batch: Batch) -> list[Effect]:
    if batch_verdict(state, batch) != APPLIED:
        return []
    state.dedup[(batch.node, batch.incarnation)] = batch.seq + 1
    if batch.now > state.now:
        state.now = batch.now
    ap = _Applier(state)
    for cmd in batch.commands:
        ap.run(cmd)
    return ap.fx


SKIPPED_TEXT = ("CONNECTION_FORCED - this node installed a snapshot past changes it had not applied "
                "yet; replies, confirms or deliveries for this connection may be among them: reconnect")


def skipped_effects(old: BrokerState, new: BrokerState, node: str, incarnation: int) -> list[Effect]:
    """What `node` owes its clients after a snapshot from the leader replaced
    `old` with `new`: the entries between them were never applied here, so
    their effects (replies, confirms, deliveries, cancels) never left. Each
    connection of this node whose effects may be among them is closed with
    320, as a node that loses its state would: the client reconnects,
    republishes what was not confirmed, and what it had unacked is requeued
    when the close applies. Untouched connections stay open. Pure."""
    ours = (node, incarnation)
    all_mine = new.dedup.get(ours, 1) != old.dedup.get(ours, 1)  # our commands applied: replies lost
    conns = dict.fromkeys(c for st in (old, new) for c in st.conns if c.node == node)
    return [ConnectionFailure(c, 320, SKIPPED_TEXT, 0, 0) for c in conns
            if all_mine or _connection_view(old, c) != _connection_view(new, c)]


def _connection_view(st: BrokerState, conn: ConnId) -> tuple[Any, ...] | None:
    """What a connection's clients have seen happen: its channels, each one's
    next delivery tag and consumers. None: the connection is not open."""
    chans = st.conns.get(conn)
    if chans is None:
        return None
    out = []
    for c in chans:
        ch = st.channels.get(c)
        if ch is not None:
            out.append((c, ch.next_tag, tuple(ch.consumers)))
    return tuple(out)


_ECHO_IDS = {"Confirm.SelectOk": CONFIRM_SELECT, "Tx.SelectOk": TX_SELECT, "Tx.RollbackOk": TX_ROLLBACK,
             "Basic.QosOk": BASIC_QOS, "Basic.RecoverOk": BASIC_RECOVER,
             "Channel.FlowOk": CHANNEL_FLOW, "Channel.CloseOk": CHANNEL_CLOSE}
_REPLY_IDS: dict[type, Callable[[Any], tuple[int, int] | None]] = {
    ChannelClose: lambda c: CHANNEL_CLOSE if c.reply else None,
    ChannelFlow: lambda c: CHANNEL_FLOW,
    ExchangeDeclare: lambda c: None if c.nowait else EXCHANGE_DECLARE,
    ExchangeDelete: lambda c: None if c.nowait else EXCHANGE_DELETE,
    ExchangeBind: lambda c: None if c.nowait else EXCHANGE_BIND,
    ExchangeUnbind: lambda c: None if c.nowait else EXCHANGE_UNBIND,
    QueueDeclare: lambda c: None if c.nowait else QUEUE_DECLARE,
    QueueBind: lambda c: None if c.nowait else QUEUE_BIND,
    QueueUnbind: lambda c: QUEUE_UNBIND,
    QueuePurge: lambda c: None if c.nowait else QUEUE_PURGE,
    QueueDelete: lambda c: None if c.nowait else QUEUE_DELETE,
    BasicQos: lambda c: BASIC_QOS,
    BasicConsume: lambda c: None if c.nowait else BASIC_CONSUME,
    BasicCancel: lambda c: None if c.nowait else BASIC_CANCEL,
    BasicGet: lambda c: BASIC_GET,
    BasicRecover: lambda c: BASIC_RECOVER,
    TxCommit: lambda c: TX_COMMIT,
    Echo: lambda c: _ECHO_IDS.get(c.method, (0, 0)),
}
def failure_effects(batch: Batch) -> list[Effect]:
    """Effects for a batch that could not be committed: nack every confirmed
    publish (S16) and fail each channel that waits for a reply (541)."""
    fx: list[Effect] = []
    failed: dict[ChanId, None] = {}
    for cmd in batch.commands:
        if isinstance(cmd, BasicPublish):
            if cmd.seq > 0:
                fx.append(Confirm(cmd.chan, cmd.seq, False))
            continue
        if isinstance(cmd, TxCommit):
            for sub in cmd.commands:
                if isinstance(sub, BasicPublish) and sub.seq > 0:
                    fx.append(Confirm(sub.chan, sub.seq, False))
        ids_of = _REPLY_IDS.get(type(cmd))
        if ids_of is None:
            continue
        ids = ids_of(cmd)
        chan: ChanId = cmd.chan  # type: ignore[union-attr]
        if ids is None or chan in failed:
            continue
        failed[chan] = None
        fx.append(ChannelError(chan, 541, "INTERNAL_ERROR - could not replicate", *ids))
    return fx


class _Applier:
    """Applies the commands of one batch; collects effects and the queues
    whose delivery may have become possible."""

    __slots__ = ("s", "fx", "dirty")

    def __init__(self, state: BrokerState) -> None:
        self.s = state
        self.fx: list[Effect] = []
        self.dirty: dict[str, Queue] = {}

    # -- dispatch ---------------------------------------------------------

    def run(self, cmd: Command) -> None:
        handler = _HANDLERS[type(cmd)]
        try:
            handler(self, cmd)
        except _ConnErr as e:
            conn = cmd.chan.conn_id  # type: ignore[union-attr]
            self.close_connection(conn)
            self.fx.append(ConnectionFailure(conn, e.code, e.text, *e.ids))
        except _ChanErr as e:
            chan: ChanId = cmd.chan  # type: ignore[union-attr]
            ch = self.s.channels.get(chan)
            if ch is not None:
                self.close_channel(ch)
            self.fx.append(ChannelError(chan, e.code, e.text, *e.ids))
        if self.dirty:
            self.flush()

    def flush(self) -> None:
        while self.dirty:
            dirty = self.dirty
            self.dirty = {}
            for q in dirty.values():
                self.service(q)

    def reply(self, chan: ChanId, method: str, fields: dict[str, Any] | None = None) -> None:
        self.fx.append(Reply(chan, method, fields or {}))

    @staticmethod
    def key(ch: Channel, name: str, ids: tuple[int, int]) -> ResourceKey:
        """The table key of `name` in the channel's vhost."""
        if SEP in name:  # would alias another vhost's resource
            raise _ChanErr(406, "PRECONDITION_FAILED - resource names cannot contain NUL", ids)
        return resource_key(ch.vhost, name)

    # -- channels and connections -------------------------------------------

    def channel_open(self, cmd: ChannelOpen) -> None:
        s = self.s
        if cmd.chan in s.channels:
            return
        if cmd.vhost not in s.vhosts:  # deleted between connection.open and now
            conn = cmd.chan.conn_id
            self.close_connection(conn)
            self.fx.append(ConnectionFailure(conn, 530, f"NOT_ALLOWED - vhost {cmd.vhost} not "
                                                      f"found", 20, 10))
            return
        s.channels[cmd.chan] = Channel(cmd.chan, cmd.vhost)
        s.conns.setdefault(cmd.chan.conn_id, {})[cmd.chan] = None

    def channel_close(self, cmd: ChannelClose) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        self.close_channel(ch)
        if cmd.reply:
            self.reply(cmd.chan, "Channel.CloseOk")

    def close_channel(self, ch: Channel) -> None:
        """Drop consumers, requeue every unacked delivery (S08)."""
        s = self.s
        del s.channels[ch.id]
        conn = ch.id.conn_id
        chans = s.conns.get(conn)
        if chans is not None:
            chans.pop(ch.id, None)
            if not chans:
                del s.conns[conn]
        for c in list(ch.consumers.values()):
            self.remove_consumer(c)
        unacked = ch.unacked
        ch.unacked = {}
        ch.limited_unacked = 0
        for q, m, _ in unacked.values():
            self.requeue(q, m)

    def close_connection(self, conn: ConnId) -> None:
        s = self.s
        for chan in list(s.conns.get(conn, ())):
            self.close_channel(s.channels[chan])
        for qname in list(s.exclusive.get(conn, ())):
            q = s.queues.get(qname)
            if q is not None:
                self.delete_queue(q)
        s.exclusive.pop(conn, None)

    def connection_close(self, cmd: ConnectionClose) -> None:
        self.close_connection(cmd.conn)

    def channel_flow(self, cmd: ChannelFlow) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        ch.flow = cmd.active
        self.reply(cmd.chan, "Channel.FlowOk", {"active": cmd.active})
        if cmd.active:
            self.mark_channel_queues(ch)

    def mark_channel_queues(self, ch: Channel) -> None:
        for c in ch.consumers.values():
            self.dirty[c.queue.name] = c.queue

    def node_up(self, cmd: NodeUp) -> None:
        s = self.s
        node = cmd.node
        conns = [c for c in s.conns if c.node == node]
        for conn in conns:
            self.close_connection(conn)
        for conn in [c for c in s.exclusive if c.node == node]:
            self.close_connection(conn)
        for q in [q for q in s.queues.values() if q.home == node]:
            if not q.durable:
                self.delete_queue(q)
                continue
            keep = []
            for m in q.take_all():
                if m.persistent:
                    keep.append(m)
                else:
                    s.message_bytes -= m.size
            for m in keep:  # heap order == seq order, so plain re-insertion keeps positions
                q.requeue(m)
        for x in [x for x in s.exchanges.values() if x.home == node and not x.durable]:
            self.delete_exchange(x)
        for key in [k for k in s.dedup if k[0] == node and k[1] != cmd.incarnation]:
            del s.dedup[key]

    def node_down(self, cmd: NodeDown) -> None:
        """Drop the node's connections (S25): their unacked deliveries return to
        their queues redelivered and reach consumers on other nodes (flushed
        after this command). Unlike NodeUp, queues and transient messages
        stay: the node may come back, and every node holds every queue."""
        self.drop_connections_of(cmd.node, f"CONNECTION_FORCED - node {cmd.node} was declared down "
                                           "by the cluster")

    def drop_connections_of(self, node: str, text: str) -> None:
        s = self.s
        conns = dict.fromkeys(c for c in s.conns if c.node == node)
        for c in s.exclusive:
            if c.node == node:
                conns[c] = None
        for conn in conns:
            self.close_connection(conn)
            self.fx.append(ConnectionFailure(conn, 320, text, 0, 0))

    # -- membership (the raft thread alone touches these: mutated in place) -----

    def _in_sync_of(self, nodes: dict[str, None]) -> dict[str, None]:
        return {n: None for n in self.s.members if n in nodes}

    def set_member(self, cmd: SetMember) -> None:
        s = self.s
        if s.members.get(cmd.node) != cmd.address:
            s.members[cmd.node] = cmd.address
            _config_changed(s)
        if cmd.in_sync and cmd.node not in s.in_sync:
            s.in_sync = self._in_sync_of({**s.in_sync, cmd.node: None})  # in members order
            _config_changed(s)

    def drop_member(self, cmd: DropMember) -> None:
        s = self.s
        if cmd.node in s.members or cmd.node in s.in_sync or cmd.node in s.draining:
            s.members.pop(cmd.node, None)
            s.in_sync.pop(cmd.node, None)
            s.draining.pop(cmd.node, None)  # added back later, it starts afresh
            _config_changed(s)
        # its clients can no longer reach the log (it stops serving): drop them
        # here, or their consumers would hold unacked deliveries for ever
        self.drop_connections_of(cmd.node, f"CONNECTION_FORCED - node {cmd.node} was removed "
                                           "from the cluster")

    def user_put(self, cmd: UserPut) -> None:
        self.s.users[cmd.name] = (cmd.password_hash, tuple(cmd.tags))
        _config_changed(self.s)

    def user_delete(self, cmd: UserDelete) -> None:
        s = self.s
        if cmd.name in s.users:
            del s.users[cmd.name]
            _config_changed(s)
        gone = [k for k in s.permissions if k[0] == cmd.name]
        for k in gone:
            del s.permissions[k]
        if gone:
            _config_changed(s)

    # -- vhosts and permissions ------------------------------------------------

    def vhost_put(self, cmd: VhostPut) -> None:
        if cmd.name not in self.s.vhosts:
            _add_vhost(self.s, cmd.name)

    def vhost_delete(self, cmd: VhostDelete) -> None:
        s = self.s
        vhost = cmd.name
        if vhost not in s.vhosts:
            return
        del s.vhosts[vhost]
        for k in [k for k in s.permissions if k[1] == vhost]:
            del s.permissions[k]
        _config_changed(s)
        conns = dict.fromkeys(ch.id.conn_id for ch in s.channels.values() if ch.vhost == vhost)
        for conn in conns:
            self.close_connection(conn)
            self.fx.append(ConnectionFailure(conn, 320, f"CONNECTION_FORCED - vhost '{vhost}' is "
                                                      f"deleted", 0, 0))
        for q in [q for k, q in s.queues.items() if split_key(k)[0] == vhost]:
            self.delete_queue(q)
        for key in [k for k in s.exchanges if split_key(k)[0] == vhost]:
            x = s.exchanges.get(key)
            if x is not None:
                self.delete_exchange(x)

    def permission_set(self, cmd: PermissionSet) -> None:
        s = self.s
        if cmd.user in s.users and cmd.vhost in s.vhosts:
            s.permissions[(cmd.user, cmd.vhost)] = (cmd.configure, cmd.write, cmd.read)
            _config_changed(s)

    def permission_clear(self, cmd: PermissionClear) -> None:
        s = self.s
        key = (cmd.user, cmd.vhost)
        if key in s.permissions:
            del s.permissions[key]
            _config_changed(s)

    def set_draining(self, cmd: SetDraining) -> None:
        s = self.s
        if cmd.node not in s.members:
            return
        if not cmd.draining:
            if cmd.node in s.draining:
                del s.draining[cmd.node]
                _config_changed(s)
            return
        if cmd.node not in s.draining:
            s.draining[cmd.node] = None
            _config_changed(s)
        self.mark_out_of_sync(MarkOutOfSync(cmd.node))
        self.drop_connections_of(cmd.node, f"CONNECTION_FORCED - node {cmd.node} is draining "
                                           "(maintenance mode)")

    def mark_out_of_sync(self, cmd: MarkOutOfSync) -> None:
        """Refused unless the rest of the set is still a majority of members."""
        s = self.s
        if cmd.node in s.in_sync and len(s.in_sync) - 1 >= len(s.members) // 2 + 1:
            del s.in_sync[cmd.node]
            _config_changed(s)

    def mark_in_sync(self, cmd: MarkInSync) -> None:
        s = self.s
        if cmd.node in s.members and cmd.node not in s.in_sync and cmd.node not in s.draining:
            s.in_sync = self._in_sync_of({**s.in_sync, cmd.node: None})  # in members order
            _config_changed(s)

    # -- exchanges ----------------------------------------------------------

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
                s.exchanges[key] = Exchange(key, cmd.exchange_type, cmd.durable,
                                             cmd.auto_delete, cmd.internal, dict(cmd.arguments),
                                             home=cmd.chan.node)
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
        for key, b in list(x.bindings.items()):
            x.remove_binding(key)
            self._dest_incoming(b.dest).pop((x.name, key), None)
        for src_name, key in list(x.incoming):
            src = s.exchanges.get(src_name)
            if src is not None:
                src.remove_binding(key)
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
              args: dict[str, Any]) -> None:
        key: BindKey = (dest[0], dest[1], rk, freeze(args))
        if src.add_binding(Binding(src.name, dest, rk, dict(args)), key):
            self._dest_incoming(dest)[(src.name, key)] = None

    def _unbind(self, src: Exchange, dest: tuple[bool, str], rk: str,
                args: dict[str, Any]) -> None:
        key: BindKey = (dest[0], dest[1], rk, freeze(args))
        if src.remove_binding(key) is not None:
            self._dest_incoming(dest).pop((src.name, key), None)
            self._maybe_autodelete_exchange(src)

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
        if dkey not in s.exchanges:
            raise _not_found("exchange", dkey, EXCHANGE_BIND)
        self._bind(src, (True, dkey), cmd.routing_key, cmd.arguments)
        if not cmd.nowait:
            self.reply(cmd.chan, "Exchange.BindOk")

    def exchange_unbind(self, cmd: ExchangeUnbind) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        if cmd.source == "" or cmd.destination == "":
            raise _default_x(EXCHANGE_UNBIND)
        src = s.exchanges.get(self.key(ch, cmd.source, EXCHANGE_UNBIND))
        if src is not None:
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
            args = _validate_queue_args(key, cmd.arguments)
            _check_queue_type(key, args, cmd.durable, cmd.exclusive, cmd.auto_delete)
            owner = cmd.chan.conn_id if cmd.exclusive else None
            q = Queue(key, cmd.durable, owner, cmd.auto_delete, args, cmd.chan.node, s.now)
            if cmd.default_max_length and "x-max-length" not in args:
                # the node's default bound; publishers past it are nacked (not
                # drop-head: a confirmed message must never vanish silently)
                q.max_length = cmd.default_max_length
                if "x-overflow" not in args:
                    q.overflow = "reject-publish"
            s.queues[key] = q
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
        q = self._queue_for(ch, cmd.queue, QUEUE_BIND)
        self._bind(x, (False, q.name), cmd.routing_key, cmd.arguments)
        if not cmd.nowait:
            self.reply(cmd.chan, "Queue.BindOk")

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
            self._unbind(x, (False, qkey), cmd.routing_key, cmd.arguments)
        self.reply(cmd.chan, "Queue.UnbindOk")

    def queue_purge(self, cmd: QueuePurge) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        q = self._queue_for(ch, cmd.queue, QUEUE_PURGE)
        msgs = q.take_all()
        for m in msgs:
            s.message_bytes -= m.size
        if not cmd.nowait:
            self.reply(cmd.chan, "Queue.PurgeOk", {"message_count": len(msgs)})

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
        self.dirty.pop(q.name, None)
        for c in list(q.consumers.values()):
            c.channel.consumers.pop(c.tag, None)
            self.fx.append(ConsumerCancelled(c.chan, c.tag))
        q.consumers.clear()
        q.exclusive_consumer = None
        for src_name, key in list(q.incoming):
            x = s.exchanges.get(src_name)
            if x is not None:
                x.remove_binding(key)
                self._maybe_autodelete_exchange(x)
        q.incoming.clear()
        s.message_bytes -= q.ready_bytes
        q.take_all()
        if q.owner is not None:
            owned = s.exclusive.get(q.owner)
            if owned is not None:
                owned.pop(q.name, None)
                if not owned:
                    del s.exclusive[q.owner]
        s.ttl_index.pop(q.name, None)
        s.expires_index.pop(q.name, None)

    # -- consumers ----------------------------------------------------------

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
        c = Consumer(ch, tag, q, cmd.no_ack, cmd.exclusive, cmd.credit, prio)
        ch.consumers[tag] = c
        q.consumers[(cmd.chan, tag)] = c
        if prio:
            q.prio_consumers += 1
        if cmd.exclusive:
            q.exclusive_consumer = c
        if not cmd.nowait:
            self.reply(cmd.chan, "Basic.ConsumeOk", {"consumer_tag": tag})
        self.dirty[q.name] = q

    def basic_cancel(self, cmd: BasicCancel) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        c = ch.consumers.get(cmd.consumer_tag)
        if not cmd.nowait:
            self.reply(cmd.chan, "Basic.CancelOk", {"consumer_tag": cmd.consumer_tag})
        if c is not None:
            self.remove_consumer(c)

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

    def deliver(self, c: Consumer, q: Queue, m: Message) -> None:
        ch = c.channel
        tag = ch.next_tag
        ch.next_tag = tag + 1
        c.credit -= 1
        if c.no_ack:
            self.s.message_bytes -= m.size  # settled on delivery (S02)
        else:
            ch.unacked[tag] = (q, m, c)
            c.unacked += 1
            ch.limited_unacked += 1
        stats = q.stats
        stats[1] += 1
        if m.redelivered:
            stats[2] += 1
        props = _with_delivery_count(m) if m.delivery_count and q.counts_deliveries else m.props
        self.fx.append(Deliver(c.chan, c.tag, tag, m.redelivered, m.exchange, m.routing_key,
                               props, m.body))
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

    def requeue(self, q: Queue, m: Message) -> None:
        """Return a delivery to its original position (S04), or drop it if its
        queue is gone."""
        if q.deleted:
            self.s.message_bytes -= m.size
            return
        # every return counts, as in a quorum queue: past x-delivery-limit the
        # message is dead-lettered (dropped without a DLX) instead
        m.delivery_count += 1
        if q.delivery_limit is not None and m.delivery_count > q.delivery_limit:
            self.dead_letter(q, m, "delivery_limit")
            return
        q.requeue(m)
        if m.expires_at is not None:
            self.s.ttl_index[q.name] = None
        self.dirty[q.name] = q

    # -- publishing ---------------------------------------------------------

    def basic_publish(self, cmd: BasicPublish) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        # A publish that closes its channel (404 no exchange, 403 internal, 406 bad
        # expiration) gets no basic.ack/nack, only the channel.close, as RabbitMQ
        # does: a nack first made aiormq/aio-pika report a DeliveryError instead
        # of the channel error their users handle (issue 14). The channel is gone,
        # so nothing waits for that confirm.
        names = self._route(ch, cmd, BASIC_PUBLISH)
        exp = _expiration_ms(cmd.props)
        self._publish(cmd, names, exp)

    def _route(self, ch: Channel, cmd: BasicPublish, ids: tuple[int, int]) -> list[str]:
        s = self.s
        xname = cmd.exchange
        if xname == "":  # the default exchange: the routing key names a queue
            qkey = resource_key(ch.vhost, cmd.routing_key)
            return [qkey] if qkey in s.queues and SEP not in cmd.routing_key else []
        xkey = self.key(ch, xname, ids)
        x = s.exchanges.get(xkey)
        if x is None:
            raise _not_found("exchange", xkey, ids)
        if x.internal:
            raise _ChanErr(403, f"ACCESS_REFUSED - cannot publish to internal exchange "
                                f"{_where(xkey)}", ids)
        return route(s.exchanges, x, cmd.routing_key, cmd.props.get("headers"))

    def _publish(self, cmd: BasicPublish, names: list[str], exp: int | None) -> None:
        queues = self.s.queues
        props = cmd.props
        persistent = props.get("delivery_mode") == 2
        accepted = True
        for name in names:
            if not self.enqueue(queues[name], cmd.exchange, cmd.routing_key, props, cmd.body,
                                persistent, exp):
                accepted = False
        if not names and cmd.mandatory:
            self.fx.append(Return(cmd.chan, 312, "NO_ROUTE", cmd.exchange, cmd.routing_key,
                                  props, cmd.body))  # before its confirm (S17)
        if cmd.seq > 0:
            self.fx.append(Confirm(cmd.chan, cmd.seq, accepted))

    def enqueue(self, q: Queue, exchange: str, rk: str, props: dict[str, Any], body: bytes,
                persistent: bool, exp: int | None) -> bool:
        """Put a message on a queue (or hand it straight to a consumer).
        False when x-overflow reject-publish refused it."""
        s = self.s
        q.stats[0] += 1
        if q.overflow != "drop-head" and q.full():
            if q.overflow == "reject-publish-dlx":
                m = Message(0, exchange, rk, props, body, persistent, None)
                s.message_bytes += m.size
                self.dead_letter(q, m, "maxlen")
            return False
        ttl = q.message_ttl
        if exp is not None and (ttl is None or exp < ttl):
            ttl = exp
        m = Message(0, exchange, rk, props, body, persistent,
                    None if ttl is None else s.now + ttl / 1000.0)
        s.message_bytes += m.size
        if q.consumers and q.peek() is None:
            # fast path: nothing queued ahead, hand it over directly (so even a
            # TTL 0 message reaches a waiting consumer, as in RabbitMQ)
            c = self.pick(q)
            if c is not None:
                m.seq = q.next_seq
                q.next_seq += 1
                self.deliver(c, q, m)
                return True
        q.push(m)
        if m.expires_at is not None:
            s.ttl_index[q.name] = None
        if q.name in s.ttl_index:
            self.service(q)  # drop expired heads on enqueue
        if (q.max_length is not None or q.max_length_bytes is not None) and q.over_limit():
            while q.over_limit():
                self.dead_letter(q, q.pop(), "maxlen")
        return True

    def dead_letter(self, q: Queue, m: Message, reason: str) -> None:
        """Remove `m` from `q` for good, republishing it through the queue's DLX."""
        s = self.s
        s.message_bytes -= m.size
        if q.dlx is None:
            return
        vhost, qname = split_key(q.name)
        x = s.exchanges.get(resource_key(vhost, q.dlx))
        if x is None:
            return
        props = dict(m.props)
        headers = dict(props.get("headers") or {})
        deaths = [d for d in (headers.get("x-death") or []) if isinstance(d, dict)]
        entry: dict[str, Any] | None = None
        for i, d in enumerate(deaths):
            if d.get("queue") == qname and d.get("reason") == reason:
                entry = dict(d)
                entry["count"] = int(d.get("count", 1)) + 1
                del deaths[i]
                break
        if entry is None:
            rks = [m.routing_key]
            cc = headers.get("CC")
            if isinstance(cc, list):
                rks.extend(str(k) for k in cc)
            entry = {"count": 1, "reason": reason, "queue": qname,
                     "time": datetime.datetime.fromtimestamp(int(s.now), datetime.UTC),
                     "exchange": m.exchange, "routing-keys": rks}
            if "expiration" in props:
                entry["original-expiration"] = props["expiration"]
        props.pop("expiration", None)
        deaths.insert(0, entry)
        headers["x-death"] = deaths
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", qname)
        headers.setdefault("x-first-death-exchange", m.exchange)
        props["headers"] = headers
        rk = q.dlrk if q.dlrk is not None else m.routing_key
        if q.dlx == "":  # the default exchange routes by queue name
            tkey = resource_key(vhost, rk)
            targets: list[str] = [tkey] if tkey in s.queues and SEP not in rk else []
        else:
            targets = route(s.exchanges, x, rk, headers)
        for name in targets:
            if reason != "rejected" and _is_cycle(split_key(name)[1], deaths):
                continue
            t = s.queues[name]
            self.enqueue(t, q.dlx, rk, props, m.body, m.persistent, None)

    # -- acknowledgements ---------------------------------------------------

    def _collect(self, ch: Channel, tag: int, multiple: bool,
                 ids: tuple[int, int]) -> list[int]:
        """Tags covered by an ack/nack (S05); unknown tag -> 406 (S06)."""
        if multiple and tag == 0:
            return list(ch.unacked)
        if tag not in ch.unacked:
            raise _ChanErr(406, f"PRECONDITION_FAILED - unknown delivery tag {tag}", ids)
        if not multiple:
            return [tag]
        out = []
        for t in ch.unacked:
            if t > tag:
                break
            out.append(t)
        return out

    def _settle(self, ch: Channel, tag: int) -> tuple[Queue, Message]:
        q, m, c = ch.unacked.pop(tag)
        if c is not None:
            c.unacked -= 1
            ch.limited_unacked -= 1
        return q, m

    def basic_ack(self, cmd: BasicAck, ids: tuple[int, int] = BASIC_ACK) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        for tag in self._collect(ch, cmd.delivery_tag, cmd.multiple, ids):
            q, m = self._settle(ch, tag)
            q.stats[3] += 1
            self.s.message_bytes -= m.size
        self.mark_channel_queues(ch)

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
                self.requeue(q, m)
            elif q.deleted:
                self.s.message_bytes -= m.size
            else:
                self.dead_letter(q, m, "rejected")  # S03
        self.mark_channel_queues(ch)

    def basic_recover(self, cmd: BasicRecover) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        for tag in list(ch.unacked):  # S12
            q, m = self._settle(ch, tag)
            self.requeue(q, m)
        self.reply(cmd.chan, "Basic.RecoverOk")
        self.mark_channel_queues(ch)

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
        ch.next_tag = tag + 1
        if cmd.no_ack:
            s.message_bytes -= m.size
        else:
            ch.unacked[tag] = (q, m, None)
        stats = q.stats
        stats[1] += 1
        if m.redelivered:
            stats[2] += 1
        # a quorum queue's basic.get always carries the count, 0 the first time
        props = _with_delivery_count(m) if q.counts_deliveries else m.props
        self.fx.append(GetOk(cmd.chan, tag, m.redelivered, m.exchange, m.routing_key,
                             q.ready_count(), props, m.body))
        m.redelivered = True

    # -- transactions, echo, time ---------------------------------------------

    def tx_commit(self, cmd: TxCommit) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        # Validate everything first so the commit is all or nothing (S24).
        outstanding = dict.fromkeys(ch.unacked)
        for sub in cmd.commands:
            if isinstance(sub, BasicPublish):
                self._route(ch, sub, TX_COMMIT)
                try:
                    _expiration_ms(sub.props)
                except _ChanErr as e:
                    raise _ChanErr(e.code, e.text, TX_COMMIT) from None
            else:
                multiple = sub.multiple and not (isinstance(sub, BasicNack) and sub.reject)
                tag = sub.delivery_tag
                if multiple and tag == 0:
                    outstanding.clear()
                    continue
                if tag not in outstanding:
                    raise _ChanErr(406, f"PRECONDITION_FAILED - unknown delivery tag {tag}",
                                   TX_COMMIT)
                for t in ([x for x in outstanding if x <= tag] if multiple else [tag]):
                    del outstanding[t]
        for sub in cmd.commands:
            if isinstance(sub, BasicPublish):
                self._publish(sub, self._route(ch, sub, TX_COMMIT), _expiration_ms(sub.props))
            elif isinstance(sub, BasicAck):
                self.basic_ack(sub, TX_COMMIT)
            else:
                self.basic_nack(sub, TX_COMMIT)
        self.reply(cmd.chan, "Tx.CommitOk")

    def echo(self, cmd: Echo) -> None:
        if cmd.chan in self.s.channels:
            self.reply(cmd.chan, cmd.method, dict(cmd.fields))

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


def _consumer_count(q: Queue) -> int:
    """What queue.declare-ok reports: a quorum queue with single active
    consumer counts only the active one (RabbitMQ 3.10; a classic one, all)."""
    n = len(q.consumers)
    if q.single_active and q.arguments.get("x-queue-type") == "quorum":
        return min(n, 1)
    return n


def _with_delivery_count(m: Message) -> dict[str, Any]:
    """The props of a redelivery from a quorum queue: x-delivery-count says how
    often the message came back (a new dict: props are shared between queues)."""
    props = dict(m.props)
    headers = dict(props.get("headers") or {})
    headers["x-delivery-count"] = m.delivery_count
    props["headers"] = headers
    return props


def _is_cycle(queue: str, deaths: list[dict[str, Any]]) -> bool:
    """RabbitMQ's rule: dead-lettering back into a queue the message already died
    in is a cycle unless a client rejection happened along the way."""
    for i, d in enumerate(deaths):
        if d.get("queue") == queue:
            return all(x.get("reason") != "rejected" for x in deaths[: i + 1])
    return False


_HANDLERS: dict[type, Callable[[_Applier, Any], None]] = {
    ChannelOpen: _Applier.channel_open,
    ChannelClose: _Applier.channel_close,
    ChannelFlow: _Applier.channel_flow,
    ConnectionClose: _Applier.connection_close,
    ExchangeDeclare: _Applier.exchange_declare,
    ExchangeDelete: _Applier.exchange_delete,
    ExchangeBind: _Applier.exchange_bind,
    ExchangeUnbind: _Applier.exchange_unbind,
    QueueDeclare: _Applier.queue_declare,
    QueueBind: _Applier.queue_bind,
    QueueUnbind: _Applier.queue_unbind,
    QueuePurge: _Applier.queue_purge,
    QueueDelete: _Applier.queue_delete,
    BasicQos: _Applier.basic_qos,
    BasicConsume: _Applier.basic_consume,
    BasicCancel: _Applier.basic_cancel,
    BasicCredit: _Applier.basic_credit,
    BasicGet: _Applier.basic_get,
    BasicPublish: _Applier.basic_publish,
    BasicAck: _Applier.basic_ack,
    BasicNack: _Applier.basic_nack,
    BasicRecover: _Applier.basic_recover,
    TxCommit: _Applier.tx_commit,
    Echo: _Applier.echo,
    Tick: _Applier.tick,
    NodeUp: _Applier.node_up,
    NodeDown: _Applier.node_down,
    SetMember: _Applier.set_member,
    DropMember: _Applier.drop_member,
    SetDraining: _Applier.set_draining,
    UserPut: _Applier.user_put,
    UserDelete: _Applier.user_delete,
    VhostPut: _Applier.vhost_put,
    VhostDelete: _Applier.vhost_delete,
    PermissionSet: _Applier.permission_set,
    PermissionClear: _Applier.permission_clear,
    MarkOutOfSync: _Applier.mark_out_of_sync,
    MarkInSync: _Applier.mark_in_sync,
}
