"""Limits with clear errors (issue 7): channels per connection and message
size, on a real node configured with small values (and a setting from before
issue 27, default_queue_max_length, which is now ignored),
driven by pika. Each limit answers with its AMQP code, closes only what the
spec says, and the node keeps serving. (max_connections and the alarms have
their own tests in test_users.py and test_disk_alarm.py; frame_max in
test_bad_input.py.)"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands as spec

from harness.amqp import RawClient
from tests.broker_proc import NodeProcess, uniq

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own config")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    base = Path(tmp_path_factory.mktemp("limits"))
    cfg = base / "node.toml"
    cfg.write_text("channel_max = 3\nmax_message_size = 1000\ndefault_queue_max_length = 3\n")
    n = NodeProcess(base / "data", extra_args=("--config", str(cfg)))
    n.start()
    try:
        yield n
    finally:
        n.stop()


def connect(node: NodeProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0"))


def test_channel_max_is_negotiated_and_enforced(node: NodeProcess) -> None:
    with connect(node) as conn:
        assert conn._impl.params.channel_max == 3  # tune carried the limit
        chans = [conn.channel() for _ in range(3)]
        assert [c.channel_number for c in chans] == [1, 2, 3]
        with pytest.raises(pika.exceptions.NoFreeChannels):
            conn.channel()  # the client honours it ...
    # ... and a client that does not gets 530 NOT_ALLOWED for the connection once it
    # opens more than channel_max; the numbers themselves may be anything (RabbitMQ)
    raw = RawClient(node)
    try:
        raw.handshake()
        for n in (65535, 4, 9):
            raw.send_frame(spec.Channel.Open(), n)
            chan, reply = raw.read_frame()
            assert (chan, type(reply)) == (n, spec.Channel.OpenOk), (chan, reply)
        raw.send_frame(spec.Channel.Open(), 10)
        closes = [v for _, v in raw.read_until_closed() if isinstance(v, spec.Connection.Close)]
        assert closes and closes[0].reply_code == 530, closes
        assert "has reached the negotiated channel_max (3)" in closes[0].reply_text, closes
    finally:
        raw.close()


def test_message_size_over_max_is_a_channel_error(node: NodeProcess) -> None:
    q = uniq("size")
    with connect(node) as conn:
        ch = conn.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"x" * 1000)  # at the limit: fine
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch.basic_publish("", q, b"x" * 1001)
        assert exc.value.reply_code == 406 and "larger than configured max size 1000" in \
            exc.value.reply_text, exc.value
        ch2 = conn.channel()  # only the channel closed
        assert ch2.queue_declare(q, passive=True).method.message_count == 1
        ch2.queue_delete(q)


def test_old_default_queue_max_length_is_ignored_with_a_warning(node: NodeProcess) -> None:
    """Issue 27 item 6: the config still says default_queue_max_length = 3 (as a
    node.toml from before may): the node starts, logs one DEPRECATED warning and
    ignores it, so a queue without x-max-length takes a 4th message and more,
    as in RabbitMQ; a queue's own x-max-length is still enforced."""
    assert "DEPRECATED: default_queue_max_length in" in node.tail_log(200)
    q, own = uniq("deflen"), uniq("ownlen")
    with connect(node) as conn:
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        ch.queue_declare(own, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
        ch.confirm_delivery()
        for i in range(20):  # every one confirmed: no nack
            ch.basic_publish("", q, b"%d" % i, pika.BasicProperties(delivery_mode=2))
        assert ch.queue_declare(q, passive=True).method.message_count == 20
        for i in range(2):
            ch.basic_publish("", own, b"%d" % i)
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", own, b"2")
        assert ch.queue_declare(own, passive=True).method.message_count == 2
        ch.queue_delete(q)
        ch.queue_delete(own)


def test_frame_over_frame_min_size_before_tune_is_501(node: NodeProcess) -> None:
    """Before tune only frame-min-size (4096) frames are taken, as in RabbitMQ:
    an unauthenticated peer cannot feed the node a 100 KB field table (pamqp
    decodes tables in quadratic time). Under frame_max, so it is the pre-tune
    limit that refuses it."""
    from pamqp import frame as pframe
    from pamqp import header as pheader
    raw = RawClient(node)
    try:
        raw.send(pframe.marshal(pheader.ProtocolHeader(), 0))
        raw.expect(spec.Connection.Start)
        props = {f"k{i}": i for i in range(8_000)}  # ~100 KB of tiny entries: < frame_max
        start = time.monotonic()
        raw.send(pframe.marshal(spec.Connection.StartOk(
            client_properties=props, mechanism="PLAIN", response="\0guest\0guest",
            locale="en_US"), 0))
        closes = [v for _, v in raw.read_until_closed() if isinstance(v, spec.Connection.Close)]
        assert closes and closes[0].reply_code == 501 and "frame_too_large" in \
            closes[0].reply_text, closes
        assert time.monotonic() - start < 5.0
    finally:
        raw.close()
    with connect(node) as conn:  # everyone else keeps being served
        conn.channel().queue_declare("", exclusive=True)
