"""Exchanges and routing (RabbitMQ behaviour; SEMANTICS: 'do what RabbitMQ does')."""
from __future__ import annotations

import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.broker_proc import uniq, wait_for
from tests.support.pika_session import Amqp

pytestmark = pytest.mark.rabbitmq_ok


def routed(amqp: Amqp, queues: dict[str, str]) -> dict[str, list[bytes]]:
    return {k: sorted(b for b, _ in amqp.drain(q)) for k, q in queues.items()}


def test_direct_exchange(amqp: Amqp) -> None:
    ch = amqp.channel()
    x = amqp.exchange(ch, uniq("dx"), "direct")
    qa, qb = amqp.queue(ch), amqp.queue(ch)
    ch.queue_bind(qa, x, "a")
    ch.queue_bind(qb, x, "b")
    ch.queue_bind(qb, x, "a")
    ch.confirm_delivery()
    ch.basic_publish(x, "a", b"1")
    ch.basic_publish(x, "b", b"2")
    ch.basic_publish(x, "c", b"3")
    assert routed(amqp, {"a": qa, "b": qb}) == {"a": [b"1"], "b": [b"1", b"2"]}
    ch.queue_unbind(qb, x, "a")
    ch.basic_publish(x, "a", b"4")
    assert routed(amqp, {"a": qa, "b": qb}) == {"a": [b"4"], "b": []}


def test_default_exchange_routes_by_queue_name(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"d")
    assert routed(amqp, {"q": q}) == {"q": [b"d"]}
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_bind(q, "", "x")
    assert ei.value.reply_code == 403


def test_fanout_exchange(amqp: Amqp) -> None:
    ch = amqp.channel()
    x = amqp.exchange(ch, uniq("fx"), "fanout")
    qs = {str(i): amqp.queue(ch) for i in range(3)}
    for q in qs.values():
        ch.queue_bind(q, x, "ignored")
    ch.confirm_delivery()
    ch.basic_publish(x, "whatever", b"f")
    assert routed(amqp, qs) == {k: [b"f"] for k in qs}


def test_topic_exchange_star_and_hash(amqp: Amqp) -> None:
    ch = amqp.channel()
    x = amqp.exchange(ch, uniq("tx"), "topic")
    pats = {"star": "a.*.c", "hash": "a.#", "mid": "#.c", "exact": "a.b.c", "all": "#",
            "two": "*.*"}
    qs = {k: amqp.queue(ch) for k in pats}
    for k, p in pats.items():
        ch.queue_bind(qs[k], x, p)
    ch.confirm_delivery()
    for key in ["a.b.c", "a", "a.b", "a.x.y.c", "b.c", "c"]:
        ch.basic_publish(x, key, key.encode())
    got = routed(amqp, qs)
    assert got["star"] == [b"a.b.c"]
    assert got["hash"] == sorted([b"a.b.c", b"a", b"a.b", b"a.x.y.c"])
    assert got["mid"] == sorted([b"a.b.c", b"a.x.y.c", b"b.c", b"c"])
    assert got["exact"] == [b"a.b.c"]
    assert len(got["all"]) == 6
    assert got["two"] == sorted([b"a.b", b"b.c"])


@pytest.mark.parametrize("match", ["all", "any"])
def test_headers_exchange(amqp: Amqp, match: str) -> None:
    import pika
    ch = amqp.channel()
    x = amqp.exchange(ch, uniq("hx"), "headers")
    q = amqp.queue(ch)
    ch.queue_bind(q, x, "", arguments={"x-match": match, "k1": "v1", "k2": "v2"})
    ch.confirm_delivery()
    cases = {"both": {"k1": "v1", "k2": "v2"}, "one": {"k1": "v1"},
             "wrong": {"k1": "v1", "k2": "zz"}, "none": {"other": "x"}}
    for name, h in cases.items():
        ch.basic_publish(x, "", name.encode(), pika.BasicProperties(headers=h))
    got = routed(amqp, {"q": q})["q"]
    if match == "all":
        assert got == [b"both"]
    else:
        assert got == sorted([b"both", b"one", b"wrong"])


def test_exchange_to_exchange_binding(amqp: Amqp) -> None:
    ch = amqp.channel()
    src = amqp.exchange(ch, uniq("src"), "topic")
    dst = amqp.exchange(ch, uniq("dst"), "fanout")
    q = amqp.queue(ch)
    ch.exchange_bind(dst, src, "k.*")
    ch.queue_bind(q, dst)
    ch.confirm_delivery()
    ch.basic_publish(src, "k.1", b"yes")
    ch.basic_publish(src, "z.1", b"no")
    assert routed(amqp, {"q": q})["q"] == [b"yes"]
    ch.exchange_unbind(dst, src, "k.*")
    ch.basic_publish(src, "k.1", b"after-unbind")
    assert routed(amqp, {"q": q})["q"] == []


def test_internal_exchange_refuses_publish(amqp: Amqp) -> None:
    ch = amqp.channel()
    x = amqp.exchange(ch, uniq("ix"), "fanout", internal=True)
    ch.basic_publish(x, "", b"x")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(uniq("probe"), exclusive=True)
    assert ei.value.reply_code == 403


def test_auto_delete_exchange_goes_with_last_binding(amqp: Amqp) -> None:
    ch = amqp.channel()
    x = uniq("adx")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q = amqp.queue(ch)
    ch.queue_bind(q, x)
    ch.exchange_declare(x, "fanout", passive=True, auto_delete=True)
    ch.queue_unbind(q, x)

    def gone() -> bool:
        c = amqp.channel()
        try:
            c.exchange_declare(x, "fanout", passive=True)
            return False
        except ChannelClosedByBroker as e:
            return e.reply_code == 404
    wait_for(gone, timeout=10, what="auto-delete exchange to disappear")


def test_exchange_delete_if_unused(amqp: Amqp) -> None:
    ch = amqp.channel()
    x = amqp.exchange(ch, uniq("ux"), "direct")
    q = amqp.queue(ch)
    ch.queue_bind(q, x, "k")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_delete(x, if_unused=True)
    assert ei.value.reply_code == 406
    ch = amqp.channel()
    ch.queue_unbind(q, x, "k")
    ch.exchange_delete(x, if_unused=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare(x, "direct", passive=True)
    assert ei.value.reply_code == 404


def test_exchange_redeclare_with_other_type_is_406(amqp: Amqp) -> None:
    ch = amqp.channel()
    x = amqp.exchange(ch, uniq("rx"), "direct")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare(x, "fanout")
    assert ei.value.reply_code == 406


def test_publish_to_missing_exchange_is_404(amqp: Amqp) -> None:
    ch = amqp.channel()
    ch.basic_publish(uniq("missing"), "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(uniq("probe"), exclusive=True)
    assert ei.value.reply_code == 404
