"""Disk-free alarm (issue 7): when the data dir's filesystem has less free space
than disk_free_limit, publishers get connection.blocked ("low on disk") and are
no longer read from, while consumers keep draining. The limit is set above this
machine's free space to raise the alarm for real (statvfs, not a mock)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pika
import pytest
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from harness.amqp import RawConn
from harness.amqp import frame as _frame
from tests.broker_proc import NodeProcess

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own node")
BIG = 2**40  # 1 TiB: more than this machine has free


def test_disk_free_alarm_blocks_publishers_consumers_drain(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    if st.f_bavail * st.f_frsize >= BIG:
        pytest.skip("more than 1 TiB free: cannot raise the alarm for real")
    cfg = tmp_path / "node.toml"
    cfg.write_text("")
    node = NodeProcess(tmp_path / "data", extra_args=("--config", str(cfg)))
    try:
        node.start()
        conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=node.amqp_port,
                                                                 heartbeat=0))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("disk-q", durable=True)
        for i in range(10):
            ch.basic_publish("", "disk-q", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        conn.close()
        node.stop()

        cfg.write_text(f"disk_free_limit = {BIG}\n")
        node.start()
        pub = RawConn("127.0.0.1", node.amqp_port)
        pub.send(pframe.marshal(spec.Basic.Publish(exchange="", routing_key="disk-q"), 1)
                 + pframe.marshal(pheader.ContentHeader(0, 4, spec.Basic.Properties(delivery_mode=2)), 1)
                 + _frame(3, 1, b"late"))
        deadline = time.monotonic() + 10
        while not pub.blocked and time.monotonic() < deadline:
            if pub.fill(0.2):
                pub.frames()
        assert pub.blocked and "disk" in pub.blocked_reason, (pub.blocked, pub.blocked_reason)

        # consumers keep draining what was there
        cons = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=node.amqp_port,
                                                                 heartbeat=0))
        cch = cons.channel()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            method, _props, body = cch.basic_get("disk-q", auto_ack=True)
            if method is not None:
                got.append(body)
        assert got == [f"m{i}".encode() for i in range(10)]
        cons.close()
        pub.close()
    finally:
        node.kill9()
