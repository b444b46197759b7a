"""Exchanges, bindings and routing (pure model, deterministic).

A binding's destination is a `Dest` = (is_exchange, name). Bindings of one
source exchange live in an insertion-ordered dict so routing results are in a
stable order on every node; per-type indexes keep the hot path cheap:
direct exchanges look the routing key up in a dict, fanout keeps its
destinations, topic routes through a trie of binding-key words
(node/broker/topic.py) and caches key -> destinations until the next (un)bind.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from node.broker.topic import Dest, TopicTrie
from node.broker.vhost import SEP, resource_key, split_key

# (dest_is_exchange, dest, routing_key, frozen arguments): a binding's identity
BindKey = tuple[bool, str, str, Any]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
_TOPIC_CACHE_MAX = 4096


def freeze(value: Any) -> Any:
    """A hashable, order-independent stand-in for a field-table value."""
    if isinstance(value, dict):
        return ("{", tuple(sorted((str(k), freeze(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return ("[", tuple(freeze(v) for v in value))
    if isinstance(value, bytearray):
        return bytes(value)
    return (type(value).__name__, value)


def split_topic(key: str) -> list[str]:
    # RabbitMQ treats "" as zero words, so "#" matches it and "*" does not.
    return key.split(".") if key else []


def topic_matches(pattern: list[str], words: list[str]) -> bool:
    """AMQP topic match: `*` is exactly one word, `#` zero or more words
    (one binding; routing goes through node/broker/topic.py's trie, which the
    unit tests hold to this)."""
    # Iterative backtracking over the last `#` seen (like glob matching).
    p = w = 0
    star_p = -1
    star_w = 0
    np, nw = len(pattern), len(words)
    while w < nw:
        if p < np and pattern[p] == "#":
            star_p, star_w = p, w
            p += 1
        elif p < np and (pattern[p] == "*" or pattern[p] == words[w]):
            p += 1
            w += 1
        elif star_p >= 0:
            star_w += 1
            w = star_w
            p = star_p + 1
        else:
            return False
    while p < np and pattern[p] == "#":
        p += 1
    return p == np


def headers_match(args: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """x-match all/any (and the -with-x variants of RabbitMQ 3.10)."""
    mode = args.get("x-match", "all")
    if isinstance(mode, bytes):  # a longstr that is not UTF-8 stays bytes (pamqp)
        mode = mode.decode("utf-8", "replace")  # strict would raise out of apply
    with_x = mode in ("all-with-x", "any-with-x")
    want_all = mode in ("all", "all-with-x")
    hdrs: Mapping[str, Any] = headers or {}
    matched_any = False
    for k, v in args.items():
        if k == "x-match" or (k.startswith("x-") and not with_x):
            continue
        ok = k in hdrs and (v is None or hdrs[k] == v)
        if want_all and not ok:
            return False
        if ok:
            matched_any = True
            if not want_all:
                return True
    return want_all or matched_any


class Binding:
    __slots__ = ("source", "dest", "routing_key", "arguments", "words")

    def __init__(self, source: str, dest: Dest, routing_key: str,
                 arguments: dict[str, Any]) -> None:
        self.source = source
        self.dest = dest
        self.routing_key = routing_key
        self.arguments = arguments
        self.words = split_topic(routing_key)


class Exchange:
    __slots__ = ("name", "type", "durable", "auto_delete", "internal", "arguments", "home",
                 "bindings", "direct", "fanout", "incoming", "_topic_cache", "_topic")

    def __init__(self, name: str, type_: str, durable: bool = True, auto_delete: bool = False,
                 internal: bool = False, arguments: dict[str, Any] | None = None,
                 home: str = "") -> None:
        self.name = name
        # the declaring node: a transient exchange dies with that node's restart
        self.home = home
        self.type = type_
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        # bindings where this exchange is the source
        self.bindings: dict[BindKey, Binding] = {}
        # direct index: routing key -> dest -> number of bindings (args differ)
        self.direct: dict[str, dict[Dest, int]] = {}
        # fanout index: dest -> number of bindings
        self.fanout: dict[Dest, int] = {}
        # bindings where this exchange is the destination: (source, key) -> None
        self.incoming: dict[tuple[str, BindKey], None] = {}
        self._topic_cache: dict[str, tuple[Dest, ...]] = {}
        # topic bindings as a trie (derived: rebuilt from `bindings`, never written)
        self._topic = TopicTrie()

    def rebuild_topic(self) -> None:
        """The derived routing state, from `bindings` (after a snapshot is read)."""
        self._topic_cache = {}
        self._topic = TopicTrie()
        if self.type == "topic":
            for key, b in self.bindings.items():
                self._topic.add(key, b.words, b.dest)

    def topic_wild(self) -> int:
        """Trie nodes below a wildcard edge (what bounds a topic match's cost)."""
        return self._topic.wild

    def topic_wild_added(self, words: list[str]) -> int:
        return self._topic.wild_added(words)

    def add_binding(self, b: Binding, key: BindKey) -> bool:
        if key in self.bindings:
            return False
        self.bindings[key] = b
        if self.type == "direct":
            d = self.direct.setdefault(b.routing_key, {})
            d[b.dest] = d.get(b.dest, 0) + 1
        elif self.type == "fanout":
            self.fanout[b.dest] = self.fanout.get(b.dest, 0) + 1
        elif self.type == "topic":
            self._topic.add(key, b.words, b.dest)
            self._topic_cache.clear()
        return True

    def remove_binding(self, key: BindKey) -> Binding | None:
        b = self.bindings.pop(key, None)
        if b is None:
            return None
        if self.type == "direct":
            d = self.direct[b.routing_key]
            n = d[b.dest] - 1
            if n:
                d[b.dest] = n
            else:
                del d[b.dest]
                if not d:
                    del self.direct[b.routing_key]
        elif self.type == "fanout":
            n = self.fanout[b.dest] - 1
            if n:
                self.fanout[b.dest] = n
            else:
                del self.fanout[b.dest]
        elif self.type == "topic":
            self._topic.remove(key, b.words)
            self._topic_cache.clear()
        return b

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Dest]:
        """Destinations bound to this exchange for a message (may repeat)."""
        t = self.type
        if t == "direct":
            d = self.direct.get(routing_key)
            return d.keys() if d else ()
        if t == "fanout":
            return self.fanout.keys()
        if t == "topic":
            hit = self._topic_cache.get(routing_key)
            if hit is None:
                hit = self._topic.match(split_topic(routing_key))
                if len(self._topic_cache) >= _TOPIC_CACHE_MAX:
                    self._topic_cache.clear()
                self._topic_cache[routing_key] = hit
            return hit
        # headers
        return [b.dest for b in self.bindings.values() if headers_match(b.arguments, headers)]


def route(exchanges: Mapping[str, Exchange], start: Exchange, routing_key: str,
          headers: Mapping[str, Any] | None,
          policy_ae: Mapping[str, str] | None = None) -> list[str]:
    """Queue names a message reaches from `start` (see _route_from); when none,
    tries the exchange's alternate exchange chain like RabbitMQ: its
    "alternate-exchange" argument, else the one its policy names
    (`policy_ae`: exchange key -> name), in the exchange's vhost."""
    queues = _route_from(exchanges, start, routing_key, headers)
    if queues or ("alternate-exchange" not in start.arguments
                  and not (policy_ae and start.name in policy_ae)):
        return queues
    seen: dict[str, None] = {start.name: None}
    x: Exchange | None = start
    while not queues and x is not None:
        ae = x.arguments.get("alternate-exchange")
        if isinstance(ae, bytes):
            ae = ae.decode("utf-8", "replace")  # may not be UTF-8: see headers_match
        if not isinstance(ae, str) and policy_ae:
            ae = policy_ae.get(x.name)
        if not isinstance(ae, str) or SEP in ae:
            break
        key = resource_key(split_key(x.name)[0], ae)
        if key in seen:
            break
        seen[key] = None
        x = exchanges.get(key)
        if x is not None:
            queues = _route_from(exchanges, x, routing_key, headers)
    return queues


def _route_from(exchanges: Mapping[str, Exchange], start: Exchange, routing_key: str,
                headers: Mapping[str, Any] | None) -> list[str]:
    """Follow exchange-to-exchange bindings transitively (each exchange visited
    once, so loops end); deterministic order, no duplicates."""
    first = start.match(routing_key, headers)
    # Fast path: no exchange-to-exchange bindings hit.
    if all(not is_x for is_x, _ in first):
        if start.type == "direct" or start.type == "fanout":
            return [name for _, name in first]
        return list(dict.fromkeys(name for _, name in first))
    queues: dict[str, None] = {}
    visited: dict[str, None] = {start.name: None}
    stack: list[Iterable[Dest]] = [first]
    while stack:
        for is_x, name in stack.pop(0):
            if not is_x:
                queues[name] = None
            elif name not in visited:
                visited[name] = None
                x = exchanges.get(name)
                if x is not None:
                    stack.append(x.match(routing_key, headers))
    return list(queues)
