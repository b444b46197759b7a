"""The snapshot's trailing sections, in the order they are written and read
(section.py registers them): policies, machine, access, dead letters,
cluster. Each is absent from a file of a cluster below its machine version,
and a missing one means none of what it holds.
"""
from __future__ import annotations

from typing import Any

from node.broker.dead_letter import DeadLetter, DeadLetterStore
from node.broker.ids import ConnId
from node.broker.parameter import json_error
from node.broker.policy import Policy
from node.broker.queue import uses_levels
from node.replication.machine.policy import rebuild_policy_ae
from node.replication.machine.state import BrokerState, rebuild_deadlines
from node.replication.machine.version import (
    CLUSTER_METADATA,
    COUNTED_RECORDS,
    DEAD_LETTER_STORE,
    FIRST_VERSION,
    LIMITS,
    QUORUM_SEMANTICS,
)
from node.replication.raft.snapshot.envelope import (
    _dict,
    _expect,
    _list,
    _pairs,
    _tuple,
    _Writer,
)
from node.replication.raft.snapshot.message import _MessageReader, _MessageWriter
from node.replication.raft.snapshot.section import SECTIONS, Section, section

__all__ = ["SECTIONS"]  # importing this module registers the sections


@section("policies", version=1, since=FIRST_VERSION)
class PolicySection(Section):
    """("policies", section version, policies, operator policies), each policy
    a plain tuple of Policy's fields (issue 28). The first section: a file of
    a build before it ends where the state does (no policies then)."""

    @classmethod
    def write(cls, w: _Writer, state: BrokerState, msgs: _MessageWriter) -> None:
        w.value((cls.name, cls.version,
                 [tuple(p) for p in state.policies.values()],
                 [tuple(p) for p in state.operator_policies.values()]))

    @classmethod
    def read(cls, r: _MessageReader, state: BrokerState) -> None:
        tag, version, pols, ops = _tuple(r.value(), 4, "policies section")
        _expect(tag == cls.name, f"unknown section {tag!r}")
        _expect(version == cls.version, f"policies section version {version!r}")
        for items, table in ((pols, state.policies), (ops, state.operator_policies)):
            for t in _list(items, "policies"):
                vhost, name, pattern, apply_to, priority, definition = _tuple(t, 6, "policy")
                _expect(all(type(f) is str for f in (vhost, name, pattern, apply_to))
                        and type(priority) in (int, float), "policy fields")
                table[(vhost, name)] = Policy(vhost, name, pattern, apply_to, priority,
                                              _dict(definition, "policy definition"))

    @classmethod
    def derive(cls, state: BrokerState) -> None:
        rebuild_policy_ae(state)


@section("machine", version=1, since=COUNTED_RECORDS)
class MachineSection(Section):
    """("machine", section version, the cluster's machine version), after the
    policies section, written from machine version 2 on only: below it a
    member may run a build before machine versions, which refuses trailing
    bytes. Absent, the machine version is 1."""

    @classmethod
    def write(cls, w: _Writer, state: BrokerState, msgs: _MessageWriter) -> None:
        w.value((cls.name, cls.version, state.machine_version))

    @classmethod
    def read(cls, r: _MessageReader, state: BrokerState) -> None:
        tag, version, machine = _tuple(r.value(), 3, "machine section")
        _expect(tag == cls.name, f"unknown section {tag!r}")
        _expect(version == cls.version, f"machine section version {version!r}")
        _expect(type(machine) is int and machine >= COUNTED_RECORDS, "machine_version")
        state.machine_version = machine

    @classmethod
    def derive(cls, state: BrokerState) -> None:
        """What depends on the machine version: a queue's priority levels,
        its bands (read among the returned), the deadlines."""
        quorum43 = state.machine_version >= QUORUM_SEMANTICS
        for q in state.queues.values():
            q.levels = uses_levels(q.arguments, quorum43)
            q.unband_heap()
        rebuild_deadlines(state)


@section("access", version=1, since=LIMITS)
class AccessSection(Section):
    """("access", section version, vhost limits, user limits, topic
    permissions, the connection table), after the machine section, written
    from machine version 4 on only (a version-3 build refuses trailing
    bytes); absent: none."""

    @classmethod
    def write(cls, w: _Writer, state: BrokerState, msgs: _MessageWriter) -> None:
        w.value((cls.name, cls.version, state.vhost_limits,
                 state.user_limits, state.topic_permissions, state.connections))

    @classmethod
    def read(cls, r: _MessageReader, state: BrokerState) -> None:
        tag, version, vhost_limits, user_limits, topic, conns = _tuple(r.value(), 6, "access section")
        _expect(tag == cls.name, f"unknown section {tag!r}")
        _expect(version == cls.version, f"access section version {version!r}")
        state.vhost_limits = _limit_table(vhost_limits, "vhost limits")
        state.user_limits = _limit_table(user_limits, "user limits")
        for key, perm in _dict(topic, "topic permissions").items():
            _expect(type(key) is tuple and len(key) == 3 and all(type(f) is str for f in key)
                    and type(perm) is tuple and len(perm) == 2
                    and all(type(f) is str for f in perm), "topic permission")
        state.topic_permissions = topic
        for conn, entry in _dict(conns, "connections").items():
            _expect(type(conn) is ConnId and type(entry) is tuple and len(entry) == 2
                    and all(type(f) is str for f in entry), "connection")
        state.connections = conns


def _limit_table(v: Any, what: str) -> dict[str, dict[str, int]]:
    table = _dict(v, what)
    for owner, limits in table.items():
        _expect(type(owner) is str and type(limits) is dict
                and all(type(k) is str and type(n) is int for k, n in limits.items()), what)
    return table


@section("dead-letters", version=1, since=DEAD_LETTER_STORE)
class DeadLetterSection(Section):
    """("dead-letters", section version, [(queue key, [(reason, [settled
    target queue keys]), ...]), ...]), then each entry's message in that order
    (the message format, sharing properties and bodies with those written
    before): the messages queues keep for at-least-once dead-lettering
    (state.dead_letters). After the access section, written from machine
    version 5 on only (a version-4 build refuses trailing bytes); absent: no
    queue keeps any."""

    @classmethod
    def write(cls, w: _Writer, state: BrokerState, msgs: _MessageWriter) -> None:
        w.value((cls.name, cls.version,
                 [(key, [(d.reason, list(d.settled)) for d in store])
                  for key, store in state.dead_letters.items()]))
        for store in state.dead_letters.values():
            for d in store:
                msgs.write(d.message)
                w.maybe_flush()

    @classmethod
    def read(cls, r: _MessageReader, state: BrokerState) -> None:
        tag, version, stores = _tuple(r.value(), 3, "dead-letter section")
        _expect(tag == cls.name, f"unknown section {tag!r}")
        _expect(version == cls.version, f"dead-letter section version {version!r}")
        for key, entries in _pairs(stores, "dead-letter stores"):
            _expect(type(key) is str and key in state.queues, "dead-letter store's queue")
            store = DeadLetterStore()
            for item in _list(entries, "dead letters"):
                reason, settled = _tuple(item, 2, "dead letter")
                _expect(type(reason) is str and type(settled) is list
                        and all(type(t) is str for t in settled), "dead letter")
                m = r.message()
                _expect(m.props is not None, "a dead letter without its properties")
                store.add(DeadLetter(m, reason, dict.fromkeys(settled)))
            state.dead_letters[key] = store


@section("cluster", version=1, since=CLUSTER_METADATA)
class ClusterSection(Section):
    """("cluster", section version, {global parameter name: JSON value},
    [protected vhost, ...]): the global parameters (the cluster name among
    them) and the vhosts protected from deletion. After the dead-letter
    section, written from machine version 6 on only (a version-5 build
    refuses trailing bytes); absent: none of either."""

    @classmethod
    def write(cls, w: _Writer, state: BrokerState, msgs: _MessageWriter) -> None:
        w.value((cls.name, cls.version, state.global_parameters,
                 list(state.protected_vhosts)))

    @classmethod
    def read(cls, r: _MessageReader, state: BrokerState) -> None:
        tag, version, params, protected = _tuple(r.value(), 4, "cluster section")
        _expect(tag == cls.name, f"unknown section {tag!r}")
        _expect(version == cls.version, f"cluster section version {version!r}")
        for name, value in _dict(params, "global parameters").items():
            _expect(type(name) is str and json_error(value, 0) is None, "global parameter")
        _expect(type(protected) is list
                and all(type(n) is str and n in state.vhosts for n in protected),
                "protected vhosts")
        state.global_parameters = params
        state.protected_vhosts = dict.fromkeys(protected)
