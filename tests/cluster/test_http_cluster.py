"""The management HTTP API on a 3-node cluster (issue 15): every node answers
the same queue figures from the replicated state; the quorum-critical health
check follows the in-sync set; membership changes through
/api/mirrorq/members."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import requests

from harness.process import Cluster, ClusterNode
from tests.broker_proc import uniq, wait_for
from tests.support.shared_cluster import with_http

AUTH = ("guest", "guest")
T = 15.0


def url(node: ClusterNode, path: str) -> str:
    return f"http://{node.host}:{node.http_port}{path}"  # type: ignore[attr-defined]


def get(node: ClusterNode, path: str) -> Any:
    r = requests.get(url(node, path), auth=AUTH, timeout=T)
    assert r.status_code == 200, (node.node_id, path, r.status_code, r.text)
    return r.json()


FIGURES = ("messages", "messages_ready", "messages_unacknowledged", "consumers", "durable",
           "arguments", "node", "type")


def test_two_nodes_report_the_same_queue_figures(shared_http_cluster: Cluster) -> None:
    c = shared_http_cluster
    n1, n2, n3 = c.nodes
    q = uniq("hc")
    r = requests.put(url(n1, f"/api/queues/%2F/{q}"), auth=AUTH, timeout=T,
                     json={"durable": True, "arguments": {"x-queue-type": "quorum"}})
    assert r.status_code == 201, r.text
    conn = pika.BlockingConnection(pika.URLParameters(n2.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(20):
            ch.basic_publish("", q, f"m{i}".encode(),
                             pika.BasicProperties(delivery_mode=2))
        ch.basic_qos(prefetch_count=5)
        ch.basic_consume(q, lambda *a: None)  # holds 5 unacked on n2
        # wait until both nodes applied the same index, then compare what they answer
        def same() -> tuple[dict[str, Any], dict[str, Any]] | None:
            conn.process_data_events(0)
            before = (get(n1, "/api/mirrorq/cluster")["last_applied"],
                      get(n3, "/api/mirrorq/cluster")["last_applied"])
            a, b = get(n1, f"/api/queues/%2F/{q}"), get(n3, f"/api/queues/%2F/{q}")
            after = (get(n1, "/api/mirrorq/cluster")["last_applied"],
                     get(n3, "/api/mirrorq/cluster")["last_applied"])
            if before[0] != before[1] or before != after or a["messages_unacknowledged"] != 5:
                return None
            return a, b
        a, b = wait_for(same, timeout=30, what="two nodes at the same applied index")
        assert {k: a[k] for k in FIGURES} == {k: b[k] for k in FIGURES}
        assert (a["messages"], a["messages_ready"], a["messages_unacknowledged"], a["consumers"]) \
            == (20, 15, 5, 1)
        assert a["message_stats"]["publish"] == b["message_stats"]["publish"] == 20
        assert a["type"] == "quorum" and a["node"] == "n1"
        # connection details: the owning node knows the peer, every node lists it (the
        # same list once both applied the same opens and closes: on a shared cluster
        # another test's connections may still be closing)
        def listed() -> dict[str, Any] | None:
            rows = {n.node_id: get(n, "/api/connections") for n in (n1, n2)}
            same = [r["name"] for r in rows["n1"]] == [r["name"] for r in rows["n2"]]
            return rows if same and any(r["node"] == "n2" for r in rows["n2"]) else None
        rows = wait_for(listed, timeout=30, what="n1 and n2 to list the same connections")
        local = [r for r in rows["n2"] if r["node"] == "n2"]
        assert all(r["peer_host"] == "127.0.0.1" for r in local), local
        assert any(r["user"] == "guest" for r in local), local
    finally:
        conn.close()
    cl = {n.node_id: get(n, "/api/mirrorq/cluster") for n in c.nodes}
    assert len({x["leader"] for x in cl.values()}) == 1
    assert all(sorted(x["in_sync"]) == ["n1", "n2", "n3"] for x in cl.values())
    for n in c.nodes:
        assert get(n, "/api/health/checks/node-is-quorum-critical") == {"status": "ok"}


def test_quorum_critical_and_membership(cluster_factory: Callable[..., Cluster]) -> None:
    c = with_http(cluster_factory(3), member_urls=False)
    c.start()
    leader = c.leader()
    victim = next(n for n in c.nodes if n is not leader)
    others = [n for n in c.nodes if n is not victim]
    victim.kill9()

    def out_of_sync() -> bool:
        return victim.node_id not in get(leader, "/api/mirrorq/cluster")["in_sync"]
    wait_for(out_of_sync, timeout=20, what=f"{victim.node_id} out of the in-sync set")
    # two in sync of three: losing either survivor leaves fewer than a majority
    for n in others:
        def critical(n: ClusterNode = n) -> Any:
            r = requests.get(url(n, "/api/health/checks/node-is-quorum-critical"), auth=AUTH,
                             timeout=T)
            return (r,) if r.status_code == 503 else None  # a 503 Response is falsy
        (r,) = wait_for(critical, timeout=20, what=f"{n.node_id} quorum critical")
        assert r.json()["status"] == "failed" and "majority" in r.json()["reason"]
    members = {m["name"]: m for m in get(leader, "/api/mirrorq/cluster")["members"]}
    assert members[victim.node_id]["reachable"] is False
    # non-administrators may not change membership
    assert requests.delete(url(leader, f"/api/mirrorq/members/{victim.node_id}"), timeout=T
                           ).status_code == 401
    r = requests.delete(url(leader, f"/api/mirrorq/members/{victim.node_id}"), auth=AUTH,
                        timeout=60)
    assert r.status_code == 204, r.text
    c.nodes.remove(victim)
    c.removed.append(victim)
    wait_for(lambda: sorted(get(leader, "/api/mirrorq/cluster")["in_sync"]) ==
             sorted(n.node_id for n in others), timeout=20, what="two members in sync")
    assert sorted(m["name"] for m in get(leader, "/api/mirrorq/cluster")["members"]) == \
        sorted(n.node_id for n in others)
    assert requests.delete(url(leader, "/api/mirrorq/members/zz"), auth=AUTH,
                           timeout=T).status_code == 404


def test_cluster_view_match_index_and_member_urls(shared_http_cluster: Cluster) -> None:
    """Only the leader knows its followers' match index: a follower reports
    null for the other members (not 0); every member carries the management
    URL of its node where known (its own, and --http-member-url's), and that
    URL serves that node's API (the console links to it)."""
    c = shared_http_cluster  # each node started with --http-member-url of the others (with_http)
    urls = {n.node_id: f"http://{n.host}:{n.http_port}/" for n in c.nodes}  # type: ignore[attr-defined]

    def settled() -> dict[str, Any] | None:
        views = {n.node_id: get(n, "/api/mirrorq/cluster") for n in c.nodes}
        leaders = {v["leader"] for v in views.values()}
        if len(leaders) != 1 or None in leaders:
            return None
        leader = leaders.pop()
        lv = views[leader]
        if lv["role"] != "leader" or not all(
                isinstance(m["match_index"], int) and m["match_index"] > 0 for m in lv["members"]):
            return None
        return views
    views = wait_for(settled, timeout=30, what="a leader that knows every match index")
    for name, v in views.items():
        by = {m["name"]: m for m in v["members"]}
        assert sorted(by) == ["n1", "n2", "n3"]
        assert {m: by[m]["http_url"] for m in by} == urls, name
        assert isinstance(by[name]["match_index"], int)  # its own: last applied
        if v["role"] != "leader":
            assert all(by[m]["match_index"] is None for m in by if m != name), (name, by)
    for name, u in urls.items():
        r = requests.get(u + "api/overview", auth=AUTH, timeout=T)
        assert r.status_code == 200 and r.json()["node"] == name
