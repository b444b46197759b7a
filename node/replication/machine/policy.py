"""Handlers for policies and operator policies, and how they reach queues
and exchanges: a change applies at once to every queue and exchange of the
vhost whose matching policy changed (RabbitMQ's update_matched_objects),
and a new queue or exchange takes its policies when declared.
"""
from __future__ import annotations

from node.broker.definition_limit import policy_over_ceiling
from node.broker.exchange import Exchange
from node.broker.policy import (
    Policy,
    alternate_exchange,
    effective_definition,
    queue_settings,
    queue_type,
)
from node.broker.policy_index import beats, build, entry_matches
from node.broker.queue import Queue
from node.broker.vhost import split_key
from node.replication.command import PolicyClear, PolicySet
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.state import BrokerState, _config_changed
from node.replication.machine.version import QUORUM_SEMANTICS

Matched = tuple[Policy | None, Policy | None]
NONE: Matched = (None, None)


def queue_policies(s: BrokerState, q: Queue) -> Matched:
    """The policy and the operator policy that apply to `q` (cached: O(1))."""
    return s.queue_policy.get(q.name, NONE)


def _match(s: BrokerState, key: str, kind: str, qtype: str = "classic") -> Matched:
    """Both families' winners for one object, from the index."""
    vhost, name = split_key(key)
    ix = s.policy_index
    return (ix.best(False, vhost, name, kind, qtype), ix.best(True, vhost, name, kind, qtype))


def _store(cache: dict[str, Matched], key: str, m: Matched) -> None:
    if m == NONE:
        cache.pop(key, None)
    else:
        cache[key] = m


def _set_ae(s: BrokerState, key: str, m: Matched) -> None:
    ae = alternate_exchange({}, effective_definition(*m)) if m != NONE else None
    if ae is None:
        s.policy_ae.pop(key, None)
    else:
        s.policy_ae[key] = ae


def refresh_exchange(s: BrokerState, x: Exchange) -> None:
    """Match a new exchange and record the alternate exchange its policies
    name (if any)."""
    m = _match(s, x.name, "exchange") if s.policies or s.operator_policies else NONE
    _store(s.exchange_policy, x.name, m)
    _set_ae(s, x.name, m)


def rebuild_policy_ae(s: BrokerState) -> None:
    """The derived policy state after a snapshot load: the compiled index,
    each queue's and exchange's winners and the exchange -> alternate
    exchange table (never written)."""
    s.policy_index = build(s.policies, s.operator_policies)
    s.queue_policy = {}
    s.exchange_policy = {}
    s.policy_ae = {}
    if s.policies or s.operator_policies:
        for key, q in s.queues.items():
            _store(s.queue_policy, key, _match(s, key, "queue", queue_type(q.arguments)))
        for x in s.exchanges.values():
            refresh_exchange(s, x)


def _moved(s: BrokerState, cur: Matched, operator: bool, name: str, key: str, kind: str,
           qtype: str) -> Matched:
    """The object's winners after policy `name` of its family changed
    (set, replaced or cleared): a full match only when `name` was the
    winner; else the changed policy either beats the winner or nothing moves."""
    slot = 1 if operator else 0
    won = cur[slot]
    vhost, oname = split_key(key)
    if won is not None and won.name == name:
        now = s.policy_index.best(operator, vhost, oname, kind, qtype)
    else:
        e = s.policy_index.entry(operator, vhost, name)
        if e is None or not beats(e.policy, won) or not entry_matches(e, oname, kind, qtype):
            return cur
        now = e.policy
    return (cur[0], now) if operator else (now, cur[1])


class PolicyHandlers(ApplierBase):
    __slots__ = ()

    @handles(PolicySet)
    def policy_set(self, cmd: PolicySet) -> None:
        s = self.s
        if cmd.vhost not in s.vhosts:
            return
        table = s.operator_policies if cmd.operator else s.policies
        new = (cmd.vhost, cmd.name) not in table
        if policy_over_ceiling(cmd.name, cmd.pattern, cmd.definition,
                               s.policy_index.count(cmd.operator, cmd.vhost), new):
            return  # refused before proposing; this holds whatever a node's settings said
        p = Policy(cmd.vhost, cmd.name, cmd.pattern, cmd.apply_to, cmd.priority,
                   dict(cmd.definition))
        table[(cmd.vhost, cmd.name)] = p
        s.policy_index.put(cmd.operator, p)  # its pattern compiled once, here
        _config_changed(s)
        self._reapply(cmd.vhost, cmd.operator, cmd.name)

    @handles(PolicyClear)
    def policy_clear(self, cmd: PolicyClear) -> None:
        s = self.s
        table = s.operator_policies if cmd.operator else s.policies
        if (cmd.vhost, cmd.name) not in table:
            return
        del table[(cmd.vhost, cmd.name)]
        s.policy_index.remove(cmd.operator, cmd.vhost, cmd.name)
        _config_changed(s)
        self._reapply(cmd.vhost, cmd.operator, cmd.name)

    def _reapply(self, vhost: str, operator: bool, name: str) -> None:
        """Re-evaluate the queues and exchanges of `vhost` only, each against
        the changed policy (all of the vhost's only where it was the winner);
        a queue whose winners moved is settled again (RabbitMQ's
        update_matched_objects; no_change otherwise)."""
        s = self.s
        for key, q in list(s.queues.items()):
            if split_key(key)[0] != vhost:
                continue
            cur = s.queue_policy.get(key, NONE)
            now = _moved(s, cur, operator, name, key, "queue", queue_type(q.arguments))
            if now != cur:
                _store(s.queue_policy, key, now)
                self.settle_queue(q, now)
        for key in s.exchanges:
            if split_key(key)[0] != vhost:
                continue
            cur = s.exchange_policy.get(key, NONE)
            now = _moved(s, cur, operator, name, key, "exchange", "classic")
            if now != cur:
                _store(s.exchange_policy, key, now)
                _set_ae(s, key, now)

    def apply_policies(self, q: Queue) -> None:
        """A queue just declared takes the policies that match it (none:
        its x-arguments alone, as set by Queue(), but for a quorum queue's
        defaults from machine version 3 on)."""
        s = self.s
        if s.policies or s.operator_policies:
            matched = _match(s, q.name, "queue", queue_type(q.arguments))
            _store(s.queue_policy, q.name, matched)
            if matched != NONE:
                self.settle_queue(q, matched)
                return
        if s.machine_version >= QUORUM_SEMANTICS and queue_type(q.arguments) == "quorum":
            self.settle_queue(q, (None, None))

    def refresh_queue(self, q: Queue) -> None:
        """Settle `q` again from its arguments and current policies."""
        matched = _match(self.s, q.name, "queue", queue_type(q.arguments))
        _store(self.s.queue_policy, q.name, matched)
        self.settle_queue(q, matched)

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
