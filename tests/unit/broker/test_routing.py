"""Routing tables: direct, fanout, topic (* and #), headers (all/any), e2e bindings."""
from __future__ import annotations

import random
import time

import pytest

from node.broker.exchange import Binding, Exchange, headers_match, route, topic_matches
from node.replication.machine import BrokerState
from tests.support.snapshot import snapshot_copy

Q = False
X = True


def bind(x: Exchange, dest: str, rk: str = "", args: dict | None = None,
         is_x: bool = False) -> None:
    from node.broker.exchange import freeze
    a = args or {}
    x.add_binding(Binding(x.name, (is_x, dest), rk, a), (is_x, dest, rk, freeze(a)))


def T(p: str) -> list[str]:
    return p.split(".") if p else []


@pytest.mark.parametrize("pattern,key,ok", [
    ("a.b", "a.b", True),
    ("a.*", "a.b", True),
    ("a.*", "a", False),
    ("a.*", "a.b.c", False),
    ("*.b.*", "a.b.c", True),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("*", "", False),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("#.c", "c", True),
    ("#.c", "a.b.c", True),
    ("#.c", "a.b.c.d", False),
    ("a.#.c", "a.c", True),
    ("a.#.c", "a.x.y.c", True),
    ("a.#.c", "a.x.y.d", False),
    ("#.#", "a", True),
    ("*.#", "", False),
    ("#.*", "a", True),
    ("a.#.b.#.c", "a.b.x.c", True),
    ("a.#.b.#.c", "a.x.c", False),
    ("a..b", "a..b", True),
])
def test_topic_patterns(pattern: str, key: str, ok: bool) -> None:
    assert topic_matches(T(pattern), T(key)) is ok


def test_direct_routes_by_key_without_duplicates() -> None:
    x = Exchange("d", "direct")
    bind(x, "q1", "k")
    bind(x, "q2", "k")
    bind(x, "q1", "k", {"a": 1})  # second binding, same dest: still one copy
    bind(x, "q3", "other")
    assert route({"d": x}, x, "k", None) == ["q1", "q2"]
    assert route({"d": x}, x, "none", None) == []


def test_direct_unbind_keeps_other_binding_of_same_dest() -> None:
    from node.broker.exchange import freeze
    x = Exchange("d", "direct")
    bind(x, "q1", "k")
    bind(x, "q1", "k", {"a": 1})
    x.remove_binding((False, "q1", "k", freeze({})))
    assert route({"d": x}, x, "k", None) == ["q1"]
    x.remove_binding((False, "q1", "k", freeze({"a": 1})))
    assert route({"d": x}, x, "k", None) == []
    assert x.direct == {}


def test_fanout_ignores_key() -> None:
    x = Exchange("f", "fanout")
    bind(x, "q1", "a")
    bind(x, "q2", "b")
    assert route({"f": x}, x, "zzz", None) == ["q1", "q2"]


def test_topic_routing_and_cache_invalidation() -> None:
    x = Exchange("t", "topic")
    bind(x, "q1", "stock.*.nyse")
    bind(x, "q2", "stock.#")
    assert route({"t": x}, x, "stock.ibm.nyse", None) == ["q1", "q2"]
    assert route({"t": x}, x, "stock", None) == ["q2"]
    bind(x, "q3", "#")
    assert route({"t": x}, x, "stock", None) == ["q2", "q3"]


def test_topic_cache_not_in_a_snapshot() -> None:
    x = Exchange("t", "topic")
    bind(x, "q1", "a.*")
    route({"t": x}, x, "a.b", None)
    assert x._topic_cache
    state = BrokerState()
    state.exchanges["t"] = x
    y = snapshot_copy(state).exchanges["t"]
    assert y._topic_cache == {}
    assert route({"t": y}, y, "a.b", None) == ["q1"]


def test_headers_all_and_any() -> None:
    assert headers_match({"x-match": "all", "a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3})
    assert not headers_match({"x-match": "all", "a": 1, "b": 2}, {"a": 1})
    assert headers_match({"x-match": "any", "a": 1, "b": 2}, {"b": 2})
    assert not headers_match({"x-match": "any", "a": 1, "b": 2}, {"b": 3})
    assert headers_match({"a": 1}, {"a": 1})  # all is the default
    assert not headers_match({"x-match": "any", "a": 1}, None)
    # x-* arguments are ignored unless *-with-x
    assert headers_match({"x-match": "all", "x-foo": 1}, {})
    assert not headers_match({"x-match": "all-with-x", "x-foo": 1}, {})


def test_headers_exchange_route() -> None:
    x = Exchange("h", "headers")
    bind(x, "q1", "", {"x-match": "all", "format": "pdf", "type": "report"})
    bind(x, "q2", "", {"x-match": "any", "format": "pdf", "type": "log"})
    assert route({"h": x}, x, "", {"format": "pdf", "type": "report"}) == ["q1", "q2"]
    assert route({"h": x}, x, "", {"type": "log"}) == ["q2"]
    assert route({"h": x}, x, "", None) == []


def test_e2e_transitive_with_loop() -> None:
    a = Exchange("a", "fanout")
    b = Exchange("b", "topic")
    c = Exchange("c", "fanout")
    xs = {"a": a, "b": b, "c": c}
    bind(a, "b", "", is_x=True)
    bind(b, "c", "k.#", is_x=True)
    bind(c, "a", "", is_x=True)  # loop back to a
    bind(c, "qc", "")
    bind(a, "qa", "")
    bind(b, "qc", "k.x")  # reachable twice: still one copy
    assert route(xs, a, "k.x", None) == ["qa", "qc"]
    assert route(xs, a, "z", None) == ["qa"]


def test_alternate_exchange_chain_used_only_when_unroutable() -> None:
    a = Exchange("a", "direct", arguments={"alternate-exchange": "b"})
    b = Exchange("b", "direct", arguments={"alternate-exchange": "a"})  # loop: ends
    c = Exchange("c", "fanout")
    xs = {"a": a, "b": b, "c": c}
    bind(a, "qa", "k")
    bind(b, "qb", "k2")
    assert route(xs, a, "k", None) == ["qa"]
    assert route(xs, a, "k2", None) == ["qb"]
    assert route(xs, a, "zz", None) == []
    b.arguments["alternate-exchange"] = "c"
    bind(c, "qc")
    assert route(xs, a, "zz", None) == ["qc"]


# The trie (node/broker/topic.py) against the one-binding matcher it replaced:
# random binding keys and routing keys over a small alphabet, so that `*`, `#`,
# literal words, empty words and repeated patterns meet often.
_WORDS = ("a", "b", "", "*", "#")


def _random_key(rng: random.Random, most: int, wild: bool) -> str:
    words = _WORDS if wild else _WORDS[:3]
    return ".".join(rng.choice(words) for _ in range(rng.randint(0, most)))


def _old_match(x: Exchange, key: str) -> tuple:
    words = T(key)
    seen: dict = {}
    for b in x.bindings.values():
        if b.dest not in seen and topic_matches(b.words, words):
            seen[b.dest] = None
    return tuple(seen)


def _check_shape(x: Exchange) -> None:
    """The trie is compressed (a node without bindings ending in it forks)
    and counts words as a trie with a node per word would hold them."""
    trie = x._topic
    stack = list(trie.root.edges.values())
    while stack:
        node = stack.pop()
        assert node.seg and (node.ends or len(node.edges) >= 2), node.seg
        assert all(c.seg[0] == w for w, c in node.edges.items())
        stack.extend(node.edges.values())
    prefixes = {tuple(b.words[:k]) for b in x.bindings.values() for k in range(1, len(b.words) + 1)}
    assert trie.nodes == 1 + len(prefixes)
    assert trie.wild == sum(1 for p in prefixes if "*" in p or "#" in p)


@pytest.mark.parametrize("seed", range(60))
def test_topic_trie_matches_like_the_one_binding_matcher(seed: int) -> None:
    from node.broker.exchange import freeze
    rng = random.Random(seed)
    x = Exchange("t", "topic")
    for i in range(rng.randint(1, 40)):
        rk = _random_key(rng, 6, True)
        wild, added = x._topic.wild, x._topic.wild_added(T(rk))
        bind(x, f"q{rng.randint(0, 9)}", rk, {"i": i % 3})
        assert x._topic.wild == wild + added
        _check_shape(x)
    for _ in range(rng.randint(0, 30)):  # unbinding keeps the trie right (and pruned)
        if x.bindings:
            x.remove_binding(rng.choice(list(x.bindings)))
            _check_shape(x)
    _check_shape(x)
    if rng.random() < 0.5:  # the same bound twice: no duplicates, binding order kept
        bind(x, "q0", "#", {"x": 1})
        x.remove_binding((False, "q0", "#", freeze({"x": 1})))
    for _ in range(60):
        key = _random_key(rng, 7, rng.random() < 0.2)
        assert x._topic.match(T(key)) == _old_match(x, key), key
        assert tuple(x.match(key, None)) == _old_match(x, key), key
    y = Exchange("t", "topic")  # rebuilt from the bindings (as after a snapshot)
    y.bindings = dict(x.bindings)
    y.rebuild_topic()
    assert (y._topic.nodes, y._topic.wild) == (x._topic.nodes, x._topic.wild)
    for _ in range(30):
        key = _random_key(rng, 7, False)
        assert y._topic.match(T(key)) == _old_match(x, key), key


def test_topic_trie_prunes_unbound_branches() -> None:
    from node.broker.exchange import freeze
    x = Exchange("t", "topic")
    bind(x, "q1", "a.b.c")
    bind(x, "q2", "a.*.c")
    assert (x._topic.nodes, x._topic.wild) == (6, 2)  # `*` and the `c` below it
    x.remove_binding((False, "q1", "a.b.c", freeze({})))
    assert (x._topic.nodes, x._topic.wild) == (4, 2)
    x.remove_binding((False, "q2", "a.*.c", freeze({})))
    assert x._topic.nodes == 1 and x._topic.wild == 0 and not x._topic.root.edges


def test_topic_trie_bounds_a_pathological_binding() -> None:
    """Issue 42: 3,000 keys `#.*.*...*.bN` (63 stars) against fresh 127-word
    routing keys cost the scan ~1.15 s a publish; the trie visits each of its
    nodes at most once (~0.1 ms here)."""
    x = Exchange("t", "topic")
    stars = ".".join(["*"] * 63)
    for n in range(3000):
        bind(x, "q", f"#.{stars}.b{n}")
    assert x._topic.nodes == 1 + 1 + 63 + 3000
    key = ".".join(f"w{i}" for i in range(126)) + ".b2999"
    t0 = time.perf_counter()
    for i in range(20):
        assert x.match(f"{i}.{key}", None) == (((False, "q"),))
    assert (time.perf_counter() - t0) / 20 < 0.05  # was ~1 s each


def test_topic_match_cost_is_bounded_by_the_wildcard_nodes() -> None:
    """The worst a vhost's bindings can make one publish cost: random `*`/`#`
    keys (every node below a wildcard, all reachable) up to the default cap of
    words below a wildcard (max_topic_wildcard_nodes, 32,768): ~12 ms here,
    where 20,000 such bindings (376,000 words) cost ~270 ms."""
    from node.broker.binding_limit import BindingLimits
    cap = BindingLimits().wildcard_nodes
    rng = random.Random(1)
    x = Exchange("t", "topic")
    while True:
        rk = ".".join(rng.choice("*#") for _ in range(31)) + ".a"
        if x._topic.wild + x._topic.wild_added(T(rk)) > cap:
            break
        bind(x, f"q{len(x.bindings) % 50}", rk)
    assert x._topic.wild > cap - 32
    key = ".".join(["w"] * 127 + ["a"])
    t0 = time.perf_counter()
    assert len(x.match(key, None)) == 50
    assert time.perf_counter() - t0 < 0.25
