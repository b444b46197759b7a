"""Handlers for vhost and user limits, topic permissions and the replicated
connection table they count against (issue 28), and the checks applied in
the log: max-queues at queue.declare, topic permissions at publish and
bind/unbind (the machine knows exchange types and, from ConnectionOpen,
each channel's user). Connection and channel limits are checked by the wire
against the read model's counts (node/amqp/access.py).
"""
from __future__ import annotations

from node.broker.channel import Channel
from node.broker.exchange import Exchange
from node.broker.ids import ChanId, ConnId
from node.broker.limit import (
    MAX_QUEUES,
    USER,
    VHOST,
    over,
    queues_refused,
    topic_refusal,
)
from node.broker.vhost import split_key
from node.replication.command import (
    ConnectionOpen,
    LimitClear,
    LimitSet,
    TopicPermissionClear,
    TopicPermissionSet,
)
from node.replication.machine.errors import _ChanErr
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.state import BrokerState, _config_changed
from node.replication.machine.version import TOPIC_FAIL_CLOSED

# count kinds: connections per vhost, connections per user, channels per user
VHOST_CONNS, USER_CONNS, USER_CHANS = "vhost", "user", "chan"


def _limited(s: BrokerState, kind: str, name: str) -> bool:
    table = s.vhost_limits if kind == VHOST_CONNS else s.user_limits
    return name in table


def count(s: BrokerState, kind: str, name: str, node: str, delta: int) -> None:
    """Move one derived count; a count a limit reads is config (the read
    model carries it), so moving it bumps config_version."""
    key = (kind, name, node)
    n = s.counts.get(key, 0) + delta
    if n > 0:
        s.counts[key] = n
    else:
        s.counts.pop(key, None)
    if (s.vhost_limits or s.user_limits) and _limited(s, kind, name):
        _config_changed(s)


def rebuild_counts(s: BrokerState) -> None:
    """The derived counts from the connection table and the channels (after
    a snapshot load)."""
    s.counts = {}
    for conn, (vhost, user) in s.connections.items():
        for kind, name in ((VHOST_CONNS, vhost), (USER_CONNS, user)):
            key = (kind, name, conn.node)
            s.counts[key] = s.counts.get(key, 0) + 1
    for chan in s.channels:
        entry = s.connections.get(chan.conn_id)
        if entry is not None:
            key = (USER_CHANS, entry[1], chan.node)
            s.counts[key] = s.counts.get(key, 0) + 1


def channel_user(s: BrokerState, chan: ChanId) -> str | None:
    entry = s.connections.get(chan.conn_id)
    return entry[1] if entry is not None else None


class LimitHandlers(ApplierBase):
    __slots__ = ()

    # -- the connection table -------------------------------------------------

    @handles(ConnectionOpen)
    def connection_open(self, cmd: ConnectionOpen) -> None:
        s = self.s
        if cmd.conn in s.connections:
            return
        s.connections[cmd.conn] = (cmd.vhost, cmd.user)
        count(s, VHOST_CONNS, cmd.vhost, cmd.conn.node, 1)
        count(s, USER_CONNS, cmd.user, cmd.conn.node, 1)
        # channels opened before it (a connection older than machine version 4,
        # recorded at the switch) count from now on, as their closes will
        for _chan in s.conns.get(cmd.conn, ()):
            count(s, USER_CHANS, cmd.user, cmd.conn.node, 1)

    def forget_connection(self, conn: ConnId) -> None:
        s = self.s
        entry = s.connections.pop(conn, None)
        if entry is not None:
            count(s, VHOST_CONNS, entry[0], conn.node, -1)
            count(s, USER_CONNS, entry[1], conn.node, -1)

    def count_channel(self, chan: ChanId, delta: int) -> None:
        s = self.s
        if s.connections:
            user = channel_user(s, chan)
            if user is not None:
                count(s, USER_CHANS, user, chan.node, delta)

    # -- limits -------------------------------------------------------------

    @handles(LimitSet)
    def limit_set(self, cmd: LimitSet) -> None:
        s = self.s
        if cmd.scope == VHOST:
            if cmd.owner not in s.vhosts:
                return
            table = s.vhost_limits
        elif cmd.scope == USER:
            if cmd.owner not in s.users:
                return
            table = s.user_limits
        else:
            return
        table.setdefault(cmd.owner, {})[cmd.name] = int(cmd.value)
        _config_changed(s)

    @handles(LimitClear)
    def limit_clear(self, cmd: LimitClear) -> None:
        s = self.s
        table = s.vhost_limits if cmd.scope == VHOST else s.user_limits
        limits = table.get(cmd.owner)
        if limits is None:
            return
        if cmd.name:
            if limits.pop(cmd.name, None) is None:
                return
            if not limits:
                del table[cmd.owner]
        else:
            del table[cmd.owner]
        _config_changed(s)

    def check_queue_limit(self, ch: Channel, name: str, ids: tuple[int, int]) -> None:
        """406 when the vhost already holds max-queues queues (RabbitMQ's
        check_vhost_queue_limit); counted only where a limit is set."""
        s = self.s
        limits = s.vhost_limits.get(ch.vhost)
        if limits is None or MAX_QUEUES not in limits:
            return
        n = sum(1 for key in s.queues if split_key(key)[0] == ch.vhost)
        limit = over(limits, MAX_QUEUES, n)
        if limit is not None:
            raise _ChanErr(406, queues_refused(name, ch.vhost, limit), ids)

    # -- topic permissions ----------------------------------------------------

    @handles(TopicPermissionSet)
    def topic_permission_set(self, cmd: TopicPermissionSet) -> None:
        s = self.s
        if cmd.user in s.users and cmd.vhost in s.vhosts:
            s.topic_permissions[(cmd.user, cmd.vhost, cmd.exchange)] = (cmd.write, cmd.read)
            _config_changed(s)

    @handles(TopicPermissionClear)
    def topic_permission_clear(self, cmd: TopicPermissionClear) -> None:
        s = self.s
        if cmd.exchange:
            gone = [(cmd.user, cmd.vhost, cmd.exchange)]
        else:
            gone = [k for k in s.topic_permissions if k[0] == cmd.user and k[1] == cmd.vhost]
        changed = False
        for k in gone:
            if s.topic_permissions.pop(k, None) is not None:
                changed = True
        if changed:
            _config_changed(s)

    def check_topic(self, ch: Channel, x: Exchange, key: str, write: bool,
                    ids: tuple[int, int]) -> None:
        """403 unless the channel's user may write (publish) or read (bind,
        unbind) `key` on the topic exchange `x` (RabbitMQ's
        check_topic_authorisation); a channel whose user the connection table
        does not know is refused where the exchange has topic permissions."""
        s = self.s
        if not s.topic_permissions or x.type != "topic":
            return
        vhost, name = split_key(x.name)
        user = channel_user(s, ch.id)
        if user is None and s.machine_version < TOPIC_FAIL_CLOSED:
            return  # (an older member lets it through: every member must decide alike)
        refused = topic_refusal(s.topic_permissions, user, vhost, name, key, write)
        if refused is not None:
            raise _ChanErr(403, refused, ids)

    def drop_access_of_user(self, user: str) -> None:
        s = self.s
        if s.user_limits.pop(user, None) is not None:
            _config_changed(s)
        gone = [k for k in s.topic_permissions if k[0] == user]
        for k in gone:
            del s.topic_permissions[k]
        if gone:
            _config_changed(s)

    def drop_access_of_vhost(self, vhost: str) -> None:
        s = self.s
        s.vhost_limits.pop(vhost, None)
        for k in [k for k in s.topic_permissions if k[1] == vhost]:
            del s.topic_permissions[k]
