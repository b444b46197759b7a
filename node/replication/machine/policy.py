"""Handlers for policies and operator policies, and how they reach queues
and exchanges: a change applies at once to every queue and exchange of the
vhost whose matching policy changed (RabbitMQ's update_matched_objects),
and a new queue or exchange takes its policies when declared.
"""
from __future__ import annotations

from collections.abc import Iterator

from node.broker.definition_limit import policy_over_ceiling
from node.broker.exchange import Exchange
from node.broker.policy import (
    Policy,
    alternate_exchange,
    effective_definition,
    queue_settings,
    queue_type,
)
from node.broker.policy_index import NONE, Matched, Obj, build
from node.broker.queue import Queue
from node.broker.vhost import split_key
from node.replication.command import PolicyClear, PolicySet
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.state import BrokerState, _config_changed
from node.replication.machine.version import DEFINITION_CEILINGS, QUORUM_SEMANTICS


def queue_policies(s: BrokerState, q: Queue) -> Matched:
    """The policy and the operator policy that apply to `q` (O(1))."""
    return s.policy_index.winners("queue", q.name)


def _queue_obj(q: Queue) -> Obj:
    return Obj("queue", q.name, split_key(q.name)[1], queue_type(q.arguments))


def _set_ae(s: BrokerState, key: str, m: Matched) -> None:
    ae = alternate_exchange({}, effective_definition(*m)) if m != NONE else None
    if ae is None:
        s.policy_ae.pop(key, None)
    else:
        s.policy_ae[key] = ae


def refresh_exchange(s: BrokerState, x: Exchange) -> None:
    """Match a new exchange and record the alternate exchange its policies
    name (if any)."""
    vhost, name = split_key(x.name)
    _set_ae(s, x.name, s.policy_index.add_object(Obj("exchange", x.name, name), vhost))


def forget_exchange(s: BrokerState, key: str) -> None:
    s.policy_ae.pop(key, None)
    s.policy_index.drop_object("exchange", key)


def _objects(s: BrokerState) -> Iterator[tuple[Obj, str]]:
    """Every queue and exchange, with its vhost."""
    for key, q in s.queues.items():
        v, name = split_key(key)
        yield Obj("queue", key, name, queue_type(q.arguments)), v
    for key in s.exchanges:
        v, name = split_key(key)
        yield Obj("exchange", key, name), v


def rebuild_policy_ae(s: BrokerState) -> None:
    """The derived policy state after a snapshot load: the compiled index
    with each queue's and exchange's matches, and the exchange -> alternate
    exchange table (never written)."""
    s.policy_index = build(s.policies, s.operator_policies, _objects(s))
    s.policy_ae = {}
    for key in s.exchanges:
        _set_ae(s, key, s.policy_index.winners("exchange", key))


class PolicyHandlers(ApplierBase):
    __slots__ = ()

    @handles(PolicySet)
    def policy_set(self, cmd: PolicySet) -> None:
        s = self.s
        if cmd.vhost not in s.vhosts:
            return
        table = s.operator_policies if cmd.operator else s.policies
        new = (cmd.vhost, cmd.name) not in table
        # (from version 7 on: an older member in the cluster would take it and diverge)
        if s.machine_version >= DEFINITION_CEILINGS and policy_over_ceiling(
                cmd.name, cmd.pattern, cmd.definition, s.policy_index.count(cmd.operator, cmd.vhost), new):
            return  # refused before proposing; this holds whatever a node's settings said
        p = Policy(cmd.vhost, cmd.name, cmd.pattern, cmd.apply_to, cmd.priority,
                   dict(cmd.definition))
        table[(cmd.vhost, cmd.name)] = p
        _config_changed(s)
        # its pattern compiled once, here; tested against the vhost's objects only
        self._reapply(s.policy_index.put(cmd.operator, p))

    @handles(PolicyClear)
    def policy_clear(self, cmd: PolicyClear) -> None:
        s = self.s
        table = s.operator_policies if cmd.operator else s.policies
        if (cmd.vhost, cmd.name) not in table:
            return
        del table[(cmd.vhost, cmd.name)]
        _config_changed(s)
        self._reapply(s.policy_index.remove(cmd.operator, cmd.vhost, cmd.name))

    def _reapply(self, changed: list[tuple[Obj, Matched]]) -> None:
        """Settle the queues whose winners moved, record the exchanges'
        alternate exchanges (RabbitMQ's update_matched_objects; no_change
        for the others)."""
        s = self.s
        for o, now in changed:
            if o.kind == "queue":
                q = s.queues.get(o.key)
                if q is not None:
                    self.settle_queue(q, now)
            else:
                _set_ae(s, o.key, now)

    def apply_policies(self, q: Queue) -> None:
        """A queue just declared takes the policies that match it (none:
        its x-arguments alone, as set by Queue(), but for a quorum queue's
        defaults from machine version 3 on)."""
        s = self.s
        matched = s.policy_index.add_object(_queue_obj(q), split_key(q.name)[0])
        if matched != NONE:
            self.settle_queue(q, matched)
            return
        if s.machine_version >= QUORUM_SEMANTICS and queue_type(q.arguments) == "quorum":
            self.settle_queue(q, (None, None))

    def refresh_queue(self, q: Queue) -> None:
        """Settle `q` again from its arguments and current policies."""
        self.settle_queue(q, queue_policies(self.s, q))

    def settle_queue(self, q: Queue, matched: Matched) -> None:
        """Give `q` its effective settings and enforce them now: a lower
        max-length drops (dead-letters) the heads past it when the queue
        overflows by drop-head; expiry follows the new `expires`. Messages
        already queued keep the expiry they were enqueued with (RabbitMQ
        computes it at enqueue)."""
        s = self.s
        p, op = matched
        definition = effective_definition(p, op) if p is not None or op is not None else None
        q.settle(queue_settings(q.arguments, definition,
                                quorum_defaults=s.machine_version >= QUORUM_SEMANTICS))
        self.configure_dead_letters(q, definition)
        if q.expires is not None:
            s.expires_index[q.name] = None
        else:
            s.expires_index.pop(q.name, None)
        if q.overflow == "drop-head" and q.over_limit():
            while q.over_limit():
                self.dead_letter(q, q.pop(), "maxlen")
