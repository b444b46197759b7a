"""Connection life on real sockets: heartbeats both ways, frame_max splitting."""
from __future__ import annotations

import time
from typing import Any

from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

from harness.amqp import Closed, RawClient
from tests.broker_proc import Broker
from tests.support.pika_session import Amqp


def test_s08_missed_heartbeats_close_connection_and_requeue(broker: Broker, amqp: Amqp) -> None:
    q = amqp.queue()
    amqp.publish(q, [b"h1", b"h2", b"h3"])
    c = RawClient(broker)
    try:
        c.handshake(heartbeat=1)
        c.open_channel(1)
        c.call(spec.Basic.Consume(queue=q, consumer_tag="hb"), spec.Basic.ConsumeOk)
        got = []
        for _ in range(3):
            got.append(c.expect(spec.Basic.Deliver)[1])
            c.expect(pheader.ContentHeader)
            c.expect(pbody.ContentBody)
        assert [d.redelivered for d in got] == [False] * 3
        assert amqp.count(q) == 0
        # Now stay silent (never ack, never send a heartbeat) but keep reading:
        # the broker must keep sending heartbeats and then give up on us.
        heartbeats = 0
        start = time.monotonic()
        closed_after = None
        while time.monotonic() - start < 15:
            try:
                c._fill(0.5)
            except TimeoutError:
                continue
            except (Closed, ConnectionResetError):
                closed_after = time.monotonic() - start
                break
            while (f := c.try_frame()) is not None:
                if isinstance(f[1], pheartbeat.Heartbeat):
                    heartbeats += 1
        assert closed_after is not None, "broker kept a silent peer for 15 s with heartbeat=1"
        assert heartbeats >= 1, "broker sent no heartbeat while we were silent"
        assert closed_after < 8, f"dead peer detected only after {closed_after:.1f}s"
    finally:
        c.close()
    # S08: its three unacked deliveries are back, and S07: redelivered
    amqp.wait_count(q, 3)
    assert amqp.drain(q) == [(b"h1", True), (b"h2", True), (b"h3", True)]


def test_bodies_split_by_negotiated_frame_max(raw: Any, amqp: Amqp) -> None:
    q = amqp.queue()
    payload = bytes(range(256)) * 80  # 20,480 bytes
    c = raw(handshake=False)
    c.handshake(frame_max=4096)
    c.open_channel(1)
    c.publish("", q, payload)  # our client splits at 4088 bytes too
    c.send_frame(spec.Basic.Get(queue=q, no_ack=True), 1)
    c.expect(spec.Basic.GetOk)
    _, hdr = c.read_frame()
    assert isinstance(hdr, pheader.ContentHeader) and hdr.body_size == len(payload)
    parts = []
    while sum(map(len, parts)) < len(payload):
        _, part = c.read_frame()
        assert isinstance(part, pbody.ContentBody)
        assert len(part.value) <= 4096 - 8, f"body frame of {len(part.value)} bytes > frame_max"
        parts.append(part.value)
    assert b"".join(parts) == payload
    assert len(parts) == 6


def test_large_message_round_trip_with_pika(amqp: Amqp) -> None:
    q = amqp.queue()
    payload = b"0123456789abcdef" * 65536  # 1 MiB: eight frames at the default frame_max
    amqp.publish(q, [payload], persistent=True)
    assert amqp.drain(q) == [(payload, False)]
