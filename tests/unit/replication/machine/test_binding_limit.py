"""Issue 42: the apply bounds bindings (node/broker/binding_limit.py) on
every member alike, from machine version 7 on: a topic binding key's words, bindings per exchange and
per vhost, refused with 406 PRECONDITION_FAILED; binding again is no new
binding; unbinding and deleting free the counts; the per-vhost count is
derived, rebuilt from a snapshot."""
from __future__ import annotations

from node.broker.binding_limit import BindingLimits
from node.broker.vhost import resource_key
from node.replication.command import (
    ChannelOpen,
    ExchangeDelete,
    QueueDelete,
    QueueUnbind,
    SetMachineVersion,
    VhostPut,
)
from node.replication.machine.version import BINDING_LIMITS
from tests.support.machine import Harness, chan, errors, qbind, qdecl, xbind, xdecl
from tests.support.snapshot import assert_same_state, snapshot_copy


def codes(fx: list) -> list[tuple[int, str, int, int]]:
    return [(e.reply_code, e.reply_text, e.class_id, e.method_id) for e in errors(fx)]


def harness(words: int = 4, per_exchange: int = 3, per_vhost: int = 5, wild: int = 0,
            version: int = BINDING_LIMITS) -> Harness:
    h = Harness()
    h.run(SetMachineVersion(version))
    h.state.binding_limits = BindingLimits(words, per_exchange, per_vhost, wild)
    return h


def test_a_topic_binding_key_over_the_word_limit_is_refused() -> None:
    h = harness()
    c = h.open(chan(1))
    h.run(xdecl(c, "t", "topic"), xdecl(c, "d", "direct"), qdecl(c, "q"))
    assert not errors(h.run(qbind(c, "q", "t", "#.*.*.a")))  # 4 words
    assert codes(h.run(qbind(c, "q", "t", "#.*.*.*.a"))) == [
        (406, "PRECONDITION_FAILED - binding key has 5 words, more than the limit of 4 "
              "(max_binding_key_words)", 50, 20)]
    c = h.open(chan(2))
    assert not errors(h.run(qbind(c, "q", "d", "a.b.c.d.e.f")))  # direct: one key, no words
    assert [e[0] for e in codes(h.run(xbind(c, "d", "t", "a.b.c.d.e")))] == [406]
    assert len(h.state.exchanges[resource_key("/", "t")].bindings) == 1


def test_bindings_per_exchange_and_per_vhost_are_capped_and_freed() -> None:
    h = harness()
    c = h.open(chan(1))
    h.run(xdecl(c, "t", "topic"), xdecl(c, "u", "topic"), qdecl(c, "q"), qdecl(c, "r"))
    h.run(qbind(c, "q", "t", "a"), qbind(c, "q", "t", "b"), qbind(c, "q", "t", "c"))
    assert not errors(h.run(qbind(c, "q", "t", "c")))  # the same again: no new binding
    assert codes(h.run(qbind(c, "q", "t", "d"))) == [
        (406, "PRECONDITION_FAILED - cannot bind to exchange 't' in vhost '/': its binding "
              "limit (3) is reached (max_bindings_per_exchange)", 50, 20)]
    c = h.open(chan(2))
    h.run(qbind(c, "r", "u", "a"), qbind(c, "r", "u", "b"))
    assert h.state.vhost_bindings == {"/": 5}
    assert codes(h.run(xbind(c, "t", "u", "x"))) == [
        (406, "PRECONDITION_FAILED - cannot bind in vhost '/': binding limit in vhost '/' (5) "
              "is reached (max_bindings_per_vhost)", 40, 30)]
    c = h.open(chan(3))
    h.run(QueueUnbind(c, "q", "t", "a", {}))
    assert h.state.vhost_bindings == {"/": 4}
    assert not errors(h.run(qbind(c, "r", "t", "d")))
    loaded = snapshot_copy(h.state)  # the count is rebuilt on load
    loaded.binding_limits = h.state.binding_limits  # the node's, set as it restores
    assert_same_state(h.state, loaded)
    h.run(QueueDelete(c, "r", False, False, False))  # r's bindings on t and u go
    assert h.state.vhost_bindings == {"/": 2}
    h.run(ExchangeDelete(c, "t", False, False))
    assert h.state.vhost_bindings == {}


def test_vhosts_are_counted_apart_and_zero_is_no_limit() -> None:
    h = harness(words=0, per_exchange=0, per_vhost=2)
    h.run(VhostPut("v"))
    c = h.open(chan(1))
    v = chan(2)
    h.run(ChannelOpen(v, "v"))
    for ch in (c, v):
        h.run(xdecl(ch, "t", "topic"), qdecl(ch, "q"), qbind(ch, "q", "t", "*." * 40 + "a"),
              qbind(ch, "q", "t", "b"))
    assert h.state.vhost_bindings == {"/": 2, "v": 2}
    assert [e[0] for e in codes(h.run(qbind(c, "q", "amq.topic", "x")))] == [406]


def test_wildcard_trie_nodes_per_vhost_are_capped() -> None:
    """What a publish can cost is bounded by the trie nodes below a wildcard
    in its vhost (literal keys add none of them)."""
    h = harness(words=8, per_exchange=100, per_vhost=100, wild=6)
    c = h.open(chan(1))
    h.run(xdecl(c, "t", "topic"), xdecl(c, "u", "topic"), qdecl(c, "q"))
    h.run(qbind(c, "q", "t", "a.b.c.d"), qbind(c, "q", "t", "a.*.c"))  # 2 wild: `*`, `c`
    h.run(qbind(c, "q", "u", "#.x.y"))  # 3 more
    assert h.state.vhost_wild_nodes == {"/": 5}
    assert not errors(h.run(qbind(c, "q", "t", "a.*.d")))  # 1 more: 6
    assert not errors(h.run(qbind(c, "q", "t", "a.*.d", {"x": 1})))  # no new node
    assert not errors(h.run(qbind(c, "q", "u", "p.q.r.s.t")))  # literal: none
    assert codes(h.run(qbind(c, "q", "u", "#.z"))) == [
        (406, "PRECONDITION_FAILED - cannot bind in vhost '/': its topic bindings would hold "
              "more than 6 trie nodes below a wildcard (max_topic_wildcard_nodes)", 50, 20)]
    c = h.open(chan(2))
    h.run(QueueUnbind(c, "q", "u", "#.x.y", {}))
    assert h.state.vhost_wild_nodes == {"/": 3}
    assert not errors(h.run(qbind(c, "q", "u", "#.z")))
    loaded = snapshot_copy(h.state)
    loaded.binding_limits = h.state.binding_limits
    assert_same_state(h.state, loaded)
    h.run(ExchangeDelete(c, "t", False, False), ExchangeDelete(c, "u", False, False))
    assert h.state.vhost_wild_nodes == {}


def test_below_machine_version_7_nothing_is_refused() -> None:
    """A log written before the limits replays as it was first applied (a
    version-6 member adds the binding: so must everyone until version 7)."""
    h = harness(version=BINDING_LIMITS - 1)
    c = h.open(chan(1))
    h.run(xdecl(c, "t", "topic"), qdecl(c, "q"))
    fx = h.run(*(qbind(c, "q", "t", f"#.*.*.*.*.k{i}") for i in range(5)))
    assert not errors(fx) and len(h.state.exchanges[resource_key("/", "t")].bindings) == 5
    assert h.state.vhost_bindings == {"/": 5}  # counted all the same
    h.run(SetMachineVersion(BINDING_LIMITS))
    assert codes(h.run(qbind(c, "q", "t", "a")))[0][0] == 406
