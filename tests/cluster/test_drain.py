"""Maintenance mode (admin Drain / Revive, what the operator does before it
removes a member): the drained node closes its clients with 320, refuses new
ones, leaves the in-sync set and stays out even when caught up, also across a
restart; confirms go on meanwhile and nothing confirmed is lost; Revive puts it
back in sync and serving."""
from __future__ import annotations

import socket
import time

import grpc
import pytest
from pamqp import commands as spec

from harness.amqp import ConnLost, RawConn
from harness.amqp import frame as _frame
from harness.body import make_body
from harness.client import check_delivered, declare, drain, uniq_queue
from harness.process import Cluster, ClusterNode
from harness.publisher import StreamPublisher
from node.admin.client import call_drain, call_revive
from tests.broker_proc import wait_for


def amqp_refused(node: ClusterNode) -> bool:
    """True when a client cannot get an AMQP connection to `node`."""
    try:
        conn = RawConn(node.host, node.amqp_port, timeout=3.0)
    except (OSError, ConnLost):
        return True
    conn.close()
    return False


def tcp_refused(node: ClusterNode) -> bool:
    try:
        socket.create_connection((node.host, node.amqp_port), timeout=3).close()
    except OSError:
        return True
    return False


def registered_conn(node: ClusterNode, q: str) -> RawConn:
    """A connection whose channel is in the replicated state (a confirmed publish)."""
    from pamqp import frame as pframe
    from pamqp import header as pheader
    conn = RawConn(node.host, node.amqp_port)
    conn.send_method(spec.Confirm.Select(), 1)
    conn.expect(spec.Confirm.SelectOk)
    conn.send(pframe.marshal(spec.Basic.Publish(exchange="", routing_key=q), 1)
              + pframe.marshal(pheader.ContentHeader(0, 1024, spec.Basic.Properties(delivery_mode=2)), 1)
              + _frame(3, 1, make_body("reg", 1)))
    conn.expect(spec.Basic.Ack)
    return conn


def caught_up_twice(cluster: Cluster, leader: ClusterNode, node: ClusterNode) -> None:
    """Wait until `node` has applied what the leader had committed, twice over
    (so the leader's in-sync monitor has seen it caught up on several passes)."""
    for _ in range(2):
        target = leader.status()["commit_index"]
        wait_for(lambda t=target: (node.try_status() or {}).get("last_applied", 0) >= t, timeout=30,
                 what=f"{node.node_id} to apply up to {target}")
        wait_for(lambda t=target: leader.status()["commit_index"] > t, timeout=30,
                 what="the leader to commit more")


def test_s25_drain_follower_under_load_then_revive(cluster: Cluster) -> None:
    leader = cluster.leader()
    f1, f2 = cluster.followers()
    q = uniq_queue("drain")
    declare(leader, q)
    pub = StreamPublisher("drain", q, lambda: [leader, f1], total=None, window=100, deadline=240)
    pub.start()
    try:
        wait_for(lambda: len(pub.confirmed) >= 300 or pub.error, timeout=60, what="300 confirms")
        client = registered_conn(f2, q)

        with pytest.raises(grpc.RpcError) as err:
            call_drain(leader.host, leader.admin_port, node_id="nobody", token=leader.admin_token)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        reply = call_drain(f2.host, f2.admin_port, token=f2.admin_token)
        assert reply["ok"] is True and reply["status"]["draining"] == [f2.node_id]

        # its client is closed with 320, and nobody gets in any more
        with pytest.raises(ConnLost) as lost:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if client.fill(0.2):
                    client.frames()
        assert "320" in str(lost.value) and "draining" in str(lost.value), str(lost.value)
        assert amqp_refused(f2), "a draining node accepted an AMQP client"
        wait_for(lambda: tcp_refused(f2), timeout=10, what=f"{f2.node_id} to close its AMQP listener")

        # it leaves the in-sync set and stays out although it keeps up with the log
        wait_for(lambda: f2.node_id not in leader.status()["in_sync"], timeout=15,
                 what=f"{f2.node_id} to leave the in-sync set")
        t = time.monotonic()
        caught_up_twice(cluster, leader, f2)
        assert f2.node_id not in leader.status()["in_sync"], "a draining member came back in sync"
        assert pub.progress_since(t) > 0 and pub.error is None, pub.summary()

        # a restart keeps maintenance mode (replicated): still no clients, still out
        f2.stop()
        f2.start(wait=False)
        wait_for(lambda: (f2.try_status() or {}).get("draining") == [f2.node_id], timeout=30,
                 what=f"{f2.node_id} back up, still draining")
        caught_up_twice(cluster, leader, f2)
        assert amqp_refused(f2)
        assert f2.node_id not in leader.status()["in_sync"]

        # revived: back in sync and serving
        reply = call_revive(f2.host, f2.admin_port, token=f2.admin_token)
        assert reply["ok"] is True and reply["status"]["draining"] == []
        wait_for(lambda: f2.node_id in leader.status()["in_sync"], timeout=30,
                 what=f"{f2.node_id} back in the in-sync set")
        wait_for(lambda: not amqp_refused(f2), timeout=10, what=f"{f2.node_id} to accept AMQP again")
        registered_conn(f2, q).close()
        t = time.monotonic()
        wait_for(lambda: pub.progress_since(t) >= 100 or pub.error, timeout=30,
                 what="confirms with the revived member in sync")
    finally:
        pub.stop()
        pub.join(120)
    assert pub.error is None, pub.summary()
    res = check_delivered({"drain": pub.confirmed, "reg": {1}}, drain(f1, q))
    assert res["lost_count"] == 0, f"lost {res['lost_count']}: {res['lost']}"
