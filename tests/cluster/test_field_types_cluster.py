"""Every field type of RabbitMQ's dialect, published on the leader and consumed
on a follower of a 3-node cluster, comes back byte for byte (issue 28 item 2:
the typed values cross the Raft log in the codec's W values)."""
from __future__ import annotations

from pamqp import commands as spec

from harness.amqp import RawConn
from harness.process import Cluster
from tests.broker_proc import uniq
from tests.support.field_types import (
    confirm_select,
    content_after_method,
    declare,
    props_bytes,
    publish_confirmed,
    raw_frame,
)


def test_field_types_round_trip_through_a_cluster_follower(shared_cluster: Cluster) -> None:
    leader = shared_cluster.leader()
    follower = shared_cluster.followers()[0]
    q = uniq("types-cluster")
    pub = RawConn(leader.host, leader.amqp_port)
    sub = RawConn(follower.host, follower.amqp_port)
    try:
        declare(pub, q)
        confirm_select(pub)
        props = props_bytes(2**64 - 1)
        publish_confirmed(pub, q, props, b"across")
        sub.send_frame(spec.Basic.Consume(queue=q, consumer_tag="f", no_ack=True), 1)
        ftype, payload = raw_frame(sub)  # raw: pamqp cannot parse what follows (U)
        assert ftype == 1 and payload[:4] == b"\x00\x3c\x00\x15"  # basic.consume-ok
        assert content_after_method(sub, 60) == (props, b"across")
    finally:
        pub.close()
        sub.close()
