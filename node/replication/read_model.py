"""What the event loop reads of the replicated state: one immutable ReadModel
per Raft tick (issue 12).

Only the raft thread touches `BrokerState` (apply mutates its dicts in
place). At the end of every Raft tick it builds a `ReadModel` when something
the loop reads changed and hands it over; the loop (wire, admin, metrics)
reads that model, never the live state. Parts that did not change are the
very objects of the previous model, so identity tells a reader whether
users, vhosts or permissions changed (permission caches, the check for
deleted users and vhosts).

Queue rows (ListQueues, metrics) cost O(queues + unacked deliveries): they
are built on the raft thread only when the loop asked for them, between two
ticks, where the state is consistent.

`build` and `queue_rows` are pure; `ModelPublisher` is the small shell that
moves models and rows across the thread boundary (immutable objects only).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from node.broker.policy import effective_definition, matching, queue_type
from node.broker.vhost import split_key
from node.replication.machine.version import CLUSTER_METADATA, LIMITS, QUORUM_SEMANTICS

if TYPE_CHECKING:
    from node.replication.machine import BrokerState

log = logging.getLogger(__name__)

QUEUE_ROWS_TIMEOUT = 5.0  # seconds the loop waits for the raft thread's rows

_K = TypeVar("_K")
_V = TypeVar("_V")


def _frozen(m: Mapping[_K, _V]) -> Mapping[_K, _V]:
    """A read-only mapping nobody else holds a writable reference to."""
    return m if isinstance(m, MappingProxyType) else MappingProxyType(dict(m))


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, eq=False)
class ReadModel:
    """The replicated state as the event loop may read it. Immutable: plain
    dicts given to the constructor are copied behind a MappingProxyType,
    iterables become tuples."""

    # user -> (password hash, tags); empty while the cluster has none (the
    # node's configured users apply then)
    users: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=_empty)
    # vhosts (ordered set: name -> None)
    vhosts: Mapping[str, None] = field(default_factory=_empty)
    # (user, vhost) -> (configure, write, read) patterns
    permissions: Mapping[tuple[str, str], tuple[str, str, str]] = field(default_factory=_empty)
    # Raft members: node id -> raft address (in order); the in-sync set and the
    # members in maintenance mode, in members order
    members: Mapping[str, str] = field(default_factory=_empty)
    in_sync: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()
    # (vhost, name) -> Policy: policies and operator policies
    policies: Mapping[tuple[str, str], Any] = field(default_factory=_empty)
    operator_policies: Mapping[tuple[str, str], Any] = field(default_factory=_empty)
    message_bytes: int = 0  # bytes of message bodies held (memory high-watermark)
    queue_count: int = 0
    config_version: int = 0  # BrokerState.config_version this was built from
    version: int = 0  # counts the models built (one more per build that changed something)
    # vhost / user -> {limit name: value}; (user, vhost, exchange) -> (write, read)
    vhost_limits: Mapping[str, Mapping[str, int]] = field(default_factory=_empty)
    user_limits: Mapping[str, Mapping[str, int]] = field(default_factory=_empty)
    topic_permissions: Mapping[tuple[str, str, str], tuple[str, str]] = field(
        default_factory=_empty)
    # (kind, name, node) -> count, for the vhosts and users that have limits
    # only (machine/limit.py: "vhost"/"user" connections, "chan" channels)
    counts: Mapping[tuple[str, str, str], int] = field(default_factory=_empty)
    machine_version: int = 1  # the cluster's, as applied here
    # global runtime parameters (name -> JSON value: apply replaces a value,
    # never changes it in place, so it is shared, not copied; readers must not
    # change it) and the vhosts protected from deletion, in order (machine
    # version 6 on)
    global_parameters: Mapping[str, Any] = field(default_factory=_empty)
    protected_vhosts: tuple[str, ...] = ()

    @property
    def limits_on(self) -> bool:
        """The cluster's machine version carries limits, topic permissions
        and ConnectionOpen: nodes may propose them."""
        return self.machine_version >= LIMITS

    @property
    def cluster_metadata_on(self) -> bool:
        """The cluster's machine version carries global parameters and vhost
        deletion protection: nodes may propose them."""
        return self.machine_version >= CLUSTER_METADATA

    @property
    def quorum_semantics(self) -> bool:
        """Does the cluster run RabbitMQ 4.3's quorum-queue semantics (machine
        version 3 on)? The wire sets BasicConsume/BasicGet.timeout only then."""
        return self.machine_version >= QUORUM_SEMANTICS

    def __post_init__(self) -> None:
        for name in ("users", "vhosts", "permissions", "members", "policies",
                     "operator_policies", "vhost_limits", "user_limits", "topic_permissions",
                     "counts", "global_parameters"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, _frozen(value))
        for name in ("in_sync", "draining", "protected_vhosts"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))


EMPTY = ReadModel()


def _same(old: Mapping[Any, Any], new: Mapping[Any, Any]) -> bool:
    """Same items in the same order (dict order is part of the replicated state)."""
    return len(old) == len(new) and list(old.items()) == list(new.items())


def _keep_or_copy(old: Mapping[_K, _V] | None, new: Mapping[_K, _V]) -> Mapping[_K, _V]:
    if old is not None and _same(old, new):
        return old
    return MappingProxyType(dict(new))


def _keep_or_tuple(old: tuple[str, ...] | None, new: Mapping[str, None]) -> tuple[str, ...]:
    fresh = tuple(new)
    return old if old is not None and old == fresh else fresh


def build(state: BrokerState, prev: ReadModel | None = None, full: bool = False) -> ReadModel:
    """The ReadModel of `state` (pure). Returns `prev` itself when the state's
    config_version, message bytes and queue count are still prev's; otherwise
    a new model that reuses prev's objects for the parts that did not change
    (identity tells a reader what changed). The configuration parts (users,
    vhosts, permissions, members, in_sync, draining) are looked at only when
    config_version moved, or always with `full` (the state object was
    replaced, e.g. by a snapshot from the leader)."""
    cv = state.config_version
    message_bytes = int(state.message_bytes)
    queue_count = len(state.queues)
    machine = int(state.machine_version)
    if prev is not None and not full and prev.config_version == cv \
            and prev.machine_version == machine:
        if prev.message_bytes == message_bytes and prev.queue_count == queue_count:
            return prev
        return ReadModel(prev.users, prev.vhosts, prev.permissions, prev.members, prev.in_sync,
                         prev.draining, prev.policies, prev.operator_policies, message_bytes,
                         queue_count, cv, prev.version + 1, prev.vhost_limits, prev.user_limits,
                         prev.topic_permissions, prev.counts, machine,
                         global_parameters=prev.global_parameters,
                         protected_vhosts=prev.protected_vhosts)
    users = _keep_or_copy(prev.users if prev else None, state.users)
    vhosts = _keep_or_copy(prev.vhosts if prev else None, state.vhosts)
    permissions = _keep_or_copy(prev.permissions if prev else None, state.permissions)
    members = _keep_or_copy(prev.members if prev else None, state.members)
    in_sync = _keep_or_tuple(prev.in_sync if prev else None, state.in_sync)
    draining = _keep_or_tuple(prev.draining if prev else None, state.draining)
    policies = _keep_or_copy(prev.policies if prev else None, state.policies)
    ops = _keep_or_copy(prev.operator_policies if prev else None, state.operator_policies)
    vlimits = _keep_or_copy(prev.vhost_limits if prev else None, _limits(state.vhost_limits))
    ulimits = _keep_or_copy(prev.user_limits if prev else None, _limits(state.user_limits))
    topic = _keep_or_copy(prev.topic_permissions if prev else None, state.topic_permissions)
    counts = _keep_or_copy(prev.counts if prev else None, _counts(state))
    params = _keep_params(prev.global_parameters if prev else None, state.global_parameters)
    protected = _keep_or_tuple(prev.protected_vhosts if prev else None, state.protected_vhosts)
    return ReadModel(users, vhosts, permissions, members, in_sync, draining, policies, ops,
                     message_bytes, queue_count, cv, (prev.version + 1) if prev else 1,
                     vlimits, ulimits, topic, counts, machine, params, protected)


def _keep_params(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Mapping[str, Any]:
    """Global parameters: the same values are the same objects (apply replaces
    a value; JSON's 1, 1.0 and true are == but not the same value)."""
    if old is not None and len(old) == len(new) and all(
            k1 == k2 and v1 is v2 for (k1, v1), (k2, v2) in zip(old.items(), new.items(),
                                                              strict=True)):
        return old
    return MappingProxyType(dict(new))


def _limits(table: Mapping[str, Mapping[str, int]]) -> dict[str, Mapping[str, int]]:
    return {owner: MappingProxyType(dict(limits)) for owner, limits in table.items()}


def _counts(state: BrokerState) -> dict[tuple[str, str, str], int]:
    """The counts a limit reads (machine/limit.py moves config_version when
    one of them moves)."""
    vl, ul = state.vhost_limits, state.user_limits
    if not vl and not ul:
        return {}
    return {k: n for k, n in state.counts.items() if (vl if k[0] == "vhost" else ul).get(k[1])}


def access_changed(old: ReadModel, new: ReadModel) -> bool:
    """Users, vhosts or permissions (or the machine version) differ between
    the two models."""
    return (old.users is not new.users or old.vhosts is not new.vhosts
            or old.permissions is not new.permissions
            or old.machine_version != new.machine_version)


class QueueRow(NamedTuple):
    name: str
    vhost: str
    ready: int
    unacked: int
    consumers: int
    durable: bool


def queue_rows(state: Any) -> tuple[QueueRow, ...]:
    """A row for every queue, by vhost and name (pure; run it where the state
    is consistent: on the raft thread between applies). Unacked deliveries
    live on the channels: (queue, message, consumer) by delivery tag."""
    unacked: dict[int, int] = {}
    for ch in state.channels.values():
        for entry in ch.unacked.values():
            unacked[id(entry[0])] = unacked.get(id(entry[0]), 0) + 1
    rows = []
    for key, q in state.queues.items():
        vhost, name = split_key(key)
        rows.append(QueueRow(name, vhost, q.ready_count(), unacked.get(id(q), 0),
                             len(q.consumers), bool(q.durable)))
    rows.sort(key=lambda r: (r.vhost, r.name))
    return tuple(rows)


def queue_dicts(m: Management) -> list[dict[str, Any]]:
    """ListQueues' fields of the management rows' queues (the metrics read
    them from the shared snapshot, node/replication/row_cache.py)."""
    return [{"name": q.name, "vhost": q.vhost, "ready": q.ready, "unacked": q.unacked,
             "consumers": q.consumers, "durable": q.durable} for q in m.queues]


# ------------------------------------------------------------ management rows
# What the HTTP management API reads (issue 15): built on the raft thread by
# the pure `management_rows`, only when the loop asks (O(state)), as plain
# tuples and fresh dicts that nothing else references (immutable by contract).

class MQueue(NamedTuple):
    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    exclusive: bool
    owner: tuple[str, int] | None  # (node, connection serial) of an exclusive queue
    arguments: Mapping[str, Any]
    node: str  # home node (where it was declared)
    ready: int
    unacked: int
    ready_bytes: int
    unacked_bytes: int
    consumers: int
    stats: tuple[int, int, int, int]  # published, delivered+got, redelivered, acked
    idle_since: float  # the proposer's clock at the last use (apply time)
    policy: str | None = None  # the names of the policy and operator policy that apply
    operator_policy: str | None = None
    effective_policy_definition: Mapping[str, Any] = MappingProxyType({})
    # messages kept for at-least-once dead-lettering (RabbitMQ 4.x's
    # messages_dlx / message_bytes_dlx); None: the queue keeps none (not at-least-once)
    dlx: int | None = None
    dlx_bytes: int = 0


class MExchange(NamedTuple):
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: Mapping[str, Any]
    policy: str | None = None
    operator_policy: str | None = None


class MBinding(NamedTuple):
    vhost: str
    source: str
    destination: str
    destination_type: str  # "queue" or "exchange"
    routing_key: str
    arguments: Mapping[str, Any]


class MChannel(NamedTuple):
    node: str
    conn: int  # connection serial
    serial: int
    number: int  # 1-based position among its connection's channels (the state has no numbers)
    vhost: str
    prefetch: int
    global_prefetch: int
    unacked: int
    consumers: int


class MConsumer(NamedTuple):
    vhost: str
    queue: str
    node: str
    conn: int
    chan_serial: int
    tag: str
    ack_required: bool
    exclusive: bool
    prefetch: int
    priority: int


class MConnection(NamedTuple):
    node: str
    serial: int
    channels: int
    vhost: str


class Management(NamedTuple):
    queues: tuple[MQueue, ...]
    exchanges: tuple[MExchange, ...]
    bindings: tuple[MBinding, ...]
    channels: tuple[MChannel, ...]
    consumers: tuple[MConsumer, ...]
    connections: tuple[MConnection, ...]
    config_version: int


def _plain(value: Any) -> Any:
    """A fresh copy of a field-table value (dicts and lists copied)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def management_rows(state: Any) -> Management:
    """Everything the management API lists, as of now (pure; run it on the
    raft thread between applies)."""
    unacked: dict[int, list[int]] = {}
    channels = []
    consumers = []
    chan_number: dict[Any, int] = {}
    for chans in state.conns.values():
        for i, cid in enumerate(chans, 1):
            chan_number[cid] = i
    for cid, ch in state.channels.items():
        for entry in ch.unacked.values():
            slot = unacked.setdefault(id(entry[0]), [0, 0])
            slot[0] += 1
            slot[1] += entry[1].size
        channels.append(MChannel(cid.node, cid.conn, cid.serial, chan_number.get(cid, 0),
                                 ch.vhost, ch.prefetch, ch.global_prefetch, len(ch.unacked),
                                 len(ch.consumers)))
        for tag, c in ch.consumers.items():
            qv, qn = split_key(c.queue.name)
            consumers.append(MConsumer(qv, qn, cid.node, cid.conn, cid.serial, tag,
                                       not c.no_ack, bool(c.exclusive), int(c.prefetch),
                                       int(getattr(c, "priority", 0))))
    queues = []
    dead_letters = getattr(state, "dead_letters", {})
    has_policies = bool(getattr(state, "policies", None) or getattr(state, "operator_policies", None))
    # the apply's cached winners (machine/policy.py); a bare state (tests) is matched
    index = getattr(state, "policy_index", None)

    def policy_of(key: str, kind: str, qtype: str) -> tuple[Any, Any]:
        if index is not None:
            return index.winners(kind, key)
        return matching(state.policies, state.operator_policies, key, kind, qtype)

    for key, q in state.queues.items():
        vhost, name = split_key(key)
        un = unacked.get(id(q), (0, 0))
        owner = (q.owner.node, q.owner.serial) if q.owner is not None else None
        stats = getattr(q, "stats", None) or [0, 0, 0, 0]
        p, op = policy_of(key, "queue", queue_type(q.arguments)) if has_policies else (None, None)
        queues.append(MQueue(vhost, name, bool(q.durable), bool(q.auto_delete), bool(q.exclusive),
                             owner, MappingProxyType(_plain(q.arguments)), q.home,
                             q.ready_count(), un[0], int(q.ready_bytes), un[1], len(q.consumers),
                             (stats[0], stats[1], stats[2], stats[3]), float(q.last_used),
                             p.name if p else None, op.name if op else None,
                             MappingProxyType(_plain(effective_definition(p, op))),
                             *_kept(dead_letters.get(key))))
    exchanges = []
    bindings = []
    for key, x in state.exchanges.items():
        vhost, name = split_key(key)
        xp, xop = policy_of(key, "exchange", "classic") if has_policies else (None, None)
        exchanges.append(MExchange(vhost, name, x.type, bool(x.durable), bool(x.auto_delete),
                                   bool(x.internal), MappingProxyType(_plain(x.arguments)),
                                   xp.name if xp else None, xop.name if xop else None))
        for b in x.bindings.values():
            is_x, dest = b.dest
            bindings.append(MBinding(vhost, name, split_key(dest)[1],
                                     "exchange" if is_x else "queue", b.routing_key,
                                     MappingProxyType(_plain(b.arguments))))
    conns = []
    for conn_id, chans in state.conns.items():
        first = next(iter(chans), None)
        ch = state.channels.get(first) if first is not None else None
        conns.append(MConnection(conn_id.node, conn_id.serial, len(chans),
                                 ch.vhost if ch is not None else "/"))
    queues.sort(key=lambda r: (r.vhost, r.name))
    exchanges.sort(key=lambda r: (r.vhost, r.name))
    return Management(tuple(queues), tuple(exchanges), tuple(bindings), tuple(channels),
                      tuple(consumers), tuple(conns), int(state.config_version))


def _kept(store: Any) -> tuple[int | None, int]:
    return (None, 0) if store is None else (len(store), int(store.bytes))


ModelListener = Callable[[ReadModel], None]


def _settle(fut: asyncio.Future[Any], answer: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(answer)


class ModelPublisher:
    """Hands ReadModels (and queue rows on request) from the raft thread to
    the event loop.

    Raft thread: `tick(state)` at the end of every Raft tick.
    Event loop: `current`, `add_listener(cb)`, `await queue_rows()`.
    Only immutable objects cross: a ReadModel, a tuple of QueueRows."""

    def __init__(self, loop: asyncio.AbstractEventLoop, state: BrokerState | None = None,
                 rows_timeout: float = QUEUE_ROWS_TIMEOUT) -> None:
        self.loop = loop
        self.rows_timeout = rows_timeout
        first = build(state) if state is not None else EMPTY
        # ---- raft thread
        self._built = first  # the last model built
        self._state: Any = state  # the state object it was built from
        self._rows_served = 0  # the last request number answered
        # ---- shared: written by one side, read by the other (one reference each)
        self._latest = first  # written by the raft thread
        self._scheduled = False  # a hand-over is queued on the loop
        self._rows_asked = 0  # written by the loop: number of the last request
        # ---- loop thread
        self._current = first
        self._listeners: list[ModelListener] = []
        self._row_waiters: list[tuple[int, asyncio.Future[tuple[QueueRow, ...]]]] = []
        # ---- shared: (pure function of the state, its future), appended by the
        # loop, taken by the raft thread (deque operations are atomic)
        self._asks: deque[tuple[Callable[[Any], Any], asyncio.Future[Any]]] = deque()

    # ---------------------------------------------------------- raft thread
    def tick(self, state: BrokerState) -> None:
        """Build the model if something in it changed, and queue rows if the
        loop asked for them; hand both to the loop."""
        replaced = state is not self._state
        self._state = state
        model = build(state, self._built, full=replaced)
        if model is not self._built:
            self._built = model
            self._latest = model
            if not self._scheduled:  # coalesce: the loop takes the latest when it runs
                self._scheduled = True
                self.loop.call_soon_threadsafe(self._take)
        while self._asks:
            fn, fut = self._asks.popleft()
            try:
                answer = fn(state)
            except Exception as exc:  # noqa: BLE001 - the asker gets it, the raft thread goes on
                log.exception("read model request failed")
                self.loop.call_soon_threadsafe(_settle, fut, None, exc)
            else:
                self.loop.call_soon_threadsafe(_settle, fut, answer, None)
        asked = self._rows_asked
        if asked != self._rows_served:
            self._rows_served = asked
            rows = queue_rows(state)
            self.loop.call_soon_threadsafe(self._answer_rows, asked, rows)

    # ----------------------------------------------------------- loop thread
    @property
    def current(self) -> ReadModel:
        """The latest model handed to the loop."""
        return self._current

    def add_listener(self, cb: ModelListener) -> None:
        """`cb(model)` on the loop whenever users, vhosts or permissions change."""
        self._listeners.append(cb)

    async def queue_rows(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Rows (name, vhost, ready, unacked, consumers, durable) built on the
        raft thread at its next tick; TimeoutError if it does not tick."""
        self._rows_asked += 1
        fut: asyncio.Future[tuple[QueueRow, ...]] = self.loop.create_future()
        entry = (self._rows_asked, fut)
        self._row_waiters.append(entry)
        try:
            rows = await asyncio.wait_for(fut, self.rows_timeout if timeout is None else timeout)
        except TimeoutError:
            raise TimeoutError("queue rows: the raft thread did not answer") from None
        finally:
            if entry in self._row_waiters:
                self._row_waiters.remove(entry)
        return [row._asdict() for row in rows]

    async def compute(self, fn: Callable[[Any], _V], timeout: float | None = None) -> _V:
        """`fn(state)` run on the raft thread at its next tick, between two
        applies (the generalisation of queue_rows). `fn` must be pure and
        return objects the state does not share (e.g. management_rows)."""
        fut: asyncio.Future[Any] = self.loop.create_future()
        self._asks.append((fn, fut))
        try:
            return await asyncio.wait_for(fut, self.rows_timeout if timeout is None else timeout)
        except TimeoutError:
            raise TimeoutError("read model request: the raft thread did not answer") from None

    def _take(self) -> None:
        self._scheduled = False  # before reading _latest: a newer one schedules again
        self._publish(self._latest)

    def _publish(self, model: ReadModel) -> None:
        old = self._current
        if model is old:
            return
        self._current = model
        if access_changed(old, model):
            for cb in list(self._listeners):
                try:
                    cb(model)
                except Exception:  # noqa: BLE001 - one listener must not starve the others
                    log.exception("read model listener failed")

    def _answer_rows(self, asked: int, rows: tuple[QueueRow, ...]) -> None:
        waiting = []
        for n, fut in self._row_waiters:
            if n <= asked:
                if not fut.done():
                    fut.set_result(rows)
            else:
                waiting.append((n, fut))
        self._row_waiters = waiting
