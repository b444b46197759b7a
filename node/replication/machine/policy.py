"""Handlers for policies and operator policies, and how they reach queues
and exchanges: a change applies at once to every queue and exchange of the
vhost whose matching policy changed (RabbitMQ's update_matched_objects),
and a new queue or exchange takes its policies when declared.
"""
from __future__ import annotations

from node.broker.exchange import Exchange
from node.broker.policy import (
    Policy,
    alternate_exchange,
    effective_definition,
    matching,
    queue_settings,
    queue_type,
)
from node.broker.queue import Queue
from node.broker.vhost import split_key
from node.replication.command import PolicyClear, PolicySet
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.state import BrokerState, _config_changed
from node.replication.machine.version import QUORUM_SEMANTICS

Matched = tuple[Policy | None, Policy | None]


def queue_policies(s: BrokerState, q: Queue) -> Matched:
    """The policy and the operator policy that apply to `q`."""
    return matching(s.policies, s.operator_policies, q.name, "queue", queue_type(q.arguments))


def exchange_policies(s: BrokerState, key: str) -> Matched:
    return matching(s.policies, s.operator_policies, key, "exchange")


def refresh_exchange(s: BrokerState, x: Exchange) -> None:
    """Record the alternate exchange the exchange's policies name (if any)."""
    if not s.policies and not s.operator_policies:
        s.policy_ae.pop(x.name, None)
        return
    p, op = exchange_policies(s, x.name)
    ae = (alternate_exchange({}, effective_definition(p, op))
          if p is not None or op is not None else None)
    if ae is None:
        s.policy_ae.pop(x.name, None)
    else:
        s.policy_ae[x.name] = ae


def rebuild_policy_ae(s: BrokerState) -> None:
    """The derived exchange -> alternate exchange table, from the policies
    (after a snapshot load)."""
    s.policy_ae = {}
    if s.policies or s.operator_policies:
        for x in s.exchanges.values():
            refresh_exchange(s, x)


class PolicyHandlers(ApplierBase):
    __slots__ = ()

    @handles(PolicySet)
    def policy_set(self, cmd: PolicySet) -> None:
        s = self.s
        if cmd.vhost not in s.vhosts:
            return
        before = self._matched(cmd.vhost)
        table = s.operator_policies if cmd.operator else s.policies
        table[(cmd.vhost, cmd.name)] = Policy(cmd.vhost, cmd.name, cmd.pattern, cmd.apply_to,
                                             cmd.priority, dict(cmd.definition))
        _config_changed(s)
        self._reapply(cmd.vhost, before)

    @handles(PolicyClear)
    def policy_clear(self, cmd: PolicyClear) -> None:
        s = self.s
        table = s.operator_policies if cmd.operator else s.policies
        if (cmd.vhost, cmd.name) not in table:
            return
        before = self._matched(cmd.vhost)
        del table[(cmd.vhost, cmd.name)]
        _config_changed(s)
        self._reapply(cmd.vhost, before)

    def _matched(self, vhost: str) -> dict[str, Matched]:
        s = self.s
        return {key: queue_policies(s, q) for key, q in s.queues.items()
                if split_key(key)[0] == vhost}

    def _reapply(self, vhost: str, before: dict[str, Matched]) -> None:
        s = self.s
        for key, q in list(s.queues.items()):
            if key in before:
                now = queue_policies(s, q)
                if now != before[key]:  # RabbitMQ's no_change otherwise
                    self.settle_queue(q, now)
        for key, x in s.exchanges.items():
            if split_key(key)[0] == vhost:
                refresh_exchange(s, x)

    def apply_policies(self, q: Queue) -> None:
        """A queue just declared takes the policies that match it (none:
        its x-arguments alone, as set by Queue(), but for a quorum queue's
        defaults from machine version 3 on)."""
        s = self.s
        if s.policies or s.operator_policies:
            matched = queue_policies(s, q)
            if matched != (None, None):
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
