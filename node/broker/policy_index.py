"""The policies of each vhost with their patterns compiled once, and which of
them match each queue and exchange (pure, derived state): what the apply
reads a queue's or exchange's policies from.

Before this index every match looked the pattern up in a 1,024-entry RE2
cache (node/broker/pattern.py) and every policy write matched every queue of
the vhost against every policy: with 1,100 policies every match recompiled
and one more policy PUT stalled the apply ~2 s. Here a policy's pattern is
compiled when the policy is applied (set, or read back from a snapshot: the
compiled objects are never written). Each object keeps the entries that
match it in winning order (highest priority, then the lower name; one list
per family), so its winners are the heads of its lists: O(1) to read. A
policy write tests the one changed pattern against each object of its vhost
(one RE2 search each) and moves it in their lists; a new object is matched
against its vhost's policies once.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any, NamedTuple

from node.broker.pattern import PatternError, compile_pattern
from node.broker.policy import Policy, applies_to
from node.broker.vhost import split_key

Matched = tuple[Policy | None, Policy | None]  # (policy, operator policy)
NONE: Matched = (None, None)


class Entry(NamedTuple):
    order: tuple[float, str]  # (-priority, name): ascending is winning order
    policy: Policy
    rx: Any  # the compiled pattern; None for one RE2 refuses (it matches nothing)


class Obj(NamedTuple):
    """A queue (kind "queue", qtype "classic"/"quorum") or exchange (kind
    "exchange"), by table key (node/broker/vhost.py) and bare name."""

    kind: str
    key: str
    name: str
    qtype: str = "classic"


def _order(e: Entry) -> tuple[float, str]:
    return e.order


def _compiled(pattern: str) -> Any:
    try:
        return compile_pattern(pattern)
    except PatternError:  # refused before proposing; deterministic either way
        return None


def entry_matches(e: Entry, o: Obj) -> bool:
    return (e.rx is not None and applies_to(e.policy, o.kind, o.qtype)
            and e.rx.search(o.name) is not None)


def _remove(entries: list[Entry], order: tuple[float, str]) -> bool:
    i = bisect.bisect_left(entries, order, key=_order)
    if i < len(entries) and entries[i].order == order:
        del entries[i]
        return True
    return False


class PolicyIndex:
    __slots__ = ("_by", "_named", "_objects", "_members")

    def __init__(self) -> None:
        # (operator, vhost) -> that family's policies of the vhost, in winning order
        self._by: dict[tuple[bool, str], list[Entry]] = {}
        self._named: dict[tuple[bool, str, str], Entry] = {}
        # (kind, key) -> ([matching policies], [matching operator policies]),
        # each in winning order; objects matched by neither are absent
        self._objects: dict[tuple[str, str], tuple[list[Entry], list[Entry]]] = {}
        # vhost -> its queues and exchanges by (kind, key): what a policy write visits
        self._members: dict[str, dict[tuple[str, str], Obj]] = {}

    def __eq__(self, other: object) -> bool:
        """The same policies and matches (compiled patterns aside)."""
        if not isinstance(other, PolicyIndex):
            return NotImplemented
        return self.plain() == other.plain()

    __hash__ = None  # type: ignore[assignment]

    def plain(self) -> tuple[dict[Any, list[Policy]], dict[Any, list[list[Policy]]],
                             dict[str, list[tuple[str, str]]]]:
        """The index as policies only, keys sorted (compared, inspected)."""
        return ({k: [e.policy for e in v] for k, v in sorted(self._by.items())},
                {k: [[e.policy for e in fam] for fam in v]
                 for k, v in sorted(self._objects.items())},
                {v: sorted(m) for v, m in sorted(self._members.items())})

    def __repr__(self) -> str:
        return f"PolicyIndex({self.plain()!r})"

    def count(self, operator: bool, vhost: str) -> int:
        return len(self._by.get((operator, vhost), ()))

    def winners(self, kind: str, key: str) -> Matched:
        lists = self._objects.get((kind, key))
        if lists is None:
            return NONE
        p, op = lists
        return (p[0].policy if p else None, op[0].policy if op else None)

    # ------------------------------------------------------------ objects
    def add_object(self, o: Obj, vhost: str) -> Matched:
        """Register a new object of `vhost`, match it against the vhost's
        policies (each one RE2 search) and return its winners."""
        self._members.setdefault(vhost, {})[(o.kind, o.key)] = o
        lists: tuple[list[Entry], list[Entry]] = (
            [e for e in self._by.get((False, vhost), ()) if entry_matches(e, o)],
            [e for e in self._by.get((True, vhost), ()) if entry_matches(e, o)])
        if lists[0] or lists[1]:
            self._objects[(o.kind, o.key)] = lists
        else:
            self._objects.pop((o.kind, o.key), None)
        return self.winners(o.kind, o.key)

    def drop_object(self, kind: str, key: str) -> None:
        self._objects.pop((kind, key), None)
        vhost = split_key(key)[0]
        members = self._members.get(vhost)
        if members is not None:
            members.pop((kind, key), None)
            if not members:
                del self._members[vhost]

    # ----------------------------------------------------------- policies
    def put(self, operator: bool, p: Policy) -> list[tuple[Obj, Matched]]:
        """Add or replace `p` (by name), compiling its pattern once, and move
        it in the lists of its vhost's objects (those only); the objects
        whose winners changed, with their new ones."""
        old = self._named.get((operator, p.vhost, p.name))
        e = Entry((-p.priority, p.name), p, _compiled(p.pattern))
        entries = self._by.setdefault((operator, p.vhost), [])
        if old is not None:
            _remove(entries, old.order)
        bisect.insort(entries, e, key=_order)
        self._named[(operator, p.vhost, p.name)] = e
        return self._move(operator, p.vhost, old, e)

    def remove(self, operator: bool, vhost: str, name: str) -> list[tuple[Obj, Matched]]:
        old = self._named.pop((operator, vhost, name), None)
        if old is None:
            return []
        entries = self._by.get((operator, vhost), [])
        _remove(entries, old.order)
        if not entries:
            self._by.pop((operator, vhost), None)
        return self._move(operator, vhost, old, None)

    def drop_vhost(self, vhost: str) -> None:
        """Forget a deleted vhost's policies (its objects go one by one, as
        they are deleted)."""
        for operator in (False, True):
            for e in self._by.pop((operator, vhost), ()):
                self._named.pop((operator, vhost, e.policy.name), None)

    def _move(self, operator: bool, vhost: str, old: Entry | None, new: Entry | None
              ) -> list[tuple[Obj, Matched]]:
        slot = 1 if operator else 0
        changed: list[tuple[Obj, Matched]] = []
        for o in list(self._members.get(vhost, {}).values()):
            lists = self._objects.get((o.kind, o.key))
            before = self.winners(o.kind, o.key)
            if lists is not None and old is not None:
                _remove(lists[slot], old.order)
            if new is not None and entry_matches(new, o):
                if lists is None:
                    lists = self._objects[(o.kind, o.key)] = ([], [])
                bisect.insort(lists[slot], new, key=_order)
            if lists is not None and not lists[0] and not lists[1]:
                del self._objects[(o.kind, o.key)]
            after = self.winners(o.kind, o.key)
            if after != before:
                changed.append((o, after))
        return changed


def build(policies: dict[tuple[str, str], Policy],
          operator_policies: dict[tuple[str, str], Policy],
          objects: Iterable[tuple[Obj, str]]) -> PolicyIndex:
    """The index of both families and of `objects` ((object, vhost) pairs),
    after a snapshot load."""
    index = PolicyIndex()
    for operator, table in ((False, policies), (True, operator_policies)):
        for p in table.values():
            index.put(operator, p)
    for o, vhost in objects:
        index.add_object(o, vhost)
    return index
