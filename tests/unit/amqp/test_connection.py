"""node.amqp.connection/channel driven with pamqp-built frames and a fake
Proposer; effects are fed back by hand."""
from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import commands as pc
from pamqp import header as pheader
from pamqp.body import ContentBody

from node.amqp import frame
from node.amqp.channel import ConfirmTracker
from node.amqp.config import WireConfig
from node.amqp.connection import Connection
from node.amqp.endpoint import CLOSED, CLOSING
from node.amqp.throttle import LoginThrottle
from node.broker.ids import ConnId
from node.replication import command as C
from node.replication import effect as E
from tests.support.wire_client import Client, Clock

# ---------------------------------------------------------------- handshake

def test_protocol_header_mismatch_gets_our_header() -> None:
    c = Client()
    c.raw(b"AMQP\x00\x00\x09\x00")
    assert c.conn.take_output() == frame.PROTOCOL_HEADER
    assert c.conn.close_transport


def test_connection_start_contents() -> None:
    c = Client()
    start = c.start()
    assert isinstance(start, pc.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "PLAIN AMQPLAIN" and start.locales == "en_US"
    props = start.server_properties
    assert props["product"] == "mirrorq"
    caps = props["capabilities"]
    for cap in ("publisher_confirms", "basic.nack", "consumer_cancel_notify",
                "exchange_exchange_bindings", "per_consumer_qos", "connection.blocked",
                "authentication_failure_close"):
        assert caps[cap] is True


@pytest.mark.parametrize("mech", ["PLAIN", "AMQPLAIN"])
def test_auth_success(mech: str) -> None:
    c = Client()
    c.start()
    c.login(mech)
    [(_, tune)] = c.recv()
    assert isinstance(tune, pc.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)


@pytest.mark.parametrize("mech", ["PLAIN", "AMQPLAIN"])
def test_auth_failure_with_close_capability(mech: str) -> None:
    c = Client()
    c.start()
    c.login(mech, pw="wrong")
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 403
    assert c.conn.phase == CLOSING
    c.send(0, pc.Connection.CloseOk())
    assert c.conn.close_transport


@pytest.mark.parametrize("peer,ok", [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                     ("::ffff:127.0.0.1", True), ("10.0.0.5", False),
                                     ("fe80::1%eth0", False), (None, False), ("garbage", False)])
def test_guest_only_from_loopback(peer: str | None, ok: bool) -> None:
    c = Client(peer=peer)
    c.start()
    c.login()
    out = c.recv()
    if ok:
        assert out[0][1].name == "Connection.Tune"
    else:
        close = out[0][1]
        assert close.name == "Connection.Close" and close.reply_code == 403
        assert "can only connect via localhost" in close.reply_text


def _throttled(t: LoginThrottle, clock: Clock, peer: str = "10.0.0.5",
               caps: dict[str, Any] | None = None, pw: str = "guest") -> Client:
    c = Client(WireConfig(loopback_users=[]), caps=caps, peer=peer)
    c.clock = clock  # one node clock for all of its connections
    c.conn = Connection(c.p, ConnId("n1", 2), c.conn.config, clock, peer_host=peer,
                        login_gate=t)
    c.start()
    c.login(pw=pw)
    return c


def test_throttled_login_answer_is_held_then_the_right_password_gets_in() -> None:
    """Decided at login time through the gate the shell passes in: after the free
    failures the answer (right or wrong) is withheld; the right password still
    opens the connection once the hold is over (NATed users are not locked out)."""
    t, clk = LoginThrottle(limit=2, window=60.0, delay=1.0, max_delay=10.0), Clock()
    for _ in range(2):
        c = _throttled(t, clk, pw="wrong")
        assert c.names() == ["Connection.Close"] and not c.conn.held()
    c = _throttled(t, clk, pw="wrong")  # the third failure: held 1 s
    assert c.conn.held() and c.recv() == []
    c.clock.t += 1.0
    assert not c.conn.held()
    [(_, close)] = c.recv()
    assert close.reply_code == 403
    c = _throttled(t, clk)  # right password, 3 failures: held 2 s
    assert c.recv() == []
    c.clock.t += 1.9
    c.conn.tick()  # no deadline runs while held
    assert c.recv() == []
    c.clock.t += 0.1
    [(_, tune)] = c.recv()
    assert isinstance(tune, pc.Connection.Tune)
    assert t.failures("10.0.0.5", c.clock.t) == 3  # a success resets nothing


def test_failed_login_without_close_capability_hangs_up_only_after_the_hold() -> None:
    t, clk = LoginThrottle(limit=1, window=60.0, delay=1.0), Clock()
    _throttled(t, clk, caps={}, pw="wrong")
    c = _throttled(t, clk, caps={}, pw="wrong")
    assert c.conn.close_transport and c.conn.held()  # the shell must not close yet
    c.clock.t += 1.0
    assert not c.conn.held()


def test_refused_unchecked_when_the_address_queue_is_full() -> None:
    t, clk = LoginThrottle(limit=1, window=60.0, delay=5.0, max_delay=5.0, max_wait=6.0), Clock()
    _throttled(t, clk, pw="wrong")
    _throttled(t, clk, pw="wrong")  # held 5 s
    c = _throttled(t, clk)  # would be answered in 10 s > max_wait: refused at once
    [(_, close)] = c.recv()
    assert close.reply_code == 403 and "too many login attempts" in close.reply_text
    assert t.failures("10.0.0.5", c.clock.t) == 2  # not counted: the password was not looked at


def test_handshake_deadline_moves_with_the_hold() -> None:
    t, clk = LoginThrottle(limit=1, window=60.0, delay=8.0, max_delay=8.0), Clock()
    _throttled(t, clk, pw="wrong")
    c = _throttled(t, clk)  # held 8 s, then the client has handshake_timeout (10 s) to open
    c.clock.t += 8.0
    c.recv()
    c.clock.t += 9.0
    c.conn.tick()
    assert not c.conn.close_transport
    c.clock.t += 1.5
    c.conn.tick()
    assert c.conn.close_transport


def test_connection_limit_is_asked_at_open() -> None:
    asked: list[int] = []

    def gate() -> str | None:
        asked.append(1)
        return "connection limit (2) of node n1 is reached"
    c = Client()
    c.conn = Connection(c.p, ConnId("n1", 3), WireConfig(), c.clock, peer_host="127.0.0.1",
                        open_gate=gate)
    c.start()
    c.login()
    c.recv()
    assert not asked  # not at accept nor at login
    c.send(0, pc.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0),
           pc.Connection.Open(virtual_host="/"))
    close = c.recv()[-1][1]
    assert close.name == "Connection.Close" and close.reply_code == 530
    assert "connection limit (2)" in close.reply_text and asked == [1]


def test_loopback_users_configurable() -> None:
    cfg = WireConfig(users={"guest": "guest", "app": "pw"}, loopback_users=[])
    c = Client(cfg, peer="10.0.0.5")
    c.start()
    c.login()
    assert c.recv()[0][1].name == "Connection.Tune"
    cfg = WireConfig(users={"guest": "guest", "app": "pw"}, loopback_users=["app"])
    c = Client(cfg, peer="10.0.0.5")
    c.start()
    c.login(user="app", pw="pw")
    assert c.recv()[0][1].reply_code == 403


def test_auth_failure_without_capability_just_closes() -> None:
    c = Client(caps={})
    c.start()
    c.login(pw="wrong")
    assert c.recv() == []
    assert c.conn.close_transport


def test_tune_negotiation_min_and_zero() -> None:
    c = Client(WireConfig(frame_max=65536, channel_max=100))
    c.start()
    c.login()
    c.recv()
    c.send(0, pc.Connection.TuneOk(channel_max=0, frame_max=8192, heartbeat=10))
    assert (c.conn.channel_max, c.conn.frame_max, c.conn.heartbeat) == (100, 8192, 10)
    assert c.conn.reader.frame_max == 8192


def test_tune_zero_frame_max_means_ours() -> None:
    c = Client(WireConfig(frame_max=65536))
    c.start()
    c.login()
    c.recv()
    c.send(0, pc.Connection.TuneOk(channel_max=10, frame_max=0, heartbeat=0))
    assert (c.conn.channel_max, c.conn.frame_max) == (10, 65536)


def test_other_vhost_not_allowed() -> None:
    c = Client()
    c.start()
    c.login()
    c.recv()
    c.send(0, pc.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=0),
           pc.Connection.Open("other"))
    close = c.close_frame()
    assert close.reply_code == 530


def test_client_close_proposes_connection_close() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(0, pc.Connection.Close(200, "bye", 0, 0))
    assert c.names() == ["Connection.CloseOk"]
    assert c.p.of(C.ConnectionClose) == [C.ConnectionClose(ConnId("n1", 1))]
    assert c.conn.phase == CLOSED


def test_after_close_ok_the_socket_lingers_dropping_input_until_close_timeout() -> None:
    """RabbitMQ's `closed` state: frames the client sent after its Close (amqplib
    writes Close ahead of buffered publishes) are read and dropped, not answered
    with a RST by an already closed socket; the client hangs up, or we do after
    close_timeout."""
    c = Client(WireConfig(close_timeout=3.0))
    c.handshake()
    c.open(1)
    c.send(0, pc.Connection.Close(200, "bye", 0, 0),
           pc.Basic.Publish(exchange="", routing_key="q"))
    assert c.names() == ["Connection.CloseOk"] and not c.conn.close_transport
    c.send(1, pc.Basic.Publish(exchange="", routing_key="q"))
    c.conn.tick()
    assert c.recv() == [] and not c.conn.close_transport
    assert len(c.p.of(C.ConnectionClose)) == 1 and not c.p.of(C.BasicPublish)
    c.clock.t += 3.0
    c.conn.tick()
    assert c.conn.close_transport


def test_tcp_loss_proposes_connection_close_once() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.conn.connection_lost()
    c.conn.connection_lost()
    assert len(c.p.of(C.ConnectionClose)) == 1


# ---------------------------------------------------------------- heartbeats

def test_s08_heartbeat_sent_when_idle_and_dead_peer_closed() -> None:
    c = Client()
    c.handshake(heartbeat=10)
    c.open(1)
    c.clock.t += 5
    c.conn.tick()
    assert c.conn.take_output() == frame.HEARTBEAT
    c.clock.t += 10
    c.raw(frame.HEARTBEAT)  # peer alive
    c.conn.tick()
    assert not c.conn.close_transport
    c.clock.t += 21
    c.conn.tick()
    assert c.conn.close_transport
    assert len(c.p.of(C.ConnectionClose)) == 1


# ---------------------------------------------------------------- frame errors

def test_unknown_method_is_connection_error() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    payload = struct.pack(">HH", 60, 99)
    c.raw(frame.encode_frame(frame.FRAME_METHOD, 1, payload))
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (540, 60, 99)


def test_undecodable_arguments_syntax_error() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.raw(frame.encode_frame(frame.FRAME_METHOD, 1, struct.pack(">HH", 50, 10) + b"\x00"))
    close = c.close_frame()
    assert (close.reply_code, close.class_id, close.method_id) == (502, 50, 10)


def test_bad_frame_end_is_frame_error() -> None:
    c = Client()
    c.handshake()
    c.raw(struct.pack(">BHI", 1, 0, 4) + b"abcd\x00")
    close = c.close_frame()
    assert close.reply_code == 501
    assert c.conn.close_transport


def test_frame_over_frame_max_detected_from_header() -> None:
    c = Client()
    c.handshake(frame_max=4096)
    c.raw(struct.pack(">BHI", 3, 1, 5000))  # header only, no payload yet
    close = c.close_frame()
    assert close.reply_code == 501
    assert c.conn.close_transport
    assert len(c.conn.reader.buf) < 4096


def test_body_without_header_unexpected_frame_505() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, ContentBody(b"abc"))
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 505


def test_method_where_header_expected_505() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, pc.Basic.Publish(exchange="", routing_key="q"), pc.Queue.Declare(queue="x"))
    close = c.close_frame()
    assert close.reply_code == 505


def test_body_longer_than_declared_501() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, pc.Basic.Publish(exchange="", routing_key="q"),
           pheader.ContentHeader(0, 3, pc.Basic.Properties()), ContentBody(b"abcde"))
    close = c.close_frame()
    assert close.reply_code == 501
    assert c.p.of(C.BasicPublish) == []


def test_body_too_large_406_channel_error_and_discard() -> None:
    c = Client(WireConfig(max_message_size=10))
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Basic.Publish(exchange="", routing_key="q"),
           pheader.ContentHeader(0, 20, pc.Basic.Properties()), ContentBody(b"x" * 20))
    close = c.close_frame()
    assert isinstance(close, pc.Channel.Close) and close.reply_code == 406
    assert C.ChannelClose(chan, False) in c.p.cmds
    assert c.p.of(C.BasicPublish) == []
    # frames until CloseOk are dropped; then the number can be reopened
    c.send(1, pc.Queue.Declare(queue="x"))
    assert c.p.of(C.QueueDeclare) == [] and c.recv() == []
    c.send(1, pc.Channel.CloseOk())
    chan2 = c.open(1)
    assert chan2 != chan


def test_504_method_on_unopened_channel() -> None:
    c = Client()
    c.handshake()
    c.send(2, pc.Queue.Declare(queue="q"))
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 504


def test_504_second_channel_open() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, pc.Channel.Open())
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 504


def test_closing_connection_ignores_everything_but_close_ok() -> None:
    c = Client()
    c.handshake()
    c.send(2, pc.Queue.Declare(queue="q"))
    c.recv()
    c.send(0, pc.Channel.Open())
    c.send(1, pc.Channel.Open())
    assert c.recv() == [] and not c.conn.close_transport
    c.send(0, pc.Connection.CloseOk())
    assert c.conn.phase == CLOSED and c.conn.close_transport


def test_close_timeout() -> None:
    c = Client()
    c.handshake()
    c.send(2, pc.Queue.Declare(queue="q"))
    c.recv()
    c.clock.t += 10
    c.conn.tick()
    assert c.conn.close_transport


def test_channel_error_effect_closes_without_proposal() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    n = len(c.p.cmds)
    c.effects(E.ChannelError(chan, 404, "NOT_FOUND - no queue 'x'", 50, 10))
    close = c.close_frame()
    assert isinstance(close, pc.Channel.Close) and close.reply_code == 404
    assert len(c.p.cmds) == n
    # a Close from the client meanwhile gets CloseOk
    c.send(1, pc.Channel.Close(200, "", 0, 0))
    assert c.names() == ["Channel.CloseOk"]


def test_connection_error_effect() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.effects(E.ConnectionFailure(c.conn.id, 530, "NOT_ALLOWED - x", 50, 10))
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 530


# ---------------------------------------------------------------- mapping

def test_channel_open_proposed_and_reopen_gets_new_id() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    assert c.p.cmds == [C.ChannelOpen(chan)]
    c.send(1, pc.Channel.Close(200, "", 0, 0))
    assert c.p.cmds[-1] == C.ChannelClose(chan, True)
    c.effects(E.Reply(chan, "Channel.CloseOk", {}))
    assert c.names() == ["Channel.CloseOk"]
    assert c.open(1) != chan


def test_queue_declare_and_reply_effect() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Queue.Declare(queue="q", durable=True, arguments={"x-a": 1}))
    # no default bound (issue 27): default_max_length 0, as every new node sends
    assert c.p.cmds[-1] == C.QueueDeclare(chan, "q", False, True, False, False, {"x-a": 1}, False,
                                         0)
    c.effects(E.Reply(chan, "Queue.DeclareOk", {"queue": "q", "message_count": 0,
                                                "consumer_count": 0}))
    [(ch, ok)] = c.recv()
    assert ch == 1 and isinstance(ok, pc.Queue.DeclareOk) and ok.queue == "q"


def test_basic_qos_prefetch_size_is_540_like_rabbitmq() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, pc.Basic.Qos(prefetch_size=100, prefetch_count=1))
    assert c.close_frame().reply_code == 540


def test_recover_requeue_false_and_immediate_540() -> None:
    for objs in ([pc.Basic.Recover(requeue=False)], [pc.Basic.RecoverAsync(requeue=False)]):
        c = Client()
        c.handshake()
        c.open(1)
        c.send(1, *objs)
        assert c.close_frame().reply_code == 540
    c = Client()
    c.handshake()
    c.open(1)
    c.publish(1, b"x", immediate=True)
    assert c.close_frame().reply_code == 540


def test_publish_props_and_multi_frame_body() -> None:
    c = Client()
    c.handshake(frame_max=4096)
    chan = c.open(1)
    body = b"y" * 10000
    c.raw(frame.encode_publish(1, "ex", "rk", {"delivery_mode": 2, "headers": {"h": "v"}},
                               body, 4096, mandatory=True))
    [pub] = c.p.of(C.BasicPublish)
    assert pub == C.BasicPublish(chan, 0, "ex", "rk", True,
                                 {"delivery_mode": 2, "headers": {"h": "v"}}, body)


def test_deliver_and_credit_grant_once_per_consumer() -> None:
    c = Client()
    c.handshake(frame_max=4096)
    chan = c.open(1)
    c.send(1, pc.Basic.Consume(queue="q", consumer_tag="ct"))
    assert c.p.cmds[-1].credit == 256
    body = b"z" * 5000
    c.effects(*[E.Deliver(chan, "ct", i, False, "", "q", {}, body) for i in (1, 2, 3)])
    got = c.recv()
    assert [type(f).__name__ for _, f in got].count("Deliver") == 3
    assert all(not isinstance(f, ContentBody) or len(f.value) <= 4096 - 8 for _, f in got)
    assert c.p.of(C.BasicCredit) == [C.BasicCredit(chan, "ct", 3)]


def test_s11_credit_held_while_writing_paused() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.conn.writing_paused = True
    c.effects(E.Deliver(chan, "ct", 1, False, "", "q", {}, b"a"))
    assert c.p.of(C.BasicCredit) == []
    c.conn.writing_paused = False
    c.conn.grant_credit()
    assert c.p.of(C.BasicCredit) == [C.BasicCredit(chan, "ct", 1)]


def test_consumer_cancelled_only_with_capability() -> None:
    for caps, expect in (({"consumer_cancel_notify": True}, ["Basic.Cancel"]), ({}, [])):
        c = Client(caps=caps)
        c.handshake()
        chan = c.open(1)
        c.effects(E.ConsumerCancelled(chan, "ct"))
        assert c.names() == expect


def test_effects_for_old_channel_incarnation_dropped() -> None:
    c = Client()
    c.handshake()
    old = c.open(1)
    c.send(1, pc.Channel.Close(200, "", 0, 0))
    c.effects(E.Reply(old, "Channel.CloseOk", {}))
    c.recv()
    c.open(1)
    c.effects(E.Deliver(old, "ct", 1, False, "", "q", {}, b"a"))
    assert c.recv() == []


def test_blocked_notification() -> None:
    c = Client()
    c.handshake()
    assert c.conn.set_blocked("low on memory")
    assert not c.conn.set_blocked("low on memory")
    frames = [f for _, f in c.recv()]
    assert [f.name for f in frames] == ["Connection.Blocked"]
    assert frames[0].reason == "low on memory"
    assert c.conn.set_blocked(None)
    assert c.names() == ["Connection.Unblocked"]


# ---------------------------------------------------------------- confirms

def _acks(c: Client) -> list[tuple[str, int, bool]]:
    return [(f.name, f.delivery_tag, f.multiple) for _, f in c.recv()
            if isinstance(f, (pc.Basic.Ack, pc.Basic.Nack))]


def test_s13_confirm_on_tx_channel_406() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Tx.Select(), pc.Confirm.Select())
    close = c.close_frame()
    assert isinstance(close, pc.Channel.Close) and close.reply_code == 406
    assert (close.class_id, close.method_id) == (85, 10)
    assert C.ChannelClose(chan, False) in c.p.cmds


def test_s13_tx_on_confirm_channel_406() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Confirm.Select(nowait=True), pc.Tx.Select())
    close = c.close_frame()
    assert close.reply_code == 406 and (close.class_id, close.method_id) == (90, 10)
    assert c.p.of(C.Echo) == []  # nowait: no SelectOk
    assert C.ChannelClose(chan, False) in c.p.cmds


def test_s13_confirm_select_ok_via_echo() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Confirm.Select())
    assert c.p.cmds[-1] == C.Echo(chan, "Confirm.SelectOk", {})


def test_s14_publishes_numbered_from_one_only_in_confirm_mode() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.publish(1, b"a")
    c.send(1, pc.Confirm.Select())
    c.publish(1, b"b")
    c.publish(1, b"")
    assert [p.seq for p in c.p.of(C.BasicPublish)] == [0, 1, 2]


def test_s15_coalesced_ack_multiple() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Confirm.Select(nowait=True))
    for _ in range(5):
        c.publish(1, b"m")
    c.effects(*[E.Confirm(chan, s, True) for s in (1, 2, 3)])
    assert _acks(c) == [("Basic.Ack", 3, True)]
    c.effects(E.Confirm(chan, 4, True))
    assert _acks(c) == [("Basic.Ack", 4, False)]


def test_s15_out_of_order_never_covers_pending() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Confirm.Select(nowait=True))
    for _ in range(6):
        c.publish(1, b"m")
    # 2 pending while 3, 4 resolve: they go out individually
    c.effects(E.Confirm(chan, 1, True), E.Confirm(chan, 3, True), E.Confirm(chan, 4, False))
    assert _acks(c) == [("Basic.Ack", 1, False), ("Basic.Ack", 3, False),
                        ("Basic.Nack", 4, False)]
    c.effects(E.Confirm(chan, 6, True), E.Confirm(chan, 2, True), E.Confirm(chan, 5, True))
    # 2 resolves the gap; 3, 4 already reported are skipped; run continues to 6
    assert _acks(c) == [("Basic.Ack", 6, True)]


def test_s15_nack_breaks_run_and_never_multiple() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Confirm.Select(nowait=True))
    for _ in range(5):
        c.publish(1, b"m")
    c.effects(*[E.Confirm(chan, s, s != 3) for s in (1, 2, 3, 4, 5)])
    assert _acks(c) == [("Basic.Ack", 2, True), ("Basic.Nack", 3, False),
                        ("Basic.Ack", 5, True)]


def test_s15_each_seq_reported_exactly_once_randomized() -> None:
    import random

    rnd = random.Random(7)
    for _ in range(50):
        n = rnd.randint(1, 60)
        order = list(range(1, n + 1))
        rnd.shuffle(order)
        outcome = {s: rnd.random() < 0.8 for s in order}
        t = ConfirmTracker()
        client_outstanding = set(range(1, n + 1))
        resolved: set[int] = set()
        i = 0
        while i < n:
            k = rnd.randint(1, 8)
            for s in order[i:i + k]:
                t.add(s, outcome[s])
                resolved.add(s)
            i += k
            for seq, ack, multiple in t.flush():
                covered = ({x for x in client_outstanding if x <= seq} if multiple else {seq})
                assert covered <= resolved, "covers a pending seq"
                assert seq in client_outstanding, "reported twice"
                assert all(outcome[x] == ack for x in covered), "ack covers a nack"
                client_outstanding -= covered
        assert not client_outstanding


def test_s22_many_outstanding_is_fast() -> None:
    import time

    t = ConfirmTracker()
    start = time.perf_counter()
    n = 100_000
    for s in range(2, n + 1):  # seq 1 pending: everything goes out individually
        t.add(s, True)
        if s % 100 == 0:
            t.flush()
    t.add(1, True)
    out = t.flush()
    out += t.flush()
    assert out == [(1, True, False)] or out[-1][0] >= 1
    assert time.perf_counter() - start < 2.0


def test_confirms_flushed_before_channel_close_ok() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Confirm.Select(nowait=True))
    c.publish(1, b"m")
    c.send(1, pc.Channel.Close(200, "", 0, 0))
    c.effects(E.Confirm(chan, 1, True), E.Reply(chan, "Channel.CloseOk", {}))
    # client-closed channel: no further confirms, CloseOk goes out
    assert c.names() == ["Channel.CloseOk"]


# ---------------------------------------------------------------- tx (S24)

def test_s24_tx_buffers_until_commit() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Tx.Select())
    assert c.p.cmds[-1] == C.Echo(chan, "Tx.SelectOk", {})
    c.publish(1, b"a")
    c.send(1, pc.Basic.Ack(5, False), pc.Basic.Reject(6, True), pc.Basic.Nack(7, True, False))
    c.publish(1, b"b")
    assert c.p.of(C.BasicPublish) == [] and c.p.of(C.BasicAck) == []
    c.send(1, pc.Tx.Commit())
    [commit] = c.p.of(C.TxCommit)
    assert [type(x).__name__ for x in commit.commands] == [
        "BasicPublish", "BasicAck", "BasicNack", "BasicNack", "BasicPublish"]
    assert commit.commands[2] == C.BasicNack(chan, 6, False, True, True)
    assert commit.commands[3] == C.BasicNack(chan, 7, True, False, False)
    assert all(x.seq == 0 for x in commit.commands if isinstance(x, C.BasicPublish))


def test_s24_tx_rollback_drops_buffer() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Tx.Select())
    c.publish(1, b"a")
    c.send(1, pc.Tx.Rollback())
    assert c.p.cmds[-1] == C.Echo(chan, "Tx.RollbackOk", {})
    c.send(1, pc.Tx.Commit())
    assert c.p.cmds[-1] == C.TxCommit(chan, ())


def test_tx_commit_on_non_tx_channel_406() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, pc.Tx.Commit())
    assert c.close_frame().reply_code == 406


def test_ack_nack_reject_outside_tx() -> None:
    c = Client()
    c.handshake()
    chan = c.open(1)
    c.send(1, pc.Basic.Ack(3, True), pc.Basic.Nack(4, False, False), pc.Basic.Reject(5, False))
    assert c.p.cmds[1:] == [C.BasicAck(chan, 3, True), C.BasicNack(chan, 4, False, False, False),
                            C.BasicNack(chan, 5, False, False, True)]


def test_garbage_never_raises() -> None:
    import random

    rnd = random.Random(1)
    for _ in range(200):
        c = Client()
        c.handshake()
        c.open(1)
        c.raw(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 64))))
        c.recv() if c.conn.out and not c.conn.out[0].startswith(b"AMQP") else None


@pytest.mark.parametrize("chan", [0, 1, 5])
def test_unknown_frame_type_after_handshake_is_501_on_any_channel(chan: int) -> None:
    # open channel 1, channel 5 never opened, channel 0: always FRAME_ERROR, never 504
    c = Client()
    c.handshake()
    c.open(1)
    c.raw(struct.pack(">BHI", 9, chan, 1) + b"x\xce")
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 501, close
    assert "unknown frame type 9" in close.reply_text


def test_channel_max_limits_open_channels_not_their_numbers() -> None:
    c = Client(WireConfig(channel_max=3))
    c.start()
    c.login()
    c.recv()
    c.send(0, pc.Connection.TuneOk(channel_max=3, frame_max=131072, heartbeat=0),
           pc.Connection.Open("/"))
    assert c.names() == ["Connection.OpenOk"]
    for n in (65535, 7, 2):  # any numbers, while fewer than 3 are open
        c.open(n)
    c.send(1, pc.Channel.Open())
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 530, close
    assert close.reply_text == ("NOT_ALLOWED - number of channels opened (3) has reached "
                                "the negotiated channel_max (3)")
