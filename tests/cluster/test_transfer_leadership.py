"""Leadership transfer through the admin API (what a scale-down does before it
removes the leader): the named follower becomes leader, the term grows, a
follower cannot be asked, and no message confirmed before or after is lost.
(pysyncobj only transfers to a target whose log equals the leader's, so the
transfer is asked between two bursts of publishes, not during one.)"""
from __future__ import annotations

import grpc
import pytest

from harness.client import check_delivered, declare, drain, uniq_queue
from harness.process import Cluster
from harness.publisher import StreamPublisher
from node.admin.client import call_transfer_leadership
from tests.broker_proc import wait_for


def test_transfer_leadership_to_a_named_follower(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    leader = cluster.leader()
    f1, f2 = cluster.followers()
    term0 = leader.status()["term"]
    q = uniq_queue("xfer")
    declare(f1, q)
    pub = StreamPublisher("xfer", q, lambda: [f1, f2, leader], total=500)
    pub.start()
    try:
        wait_for(lambda: len(pub.confirmed) >= 500 or pub.error, timeout=60, what="500 confirms")
        pub.join(30)
        with pytest.raises(grpc.RpcError) as err:  # only the leader can hand leadership over
            call_transfer_leadership(f2.host, f2.admin_port, f1.node_id, token=f2.admin_token)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        reply = call_transfer_leadership(leader.host, leader.admin_port, f1.node_id,
                                         token=leader.admin_token)
        assert reply["ok"] is True
        wait_for(lambda: all(n.status()["leader"] == f1.node_id for n in cluster.nodes),
                 timeout=15, what=f"every node to follow {f1.node_id}")
        assert f1.status()["term"] > term0
        after = StreamPublisher("after", q, lambda: [leader, f2], total=500)
        after.start()
        wait_for(lambda: len(after.confirmed) >= 500 or after.error, timeout=60,
                 what="500 confirms under the new leader")
        after.join(30)
    finally:
        pub.stop()
        pub.join(60)
    assert pub.error is None and after.error is None, (pub.summary(), after.summary())
    res = check_delivered({"xfer": pub.confirmed, "after": after.confirmed}, drain(f2, q))
    assert res["lost_count"] == 0, f"lost {res['lost_count']}: {res['lost']}"
