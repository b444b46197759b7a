"""Regression tests for the bugs tests/fuzz found (docs/fuzzing.md), one per bug.

The connection runs against the real state machine (the fuzzer's
LoopbackProposer), so each test goes from client bytes to what the client gets.
"""
from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import commands as pc
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from node.amqp import frame
from node.amqp.channel import AmqpError
from node.amqp.config import WireConfig
from node.amqp.connection import Connection
from node.broker.ids import ConnId
from tests.fuzz.fuzz_amqp import (
    HANDSHAKES,
    LoopbackProposer,
    check_state_clean,
    settle,
    unchecked_method,
)

CONN = ConnId("n1", 1)


class Loop:
    """A client on a connection whose proposer applies through apply_batch."""

    def __init__(self) -> None:
        self.p = LoopbackProposer()
        self.conn = Connection(self.p, CONN, WireConfig(), lambda: 5000.0, peer_host="127.0.0.1")
        self.raw(HANDSHAKES[0])  # PLAIN guest/guest, consumer_cancel_notify
        assert [f.name for _, f in self.recv()][-1] == "Connection.OpenOk"

    def raw(self, data: bytes) -> None:
        self.conn.data_received(data)  # an exception here is the bug
        settle(self.conn, self.p)

    def send(self, chan: int, *objs: Any) -> None:
        self.raw(b"".join(pframe.marshal(o, chan) for o in objs))

    def recv(self) -> list[tuple[int, Any]]:
        data = self.conn.take_output()
        out = []
        if data.startswith(b"AMQP"):
            data = data[8:]
        while data:
            n, ch, f = pframe.unmarshal(data)
            out.append((ch, f))
            data = data[n:]
        return out

    def names(self) -> list[str]:
        return [f.name for _, f in self.recv()]


def method_with_table(obj: Any, table: bytes) -> bytes:
    """Method frame of `obj` (arguments last, left empty) with a raw table spliced in."""
    obj.arguments = {}
    payload = struct.pack(">HH", int(obj.index) >> 16, obj.frame_id) + obj.marshal()[:-4] + table
    return frame.encode_frame(frame.FRAME_METHOD, 1, payload)


def table(*entries: tuple[bytes, bytes]) -> bytes:
    body = b"".join(bytes((len(k),)) + k + v for k, v in entries)
    return struct.pack(">I", len(body)) + body


def longstr(raw: bytes) -> bytes:
    return b"S" + struct.pack(">I", len(raw)) + raw


def nested(depth: int) -> bytes:
    value = b"V"
    for _ in range(depth):
        value = b"A" + struct.pack(">I", len(value)) + value
    return value


# ---------------------------------------------------------------- frame.py


@pytest.mark.parametrize("depth", [600, 3000])
def test_deeply_nested_table_is_a_syntax_error_not_a_recursion_error(depth: int) -> None:
    deep = table((b"k", nested(depth)))
    with pytest.raises(frame.BadArguments):
        frame.decode_method(method_with_table(pc.Queue.Declare(queue="q"), deep)[7:-1])
    with pytest.raises(frame.BadArguments):
        frame.decode_header(struct.pack(">HHQH", 60, 0, 0, 0x2000) + deep)
    assert frame.decode_amqplain(deep[4:]) == {}


def test_deeply_nested_arguments_close_the_connection_with_502() -> None:
    c = Loop()
    c.send(1, pc.Channel.Open())
    c.recv()
    c.raw(method_with_table(pc.Queue.Declare(queue="q"), table((b"k", nested(3000)))))
    [(_, close)] = c.recv()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 502


@pytest.mark.parametrize("headers", [
    table((b"a", longstr(b"\xff\xfe"))),  # not UTF-8: pamqp decodes it as bytes
    table((b"d", b"d" + struct.pack(">d", 1e300))),  # a double pamqp re-encodes as 'f'
])
def test_message_pamqp_cannot_reencode_is_still_delivered(headers: bytes) -> None:
    c = Loop()
    c.send(1, pc.Channel.Open(), pc.Queue.Declare(queue="q"), pc.Basic.Consume(queue="q"))
    assert c.names()[-1] == "Basic.ConsumeOk"
    hdr = struct.pack(">HHQH", 60, 0, 3, 0x2000) + headers
    c.raw(pframe.marshal(pc.Basic.Publish(routing_key="q"), 1)
          + frame.encode_frame(frame.FRAME_HEADER, 1, hdr) + pframe.marshal(ContentBody(b"abc"), 1))
    got = c.recv()
    assert [type(f).__name__ for _, f in got] == ["Deliver", "ContentHeader", "ContentBody"]
    _, _, props = frame.decode_header(hdr)
    assert got[1][1].properties.headers == props["headers"]


def test_message_with_delivery_mode_3_is_still_delivered() -> None:
    # pamqp decodes delivery_mode=3 but refuses to build Properties with it
    c = Loop()
    c.send(1, pc.Channel.Open(), pc.Queue.Declare(queue="q"), pc.Basic.Consume(queue="q"))
    c.recv()
    hdr = struct.pack(">HHQHB", 60, 0, 1, 0x1000, 3)
    c.raw(pframe.marshal(pc.Basic.Publish(routing_key="q"), 1)
          + frame.encode_frame(frame.FRAME_HEADER, 1, hdr) + pframe.marshal(ContentBody(b"x"), 1))
    got = c.recv()
    assert got[1][1].properties.delivery_mode == 3


@pytest.mark.parametrize("name", ["a b", "\x7f0", "\u2603"])
def test_queue_name_outside_the_spec_regex_is_echoed(name: str) -> None:
    # pamqp validates names when building a method, not when decoding one
    c = Loop()
    c.send(1, pc.Channel.Open())
    c.recv()
    c.raw(method_with_table(unchecked_method(pc.Queue.Declare, queue=name), b"\0\0\0\0"))
    c.raw(method_with_table(unchecked_method(pc.Basic.Consume, queue=name, consumer_tag=name),
                            b"\0\0\0\0"))
    got = c.recv()
    assert [f.name for _, f in got] == ["Queue.DeclareOk", "Basic.ConsumeOk"]
    assert got[0][1].queue == name and got[1][1].consumer_tag == name


# ---------------------------------------------------------------- channel.py


def test_reply_text_is_cut_at_255_bytes_not_characters() -> None:
    err = AmqpError(404, "NOT_FOUND - no queue '" + "\u00e9" * 127 + "' in vhost '/'")
    assert len(err.text.encode("utf-8")) <= 255
    c = Loop()
    c.send(1, pc.Channel.Open())
    c.recv()
    decl = unchecked_method(pc.Queue.Declare, queue="\u00e9" * 127, passive=True)
    c.raw(method_with_table(decl, b"\0\0\0\0"))
    [(_, close)] = c.recv()
    assert isinstance(close, pc.Channel.Close) and close.reply_code == 404


# ---------------------------------------------------------------- connection.py


def test_commands_after_a_connection_error_leave_nothing_in_the_state() -> None:
    # the 503 is decided in apply; the ChannelOpen behind it in the same batch
    # applied after the state had closed the connection
    c2 = Loop()
    c2.send(1, pc.Channel.Open())
    c2.recv()
    bad = unchecked_method(pc.Exchange.Declare, exchange="x", exchange_type="")
    c2.raw(method_with_table(bad, b"\x00\x00\x00\x00")
           + pframe.marshal(pc.Channel.Open(), 2)
           + pframe.marshal(pc.Queue.Declare(queue="q"), 2)
           + pframe.marshal(pc.Basic.Consume(queue="q", consumer_tag="t"), 2))
    assert "Connection.Close" in c2.names()
    check_state_clean(c2.p.state, CONN)
    assert not c2.p.state.channels


# ---------------------------------------------------------------- replication/machine/


def test_queue_argument_that_is_not_utf8_is_refused_not_raised() -> None:
    c = Loop()
    c.send(1, pc.Channel.Open())
    c.recv()
    args = table((b"x-dead-letter-exchange", longstr(b"\xde\xad")),
                 (b"x-max-length", b"I" + struct.pack(">i", 1)))
    c.raw(method_with_table(pc.Queue.Declare(queue="q"), args))
    assert c.names() == ["Queue.DeclareOk"]  # a (replaced) exchange name, as RabbitMQ takes any
    c.raw(method_with_table(pc.Queue.Declare(queue="q", passive=False), table(
        (b"x-dead-letter-exchange", longstr(b"\xbe\xef")))))
    [(_, close)] = c.recv()  # inequivalent args: the error text shows the value
    assert isinstance(close, pc.Channel.Close) and close.reply_code == 406


def test_headers_binding_and_alternate_exchange_that_are_not_utf8() -> None:
    c = Loop()
    c.send(1, pc.Channel.Open(), pc.Queue.Declare(queue="q"))
    c.recv()
    c.raw(method_with_table(pc.Exchange.Declare(exchange="h", exchange_type="headers"),
                            table((b"alternate-exchange", longstr(b"\xff")))))
    c.raw(method_with_table(pc.Queue.Bind(queue="q", exchange="h"),
                            table((b"x-match", longstr(b"\xff")), (b"a", longstr(b"1")))))
    assert c.names() == ["Exchange.DeclareOk", "Queue.BindOk"]
    for value in ("1", "2"):  # matched, and not (then the alternate exchange is looked up)
        c.send(1, pc.Basic.Publish(exchange="h", routing_key=""),
               pheader.ContentHeader(0, 1, pc.Basic.Properties(headers={"a": value})),
               ContentBody(b"x"))
        assert c.names() == []  # routed or not, but no exception out of apply


def test_dead_letter_routing_key_over_255_bytes_is_refused() -> None:
    c = Loop()
    c.send(1, pc.Channel.Open(), pc.Queue.Declare(queue="q1", arguments={
        "x-max-length": 1, "x-dead-letter-exchange": "amq.topic",
        "x-dead-letter-routing-key": "k" * 300}))
    got = c.recv()
    close = got[-1][1]
    assert isinstance(close, pc.Channel.Close) and close.reply_code == 406
    assert "x-dead-letter-routing-key" in close.reply_text
