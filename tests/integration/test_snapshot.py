"""Snapshots (log compaction) are written by a forked child and installed
atomically: messages confirmed before, during and after one survive kill -9."""
from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.broker_proc import NodeProcess, node_metric, wait_for

pytestmark = pytest.mark.own_node


def test_s19_confirmed_messages_survive_kill9_across_snapshots(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", config="[raft]\ncompaction_min_entries = 40\n")
    try:
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.queue_declare("snap", durable=True)
        ch.confirm_delivery()
        n = 600
        for i in range(n):  # one publish per batch: many Raft entries, several snapshots
            ch.basic_publish("", "snap", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: (node_metric(node, "snapshots") or 0) >= 2, timeout=30,
                 what="at least two snapshots")
        assert (node.data_dir / "raft.dump").stat().st_size > 0
        conn.close()
        node.kill9()
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        got = []
        while True:
            method, _props, body = ch.basic_get("snap", auto_ack=True)
            if method is None:
                break
            got.append(body)
        assert got == [b"m%d" % i for i in range(n)], "every confirmed message, in order"
        conn.close()
    finally:
        node.kill9()
