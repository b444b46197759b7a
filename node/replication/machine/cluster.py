"""Handlers for the cluster's metadata (machine version 6, issue 28): global
runtime parameters (the cluster name among them) and the vhosts protected
from deletion. Below CLUSTER_METADATA no build proposes these records (a
version-5 member cannot decode them); should one be applied anyway, it
changes nothing, the same on every member.
"""
from __future__ import annotations

from node.broker.definition_limit import parameter_over_ceiling
from node.replication.command import GlobalParameterClear, GlobalParameterSet, VhostProtection
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.state import _config_changed
from node.replication.machine.version import CLUSTER_METADATA, DEFINITION_CEILINGS


class ClusterHandlers(ApplierBase):
    __slots__ = ()

    def _metadata_on(self) -> bool:
        return self.s.machine_version >= CLUSTER_METADATA

    @handles(GlobalParameterSet)
    def global_parameter_set(self, cmd: GlobalParameterSet) -> None:
        s = self.s
        if not self._metadata_on():
            return
        if s.machine_version >= DEFINITION_CEILINGS and parameter_over_ceiling(
                cmd.name, cmd.value, len(s.global_parameters), cmd.name not in s.global_parameters):
            return  # refused before proposing; this holds whatever a node's settings said
        s.global_parameters[cmd.name] = cmd.value
        _config_changed(s)

    @handles(GlobalParameterClear)
    def global_parameter_clear(self, cmd: GlobalParameterClear) -> None:
        s = self.s
        if self._metadata_on() and s.global_parameters.pop(cmd.name, _ABSENT) is not _ABSENT:
            _config_changed(s)

    @handles(VhostProtection)
    def vhost_protection(self, cmd: VhostProtection) -> None:
        s = self.s
        if not self._metadata_on() or cmd.name not in s.vhosts:
            return
        if cmd.protected and cmd.name not in s.protected_vhosts:
            s.protected_vhosts[cmd.name] = None
        elif not cmd.protected and cmd.name in s.protected_vhosts:
            del s.protected_vhosts[cmd.name]
        else:
            return
        _config_changed(s)


_ABSENT = object()
