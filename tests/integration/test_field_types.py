"""Every field type of RabbitMQ's dialect (t b B s u U i I l L f d D S A T F V x)
comes back exactly as published (issue 28 item 2), compared byte for byte on
the wire: in headers, nested tables and arrays; through basic.get and
basic.deliver, dead-lettering (x-death added after the original entries),
the management API, and a node restart that loads a snapshot and
replays the journal (tests/cluster/test_field_types_cluster.py: through a
follower). Raw frames for the types no client library sends; pika
for what it can. The timestamp property past year 9999, 2^64-1 and a
"negative" (as a signed client packs it) is stored and returned as sent
(item 3)."""
from __future__ import annotations

import datetime
import decimal
import os
import struct
import urllib.parse
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
from pamqp import commands as spec

from harness.amqp import RawClient
from node.amqp import properties
from tests.broker_proc import Broker, node_metric, start_http_node, uniq, wait_for
from tests.support.field_types import (
    ENTRIES,
    HEADER_ITEMS,
    SCALARS,
    confirm_select,
    content_after_method,
    declare,
    get_raw,
    get_raw_eventually,
    props_bytes,
    publish_confirmed,
    publish_raw,
    raw_frame,
    table,
)

# ------------------------------------------------------------------ one node

def test_every_field_type_round_trips_through_get_and_deliver(raw: Any) -> None:
    q = uniq("types")
    c = raw()
    declare(c, q)
    for ts in (253402300800 + 86400, 2**64 - 1, struct.unpack(">Q", struct.pack(">q", -1))[0], 0):
        props = props_bytes(ts)
        publish_raw(c, q, props)
        assert get_raw(c, q) == (props, b"hello")
    props = props_bytes()
    publish_raw(c, q, props)
    c.send_frame(spec.Basic.Consume(queue=q, consumer_tag="ct", no_ack=True), 1)
    c.expect(spec.Basic.ConsumeOk)
    assert content_after_method(c, 60) == (props, b"hello")


def test_every_field_type_survives_dead_lettering(raw: Any) -> None:
    """The original entries come back byte for byte in the dead-lettered message's
    headers (first and in order on mirrorq); x-death is added, its count a long
    and its time a timestamp."""
    src, dlq = uniq("dlsrc"), uniq("dlq")
    c = raw()
    declare(c, dlq)
    declare(c, src, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    publish_raw(c, src, props_bytes())
    c.send_frame(spec.Basic.Get(queue=src, no_ack=False), 1)
    ftype, payload = raw_frame(c)
    tag = struct.unpack_from(">Q", payload, 4)[0]
    raw_frame(c), raw_frame(c)  # header, body
    c.send_frame(spec.Basic.Reject(delivery_tag=tag, requeue=False), 1)
    got, body = get_raw_eventually(c, dlq)
    assert body == b"hello"
    table_len = struct.unpack_from(">I", got, 2)[0]
    items = got[6:6 + table_len]
    assert all(e in items for e in ENTRIES)  # each entry byte for byte (RabbitMQ sorts them)
    if not os.environ.get("MIRRORQ_TARGET"):
        assert items.startswith(HEADER_ITEMS)  # ours keeps their order too
    assert got[6 + table_len:] == props_bytes()[6 + len(HEADER_ITEMS):]  # mode, timestamp
    death = properties.decode_properties(got, 0)["headers"]["x-death"][0]
    assert (death["count"].wire, death["time"].wire) == (b"l", b"T")
    assert death["queue"] == src and death["reason"] == "rejected"


def test_pika_header_values_round_trip(amqp: Any, broker: Broker) -> None:
    """What pika sends (its own choice of types) comes back equal and of the same
    Python types: ints, a decimal, a timestamp, bytes (x), nesting (pika sends no
    floats: the raw-frame tests cover f and d)."""
    q = uniq("pika-types")
    ch = amqp.channel()
    ch.queue_declare(q)
    headers = {"int": 7, "big": 2**40, "neg": -300, "bool": True, "str": "é",
               "dec": decimal.Decimal("1.20"), "none": None, "bytes": b"\x00\xff",
               "when": datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
               "nested": {"a": [1, "two", {"b": False}]}, "list": [b"x", 2**33]}
    ch.basic_publish("", q, b"m", pika.BasicProperties(headers=headers, timestamp=2**40))
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert method is not None and body == b"m"
    assert props.headers == headers
    assert isinstance(props.headers["bytes"], bytes)  # x, not S
    assert props.timestamp == 2**40


# ------------------------------------------------- restart: snapshot + journal

@pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="a mirrorq node of its own")
def test_field_types_and_timestamps_survive_restart_from_snapshot_and_journal(tmp_path: Path) -> None:
    """One message before a snapshot, one after it (in the journal only), kill -9,
    restart: both come back byte for byte; then the management API's get shows
    the values as RabbitMQ does and its publish makes JSON integers longs."""
    node = start_http_node(tmp_path / "data", config="[raft]\ncompaction_min_entries = 40\n")
    try:
        q = uniq("types-restart")
        c = RawClient(node)
        c.handshake()
        c.open_channel(1)
        declare(c, q, durable=True)
        declare(c, q + "-x")
        confirm_select(c)
        before, after = props_bytes(2**64 - 1), props_bytes(253402300800 + 7)
        publish_confirmed(c, q, before, b"before")
        for i in range(100):  # fillers: enough log entries for a snapshot
            publish_confirmed(c, q + "-x", b"\x00\x00", b"%d" % i)
        wait_for(lambda: (node_metric(node, "snapshots_total") or 0) >= 1, timeout=30,
                 what="a snapshot")
        publish_confirmed(c, q, after, b"after")
        c.close()
        node.kill9()
        node.start()
        c = RawClient(node)
        c.handshake()
        c.open_channel(1)
        assert get_raw(c, q) == (before, b"before")
        assert get_raw(c, q) == (after, b"after")

        api = f"http://127.0.0.1:{node.http_port}/api"  # type: ignore[attr-defined]
        auth = ("guest", "guest")
        publish_raw(c, q, props_bytes())
        r = requests.post(f"{api}/queues/%2F/{urllib.parse.quote(q)}/get", auth=auth, timeout=10,
                          json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        r.raise_for_status()
        shown = r.json()[0]["properties"]
        h = shown["headers"]
        assert [h[f"k{i}"] for i in range(len(SCALARS))] == [
            True, -1, 255, -32768, 65535, -32767, -2**31, 2**32 - 1, -5, -1,
            struct.unpack(">f", struct.pack(">f", 2.32))[0], 2.32, 1.2, "abc", "\ufffd\ufffd",
            2**64 - 1, None, "\x00\x01\ufffd"]
        assert h["tbl"] == {f"k{i}": h[f"k{i}"] for i in range(len(SCALARS))}
        assert shown["timestamp"] == 253402300800 + 86400
        r = requests.post(f"{api}/exchanges/%2F/amq.default/publish", auth=auth, timeout=10,
                          json={"routing_key": q, "payload": "p", "payload_encoding": "string",
                                "properties": {"headers": {"n": 1, "x": 1.5, "s": "t"}}})
        assert r.json() == {"routed": True}
        got, _ = get_raw(c, q)
        assert got == (struct.pack(">H", 0x2000) + table([(b"n", b"l" + struct.pack(">q", 1)),
                                 (b"x", b"d" + struct.pack(">d", 1.5)),
                                 (b"s", b"S\x00\x00\x00\x01t")]))
        c.close()
    finally:
        node.kill9()
