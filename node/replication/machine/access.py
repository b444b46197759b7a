"""Handlers for users, virtual hosts and permissions.
"""
from __future__ import annotations

from node.broker.vhost import split_key
from node.replication.command import (
    PermissionClear,
    PermissionSet,
    UserDelete,
    UserPut,
    VhostDelete,
    VhostPut,
)
from node.replication.effect import ConnectionFailure
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.state import _add_vhost, _config_changed


class AccessHandlers(ApplierBase):
    __slots__ = ()

    # -- users --------------------------------------------------------------

    @handles(UserPut)
    def user_put(self, cmd: UserPut) -> None:
        self.s.users[cmd.name] = (cmd.password_hash, tuple(cmd.tags))
        _config_changed(self.s)

    @handles(UserDelete)
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
        self.drop_access_of_user(cmd.name)

    # -- vhosts and permissions ------------------------------------------------

    @handles(VhostPut)
    def vhost_put(self, cmd: VhostPut) -> None:
        if cmd.name not in self.s.vhosts:
            _add_vhost(self.s, cmd.name)

    @handles(VhostDelete)
    def vhost_delete(self, cmd: VhostDelete) -> None:
        s = self.s
        vhost = cmd.name
        if vhost not in s.vhosts or vhost in s.protected_vhosts:
            return  # a protected vhost stays (RabbitMQ 4.x's protected_from_deletion)
        del s.vhosts[vhost]
        for k in [k for k in s.permissions if k[1] == vhost]:
            del s.permissions[k]
        for table in (s.policies, s.operator_policies):
            for k in [k for k in table if k[0] == vhost]:
                del table[k]
        s.policy_index.drop_vhost(vhost)
        self.drop_access_of_vhost(vhost)
        _config_changed(s)
        conns = dict.fromkeys(ch.id.conn_id for ch in s.channels.values() if ch.vhost == vhost)
        for conn, (cv, _user) in s.connections.items():  # channel-less ones too
            if cv == vhost:
                conns[conn] = None
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

    @handles(PermissionSet)
    def permission_set(self, cmd: PermissionSet) -> None:
        s = self.s
        if cmd.user in s.users and cmd.vhost in s.vhosts:
            s.permissions[(cmd.user, cmd.vhost)] = (cmd.configure, cmd.write, cmd.read)
            _config_changed(s)

    @handles(PermissionClear)
    def permission_clear(self, cmd: PermissionClear) -> None:
        s = self.s
        key = (cmd.user, cmd.vhost)
        if key in s.permissions:
            del s.permissions[key]
            _config_changed(s)
