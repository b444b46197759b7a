"""A topic exchange's bindings as a trie of binding-key words (pure, derived).

RabbitMQ routes topics through a trie (rabbit_db_topic_exchange) so that a
publish costs what the bindings that can match cost, not all of them; so does
this. Each edge is one binding-key word; `*` and `#` are edges like any other
word and get their meaning in `match`, which walks the trie once, top down,
carrying for each node the set of routing-key positions at which a prefix of
the key can stand there (an int used as a bit set): a literal edge keeps the
positions holding its word and moves them one on, `*` moves all of them one
on, `#` keeps every position from the first on. Every node is visited at most
once per publish, at the cost of a few int operations plus at most
min(its literal children, distinct routing-key words) dict lookups (each
lookup that hits is a child visited), however many `#` and `*` a key holds
(the scan it replaced backtracked over `#` per binding: bindings x words x
stars). Nodes reachable only by literal edges from the root lie on the
routing key's own path (at most its words + 1); the others lie below a
wildcard edge (`wild`), so a publish costs at most
routing-key words + 1 + 2 x wild nodes steps; the wild nodes are what
node/broker/binding_limit.py caps per vhost.

The trie is derived from the exchange's bindings: maintained on bind and
unbind, rebuilt when a snapshot is read, never written.
"""
from __future__ import annotations

from typing import Any

Dest = tuple[bool, str]  # (is_exchange, name): node.broker.exchange's


class _Node:
    __slots__ = ("children", "ends", "hash", "wild")

    def __init__(self, hash_: bool, wild: bool) -> None:
        self.children: dict[str, _Node] = {}
        # bindings whose key ends here: binding key -> (insertion seq, dest)
        self.ends: dict[Any, tuple[int, Dest]] = {}
        self.hash = hash_  # reached by a `#` edge: may consume any number of words
        # below a `*` or `#` edge: a publish may reach it whatever its first
        # words are (the others only along the key's own literal path)
        self.wild = wild


class TopicTrie:
    __slots__ = ("root", "seq", "nodes", "wild")

    def __init__(self) -> None:
        self.root = _Node(False, False)
        # insertion counter: a match lists its destinations in binding order, as
        # the scan over the bindings dict did (the same order on every member)
        self.seq = 0
        self.nodes = 1
        self.wild = 0  # nodes below a wildcard edge: what bounds a match's cost

    def wild_added(self, words: list[str]) -> int:
        """How many nodes below a wildcard edge binding `words` would add."""
        node: _Node | None = self.root
        wild = False
        added = 0
        for w in words:
            wild = wild or w == "*" or w == "#"
            if node is not None:
                node = node.children.get(w)
            if node is None and wild:
                added += 1
        return added

    def add(self, key: Any, words: list[str], dest: Dest) -> None:
        node = self.root
        for w in words:
            child = node.children.get(w)
            if child is None:
                wild = node.wild or w == "*" or w == "#"
                child = node.children[w] = _Node(w == "#", wild)
                self.nodes += 1
                self.wild += wild
            node = child
        self.seq += 1
        node.ends[key] = (self.seq, dest)

    def remove(self, key: Any, words: list[str]) -> None:
        path = [self.root]
        for w in words:
            child = path[-1].children.get(w)
            if child is None:
                return
            path.append(child)
        if path[-1].ends.pop(key, None) is None:
            return
        # prune the branch the binding alone kept
        for i in range(len(words), 0, -1):
            node = path[i]
            if node.ends or node.children:
                break
            del path[i - 1].children[words[i - 1]]
            self.nodes -= 1
            self.wild -= node.wild

    def match(self, words: list[str]) -> tuple[Dest, ...]:
        """Destinations of the bindings whose keys match `words`, each once,
        in binding order."""
        n = len(words)
        full = (1 << (n + 1)) - 1
        end = 1 << n
        at: dict[str, int] = {}  # word -> bit i set where words[i] is it
        for i, w in enumerate(words):
            at[w] = at.get(w, 0) | (1 << i)
        at.pop("*", None)  # a literal `*` or `#` routing word: the wildcard edges take it
        at.pop("#", None)
        hits: list[tuple[int, Dest]] = []
        stack = [(self.root, 1)]
        while stack:
            node, m = stack.pop()
            if node.hash:  # `#` ends anywhere from its first start on
                m = full & ~((m & -m) - 1)
            if m & end and node.ends:
                hits.extend(node.ends.values())
            children = node.children
            if not children:
                continue
            h = children.get("#")
            if h is not None:
                stack.append((h, m))
            m &= ~end  # positions with a word left to consume
            if not m:
                continue
            s = children.get("*")
            if s is not None:
                stack.append((s, m << 1))
            if len(at) <= len(children):
                for w, bits in at.items():
                    if bits & m:
                        c = children.get(w)
                        if c is not None:
                            stack.append((c, (bits & m) << 1))
            else:
                for w, c in children.items():
                    bits = at.get(w, 0) & m
                    if bits:
                        stack.append((c, bits << 1))
        if not hits:
            return ()
        hits.sort()
        return tuple(dict.fromkeys(d for _, d in hits))
