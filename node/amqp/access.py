"""What a Connection's user may do here (a mixin of node/amqp/connection.py):
the permission checks of its channels' methods (cached while the read
model's permissions and users stay the same objects), the vhost and user
limits (max-connections, max-channels) counted across the cluster (this
node's connections exactly, the others' from the read model), and whether a
deleted user or vhost revokes the connection.
"""
from __future__ import annotations

from node.amqp.channel import ChannelException
from node.amqp.endpoint import RUNNING, Endpoint
from node.broker.limit import (
    MAX_CHANNELS,
    MAX_CONNECTIONS,
    over,
    user_channels_refused,
    user_connections_refused,
    vhost_connections_refused,
)
from node.broker.permission import FULL, KIND_NAMES, permitted
from node.broker.vhost import DEFAULT_VHOST


class Access(Endpoint):
    """Connection's permission and limit checks."""

    def _count(self, kind: str, name: str, local: int) -> int:
        """How many `kind` ("vhost"/"user" connections, "chan" channels) of
        `name` the cluster has: this node's counted here (`local`: exact,
        applied or not), the others' from the read model."""
        node = self.id.node
        return local + sum(n for (k, owner, where), n in self.proposer.read_model().counts.items()
                           if k == kind and owner == name and where != node)

    def _local(self) -> list[Endpoint]:
        peers = self.peers() if self.peers is not None else ()
        return [c for c in peers if c is not self and c.phase == RUNNING]

    def _connection_limit_refusal(self) -> str | None:
        """Why the vhost's or the user's max-connections refuses this
        connection (RabbitMQ's is_over_vhost/user_connection_limit), or None."""
        model = self.proposer.read_model()
        vlimits, ulimits = model.vhost_limits.get(self.vhost), model.user_limits.get(self.user)
        if vlimits is None and ulimits is None:
            return None
        local = self._local()
        if vlimits is not None:
            n = self._count("vhost", self.vhost, sum(1 for c in local if c.vhost == self.vhost))
            limit = over(vlimits, MAX_CONNECTIONS, n)
            if limit is not None:
                return vhost_connections_refused(self.vhost, self.user, limit)
        if ulimits is not None:
            n = self._count("user", self.user, sum(1 for c in local if c.user == self.user))
            limit = over(ulimits, MAX_CONNECTIONS, n)
            if limit is not None:
                return user_connections_refused(self.user, limit)
        return None

    def _channel_limit_refusal(self) -> str | None:
        """Why the user's max-channels (across the cluster) refuses one more."""
        ulimits = self.proposer.read_model().user_limits.get(self.user)
        if ulimits is None or MAX_CHANNELS not in ulimits:
            return None
        local = len(self.channels) + sum(len(c.channels) for c in self._local()
                                         if c.user == self.user)
        limit = over(ulimits, MAX_CHANNELS, self._count("chan", self.user, local))
        return None if limit is None else user_channels_refused(self.user, limit)

    def _patterns(self) -> tuple[str, str, str] | None:
        """The user's permission patterns on the connection's vhost; before the
        cluster has replicated users, configured users get full access to "/"."""
        model = self.proposer.read_model()
        if not model.users:
            return FULL if self.vhost == DEFAULT_VHOST and self.user in self.config.users else None
        return model.permissions.get((self.user, self.vhost))

    def check(self, kind: int, rtype: str, name: str, class_id: int, method_id: int) -> None:
        """403 ACCESS_REFUSED (a channel error) unless the user may `kind`
        (CONFIGURE / WRITE / READ) the resource, as RabbitMQ checks it."""
        model = self.proposer.read_model()
        if model.permissions is not self._perm_source or model.users is not self._perm_users:
            self._perm_source, self._perm_users = model.permissions, model.users
            self._perm_cache = {}
        key = (kind, rtype, name)
        ok = self._perm_cache.get(key)
        if ok is None:
            patterns = self._patterns()
            ok = patterns is not None and permitted(patterns, kind, name)
            if len(self._perm_cache) < 4096:  # bounded: names are client-chosen
                self._perm_cache[key] = ok
        if not ok:
            raise ChannelException(403, f"ACCESS_REFUSED - {KIND_NAMES[kind]} access to {rtype} "
                                        f"'{name}' in vhost '{self.vhost}' refused for user "
                                        f"'{self.user}'", class_id, method_id)

    def revoked(self) -> str | None:
        """Why an open connection may no longer stay (its user or vhost was
        deleted, as RabbitMQ closes them), or None."""
        if self.phase != RUNNING:
            return None
        model = self.proposer.read_model()
        if model.users and self.user not in model.users:
            return f"user '{self.user}' was deleted"
        if self.vhost not in model.vhosts:
            return f"vhost '{self.vhost}' was deleted"
        return None
