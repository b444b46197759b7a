"""A topic exchange's bindings as a trie of binding-key words (pure, derived).

RabbitMQ routes topics through a trie (rabbit_db_topic_exchange) so that a
publish costs what the bindings that can match cost, not all of them; so does
this. Each binding-key word is a step down the trie; `*` and `#` are words
like any other and get their meaning in `match`, which walks the trie once,
top down, carrying the set of routing-key positions at which a prefix of the
key can stand (an int used as a bit set): a literal word keeps the positions
holding it and moves them one on, `*` moves all of them one on, `#` keeps
every position from the first on. Every word of the trie is stepped at most
once per publish, at the cost of a few int operations, plus at most
min(a node's literal children, distinct routing-key words) dict lookups
(each hit a child stepped into), however many `#` and `*` a key holds (the
scan it replaced backtracked over `#` per binding: bindings x words x stars).
Words reachable only by literal steps from the root lie on the routing key's
own path (at most its words); the others lie below a wildcard (`wild`), so a
publish costs at most routing-key words + 1 + 2 x wild words steps; the wild
words are what node/broker/binding_limit.py caps per vhost.

Chains of words with one child and no binding ending inside them share one
node (a radix trie: a node per binding at most, twice over, rather than one
per word; measured, 20,000 keys of 32 distinct words: 17 MB, where a node per
word took 201 MB and the bindings themselves take 54 MB). `nodes` and `wild`
count words, as if every word had a node.

The trie is derived from the exchange's bindings: maintained on bind and
unbind, rebuilt when a snapshot is read, never written.
"""
from __future__ import annotations

from typing import Any

Dest = tuple[bool, str]  # (is_exchange, name): node.broker.exchange's
_WILD = ("*", "#")


class _Node:
    __slots__ = ("seg", "edges", "ends")

    def __init__(self, seg: tuple[str, ...]) -> None:
        self.seg = seg  # the words from the parent to here (the root's: none)
        self.edges: dict[str, _Node] = {}  # child by the first word of its seg
        # bindings whose key ends here: binding key -> (insertion seq, dest)
        self.ends: dict[Any, tuple[int, Dest]] = {}


def _wild_from(words: list[str], start: int) -> int:
    """How many of words[start:] lie below a wildcard (theirs or an earlier one)."""
    for i, w in enumerate(words):
        if w in _WILD:
            return len(words) - max(i, start)
    return 0


class TopicTrie:
    __slots__ = ("root", "seq", "nodes", "wild")

    def __init__(self) -> None:
        self.root = _Node(())
        # insertion counter: a match lists its destinations in binding order, as
        # the scan over the bindings dict did (the same order on every member)
        self.seq = 0
        self.nodes = 1  # words held, plus the root
        self.wild = 0  # words held below a wildcard: what bounds a match's cost

    def _shared(self, words: list[str]) -> int:
        """How many leading words of `words` the trie already holds."""
        node, i, n = self.root, 0, len(words)
        while i < n:
            child = node.edges.get(words[i])
            if child is None:
                return i
            for w in child.seg:
                if i == n or words[i] != w:
                    return i
                i += 1
            node = child
        return i

    def wild_added(self, words: list[str]) -> int:
        """How many words below a wildcard binding `words` would add."""
        return _wild_from(words, self._shared(words))

    def add(self, key: Any, words: list[str], dest: Dest) -> None:
        shared = self._shared(words)
        self.nodes += len(words) - shared
        self.wild += _wild_from(words, shared)
        node, i, n = self.root, 0, len(words)
        while i < n:
            child = node.edges.get(words[i])
            if child is None:
                child = node.edges[words[i]] = _Node(tuple(words[i:]))
                node, i = child, n
                break
            seg = child.seg
            j = 0
            while j < len(seg) and i + j < n and seg[j] == words[i + j]:
                j += 1
            if j < len(seg):  # the key leaves (or ends) inside the chain: split it
                mid = node.edges[words[i]] = _Node(seg[:j])
                child.seg = seg[j:]
                mid.edges[seg[j]] = child
                child = mid
            node, i = child, i + j
        self.seq += 1
        node.ends[key] = (self.seq, dest)

    def remove(self, key: Any, words: list[str]) -> None:
        path = [self.root]
        i, n = 0, len(words)
        while i < n:
            child = path[-1].edges.get(words[i])
            if child is None or tuple(words[i:i + len(child.seg)]) != child.seg:
                return
            path.append(child)
            i += len(child.seg)
        node = path[-1]
        if node.ends.pop(key, None) is None or node.ends or node is self.root:
            return
        parent = path[-2]
        if not node.edges:  # its words go
            del parent.edges[node.seg[0]]
            self.nodes -= len(node.seg)
            self.wild -= _wild_from(words, n - len(node.seg))
            node = parent
            if node is self.root or node.ends or len(node.edges) != 1:
                return
            parent = path[-3]
        if len(node.edges) == 1:  # a chain again: one node
            (child,) = node.edges.values()
            child.seg = node.seg + child.seg
            parent.edges[node.seg[0]] = child

    def match(self, words: list[str]) -> tuple[Dest, ...]:
        """Destinations of the bindings whose keys match `words`, each once,
        in binding order."""
        n = len(words)
        full = (1 << (n + 1)) - 1
        end = 1 << n
        at: dict[str, int] = {}  # word -> bit i set where words[i] is it
        for i, w in enumerate(words):
            at[w] = at.get(w, 0) | (1 << i)
        at.pop("*", None)  # a literal `*` or `#` routing word: the wildcard steps take it
        at.pop("#", None)
        hits: list[tuple[int, Dest]] = []
        stack = [(self.root, 1)]
        while stack:
            node, m = stack.pop()
            for w in node.seg:
                if w == "#":  # ends anywhere from its first start on
                    m = full & ~((m & -m) - 1)
                elif w == "*":
                    m = (m & ~end) << 1
                else:
                    m = (m & at.get(w, 0)) << 1
                if not m:
                    break
            if not m:
                continue
            if m & end and node.ends:
                hits.extend(node.ends.values())
            edges = node.edges
            if not edges:
                continue
            h = edges.get("#")
            if h is not None:
                stack.append((h, m))
            left = m & ~end  # positions with a word left to consume
            if not left:
                continue
            s = edges.get("*")
            if s is not None:
                stack.append((s, m))
            if len(at) <= len(edges):
                for w, bits in at.items():
                    if bits & left:
                        c = edges.get(w)
                        if c is not None:
                            stack.append((c, m))
            else:
                for w, c in edges.items():
                    if at.get(w, 0) & left:
                        stack.append((c, m))
        if not hits:
            return ()
        hits.sort()
        return tuple(dict.fromkeys(d for _, d in hits))
