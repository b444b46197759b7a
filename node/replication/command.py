"""Commands: what a node proposes to the replicated log.

Every change of broker state is one of these, applied by
node.replication.machine.apply_batch on every node in log order. They are NamedTuples,
encoded by node/replication/codec.py (one registered record each). Field tables (arguments, headers) are plain dicts
as decoded from the wire; message properties are a dict keyed by pamqp's
Basic.Properties attribute names (content_type, delivery_mode, headers,
expiration, ...) holding only the properties that were set.

`nowait` fields: when true the state machine emits no Reply effect (errors
are still emitted).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from node.broker.ids import ChanId, ConnId, DeliveryTag, PublishSeq

Table = dict[str, Any]
Props = dict[str, Any]


class ChannelOpen(NamedTuple):
    """A channel of a connection opened on `vhost`: every name its commands
    carry resolves in that vhost."""

    chan: ChanId
    vhost: str = "/"


class ChannelClose(NamedTuple):
    """Close a channel: requeue its unacked deliveries, drop its consumers.

    reply=True when the client asked (emits Reply Channel.CloseOk); False when
    the node closed it (local protocol error, connection gone).
    """

    chan: ChanId
    reply: bool


class ChannelFlow(NamedTuple):
    chan: ChanId
    active: bool


class ConnectionClose(NamedTuple):
    """Connection gone (clean close, TCP loss, missed heartbeats): close all
    its channels and delete the exclusive queues it owns. No reply."""

    conn: ConnId


class ExchangeDeclare(NamedTuple):
    chan: ChanId
    exchange: str
    exchange_type: str
    passive: bool
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: Table
    nowait: bool


class ExchangeDelete(NamedTuple):
    chan: ChanId
    exchange: str
    if_unused: bool
    nowait: bool


class ExchangeBind(NamedTuple):
    chan: ChanId
    destination: str
    source: str
    routing_key: str
    arguments: Table
    nowait: bool


class ExchangeUnbind(NamedTuple):
    chan: ChanId
    destination: str
    source: str
    routing_key: str
    arguments: Table
    nowait: bool


class QueueDeclare(NamedTuple):
    """queue == "" asks for a server-named queue (amq.gen-...).

    default_max_length: 0 from today's nodes (queues are unbounded unless
    x-max-length says otherwise). Older nodes sent their default_queue_max_length
    here; entries they wrote keep that bound when applied (replay and a rolling
    upgrade's mixed cluster apply the log identically)."""

    chan: ChanId
    queue: str
    passive: bool
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: Table
    nowait: bool
    default_max_length: int = 0


class QueueBind(NamedTuple):
    chan: ChanId
    queue: str
    exchange: str
    routing_key: str
    arguments: Table
    nowait: bool


class QueueUnbind(NamedTuple):
    chan: ChanId
    queue: str
    exchange: str
    routing_key: str
    arguments: Table


class QueuePurge(NamedTuple):
    chan: ChanId
    queue: str
    nowait: bool


class QueueDelete(NamedTuple):
    chan: ChanId
    queue: str
    if_unused: bool
    if_empty: bool
    nowait: bool


class BasicQos(NamedTuple):
    """prefetch_count for consumers created later on the channel
    (global_=False) or shared by the whole channel (global_=True). S09."""

    chan: ChanId
    prefetch_count: int
    global_: bool


class BasicConsume(NamedTuple):
    """consumer_tag == "" asks for a server-generated tag (amq.ctag-...).

    credit: how many deliveries the node can take for this consumer before it
    grants more with BasicCredit (socket back-pressure, S11). It bounds
    deliveries in flight to the node in addition to prefetch.

    timeout: the proposing node's `consumer_timeout` in ms (a quorum
    queue's consumer timeout when neither the consumer nor the queue sets
    one, S29); -1: none. Set only from machine version 3 on: a trailing
    field at its default is left out of the record (codec), so builds
    before it read the record.
    """

    chan: ChanId
    queue: str
    consumer_tag: str
    no_local: bool
    no_ack: bool
    exclusive: bool
    arguments: Table
    nowait: bool
    credit: int
    timeout: int = -1


class BasicCancel(NamedTuple):
    chan: ChanId
    consumer_tag: str
    nowait: bool


class BasicCredit(NamedTuple):
    """The node wrote `credit` more deliveries to the consumer's socket and
    can take that many more (never replied)."""

    chan: ChanId
    consumer_tag: str
    credit: int


class BasicGet(NamedTuple):
    """timeout: as BasicConsume's (an unacked basic.get of a quorum queue
    times out too, S29)."""

    chan: ChanId
    queue: str
    no_ack: bool
    timeout: int = -1


class BasicPublish(NamedTuple):
    """seq > 0: the channel is in confirm mode and this is publish number seq
    (S14); the state machine emits exactly one Confirm for it (S15)."""

    chan: ChanId
    seq: PublishSeq
    exchange: str
    routing_key: str
    mandatory: bool
    props: Props
    body: bytes


class BasicAck(NamedTuple):
    chan: ChanId
    delivery_tag: DeliveryTag
    multiple: bool


class BasicNack(NamedTuple):
    """basic.nack and basic.reject (reject=True: multiple is always False;
    the flag only chooses the method ids reported in a channel error)."""

    chan: ChanId
    delivery_tag: DeliveryTag
    multiple: bool
    requeue: bool
    reject: bool


class BasicRecover(NamedTuple):
    """basic.recover requeue=true (S12); replies Basic.RecoverOk."""

    chan: ChanId


class TxCommit(NamedTuple):
    """The publishes and acks a tx channel buffered since its last
    commit/rollback, applied atomically; replies Tx.CommitOk (S24)."""

    chan: ChanId
    commands: tuple[BasicPublish | BasicAck | BasicNack, ...]


class Echo(NamedTuple):
    """A reply with no state change, routed through the log so it reaches
    the client in order after the replies of earlier commands
    (Confirm.SelectOk, Tx.SelectOk, Tx.RollbackOk, Basic.QosOk...)."""

    chan: ChanId
    method: str
    fields: Table


class Tick(NamedTuple):
    """Expire messages (x-message-ttl, expiration) and idle queues
    (x-expires) using the batch's time stamp."""


class NodeUp(NamedTuple):
    """A node (re)started: forget every connection, channel and consumer of
    its earlier incarnations (their deliveries return to their queues,
    redelivered) and, for queues homed on it, drop non-durable queues and
    transient messages (a restart of the node that holds them)."""

    node: str
    incarnation: int


class NodeDown(NamedTuple):
    """The leader gave up on a member (unreachable or lagging past the bound):
    drop that node's connections, channels and consumers; their unacked
    deliveries return to their queues (redelivered=true, S25). The node itself,
    when it applies this, gets ConnectionFailure 320 for each of its connections
    so that its clients reconnect elsewhere."""

    node: str


class MarkOutOfSync(NamedTuple):
    """Remove a member from the in-sync set (confirms stop waiting for it).
    Refused (no-op) if the set would drop below a majority of members."""

    node: str


class MarkInSync(NamedTuple):
    """A member caught up: confirms wait for it again."""

    node: str


class SetMember(NamedTuple):
    """Record a Raft member: node id -> raft address "host:port". A new
    member starts out of sync; members recorded at cluster bootstrap start in
    sync."""

    node: str
    address: str
    in_sync: bool


class SetDraining(NamedTuple):
    """Maintenance mode for a member (RabbitMQ's `rabbitmq-upgrade drain`):
    while draining, its connections are closed (320; their unacked deliveries
    return to their queues, redelivered), it stops accepting clients, and it
    leaves the in-sync set and stays out (never below a majority), so it can
    be removed or stopped without pausing confirms. draining=False revives it."""

    node: str
    draining: bool


class UserPut(NamedTuple):
    """Create or update a user: the salted SHA-256 hash (node.broker.password,
    computed before proposing, so apply stays deterministic) and its tags."""

    name: str
    password_hash: str
    tags: tuple[str, ...] = ()


class UserDelete(NamedTuple):
    name: str


class VhostPut(NamedTuple):
    """Create a virtual host (with its own amq.* exchanges); no-op if it exists."""

    name: str


class VhostDelete(NamedTuple):
    """Delete a vhost with every queue, exchange and permission in it; its
    connections are closed (320)."""

    name: str


class PermissionSet(NamedTuple):
    """A user's configure / write / read regular expressions on one vhost
    (RabbitMQ's set_permissions). Validated before proposing."""

    user: str
    vhost: str
    configure: str
    write: str
    read: str


class PermissionClear(NamedTuple):
    user: str
    vhost: str


class PolicySet(NamedTuple):
    """Create or replace a policy (operator=False) or an operator policy of
    `vhost` (RabbitMQ's set_policy / set_operator_policy); validated before
    proposing (node/broker/policy.py). Applies at once to every matching
    queue and exchange of the vhost."""

    operator: bool
    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int | float
    definition: Table


class PolicyClear(NamedTuple):
    operator: bool
    vhost: str
    name: str


class DropMember(NamedTuple):
    """Forget a removed member (also leaves the in-sync set)."""

    node: str


class SetMachineVersion(NamedTuple):
    """The cluster's machine version becomes `version` from this entry on
    (Ra's machine version): apply behaviour that differs between versions
    switches here, at the same index on every member. The leader appends it
    once every member of the configuration runs a build of at least
    `version` (node/replication/upgrade.py); never lowers the version."""

    version: int


class ConnectionOpen(NamedTuple):
    """A client connection passed connection.open on `vhost` as `user`: the
    replicated connection table that vhost and user limits count
    cluster-wide (RabbitMQ's connection tracking). Proposed from machine
    version 4 on (machine/version.py LIMITS); ConnectionClose forgets it."""

    conn: ConnId
    vhost: str
    user: str


class LimitSet(NamedTuple):
    """One limit of a vhost (scope "vhost": max-connections, max-queues) or
    a user (scope "user": max-connections, max-channels); a negative value
    is no limit (RabbitMQ's vhost-limits / user limits). Validated before
    proposing (node/broker/limit.py)."""

    scope: str
    owner: str
    name: str
    value: int


class LimitClear(NamedTuple):
    """Forget one limit (name) or, with name "", every limit of the owner."""

    scope: str
    owner: str
    name: str


class TopicPermissionSet(NamedTuple):
    """A user's write / read patterns for the routing and binding keys on one
    topic exchange of a vhost (RabbitMQ's set_topic_permissions)."""

    user: str
    vhost: str
    exchange: str
    write: str
    read: str


class TopicPermissionClear(NamedTuple):
    """Forget the user's topic permission on `exchange`, or with exchange ""
    all of them in the vhost (RabbitMQ's clear_topic_permissions/3 and /4)."""

    user: str
    vhost: str
    exchange: str


class GlobalParameterSet(NamedTuple):
    """Create or replace a global runtime parameter (RabbitMQ's
    set_global): `value` is any JSON value (an object as a dict). The
    cluster name is the parameter "cluster_name" (RabbitMQ's
    rabbit_nodes:set_cluster_name). Proposed from machine version 6 on
    (machine/version.py CLUSTER_METADATA)."""

    name: str
    value: Any


class GlobalParameterClear(NamedTuple):
    """Forget a global runtime parameter (RabbitMQ's clear_global); from
    machine version 6 on."""

    name: str


class VhostProtection(NamedTuple):
    """Protect a vhost from deletion or lift the protection (RabbitMQ 4.x's
    vhost metadata `protected_from_deletion`): VhostDelete of a protected
    vhost changes nothing. From machine version 6 on."""

    name: str
    protected: bool


Command = (
    ChannelOpen | ChannelClose | ChannelFlow | ConnectionClose | ExchangeDeclare |
    ExchangeDelete | ExchangeBind | ExchangeUnbind | QueueDeclare | QueueBind | QueueUnbind |
    QueuePurge | QueueDelete | BasicQos | BasicConsume | BasicCancel | BasicCredit |
    BasicGet | BasicPublish | BasicAck | BasicNack | BasicRecover | TxCommit | Echo | Tick |
    NodeUp | NodeDown | MarkOutOfSync | MarkInSync | SetMember | DropMember | SetDraining |
    UserPut | UserDelete | VhostPut | VhostDelete | PermissionSet | PermissionClear |
    PolicySet | PolicyClear | SetMachineVersion | ConnectionOpen | LimitSet | LimitClear |
    TopicPermissionSet | TopicPermissionClear | GlobalParameterSet | GlobalParameterClear |
    VhostProtection
)


class Batch(NamedTuple):
    """One Raft entry: commands of one node, in the order they were issued.

    (node, incarnation, seq) makes retries idempotent: the state machine
    applies a node's batches once each, in seq order (from 1). `now` is the proposer's wall clock (seconds);
    apply never reads a clock itself.
    """

    node: str
    incarnation: int
    seq: int
    now: float
    commands: list[Command]


# How apply_batch judges a batch against the (node, incarnation) sequence it has applied
APPLIED, DUPLICATE, GAP = "applied", "dup", "gap"
