"""Issue 11: a follower that is behind the leader's snapshot catches up through
the new transport (the snapshot in bounded chunks, then entries), holds every
confirmed message, and the majority keeps its leader and term throughout."""
from __future__ import annotations

import datetime
import decimal
import hashlib
import os
import stat
from collections.abc import Callable
from typing import Any

import pika

from harness.client import declare, drain, pika_conn, uniq_queue
from harness.process import Cluster, wait_for


def test_follower_behind_the_snapshot_installs_it_and_catches_up(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3, config="compaction_min_entries = 60\n")
    c.start()
    leader = c.leader()
    lagger = c.followers()[0]
    queue = uniq_queue("snapcatch")
    declare(leader, queue)
    lagger.kill9()
    wait_for(lambda: lagger.node_id not in leader.status()["in_sync"], timeout=30,
             what="the killed follower to leave the in-sync set")
    term = leader.status()["term"]

    # one publish per confirm round trip: many Raft entries, several snapshots
    conn = pika_conn(leader)
    bodies = []
    props_queue = uniq_queue("snapprops")
    sent_props = [_rich_props(i) for i in range(20)]
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(props_queue, durable=True)
        for i, props in enumerate(sent_props):  # properties of every kind go through the snapshot too
            ch.basic_publish("", props_queue, bytes([i]) * 300 + os.urandom(100), props)
        for i in range(300):
            body = b"%d:" % i + os.urandom(2048)
            ch.basic_publish("", queue, body)
            bodies.append(body)
    finally:
        conn.close()
    wait_for(lambda: leader.status()["snapshots"] >= 2, timeout=60, what="two snapshots on the leader")
    st = leader.status()
    assert st["log_len"] < 300, st  # the entries the lagger misses are gone from the log

    lagger.start(wait=True)
    target = leader.status()["commit_index"]
    wait_for(lambda: (s := lagger.try_status()) is not None and s["last_applied"] >= target
             and s["leader"] == leader.node_id, timeout=60, what="the restarted follower to catch up")
    wait_for(lambda: lagger.node_id in leader.status()["in_sync"], timeout=30,
             what="the follower back in sync")
    for n in (leader, c.followers()[1] if c.followers()[0] is lagger else c.followers()[0]):
        assert n.status()["term"] == term
    # the snapshot pysyncobj received from the leader is private like the rest (issue 26)
    dump = lagger.data_dir / "raft.dump"
    assert lagger.status()["installed_snapshots"] >= 1 and dump.exists()
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600, oct(dump.stat().st_mode)
    assert dump.read_bytes()[:8] == b"\x89MQSNAP\n"  # our format (issue 26), no pickle

    # properties and headers came through the snapshot intact
    conn = pika_conn(lagger)
    try:
        ch = conn.channel()
        got_props = []
        while (msg := ch.basic_get(props_queue, auto_ack=True))[0] is not None:
            got_props.append(msg[1])
    finally:
        conn.close()
    assert [_shown(p) for p in got_props] == [_shown(p) for p in sent_props]

    # the caught-up follower serves every message, intact
    got = [body for body, _redelivered in drain(lagger, queue, idle=2.0)]
    digest = lambda bs: sorted(hashlib.sha256(b).hexdigest() for b in bs)  # noqa: E731
    assert digest(got) == digest(bodies)


def _rich_props(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type="application/x-test", content_encoding="gzip", delivery_mode=2, priority=i % 10,
        correlation_id=f"corr-{i}", reply_to="amq.rabbitmq.reply-to", expiration="3600000",
        message_id=f"id-{i}", timestamp=1_700_000_000 + i, type="kind", user_id="guest", app_id="snap",
        headers={"s": "text ü", "i": i, "big": 1 << 40, "neg": -7, "t": True, "no": False,
                 "d": decimal.Decimal("12.345"), "ts": datetime.datetime(2026, 11, 26, 10, i, tzinfo=datetime.UTC),
                 "none": None, "arr": [1, "x", [2, {"k": "v"}]], "tbl": {"a": {"b": i}}})


def _shown(p: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(p).items() if v is not None}
