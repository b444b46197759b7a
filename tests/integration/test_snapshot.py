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
        wait_for(lambda: (node_metric(node, "snapshots_total") or 0) >= 2, timeout=30,
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


def test_journal_bytes_force_a_snapshot_and_bodies_survive_kill9(tmp_path: Path) -> None:
    """Issue 11: compaction by entry count alone let a journal of big random
    bodies grow to GBs (mapped into memory); past compaction_max_bytes a
    snapshot is forced. Random 64 KiB bodies, few entries, one forced
    snapshot, kill -9, every body back intact."""
    import os
    node = NodeProcess(tmp_path / "data", config="[raft]\ncompaction_min_entries = 100000\n"
                                                 "compaction_max_bytes = 2000000\ncompaction_min_gap = 1\n")
    try:
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.queue_declare("bigsnap", durable=True)
        ch.confirm_delivery()
        bodies = [os.urandom(64 * 1024) for _ in range(60)]  # ~3.8 MB: past the 2 MB bound
        for body in bodies:
            ch.basic_publish("", "bigsnap", body, pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: (node_metric(node, "forced_compactions_total") or 0) >= 1
                 and (node_metric(node, "snapshots_total") or 0) >= 1, timeout=30,
                 what="a snapshot forced by journal bytes")
        conn.close()
        node.kill9()
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        got = []
        while (msg := ch.basic_get("bigsnap", auto_ack=True))[0] is not None:
            got.append(msg[2])
        assert got == bodies, "every confirmed body, intact and in order"
        conn.close()
    finally:
        node.kill9()
