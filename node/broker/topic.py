"""A topic exchange's bindings as a trie of binding-key words (pure, derived).

RabbitMQ routes topics through a trie (rabbit_db_topic_exchange) so that a
publish costs what the bindings that can match cost, not all of them; so does
this. Each edge is one binding-key word; `*` and `#` are edges like any other
word and get their meaning in `match`. Matching walks (node, position) pairs:
a word edge or `*` consumes one routing-key word, `#` is entered without
consuming one and may then consume any number (a self-loop). Every pair is
visited at most once per publish, so a publish costs at most
(routing-key words + 1) x trie nodes pair visits, each O(1) (a dict lookup for
the literal word, `*` and `#`), however many `#` and `*` a key holds
(backtracking over `#` per binding was bindings x words x stars).

The trie is derived from the exchange's bindings: maintained on bind and
unbind, rebuilt when a snapshot is read, never written.
"""
from __future__ import annotations

from typing import Any

Dest = tuple[bool, str]  # (is_exchange, name): node.broker.exchange's


class _Node:
    __slots__ = ("children", "ends", "hash")

    def __init__(self, hash_: bool) -> None:
        self.children: dict[str, _Node] = {}
        # bindings whose key ends here: binding key -> (insertion seq, dest)
        self.ends: dict[Any, tuple[int, Dest]] = {}
        self.hash = hash_  # reached by a `#` edge: may consume any number of words


class TopicTrie:
    __slots__ = ("root", "seq", "nodes")

    def __init__(self) -> None:
        self.root = _Node(False)
        # insertion counter: a match lists its destinations in binding order, as
        # the scan over the bindings dict did (the same order on every member)
        self.seq = 0
        self.nodes = 1

    def add(self, key: Any, words: list[str], dest: Dest) -> None:
        node = self.root
        for w in words:
            child = node.children.get(w)
            if child is None:
                child = node.children[w] = _Node(w == "#")
                self.nodes += 1
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

    def match(self, words: list[str]) -> tuple[Dest, ...]:
        """Destinations of the bindings whose keys match `words`, each once,
        in binding order."""
        n = len(words)
        seen: set[tuple[int, int]] = set()
        hits: list[tuple[int, Dest]] = []
        stack = [(self.root, 0)]
        while stack:
            node, i = stack.pop()
            mark = (id(node), i)
            if mark in seen:
                continue
            seen.add(mark)
            if i == n:
                if node.ends:
                    hits.extend(node.ends.values())
            elif node.hash:
                stack.append((node, i + 1))
            children = node.children
            if not children:
                continue
            h = children.get("#")
            if h is not None:
                stack.append((h, i))
            if i < n:
                c = children.get(words[i])
                if c is not None:
                    stack.append((c, i + 1))
                s = children.get("*")
                if s is not None:
                    stack.append((s, i + 1))
        if not hits:
            return ()
        hits.sort()
        return tuple(dict.fromkeys(d for _, d in hits))
