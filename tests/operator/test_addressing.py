"""Pure tests of model.Addressing: in-cluster DNS by default, 127.0.0.1 ports in local mode."""
from __future__ import annotations

import pytest
from mirrorq_operator.model import (
    IN_CLUSTER,
    LOCAL_BASE_PORT_ENV,
    AddMember,
    Addressing,
    NodeStatus,
    Observed,
    PodObs,
    Spec,
    raft_address,
)
from mirrorq_operator.plan import plan


def test_in_cluster_is_the_default():
    a = Addressing.from_env({})
    assert a == IN_CLUSTER and not a.local
    assert a.raft_address("mq", "ns1", 2) == "mq-2.mq-headless.ns1.svc:25672" == \
        raft_address("mq", "ns1", 2)
    assert a.admin_endpoint("mq", "ns1", 2) == ("mq-2.mq-headless.ns1.svc", 15682)
    assert a.port(2, "http") == 15672
    assert a.amqp_endpoint("mq", "ns1", 0) == ("mq-0.mq-headless.ns1.svc", 5672)


def test_local_mode_ports():
    a = Addressing.from_env({LOCAL_BASE_PORT_ENV: "30000"})
    assert a.local and a.local_base_port == 30000
    assert a.amqp_endpoint("mq", "ns1", 0) == ("127.0.0.1", 30000)
    assert a.raft_address("mq", "ns1", 0) == "127.0.0.1:30001"
    assert a.admin_endpoint("mq", "ns1", 3) == ("127.0.0.1", 30032)
    assert a.port(4, "metrics") == 30043
    assert a.port(4, "http") == 30044
    ports = [a.port(k, n) for k in range(9) for n in ("amqp", "raft", "admin", "metrics", "http")]
    assert len(set(ports)) == len(ports)


@pytest.mark.parametrize("bad", ["x", "-1", "80", "65535"])
def test_local_mode_rejects_bad_ports(bad):
    with pytest.raises(ValueError):
        Addressing.from_env({LOCAL_BASE_PORT_ENV: bad})


def test_plan_adds_members_at_the_local_address():
    ids = ("mq-0", "mq-1", "mq-2")
    pods = tuple(PodObs(ordinal=k, ready=True, pvc_uid=f"u{k}",
                        node=NodeStatus(role="leader" if k == 0 else "follower", leader="mq-0",
                                        members=ids, in_sync=ids, has_quorum=True))
                 for k in range(3))
    obs = Observed(name="mq", namespace="ns1", exists=True, sts_replicas=3, sts_ready=3,
                   pods=pods, formed=True)
    local = Addressing(local_base_port=30000)
    assert AddMember("mq-3", "127.0.0.1:30031", None) in plan(Spec(replicas=4), obs, local)
    assert AddMember("mq-3", "mq-3.mq-headless.ns1.svc:25672", None) in \
        plan(Spec(replicas=4), obs)
