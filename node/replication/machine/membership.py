"""Handlers for Raft membership as the broker sees it: members, the
in-sync set and draining (maintenance mode).
"""
from __future__ import annotations

from node.replication.command import DropMember, MarkInSync, MarkOutOfSync, SetDraining, SetMember
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.state import _config_changed


class MembershipHandlers(ApplierBase):
    __slots__ = ()

    # -- membership (the raft thread alone touches these: mutated in place) -----

    def _in_sync_of(self, nodes: dict[str, None]) -> dict[str, None]:
        return {n: None for n in self.s.members if n in nodes}

    @handles(SetMember)
    def set_member(self, cmd: SetMember) -> None:
        s = self.s
        if s.members.get(cmd.node) != cmd.address:
            s.members[cmd.node] = cmd.address
            _config_changed(s)
        if cmd.in_sync and cmd.node not in s.in_sync:
            s.in_sync = self._in_sync_of({**s.in_sync, cmd.node: None})  # in members order
            _config_changed(s)

    @handles(DropMember)
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

    @handles(SetDraining)
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

    @handles(MarkOutOfSync)
    def mark_out_of_sync(self, cmd: MarkOutOfSync) -> None:
        """Refused unless the rest of the set is still a majority of members."""
        s = self.s
        if cmd.node in s.in_sync and len(s.in_sync) - 1 >= len(s.members) // 2 + 1:
            del s.in_sync[cmd.node]
            _config_changed(s)

    @handles(MarkInSync)
    def mark_in_sync(self, cmd: MarkInSync) -> None:
        s = self.s
        if cmd.node in s.members and cmd.node not in s.in_sync and cmd.node not in s.draining:
            s.in_sync = self._in_sync_of({**s.in_sync, cmd.node: None})  # in members order
            _config_changed(s)
