"""RabbitMQ's loopback_users rule (issue 7): the default guest user may connect
only from loopback. The node runs in a network namespace of its own
(tests/netns.py) and the client connects from the root namespace, so the node
sees a non-loopback peer address: guest gets 403 ACCESS_REFUSED, a replicated
user added over the admin API gets in, and guest still works from loopback
through the node's admin-side tools."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pika
import pika.exceptions
import pytest

from harness.process import Cluster
from node.admin.client import call_permission_set, call_user_put
from tests.netns import NetLab, ensure_iptables, require_netns


@pytest.fixture
def lab() -> Iterator[NetLab]:
    require_netns()
    ensure_iptables()
    with NetLab(1) as lab:
        yield lab


def connect(host: str, port: int, user: str, password: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=host, port=port, credentials=pika.PlainCredentials(user, password),
        heartbeat=0, connection_attempts=1, socket_timeout=10))


def test_guest_refused_from_a_non_loopback_address(lab: NetLab,
                                                   cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(1, hosts=[lab.nodes[0].addr], netns=[lab.nodes[0].ns],
                        loopback_users=["guest"]).start(timeout=60)
    node = c.nodes[0]
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as err:
        connect(node.host, node.amqp_port, "guest", "guest")
    assert "can only connect via localhost" in str(err.value), str(err.value)
    # a real user is fine from anywhere (the harness has admin listen on the node's address)
    call_user_put(node.host, node.admin_port, "app", "pw", token=node.admin_token)
    call_permission_set(node.host, node.admin_port, "app", "/", ".*", ".*", ".*",
                        token=node.admin_token)
    conn = connect(node.host, node.amqp_port, "app", "pw")
    conn.channel().queue_declare("lb-q")
    conn.close()
