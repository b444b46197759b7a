"""Issue 26 item 6: the bytes a connection holds in unfinished bodies and open
transactions are counted (per connection and node-wide), and past its buffer
limit the connection is not read beyond its next publish."""
from __future__ import annotations

from pamqp import commands as pc
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from node.amqp.channel import ChannelException
from node.amqp.config import WireConfig
from node.amqp.connection import BUFFER_FULL, Connection
from node.amqp.endpoint import HeldBytes
from node.broker.ids import ConnId
from node.replication import command as C
from tests.support.wire_client import Client

C_ERR = ChannelException(406, "PRECONDITION_FAILED - test")


def _start(c: Client, chan: int, size: int) -> None:
    c.send(chan, pc.Basic.Publish(exchange="", routing_key="q"),
           pheader.ContentHeader(0, size, pc.Basic.Properties()))


def _publish(c: Client, chan: int, body: bytes) -> None:
    c.send(chan, pc.Basic.Publish(exchange="", routing_key="q"),
           pheader.ContentHeader(0, len(body), pc.Basic.Properties()), ContentBody(body))


def test_unfinished_bodies_on_many_channels_are_counted_and_freed() -> None:
    gauge = HeldBytes()
    c = Client()
    c.conn = Connection(c.p, ConnId("n1", 1), WireConfig(), c.clock, peer_host="127.0.0.1",
                        gauge=gauge)
    c.handshake()
    for n in (1, 2, 3):
        c.open(n)
        _start(c, n, 1000)
        c.send(n, ContentBody(b"x" * 100))
    assert c.conn.held_bytes == gauge.total == 300
    c.send(1, ContentBody(b"y" * 900))  # channel 1's message completes: published, not held
    assert c.conn.held_bytes == 200 and len(c.p.of(C.BasicPublish)) == 1
    c.conn.connection_lost()
    assert c.conn.held_bytes == gauge.total == 0


def test_a_connection_error_frees_what_it_held() -> None:
    gauge = HeldBytes()
    c = Client()
    c.conn = Connection(c.p, ConnId("n1", 1), WireConfig(), c.clock, peer_host="127.0.0.1",
                        gauge=gauge)
    c.handshake()
    c.open(1)
    _start(c, 1, 1000)
    c.send(1, ContentBody(b"x" * 100))
    # a method where the body should continue: 505, the connection is gone
    c.send(1, pc.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert c.close_frame().reply_code == 505
    assert c.conn.held_bytes == gauge.total == 0


def test_transaction_is_counted_until_commit_or_rollback() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, pc.Tx.Select())
    for _ in range(3):
        _publish(c, 1, b"z" * 50)
    assert c.conn.held_bytes == 150
    c.send(1, pc.Tx.Rollback())
    assert c.conn.held_bytes == 0
    _publish(c, 1, b"z" * 70)
    assert c.conn.held_bytes == 70
    c.send(1, pc.Tx.Commit())
    assert c.conn.held_bytes == 0 and len(c.p.of(C.TxCommit)) == 1
    _publish(c, 1, b"z" * 30)
    c.send(1, pc.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert c.conn.held_bytes == 0  # closing the channel drops its transaction


def test_channel_error_frees_the_transaction() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, pc.Tx.Select())
    _publish(c, 1, b"z" * 50)
    c.send(1, pc.Confirm.Select())  # 406: tx -> confirm is not allowed
    assert c.conn.held_bytes == 0


def test_over_its_buffer_a_connection_is_held_at_the_next_publish() -> None:
    c = Client(WireConfig(max_connection_buffer=100))
    c.handshake()
    c.open(1)
    c.send(1, pc.Tx.Select())
    c.recv()
    _publish(c, 1, b"a" * 80)
    assert not c.conn.input_held and c.recv() == []
    _publish(c, 1, b"b" * 80)  # 160 > 100: blocked (the client asked to be told)
    assert c.conn.held_bytes == 160
    [(chan, blocked)] = c.recv()
    assert chan == 0
    assert isinstance(blocked, pc.Connection.Blocked) and blocked.reason == BUFFER_FULL
    _publish(c, 1, b"c" * 80)  # held unread: not in the transaction
    assert c.conn.input_held and c.conn.held_bytes == 160
    c.conn.retry_input()  # nothing changed: still held
    assert c.conn.input_held
    # the client saw connection.blocked and rolls back on another channel's terms:
    # closing channel 1 is behind the held publish, so a channel error frees it here
    c.conn.channel_error(c.conn.channels[1], C_ERR)
    assert c.conn.held_bytes == 0
    c.conn.retry_input()  # the held publish is read now (dropped: channel 1 is closing)
    assert not c.conn.input_held
    assert isinstance(c.recv()[-1][1], pc.Connection.Unblocked)


def test_commit_ahead_of_the_next_publish_unblocks() -> None:
    c = Client(WireConfig(max_connection_buffer=100))
    c.handshake()
    c.open(1)
    c.send(1, pc.Tx.Select())
    c.recv()
    _publish(c, 1, b"a" * 150)  # one message may always finish, even past the limit
    assert c.conn.held_bytes == 150 and not c.conn.input_held
    c.send(1, pc.Tx.Commit())
    assert c.conn.held_bytes == 0 and not c.conn.input_held
    names = [type(f).__name__ for _, f in c.recv()]
    assert names == ["Blocked", "Unblocked"]


def test_several_unfinished_bodies_over_the_limit_stop_reading() -> None:
    c = Client(WireConfig(max_connection_buffer=1000))
    c.handshake()
    for n in (1, 2):
        c.open(n)
        _start(c, n, 100_000)
    c.send(1, ContentBody(b"x" * 600))
    c.send(2, ContentBody(b"x" * 600))  # 1200 > 1000
    assert c.conn.held_bytes == 1200
    c.raw(pframe.marshal(ContentBody(b"x" * 600), 1) * 50)  # 30 KB more arrive
    assert c.conn.held_bytes == 1200 and c.conn.input_held
    c.conn.retry_input()
    assert c.conn.held_bytes == 1200  # bounded until the client closes


def test_no_limit_without_watermark_or_cap() -> None:
    assert WireConfig().connection_buffer_limit() == 0
    assert WireConfig(memory_high_watermark=400).connection_buffer_limit() == 100
    assert WireConfig(memory_high_watermark=400,
                      max_connection_buffer=7).connection_buffer_limit() == 7


def test_node_wide_alarm_holds_publishes_not_acks_or_commits() -> None:
    c = Client()
    c.handshake()
    c.open(1)
    c.send(1, pc.Tx.Select())
    _publish(c, 1, b"a" * 10)
    c.recv()
    assert c.conn.set_blocked("low on memory")
    assert isinstance(c.recv()[0][1], pc.Connection.Blocked)
    c.send(1, pc.Basic.Ack(delivery_tag=1))
    c.send(1, pc.Tx.Commit())  # the transaction can end under the alarm
    assert len(c.p.of(C.TxCommit)) == 1 and c.conn.held_bytes == 0
    _publish(c, 1, b"b" * 10)
    c.send(1, pc.Tx.Commit())  # behind the held publish: waits with it
    assert c.conn.input_held and len(c.p.of(C.TxCommit)) == 1
    assert c.conn.set_blocked(None)
    c.conn.retry_input()
    assert not c.conn.input_held and len(c.p.of(C.TxCommit)) == 2
