"""Routing tables: direct, fanout, topic (* and #), headers (all/any), e2e bindings."""
from __future__ import annotations

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
