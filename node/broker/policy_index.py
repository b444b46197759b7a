"""The policies of each vhost with their patterns compiled once (pure,
derived state): what the apply matches queues and exchanges against.

Before this index every match looked the pattern up in a 1,024-entry RE2
cache (node/broker/pattern.py) and every policy write matched every queue of
the vhost against every policy: 1,100 policies recompiled on every match and
one more policy PUT stalled the apply ~2 s. Here a policy's pattern is
compiled when the policy is applied (set or read back from a snapshot: the
compiled objects are never written), and each vhost's policies are kept in
winning order (highest priority, then the lower name) so the first that
applies is the one that wins.
"""
from __future__ import annotations

import bisect
from typing import Any, NamedTuple

from node.broker.pattern import PatternError, compile_pattern
from node.broker.policy import Policy, applies_to


class Entry(NamedTuple):
    order: tuple[float, str]  # (-priority, name): ascending is winning order
    policy: Policy
    rx: Any  # the compiled pattern; None for one RE2 refuses (it matches nothing)


def _compiled(pattern: str) -> Any:
    try:
        return compile_pattern(pattern)
    except PatternError:  # refused before proposing; deterministic either way
        return None


def entry_matches(e: Entry, name: str, kind: str, qtype: str) -> bool:
    return (e.rx is not None and applies_to(e.policy, kind, qtype)
            and e.rx.search(name) is not None)


def beats(p: Policy, other: Policy | None) -> bool:
    """Does `p` win over `other` (node/broker/policy.py best's order)?"""
    return other is None or p.priority > other.priority or (
        p.priority == other.priority and p.name < other.name)


class PolicyIndex:
    """(operator, vhost) -> that family's policies of the vhost, in winning order."""

    __slots__ = ("_by",)

    def __init__(self) -> None:
        self._by: dict[tuple[bool, str], list[Entry]] = {}

    def __eq__(self, other: object) -> bool:
        """The same policies in the same order (compiled patterns aside)."""
        if not isinstance(other, PolicyIndex):
            return NotImplemented
        return self._policies() == other._policies()

    __hash__ = None  # type: ignore[assignment]

    def _policies(self) -> dict[tuple[bool, str], list[Policy]]:
        return {k: [e.policy for e in v] for k, v in self._by.items()}

    def __repr__(self) -> str:
        return f"PolicyIndex({self._policies()!r})"

    def count(self, operator: bool, vhost: str) -> int:
        return len(self._by.get((operator, vhost), ()))

    def put(self, operator: bool, p: Policy) -> Entry:
        """Add or replace `p` (by name), compiling its pattern once."""
        self.remove(operator, p.vhost, p.name)
        e = Entry((-p.priority, p.name), p, _compiled(p.pattern))
        entries = self._by.setdefault((operator, p.vhost), [])
        bisect.insort(entries, e, key=lambda x: x.order)
        return e

    def remove(self, operator: bool, vhost: str, name: str) -> None:
        entries = self._by.get((operator, vhost))
        if not entries:
            return
        for i, e in enumerate(entries):
            if e.policy.name == name:
                del entries[i]
                break
        if not entries:
            del self._by[(operator, vhost)]

    def drop_vhost(self, vhost: str) -> None:
        for operator in (False, True):
            self._by.pop((operator, vhost), None)

    def entry(self, operator: bool, vhost: str, name: str) -> Entry | None:
        for e in self._by.get((operator, vhost), ()):
            if e.policy.name == name:
                return e
        return None

    def best(self, operator: bool, vhost: str, name: str, kind: str,
             qtype: str = "classic") -> Policy | None:
        """The policy of the family that applies to the object `name` of
        `vhost`: the first in winning order that applies (at most the
        vhost's policies, each one RE2 search)."""
        for e in self._by.get((operator, vhost), ()):
            if entry_matches(e, name, kind, qtype):
                return e.policy
        return None


def build(policies: dict[tuple[str, str], Policy],
          operator_policies: dict[tuple[str, str], Policy]) -> PolicyIndex:
    """The index of both families (after a snapshot load)."""
    index = PolicyIndex()
    for operator, table in ((False, policies), (True, operator_policies)):
        for p in table.values():
            index.put(operator, p)
    return index
