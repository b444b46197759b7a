"""State machine unit tests: fold batches through apply_batch, assert on effects/state.

The helpers (Harness, chan, pub, ...) live in tests/support/machine.py.
"""
from __future__ import annotations

from typing import Any

from node.broker.ids import ChanId
from node.replication.command import (
    BasicCancel,
    BasicCredit,
    BasicQos,
    BasicRecover,
    Batch,
    ChannelClose,
    ChannelFlow,
    Command,
    ConnectionClose,
    Echo,
    ExchangeDelete,
    ExchangeUnbind,
    NodeUp,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    Tick,
    TxCommit,
)
from node.replication.effect import (
    ChannelError,
    Confirm,
    ConnectionFailure,
    ConsumerCancelled,
    Deliver,
    Effect,
    GetOk,
    Reply,
    Return,
)
from node.replication.machine import apply_batch, default_state, failure_effects
from node.replication.raft.snapshot import encode_snapshot
from tests.support.machine import (
    Harness,
    ack,
    bodies,
    chan,
    confirms,
    consume,
    delivers,
    errors,
    get,
    gets,
    nack,
    pub,
    qbind,
    qdecl,
    reject,
    replies,
    xbind,
    xdecl,
)
from tests.support.snapshot import META, assert_same_state, snapshot_copy

C1 = chan(1)
C2 = chan(2)


def setup(*queues: str, args: dict[str, Any] | None = None) -> Harness:
    h = Harness()
    h.open(C1)
    h.open(C2)
    for q in queues:
        h.run(qdecl(C1, q, arguments=args))
    return h


def err(fx: list[Effect]) -> tuple[int, str, int, int]:
    es = errors(fx)
    assert len(es) == 1, fx
    e = es[0]
    return e.reply_code, e.reply_text, e.class_id, e.method_id


# -- defaults, declare, replies ------------------------------------------------

def test_default_exchanges() -> None:
    s = default_state()
    assert {n: (x.type, x.durable) for n, x in s.exchanges.items()} == {
        "": ("direct", True), "amq.direct": ("direct", True), "amq.fanout": ("fanout", True),
        "amq.topic": ("topic", True), "amq.headers": ("headers", True),
        "amq.match": ("headers", True)}


def test_queue_declare_ok_counts() -> None:
    h = setup("q")
    h.run(pub(C1, "q"), pub(C1, "q"), consume(C2, "q", "t", credit=0))
    fx = h.run(qdecl(C1, "q"))
    assert fx == [Reply(C1, "Queue.DeclareOk",
                        {"queue": "q", "message_count": 2, "consumer_count": 1})]


def test_server_named_queue_and_ctag_deterministic() -> None:
    fx1 = setup().run(qdecl(C1, ""), consume(C1, "", "x"))
    h = setup()
    fx = h.run(qdecl(C1, ""))
    name = fx[0].fields["queue"]  # type: ignore[union-attr]
    assert name.startswith("amq.gen-") and len(name) == len("amq.gen-") + 22
    assert fx == fx1[:1]
    fx = h.run(consume(C1, name))
    tag = fx[0].fields["consumer_tag"]  # type: ignore[union-attr]
    assert tag.startswith("amq.ctag-") and len(tag) == len("amq.ctag-") + 22


def test_nowait_suppresses_reply() -> None:
    h = setup()
    fx = h.run(QueueDeclare(C1, "q", False, False, False, False, {}, True),
               consume(C1, "q", "t", nowait=True))
    assert fx == []
    assert "q" in h.state.queues


def test_unknown_channel_commands_ignored() -> None:
    h = setup("q")
    ghost = chan(99)
    assert h.run(pub(ghost, "q", seq=1), qdecl(ghost, "z"), get(ghost, "q")) == []
    assert "z" not in h.state.queues
    assert h.state.queues["q"].ready_count() == 0


def test_echo_replies() -> None:
    h = setup()
    assert h.run(Echo(C1, "Confirm.SelectOk", {})) == [Reply(C1, "Confirm.SelectOk", {})]


# -- errors ----------------------------------------------------------------------

def test_error_passive_declare_missing_queue_404() -> None:
    h = setup()
    assert err(h.run(qdecl(C1, "nope", passive=True))) == (
        404, "NOT_FOUND - no queue 'nope' in vhost '/'", 50, 10)
    assert C1 not in h.state.channels  # channel closed by the error


def test_error_passive_declare_missing_exchange_404() -> None:
    h = setup()
    assert err(h.run(xdecl(C1, "nope", passive=True))) == (
        404, "NOT_FOUND - no exchange 'nope' in vhost '/'", 40, 10)


def test_error_amq_prefix_403() -> None:
    h = setup()
    assert err(h.run(qdecl(C1, "amq.q")))[:1] == (403,)
    h.open(C1)
    assert err(h.run(xdecl(C1, "amq.foo"))) == (
        403, "ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'",
        40, 10)
    h.open(C1)
    # redeclaring an existing amq.* exchange is fine
    assert replies(h.run(xdecl(C1, "amq.direct", durable=True)))


def test_error_default_exchange_ops_403() -> None:
    text = "ACCESS_REFUSED - operation not permitted on the default exchange"
    for cmd, ids in ((qbind(C1, "q", "", "q"), (50, 20)),
                     (QueueUnbind(C1, "q", "", "q", {}), (50, 50)),
                     (ExchangeDelete(C1, "", False, False), (40, 20)),
                     (xbind(C1, "amq.direct", ""), (40, 30))):
        h = setup("q")
        assert err(h.run(cmd)) == (403, text, *ids)


def test_error_exchange_redeclare_inequivalent_406() -> None:
    h = setup()
    h.run(xdecl(C1, "x", "direct"))
    assert err(h.run(xdecl(C1, "x", "fanout"))) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x' in vhost '/': "
             "received 'fanout' but current is 'direct'", 40, 10)
    h.open(C1)
    assert err(h.run(xdecl(C1, "x", "direct", durable=True)))[1].endswith(
        "received 'true' but current is 'false'")


def test_error_queue_redeclare_inequivalent_406() -> None:
    h = setup("q")
    assert err(h.run(qdecl(C1, "q", durable=True))) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': "
             "received 'true' but current is 'false'", 50, 10)
    h.open(C1)
    assert err(h.run(qdecl(C1, "q", arguments={"x-message-ttl": 5}))) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in "
             "vhost '/': received the value '5' of type 'signedint' but current is none",
        50, 10)
    h.open(C1)
    # unknown x- arguments are not compared
    assert not errors(h.run(qdecl(C1, "q", arguments={"x-foo": 1})))


def test_error_invalid_queue_args_406() -> None:
    cases: list[tuple[dict[str, Any], str]] = [({"x-message-ttl": -5}, "invalid arg 'x-message-ttl' for queue 'q' in vhost "
                                     "'/': {value_negative,-5}"),
             ({"x-expires": 0}, "invalid arg 'x-expires' for queue 'q' in vhost '/': "
                                "{value_zero,0}"),
             ({"x-overflow": "foo"}, "invalid arg 'x-overflow' for queue 'q' in vhost '/': "
                                     "invalid_overflow"),
             ({"x-dead-letter-routing-key": "a"},
              "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': "
              "routing_key_but_no_dlx_defined"),
             ({"x-message-ttl": "a"}, "invalid arg 'x-message-ttl' for queue 'q' in vhost "
                                      "'/': \"expected integer, got longstr\"")]
    for args, text in cases:
        h = setup()
        assert err(h.run(qdecl(C1, "q", arguments=args))) == (
            406, "PRECONDITION_FAILED - " + text, 50, 10)
        assert "q" not in h.state.queues


def test_error_unknown_exchange_type_is_connection_error_503() -> None:
    h = setup()
    fx = h.run(xdecl(C1, "x", "foo"))
    assert fx == [ConnectionFailure(C1.conn_id, 503, "COMMAND_INVALID - invalid exchange type "
                                                   "'foo'", 40, 10)]
    assert C1 not in h.state.channels and C2 not in h.state.channels


def test_error_exclusive_queue_other_connection_405() -> None:
    h = setup()
    other = h.open(chan(1, conn=2))
    h.run(qdecl(C1, "ex", exclusive=True))
    for cmd, ids in ((qdecl(other, "ex"), (50, 10)),
                     (qdecl(other, "ex", passive=True), (50, 10)),
                     (consume(other, "ex", "t"), (60, 20)),
                     (get(other, "ex"), (60, 70)),
                     (QueuePurge(other, "ex", False), (50, 30)),
                     (QueueDelete(other, "ex", False, False, False), (50, 40)),
                     (qbind(other, "ex", "amq.direct", "k"), (50, 20))):
        code, text, *got = err(h.run(cmd))
        assert (code, tuple(got)) == (405, ids)
        assert text.startswith("RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                               "queue 'ex' in vhost '/'")
        h.open(other)
    # publishing to it from another connection is allowed
    h.run(pub(other, "ex"))
    assert h.state.queues["ex"].ready_count() == 1


def test_error_unknown_delivery_tag_406_and_requeue_s06() -> None:
    h = setup("q")
    h.run(pub(C1, "q", b"a"), pub(C1, "q", b"b"))
    h.run(get(C1, "q"), get(C1, "q"))
    fx = h.run(ack(C1, 1), ack(C1, 1))  # double ack
    assert err(fx) == (406, "PRECONDITION_FAILED - unknown delivery tag 1", 60, 80)
    assert C1 not in h.state.channels
    q = h.state.queues["q"]
    assert q.ready_count() == 1  # tag 2 was requeued (S06)
    assert q.peek().redelivered  # type: ignore[union-attr]


def test_s06_ack_of_tag_from_another_channel_fails() -> None:
    h = setup("q")
    h.run(pub(C1, "q"), get(C1, "q"))
    assert err(h.run(ack(C2, 1)))[:2] == (406, "PRECONDITION_FAILED - unknown delivery tag 1")
    assert C1 in h.state.channels


def test_error_reject_and_nack_ids() -> None:
    h = setup()
    assert err(h.run(reject(C1, 5)))[2:] == (60, 90)
    assert err(h.run(nack(C2, 5)))[2:] == (60, 120)


def test_ack_of_no_ack_delivery_is_unknown_tag() -> None:
    h = setup("q")
    h.run(pub(C1, "q"))
    h.run(get(C1, "q", no_ack=True))
    assert err(h.run(ack(C1, 1)))[0] == 406


def test_error_publish_missing_exchange_404_and_no_confirm() -> None:
    # RabbitMQ: only the channel.close, no basic.nack (issue 14; aio-pika's users
    # handle the channel error, a nack first became a DeliveryError)
    h = setup()
    fx = h.run(pub(C1, "k", exchange="nope", seq=1))
    assert fx == [ChannelError(C1, 404, "NOT_FOUND - no exchange 'nope' in vhost '/'", 60, 40)]


def test_error_publish_internal_exchange_403() -> None:
    h = setup()
    h.run(xdecl(C1, "ix", internal=True))
    fx = h.run(pub(C1, "k", exchange="ix", seq=1))
    assert not confirms(fx), fx  # no nack: the channel.close alone
    assert err(fx)[:2] == (
        403, "ACCESS_REFUSED - cannot publish to internal exchange 'ix' in vhost '/'")


def test_error_bind_missing_404() -> None:
    h = setup("q")
    assert err(h.run(qbind(C1, "nope", "amq.direct"))) == (
        404, "NOT_FOUND - no queue 'nope' in vhost '/'", 50, 20)
    h.open(C1)
    assert err(h.run(qbind(C1, "nope", "nox")))[1] == "NOT_FOUND - no exchange 'nox' in vhost '/'"
    h.open(C1)
    assert err(h.run(xbind(C1, "amq.direct", "nox")))[2:] == (40, 30)


def test_unbind_missing_binding_is_ok() -> None:
    h = setup("q")
    assert h.run(QueueUnbind(C1, "q", "amq.direct", "zz", {})) == [
        Reply(C1, "Queue.UnbindOk", {})]
    assert h.run(ExchangeUnbind(C1, "amq.fanout", "amq.direct", "zz", {}, False)) == [
        Reply(C1, "Exchange.UnbindOk", {})]


def test_error_purge_missing_404() -> None:
    assert err(setup().run(QueuePurge(C1, "nope", False)))[::2] == (404, 50)


def test_error_consume_get_missing_404() -> None:
    h = setup()
    assert err(h.run(consume(C1, "nope")))[::2] == (404, 60)
    assert err(h.run(get(C2, "nope")))[2:] == (60, 70)


def test_delete_missing_queue_ok_zero_and_missing_exchange_ok() -> None:
    h = setup()
    assert h.run(QueueDelete(C1, "nope", False, False, False)) == [
        Reply(C1, "Queue.DeleteOk", {"message_count": 0})]
    assert h.run(ExchangeDelete(C1, "nope", False, False)) == [
        Reply(C1, "Exchange.DeleteOk", {})]


def test_error_delete_system_exchange_403() -> None:
    assert err(setup().run(ExchangeDelete(C1, "amq.direct", False, False)))[:1] == (403,)


def test_error_delete_if_unused_if_empty_406() -> None:
    h = setup("q")
    h.run(consume(C2, "q", "t"))
    assert err(h.run(QueueDelete(C1, "q", True, False, False))) == (
        406, "PRECONDITION_FAILED - queue 'q' in vhost '/' in use", 50, 40)
    h = setup("q")
    h.run(pub(C1, "q"))
    assert err(h.run(QueueDelete(C1, "q", False, True, False)))[1] == (
        "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty")
    h = setup("q")
    h.run(xdecl(C1, "x"), qbind(C1, "q", "x", "k"))
    assert err(h.run(ExchangeDelete(C1, "x", True, False))) == (
        406, "PRECONDITION_FAILED - exchange 'x' in vhost '/' in use", 40, 20)


def test_error_exclusive_consumer_403() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "a"))
    assert err(h.run(consume(C2, "q", "b", exclusive=True))) == (
        403, "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use", 60, 20)
    h = setup("q")
    h.run(consume(C1, "q", "a", exclusive=True))
    assert err(h.run(consume(C2, "q", "b")))[0] == 403


def test_error_reuse_consumer_tag_530() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t"))
    fx = h.run(consume(C1, "q", "t"))
    assert fx == [ConnectionFailure(C1.conn_id, 530,
                                  "NOT_ALLOWED - attempt to reuse consumer tag 't'", 60, 20)]
    assert not h.state.channels


def test_cancel_unknown_tag_ok() -> None:
    assert setup().run(BasicCancel(C1, "zz", False)) == [
        Reply(C1, "Basic.CancelOk", {"consumer_tag": "zz"})]


# -- publish / confirm / return ---------------------------------------------------

def test_s17_mandatory_unroutable_return_before_confirm() -> None:
    h = setup()
    fx = h.run(pub(C1, "nowhere", b"x", exchange="amq.direct", seq=1, mandatory=True))
    assert fx == [Return(C1, 312, "NO_ROUTE", "amq.direct", "nowhere", {}, b"x"),
                  Confirm(C1, 1, True)]


def test_s15_one_confirm_per_publish() -> None:
    h = setup("q1", "q2")
    h.run(xdecl(C1, "f", "fanout"), qbind(C1, "q1", "f"), qbind(C1, "q2", "f"))
    fx = h.run(*(pub(C1, "", exchange="f", seq=i) for i in range(1, 6)))
    assert confirms(fx) == [Confirm(C1, i, True) for i in range(1, 6)]


def test_default_exchange_routes_by_queue_name() -> None:
    h = setup("q")
    h.run(pub(C1, "q", b"1"), pub(C1, "nope", b"2"))
    assert h.state.queues["q"].ready_count() == 1


def test_topic_and_e2e_through_state() -> None:
    h = setup("qa", "qb")
    h.run(xdecl(C1, "t", "topic"), xdecl(C1, "f", "fanout"),
          xbind(C1, "f", "t", "a.#"), qbind(C1, "qa", "f"), qbind(C1, "qb", "t", "*.b"))
    h.run(pub(C1, "a.b", exchange="t"), pub(C1, "a.c.d", exchange="t"),
          pub(C1, "z.b", exchange="t"))
    assert h.state.queues["qa"].ready_count() == 2
    assert h.state.queues["qb"].ready_count() == 2


def test_headers_exchange_through_state() -> None:
    h = setup("q")
    h.run(qbind(C1, "q", "amq.match", "", {"x-match": "any", "a": 1, "b": 2}))
    h.run(pub(C1, "", exchange="amq.match", props={"headers": {"b": 2}}),
          pub(C1, "", exchange="amq.match", props={"headers": {"b": 3}}))
    assert h.state.queues["q"].ready_count() == 1


def test_queue_delete_removes_bindings_and_autodelete_exchange() -> None:
    h = setup("q")
    h.run(ExchangeDeclareAD(C1, "ad"), qbind(C1, "q", "ad", "k"))
    h.run(QueueDelete(C1, "q", False, False, False))
    assert "ad" not in h.state.exchanges
    assert h.state.exchanges["amq.direct"].bindings == {}


def ExchangeDeclareAD(c: ChanId, name: str) -> Command:  # noqa: N802
    return xdecl(c, name, auto_delete=True)


def test_exchange_delete_removes_e2e_bindings() -> None:
    h = setup("q")
    h.run(xdecl(C1, "x"), xbind(C1, "x", "amq.fanout"), qbind(C1, "q", "x", "k"))
    h.run(ExchangeDelete(C1, "x", False, False))
    assert h.state.exchanges["amq.fanout"].bindings == {}
    assert h.state.queues["q"].incoming == {}


# -- delivery -------------------------------------------------------------------

def test_s01_tags_start_at_1_shared_by_get_and_consume() -> None:
    h = setup("q")
    h.run(*(pub(C1, "q", bytes([i])) for i in range(3)))
    fx = h.run(get(C1, "q"))
    assert gets(fx)[0].delivery_tag == 1
    fx = h.run(consume(C1, "q", "t"))
    assert [d.delivery_tag for d in delivers(fx)] == [2, 3]
    fx = h.run(BasicCancel(C1, "t", True), pub(C1, "q"), get(C1, "q"), pub(C2, "q"),
               get(C2, "q"))
    assert [(g.chan, g.delivery_tag) for g in gets(fx)] == [(C1, 4), (C2, 1)]


def test_consume_ok_before_deliveries_and_message_count() -> None:
    h = setup("q")
    h.run(pub(C1, "q", b"a"), pub(C1, "q", b"b"))
    fx = h.run(consume(C1, "q", "t"))
    assert fx[0] == Reply(C1, "Basic.ConsumeOk", {"consumer_tag": "t"})
    assert fx[1:] == [Deliver(C1, "t", 1, False, "", "q", {}, b"a"),
                      Deliver(C1, "t", 2, False, "", "q", {}, b"b")]


def test_get_ok_message_count_and_empty() -> None:
    h = setup("q")
    h.run(pub(C1, "q", b"a"), pub(C1, "q", b"b"))
    assert h.run(get(C1, "q")) == [GetOk(C1, 1, False, "", "q", 1, {}, b"a")]
    h.run(get(C1, "q", no_ack=True))
    assert h.run(get(C1, "q")) == [Reply(C1, "Basic.GetEmpty", {})]


def test_round_robin_between_consumers() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "a"), consume(C2, "q", "b"))
    fx = h.run(*(pub(C1, "q", bytes([i])) for i in range(4)))
    assert [(d.chan, d.consumer_tag) for d in delivers(fx)] == [
        (C1, "a"), (C2, "b"), (C1, "a"), (C2, "b")]


def test_s02_no_ack_settles_on_delivery() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t", no_ack=True))
    fx = h.run(pub(C1, "q", b"abc"), pub(C1, "q", b"de"))
    assert [d.delivery_tag for d in delivers(fx)] == [1, 2]
    assert h.state.channels[C1].unacked == {}
    assert h.state.message_bytes == 0


def test_s03_ack_removes() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t"), pub(C1, "q", b"abc"))
    assert h.state.message_bytes == 3
    h.run(ack(C1, 1))
    assert h.state.message_bytes == 0
    h.run(ChannelClose(C1, True))
    assert h.state.queues["q"].ready_count() == 0


def test_s03_reject_requeue_false_dead_letters() -> None:
    h = setup()
    h.run(qdecl(C1, "dl"), qdecl(C1, "q", arguments={"x-dead-letter-exchange": ""
                                                    , "x-dead-letter-routing-key": "dl"}))
    h.run(pub(C1, "q", b"x"), get(C1, "q"))
    h.run(reject(C1, 1, requeue=False))
    fx = h.run(get(C1, "dl"))
    g = gets(fx)[0]
    assert g.body == b"x" and g.routing_key == "dl"
    death = g.props["headers"]["x-death"][0]
    assert (death["reason"], death["queue"], death["count"], death["exchange"],
            death["routing-keys"]) == ("rejected", "q", 1, "", ["q"])
    assert g.props["headers"]["x-first-death-reason"] == "rejected"
    assert h.state.queues["q"].ready_count() == 0


def test_s04_s07_requeue_to_original_position_redelivered() -> None:
    h = setup("q")
    h.run(*(pub(C1, "q", bytes([i])) for i in range(4)))
    h.run(get(C1, "q"), get(C1, "q"), get(C1, "q"))  # tags 1,2,3 = msgs 0,1,2
    h.run(nack(C1, 3), reject(C1, 1))  # requeue 2 then 0
    fx = h.run(*(get(C2, "q") for _ in range(3)))
    assert [(g.body, g.redelivered) for g in gets(fx)] == [
        (b"\x00", True), (b"\x02", True), (b"\x03", False)]


def test_s05_multiple_ack_covers_earlier_tags() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t"), *(pub(C1, "q") for _ in range(5)))
    h.run(ack(C1, 3, multiple=True))
    assert list(h.state.channels[C1].unacked) == [4, 5]
    h.run(ack(C1, 0, multiple=True))
    assert h.state.channels[C1].unacked == {}


def test_s05_multiple_nack_only_this_channel() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "a"), consume(C2, "q", "b"), *(pub(C1, "q") for _ in range(4)))
    fx = h.run(BasicCancel(C1, "a", False), BasicCancel(C2, "b", False),
               nack(C1, 0, multiple=True, requeue=True))
    assert len(h.state.channels[C2].unacked) == 2
    assert h.state.queues["q"].ready_count() == 2
    assert not errors(fx)


def test_s05_multiple_ack_unknown_tag_is_error() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t"), pub(C1, "q"))
    assert err(h.run(ack(C1, 9, multiple=True)))[0] == 406


def test_s08_channel_close_requeues_and_replies() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t"), pub(C1, "q"), pub(C1, "q"))
    fx = h.run(ChannelClose(C1, True))
    assert fx == [Reply(C1, "Channel.CloseOk", {})]
    q = h.state.queues["q"]
    assert q.ready_count() == 2 and not q.consumers
    fx = h.run(consume(C2, "q", "u"))
    assert [d.redelivered for d in delivers(fx)] == [True, True]


def test_s08_connection_close_requeues_and_deletes_exclusive() -> None:
    h = setup("q")
    h.run(qdecl(C1, "ex", exclusive=True), consume(C1, "q", "t"), pub(C1, "q"))
    other = h.open(chan(1, conn=2))
    h.run(consume(other, "q", "o", credit=0))
    assert h.run(ConnectionClose(C1.conn_id)) == []
    assert "ex" not in h.state.queues
    assert not h.state.channels.get(C1) and not h.state.channels.get(C2)
    fx = h.run(BasicCredit(other, "o", 1))
    assert [(d.chan, d.redelivered) for d in delivers(fx)] == [(other, True)]


def test_s09_prefetch_per_consumer() -> None:
    h = setup("q")
    h.run(BasicQos(C1, 2, False), consume(C1, "q", "a"))
    fx = h.run(*(pub(C1, "q") for _ in range(5)))
    assert len(delivers(fx)) == 2
    fx = h.run(ack(C1, 2, multiple=True))  # acking several frees several
    assert [d.delivery_tag for d in delivers(fx)] == [3, 4]


def test_s09_qos_applies_to_later_consumers_only() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "a"), BasicQos(C1, 1, False), consume(C1, "q", "b"))
    fx = h.run(*(pub(C1, "q") for _ in range(4)))
    assert [d.consumer_tag for d in delivers(fx)] == ["a", "b", "a", "a"]


def test_s09_global_prefetch_shared_by_channel() -> None:
    h = setup("q1", "q2")
    h.run(BasicQos(C1, 3, True), consume(C1, "q1", "a"), consume(C1, "q2", "b"))
    fx = h.run(*(pub(C1, q) for q in ("q1", "q2") * 3))
    assert len(delivers(fx)) == 3
    fx = h.run(ack(C1, 1))
    assert len(delivers(fx)) == 1


def test_s09_prefetch_zero_unlimited_and_qos_ok() -> None:
    h = setup("q")
    assert h.run(BasicQos(C1, 0, False)) == [Reply(C1, "Basic.QosOk", {})]
    h.run(consume(C1, "q", "a"))
    assert len(delivers(h.run(*(pub(C1, "q") for _ in range(50))))) == 50


def test_s10_get_ignores_prefetch() -> None:
    h = setup("q")
    h.run(BasicQos(C1, 1, True), pub(C1, "q"), pub(C1, "q"), get(C1, "q"))
    assert gets(h.run(get(C1, "q")))


def test_s11_credit_limits_no_ack_consumer() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t", no_ack=True, credit=2))
    fx = h.run(*(pub(C1, "q") for _ in range(5)))
    assert len(delivers(fx)) == 2
    assert h.state.queues["q"].ready_count() == 3
    fx = h.run(BasicCredit(C1, "t", 10))
    assert len(delivers(fx)) == 3


def test_s12_recover_requeues_all_unacked() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t", credit=2), *(pub(C1, "q", bytes([i])) for i in range(3)))
    fx = h.run(BasicRecover(C1))
    assert fx[0] == Reply(C1, "Basic.RecoverOk", {})
    # redelivered to the same consumer, in the original order
    assert [(d.body, d.redelivered) for d in delivers(fx)] == []  # no credit left
    fx = h.run(BasicCredit(C1, "t", 5))
    assert [(d.body, d.redelivered) for d in delivers(fx)] == [
        (b"\x00", True), (b"\x01", True), (b"\x02", False)]


def test_channel_flow_stops_deliveries() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t"))
    assert h.run(ChannelFlow(C1, False)) == [Reply(C1, "Channel.FlowOk", {"active": False})]
    assert not delivers(h.run(pub(C1, "q")))
    fx = h.run(ChannelFlow(C1, True))
    assert len(delivers(fx)) == 1


def test_auto_delete_queue_deleted_after_last_consumer() -> None:
    h = setup()
    h.run(qdecl(C1, "ad", auto_delete=True))
    h.run(consume(C1, "ad", "a"), consume(C2, "ad", "b"))
    h.run(BasicCancel(C1, "a", False))
    assert "ad" in h.state.queues
    h.run(ChannelClose(C2, False))
    assert "ad" not in h.state.queues


def test_queue_delete_cancels_consumers_and_late_ack_ok() -> None:
    h = setup("q")
    h.run(consume(C2, "q", "t"), pub(C1, "q", b"abc"), pub(C1, "q", b"zz"))
    h.run(BasicQos(C2, 0, False))
    fx = h.run(QueueDelete(C1, "q", False, False, False))
    assert ConsumerCancelled(C2, "t") in fx
    assert Reply(C1, "Queue.DeleteOk", {"message_count": 0}) in fx
    assert not errors(h.run(ack(C2, 1), nack(C2, 2, requeue=True)))
    assert h.state.message_bytes == 0


def test_purge_removes_ready_only() -> None:
    h = setup("q")
    h.run(pub(C1, "q"), pub(C1, "q"), pub(C1, "q"), get(C1, "q"))
    assert h.run(QueuePurge(C1, "q", False)) == [
        Reply(C1, "Queue.PurgeOk", {"message_count": 2})]
    h.run(nack(C1, 1))
    assert h.state.queues["q"].ready_count() == 1


# -- TTL, DLX, max-length ---------------------------------------------------------

def test_queue_ttl_expires_on_tick() -> None:
    h = setup("q", args={"x-message-ttl": 1000})
    h.run(pub(C1, "q"))
    h.now += 0.5
    h.run(Tick())
    assert h.state.queues["q"].ready_count() == 1
    h.now += 0.6
    h.run(Tick())
    assert h.state.queues["q"].ready_count() == 0
    assert h.state.ttl_index == {}
    assert h.state.message_bytes == 0


def test_per_message_expiration_min_with_queue_ttl_and_dlx() -> None:
    h = setup("dead")
    h.run(qdecl(C1, "q", arguments={"x-message-ttl": 10000, "x-dead-letter-exchange": "",
                                    "x-dead-letter-routing-key": "dead"}))
    h.run(pub(C1, "q", b"a", props={"expiration": "100"}), pub(C1, "q", b"b"))
    h.now += 0.2
    h.run(Tick())
    assert h.state.queues["q"].ready_count() == 1
    g = gets(h.run(get(C1, "dead")))[0]
    assert g.body == b"a"
    assert "expiration" not in g.props
    d = g.props["headers"]["x-death"][0]
    assert d["reason"] == "expired" and d["original-expiration"] == "100"


def test_ttl_zero_reaches_waiting_consumer_else_expires() -> None:
    h = setup("q", args={"x-message-ttl": 0})
    assert h.run(pub(C1, "q"), get(C1, "q")) == [Reply(C1, "Basic.GetEmpty", {})]
    h.run(consume(C2, "q", "t"))
    assert len(delivers(h.run(pub(C1, "q")))) == 1


def test_expired_head_not_delivered_on_get() -> None:
    h = setup("q")
    h.run(pub(C1, "q", b"a", props={"expiration": "10"}), pub(C1, "q", b"b"))
    h.now += 1
    assert gets(h.run(get(C1, "q")))[0].body == b"b"


def test_x_expires_deletes_unused_queue() -> None:
    h = setup()
    h.run(qdecl(C1, "e", arguments={"x-expires": 1000}))
    h.now += 0.9
    h.run(qdecl(C1, "e", arguments={"x-expires": 1000}))  # redeclare = use
    h.now += 0.9
    h.run(Tick())
    assert "e" in h.state.queues
    h.run(consume(C1, "e", "t"))
    h.now += 5
    h.run(Tick())
    assert "e" in h.state.queues  # has a consumer
    h.run(BasicCancel(C1, "t", True))
    h.now += 1.1
    h.run(Tick())
    assert "e" not in h.state.queues


def test_max_length_drop_head_dead_letters_maxlen() -> None:
    h = setup("dl")
    h.run(qdecl(C1, "q", arguments={"x-max-length": 2, "x-dead-letter-exchange": "",
                                    "x-dead-letter-routing-key": "dl"}))
    h.run(*(pub(C1, "q", bytes([i])) for i in range(4)))
    assert bodies(h.run(get(C1, "q"), get(C1, "q"))) == [b"\x02", b"\x03"]
    fx = h.run(get(C1, "dl"), get(C1, "dl"))
    assert bodies(fx) == [b"\x00", b"\x01"]
    assert gets(fx)[0].props["headers"]["x-death"][0]["reason"] == "maxlen"


def test_max_length_bytes() -> None:
    h = setup("q", args={"x-max-length-bytes": 5})
    h.run(pub(C1, "q", b"abc"), pub(C1, "q", b"de"), pub(C1, "q", b"f"))
    assert bodies(h.run(get(C1, "q"), get(C1, "q"))) == [b"de", b"f"]


def test_overflow_reject_publish_nacks() -> None:
    h = setup("q", args={"x-max-length": 1, "x-overflow": "reject-publish"})
    fx = h.run(pub(C1, "q", seq=1), pub(C1, "q", seq=2))
    assert confirms(fx) == [Confirm(C1, 1, True), Confirm(C1, 2, False)]
    assert h.state.queues["q"].ready_count() == 1


def test_dead_letter_cycle_dropped_but_rejected_allowed() -> None:
    h = setup()
    args = {"x-message-ttl": 0, "x-dead-letter-exchange": ""}
    # q1 -> expired -> q2 -> expired -> q1 (cycle: dropped)
    h.run(qdecl(C1, "q1", arguments={**args, "x-dead-letter-routing-key": "q2"}),
          qdecl(C1, "q2", arguments={**args, "x-dead-letter-routing-key": "q1"}))
    h.run(pub(C1, "q1"))
    assert h.state.queues["q1"].ready_count() == 0
    assert h.state.queues["q2"].ready_count() == 0
    assert h.state.message_bytes == 0
    # rejection back into the same queue is not a cycle
    h.run(qdecl(C1, "r", arguments={"x-dead-letter-exchange": "",
                                    "x-dead-letter-routing-key": "r"}))
    h.run(pub(C1, "r"), get(C1, "r"), reject(C1, 1, requeue=False))
    g = gets(h.run(get(C1, "r")))[0]
    assert g.props["headers"]["x-death"][0]["count"] == 1
    h.run(reject(C1, 2, requeue=False))
    g = gets(h.run(get(C1, "r")))[0]
    assert g.props["headers"]["x-death"][0]["count"] == 2
    assert len(g.props["headers"]["x-death"]) == 1


def test_dead_letter_missing_dlx_drops() -> None:
    h = setup("q", args={"x-dead-letter-exchange": "gone"})
    h.run(pub(C1, "q"), get(C1, "q"), nack(C1, 1, requeue=False))
    assert h.state.message_bytes == 0


# -- tx --------------------------------------------------------------------------

def test_s24_tx_commit_applies_then_replies() -> None:
    h = setup("q")
    h.run(pub(C1, "q", b"old"), get(C1, "q"))
    fx = h.run(TxCommit(C1, (pub(C1, "q", b"a"), ack(C1, 1), pub(C1, "q", b"b"))))
    assert fx == [Reply(C1, "Tx.CommitOk", {})]
    assert h.state.queues["q"].ready_count() == 2 and not h.state.channels[C1].unacked


def test_s24_tx_commit_is_atomic_on_unknown_tag() -> None:
    h = setup("q")
    fx = h.run(TxCommit(C1, (pub(C1, "q", b"a"), ack(C1, 7))))
    assert err(fx) == (406, "PRECONDITION_FAILED - unknown delivery tag 7", 90, 20)
    assert h.state.queues["q"].ready_count() == 0


# -- dedup, node up, failure, determinism -------------------------------------------

def test_dedup_repeated_batch_ignored() -> None:
    h = setup("q")
    b = Batch("n1", 1, h.seqs[("n1", 1)] + 1, h.now, [pub(C1, "q", seq=1)])
    assert apply_batch(h.state, b) == [Confirm(C1, 1, True)]
    assert apply_batch(h.state, b) == []
    assert apply_batch(h.state, b._replace(seq=b.seq - 1)) == []
    # after a gap: ignored until the missing batch is resent
    assert apply_batch(h.state, b._replace(seq=b.seq + 2)) == []
    assert h.state.queues["q"].ready_count() == 1
    # another incarnation has its own sequence
    assert apply_batch(h.state, b._replace(incarnation=2, seq=1)) == [Confirm(C1, 1, True)]


def test_clock_never_goes_back() -> None:
    h = setup()
    apply_batch(h.state, Batch("n2", 1, 1, 5000.0, []))
    apply_batch(h.state, Batch("n3", 1, 1, 10.0, []))
    assert h.state.now == 5000.0


def test_s25_node_up_drops_its_channels_and_transient_state() -> None:
    h = setup()
    remote = h.open(chan(1, conn=7, node="n2"))
    h.run(qdecl(remote, "dur", durable=True), qdecl(remote, "tmp"),
          qdecl(C1, "mine"), qdecl(remote, "rex", exclusive=True))
    h.run(pub(C1, "dur", b"p", props={"delivery_mode": 2}), pub(C1, "dur", b"t"),
          pub(C1, "mine"), consume(remote, "mine", "r"), consume(C1, "tmp", "c1"))
    fx = h.run(NodeUp("n2", 2), node="n2", incarnation=2)
    assert remote not in h.state.channels
    assert set(h.state.queues) == {"dur", "mine"}
    assert ConsumerCancelled(C1, "c1") in fx
    assert bodies(h.run(get(C1, "dur"), get(C1, "dur"))) == [b"p"]
    g = gets(h.run(get(C1, "mine")))[0]
    assert g.redelivered
    assert ("n2", 1) not in h.state.dedup


def test_s19_node_up_drops_transient_exchanges_it_declared() -> None:
    h = setup()
    remote = h.open(chan(1, conn=7, node="n2"))
    h.run(xdecl(remote, "tx-n2"), xdecl(remote, "dx-n2", durable=True), xdecl(C1, "tx-n1"),
          qdecl(C1, "dq", durable=True), qbind(C1, "dq", "tx-n2"), qbind(C1, "dq", "dx-n2"))
    h.run(NodeUp("n2", 2), node="n2", incarnation=2)
    assert "tx-n2" not in h.state.exchanges
    assert {"dx-n2", "tx-n1"} <= set(h.state.exchanges)
    # the binding from the dropped exchange is gone, the durable one still routes
    assert bodies(h.run(pub(C1, "", b"d", exchange="dx-n2"), get(C1, "dq"))) == [b"d"]


def test_failure_effects() -> None:
    b = Batch("n1", 1, 1, 0.0, [pub(C1, "q", seq=1), pub(C1, "q"), qdecl(C1, "q"),
                                qdecl(C1, "r"), pub(C2, "q", seq=4),
                                TxCommit(C2, (pub(C2, "q"),)),
                                QueueDeclare(chan(3), "z", False, False, False, False, {}, True)])
    assert failure_effects(b) == [
        Confirm(C1, 1, False),
        ChannelError(C1, 541, "INTERNAL_ERROR - could not replicate", 50, 10),
        Confirm(C2, 4, False),
        ChannelError(C2, 541, "INTERNAL_ERROR - could not replicate", 90, 20)]


def _scenario() -> list[Batch]:
    h = setup()
    h.run(qdecl(C1, "a", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                    "x-dead-letter-routing-key": "b"}),
          qdecl(C1, "b"), qdecl(C1, ""), consume(C2, "b", "", credit=3),
          xdecl(C1, "t", "topic"), qbind(C1, "a", "t", "x.#"))
    for i in range(20):
        h.run(pub(C1, "x.y", bytes([i]), exchange="t", seq=i + 1), Tick())
        h.now += 0.03
        h.run(ack(C2, 0, multiple=True), BasicCredit(C2, h.state.channels[C2].consumers
                                                     .__iter__().__next__(), 1))
    return h.batches


def test_determinism_same_batches_same_state_and_effects() -> None:
    batches = _scenario()
    s1, s2 = default_state(), default_state()
    fx1 = [apply_batch(s1, b) for b in batches]
    fx2 = [apply_batch(s2, b) for b in batches]
    assert fx1 == fx2
    assert encode_snapshot(s1, META) == encode_snapshot(s2, META)
    s3 = snapshot_copy(s1)
    assert_same_state(s1, s3)
    assert encode_snapshot(s3, META) == encode_snapshot(s1, META)
    assert any(isinstance(e, Deliver) for fx in fx1 for e in fx)


# -- more RabbitMQ parity (texts checked against RabbitMQ 3.10) ------------------------

def test_error_exclusive_flag_mismatch_by_owner_405() -> None:
    h = setup()
    h.run(qdecl(C1, "ex", exclusive=True))
    assert err(h.run(qdecl(C1, "ex")))[0] == 405
    h.open(C1)
    h.run(qdecl(C1, "plain"))
    assert err(h.run(qdecl(C1, "plain", exclusive=True)))[0] == 405
    h.open(C1)
    assert not errors(h.run(qdecl(C1, "ex", exclusive=True), qdecl(C1, "ex", passive=True)))


def test_error_passive_declare_default_exchange_403() -> None:
    assert err(setup().run(xdecl(C1, "", passive=True)))[0] == 403


def test_error_invalid_expiration_406() -> None:
    h = setup("q")
    fx = h.run(pub(C1, "q", seq=1, props={"expiration": "abc"}))
    assert fx == [ChannelError(  # no nack: the channel.close alone, as RabbitMQ
        C1, 406, "PRECONDITION_FAILED - invalid expiration 'abc': no_integer", 60, 40)]
    assert err(h.run(pub(C2, "q", props={"expiration": "-5"})))[1] == (
        "PRECONDITION_FAILED - invalid expiration '-5': {value_negative,-5}")
    assert h.state.queues["q"].ready_count() == 0


def test_error_inequivalent_arg_same_type_text() -> None:
    h = setup("q", args={"x-message-ttl": 10})
    assert err(h.run(qdecl(C1, "q", arguments={"x-message-ttl": 20})))[1] == (
        "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
        "received '20' but current is '10'")
    h.open(C1)
    assert err(h.run(qdecl(C1, "q")))[1].endswith(
        "received none but current is the value '10' of type 'signedint'")


def test_overflow_reject_publish_dlx_dead_letters_refused() -> None:
    h = setup("dl")
    h.run(qdecl(C1, "q", arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                    "x-dead-letter-exchange": "",
                                    "x-dead-letter-routing-key": "dl"}))
    fx = h.run(pub(C1, "q", b"a", seq=1), pub(C1, "q", b"b", seq=2))
    assert confirms(fx) == [Confirm(C1, 1, True), Confirm(C1, 2, False)]
    assert bodies(h.run(get(C1, "dl"))) == [b"b"]


def test_reject_publish_routed_elsewhere_still_nacked() -> None:
    h = setup("ok")
    h.run(qdecl(C1, "full", arguments={"x-max-length": 0, "x-overflow": "reject-publish"}),
          qbind(C1, "ok", "amq.fanout"), qbind(C1, "full", "amq.fanout"))
    fx = h.run(pub(C1, "", exchange="amq.fanout", seq=1, mandatory=True))
    assert fx == [Confirm(C1, 1, False)]  # routed: no Return
    assert h.state.queues["ok"].ready_count() == 1


def test_global_prefetch_not_counting_get() -> None:
    h = setup("q")
    h.run(BasicQos(C1, 1, True), pub(C1, "q"), pub(C1, "q"), get(C1, "q"))
    assert len(delivers(h.run(consume(C1, "q", "t")))) == 1


def test_exclusive_consumer_released_on_cancel() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "a", exclusive=True), BasicCancel(C1, "a", False))
    assert not errors(h.run(consume(C2, "q", "b")))


def test_x_death_first_death_headers_kept_across_queues() -> None:
    h = setup("c")
    h.run(qdecl(C1, "b", arguments={"x-message-ttl": 0, "x-dead-letter-exchange": "",
                                    "x-dead-letter-routing-key": "c"}),
          qdecl(C1, "a", arguments={"x-dead-letter-exchange": "",
                                    "x-dead-letter-routing-key": "b"}))
    h.run(pub(C1, "a", props={"headers": {"k": 1}}), get(C1, "a"),
          reject(C1, 1, requeue=False))
    g = gets(h.run(get(C1, "c", no_ack=True)))[0]
    hd = g.props["headers"]
    assert [(d["queue"], d["reason"]) for d in hd["x-death"]] == [("b", "expired"),
                                                                  ("a", "rejected")]
    assert (hd["x-first-death-queue"], hd["x-first-death-reason"], hd["k"]) == (
        "a", "rejected", 1)
    assert h.state.message_bytes == 0


def test_tick_cheap_without_ttl_queues() -> None:
    h = setup("q")
    h.run(*(pub(C1, "q") for _ in range(10)))
    assert h.state.ttl_index == {} and h.state.expires_index == {}
    assert h.run(Tick()) == []


def test_unknown_consumer_credit_and_close_ignored() -> None:
    h = setup()
    assert h.run(BasicCredit(C1, "zz", 5), ChannelClose(chan(42), True)) == []


def test_message_bytes_tracks_ready_and_unacked() -> None:
    h = setup("q")
    h.run(pub(C1, "q", b"aaaa"), pub(C1, "q", b"bb"), get(C1, "q"))
    assert h.state.message_bytes == 6
    h.run(ack(C1, 1))
    assert h.state.message_bytes == 2
    h.run(QueuePurge(C1, "q", False))
    assert h.state.message_bytes == 0


def test_snapshot_roundtrip_keeps_behaviour() -> None:
    h = setup("q")
    h.run(consume(C1, "q", "t", credit=1), pub(C1, "q", b"a"), pub(C1, "q", b"b"))
    restored = snapshot_copy(h.state)
    b = Batch("n1", 1, 999, h.now, [BasicCredit(C1, "t", 1), ack(C1, 0, True)])
    assert apply_batch(restored, b) == apply_batch(h.state, b)
    assert_same_state(restored, h.state)


def test_queue_delete_replies_before_cancelling_the_deleting_channels_consumers() -> None:
    # RabbitMQ's order (issue 14: kombu deleting the queue it consumes from got the
    # basic.cancel while it waited for delete-ok and raised ConsumerCancelled):
    # delete-ok first on the deleting channel, then its consumers' cancels; the
    # other channels' consumers are cancelled as before
    from node.replication.effect import ConsumerCancelled
    h = setup("q")
    h.run(consume(C1, "q", "mine"), consume(C2, "q", "theirs"))
    fx = h.run(QueueDelete(C1, "q", False, False, False))
    kinds = [(type(e).__name__, getattr(e, "chan", None)) for e in fx]
    reply = kinds.index(("Reply", C1))
    assert fx[reply].method == "Queue.DeleteOk", fx
    assert ConsumerCancelled(C1, "mine") in fx[reply + 1:], fx
    assert ConsumerCancelled(C2, "theirs") in fx, fx
    assert "q" not in h.state.queues


def test_queue_types_quorum_and_classic_accepted_stream_refused() -> None:
    # issue 14: what Celery / MassTransit / Spring AMQP declare; RabbitMQ 3.10's
    # quorum-queue property checks (texts as rabbit_quorum_queue:declare's)
    h = setup()
    for i, qtype in enumerate(("quorum", "classic")):
        name = f"t{i}"
        assert not errors(h.run(qdecl(C1, name, durable=True,
                                      arguments={"x-queue-type": qtype})))
        assert name in h.state.queues
        # redeclared without the type: inequivalent, as RabbitMQ
        code, text, *_ = err(h.run(qdecl(C1, name, durable=True)))
        assert code == 406 and "inequivalent arg 'x-queue-type'" in text, text
        h.open(C1)
    cases = [
        ({"durable": False}, "quorum",
         "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'q' in vhost '/'"),
        ({"durable": True, "exclusive": True}, "quorum",
         "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'q' in vhost '/'"),
        ({"durable": True, "auto_delete": True}, "quorum",
         "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'q' in vhost '/'"),
        ({"durable": True}, "stream", "streams are not supported by mirrorq"),
        ({"durable": True}, "lazy", "unknown queue type 'lazy'"),
    ]
    for kw, qtype, text in cases:
        fx = h.run(qdecl(C1, "q", arguments={"x-queue-type": qtype}, **kw))
        code, got, *_ = err(fx)
        assert code == 406 and text in got, (qtype, kw, got)
        assert "q" not in h.state.queues
        h.open(C1)
