"""Every node serves every queue: publish on one node, consume on another,
consumers attached to followers get deliveries, acks from any node settle."""
from __future__ import annotations

import time

import pika

from harness.client import pika_conn, pump, queue_counts, uniq_queue
from harness.process import Cluster
from tests.broker_proc import wait_for


def test_publish_on_one_follower_consume_on_another(shared_cluster: Cluster) -> None:
    leader = shared_cluster.leader()
    a, b = shared_cluster.followers()
    q = uniq_queue()
    lconn = pika_conn(leader)
    lconn.channel().queue_declare(q, durable=True)

    # consumer on follower B, attached before anything is published
    bconn = pika_conn(b)
    bch = bconn.channel()
    bch.basic_qos(prefetch_count=10)
    got: list[tuple[bytes, bool, int]] = []
    bch.basic_consume(q, lambda _c, m, _p, body: got.append((body, m.redelivered, m.delivery_tag)))
    wait_for(lambda: queue_counts(a, q)[1] == 1, timeout=10,
             what="the consumer on B to be visible from A")

    # publisher on follower A, confirms on
    aconn = pika_conn(a)
    ach = aconn.channel()
    ach.confirm_delivery()
    bodies = [f"m{i}".encode() for i in range(50)]
    for body in bodies:
        ach.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2))

    # prefetch 10: B sees the first 10, acks each, gets the next ones
    acked = 0
    while acked < 50:
        pump(bconn, lambda n=acked: len(got) > n, timeout=15, what="50 deliveries on B")
        for _body, _red, tag in got[acked:]:
            bch.basic_ack(tag)
            acked += 1
    assert [g[0] for g in got] == bodies, "one consumer must see the queue in FIFO order"
    assert not any(g[1] for g in got), "nothing was redelivered"
    wait_for(lambda: queue_counts(leader, q) == (0, 1), timeout=10,
             what="the leader to see the queue empty with B's consumer")
    wait_for(lambda: queue_counts(a, q) == (0, 1), timeout=10,
             what="follower A to see the queue empty with B's consumer")

    # a second consumer on follower A: deliveries go to consumers on both followers
    bch.basic_qos(prefetch_count=5)
    a2 = pika_conn(a)
    a2ch = a2.channel()
    a2ch.basic_qos(prefetch_count=5)
    got_a: list[tuple[bytes, int]] = []
    a2ch.basic_consume(q, lambda _c, m, _p, body: got_a.append((body, m.delivery_tag)))
    wait_for(lambda: queue_counts(leader, q)[1] == 2, timeout=10, what="two consumers")
    before_b = len(got)
    more = [f"r{i}".encode() for i in range(60)]
    for body in more:
        ach.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2))

    def received() -> int:
        return len(got_a) + len(got) - before_b

    done_a = done_b = 0
    deadline = time.monotonic() + 30
    while True:
        bconn.process_data_events(time_limit=0.02)
        a2.process_data_events(time_limit=0.02)
        for _body, tag in got_a[done_a:]:
            a2ch.basic_ack(tag)
            done_a += 1
        for _body, _red, tag in got[before_b + done_b:]:
            bch.basic_ack(tag)
            done_b += 1
        if received() >= len(more):
            break
        assert time.monotonic() < deadline, (
            f"only {received()} of {len(more)} delivered over A ({len(got_a)}) and B in 30 s")
    seen = sorted([g[0] for g in got[before_b:]] + [g[0] for g in got_a])
    assert seen == sorted(more), "every message delivered exactly once over the two consumers"
    assert got_a and len(got) > before_b, (
        f"both followers' consumers should get deliveries: A {len(got_a)}, B {len(got) - before_b}")
    bconn.process_data_events(time_limit=0.1)
    a2.process_data_events(time_limit=0.1)
    wait_for(lambda: queue_counts(leader, q)[0] == 0, timeout=10, what="queue empty")

    # basic.get on a follower; its ack (from that follower) settles it cluster-wide
    bch.basic_cancel(bch.consumer_tags[0]) if bch.consumer_tags else None
    a2ch.basic_cancel(a2ch.consumer_tags[0]) if a2ch.consumer_tags else None
    lconn.channel().basic_publish("", q, b"via-get", pika.BasicProperties(delivery_mode=2))
    gch = aconn.channel()
    m = wait_for(lambda: gch.basic_get(q)[0], timeout=10, what="basic.get on follower A")
    gch.basic_ack(m.delivery_tag)
    gch.close()  # had the ack been lost, closing the channel would requeue the message
    ach.basic_publish("", q, b"sentinel", pika.BasicProperties(delivery_mode=2))  # confirmed: after the close
    lch = lconn.channel()
    m2, _p, body2 = lch.basic_get(q, auto_ack=True)
    assert m2 is not None and body2 == b"sentinel", f"the acked message came back: {body2!r}"
    assert lch.basic_get(q, auto_ack=True)[0] is None
    wait_for(lambda: queue_counts(b, q) == (0, 0), timeout=10,
             what="B to see the queue empty and without consumers")

    for c in (lconn, aconn, bconn, a2):
        c.close()
