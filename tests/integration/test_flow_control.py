"""connection.blocked / unblocked under a memory high watermark (own_node)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.broker_proc import NodeProcess, uniq
from tests.support.pika_session import Amqp, pump_until

pytestmark = pytest.mark.own_node


@pytest.fixture
def low_watermark_node(tmp_path: Path) -> Any:
    if os.environ.get("MIRRORQ_TARGET"):
        pytest.skip("needs a mirrorq node of its own")
    node = NodeProcess(tmp_path / "data", config="memory_high_watermark = 200000\n")
    try:
        yield node
    finally:
        node.kill9()


def test_memory_watermark_blocks_publishers_and_drain_unblocks(low_watermark_node: NodeProcess) -> None:
    node = low_watermark_node
    node.start()
    amqp = Amqp(node)
    try:
        conn = amqp.connect(blocked_connection_timeout=60)
        events: list[str] = []
        conn.add_on_connection_blocked_callback(lambda _c, _f: events.append("blocked"))
        conn.add_on_connection_unblocked_callback(lambda _c, _f: events.append("unblocked"))
        ch = conn.channel()
        q = uniq("flow")
        ch.queue_declare(q)
        body = b"x" * 10_000
        for _ in range(100):                     # 1 MB, five times the watermark
            ch.basic_publish("", q, body)
            conn.process_data_events(time_limit=0)
            if "blocked" in events:
                break
        pump_until(conn, lambda: "blocked" in events, timeout=20, what="connection.blocked")
        # a consumer on another connection (consumers are never blocked) drains the queue
        cconn = amqp.connect()
        cch = cconn.channel()
        got: list[int] = []
        cch.basic_consume(q, lambda _c, _m, _p, b: got.append(len(b)), auto_ack=True)
        pump_until(cconn, lambda: amqp.count(q) == 0 and got, timeout=30, what="drain")
        pump_until(conn, lambda: "unblocked" in events, timeout=20, what="connection.unblocked")
        assert events.index("blocked") < events.index("unblocked")
        ch.basic_publish("", q, b"after")       # publishing works again
        conn.process_data_events(time_limit=0)
        pump_until(cconn, lambda: got[-1] == len(b"after"), timeout=10,
                   what="post-unblock publish to arrive")
    finally:
        amqp.cleanup()


_ = pika
