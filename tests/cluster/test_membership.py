"""Membership at run time under confirmed load: add a 4th node (it catches up,
joins the in-sync set, serves the queue, and does not depose the leader), and
remove a node (it stops serving and says why). No confirmed message is lost."""
from __future__ import annotations

import time

from harness.amqp import ConnLost, RawConn
from harness.client import check_delivered, declare, drain, uniq_queue
from harness.process import Cluster, ClusterNode
from harness.publisher import StreamPublisher
from tests.broker_proc import wait_for


def test_add_fourth_node_under_load(cluster: Cluster) -> None:
    leader = cluster.leader()
    f1, f2 = cluster.followers()
    term_before = leader.status()["term"]
    q = uniq_queue("add")
    declare(f1, q)
    pub = StreamPublisher("add", q, lambda: [f1, f2, leader], total=None)
    pub.start()
    try:
        wait_for(lambda: len(pub.confirmed) >= 1000 or pub.error, timeout=60, what="1000 confirms")
        t0 = time.monotonic()
        n4 = cluster.add_node()
        t_serving = time.monotonic() - t0
        cluster.wait_healthy(60)  # all four members in the in-sync set
        t_in_sync = time.monotonic() - t0
        st = leader.status()
        assert sorted(st["members"]) == sorted(n.node_id for n in cluster.nodes), st
        t1 = time.monotonic()
        wait_for(lambda: pub.progress_since(t1) >= 500 or pub.error, timeout=30,
                 what="confirms with four in-sync members")
        assert pub.error is None, pub.summary()
        n4st = n4.status()
        assert n4st["leader"] == leader.node_id and n4st["role"] == "follower", n4st
        st = leader.status()
        assert st["role"] == "leader" and st["term"] == term_before, (
            f"the joining node deposed the leader: term {term_before} -> {st['term']}, {st}")
    finally:
        pub.finish(60)
    print(f"\nadd member: {n4.node_id} serving AMQP {t_serving:.2f}s, in sync {t_in_sync:.2f}s after "
          f"AddMember\n  {pub.summary()}")
    assert pub.error is None, pub.summary()
    got = drain(n4, q)  # the new member serves the whole queue
    res = check_delivered({"add": pub.confirmed}, got)
    assert res["lost_count"] == 0, f"lost {res['lost_count']}: {res['lost']['add'][:20]}"


def _refuses(node: ClusterNode, seen: list[str]) -> str | None:
    """How a removed node refuses AMQP (process gone, port closed, or the connection
    closed with a reason); None while it still accepts work or merely hangs/blocks."""
    if not node.alive():
        return f"process exited ({node.proc and node.proc.returncode})"
    try:
        conn = RawConn(node.host, node.amqp_port, timeout=3)
    except ConnectionRefusedError:
        return "connection refused"
    except ConnLost as exc:
        if "no " in str(exc) and "within timeout" in str(exc):
            seen.append(f"handshake hangs: {exc}")
            return None
        return f"closed during handshake: {exc}"
    except OSError as exc:
        return f"socket error: {exc}"
    try:
        from pamqp import commands as spec
        conn.send_method(spec.Queue.Declare(queue="", exclusive=True), 1)
        conn.expect(spec.Queue.DeclareOk, timeout=3)
        seen.append("still serves queue.declare")
        return None
    except ConnLost as exc:
        if conn.close_reason or "EOF" in str(exc) or "recv" in str(exc):
            return f"closed: {exc}"
        seen.append(f"{exc}; blocked={conn.blocked} {conn.blocked_reason!r}")
        return None
    finally:
        conn.close()


def test_remove_node_under_load(cluster: Cluster) -> None:
    leader = cluster.leader()
    keep, gone = cluster.followers()
    q = uniq_queue("rm")
    declare(keep, q)
    pub = StreamPublisher("rm", q, lambda: [keep, leader], total=None)
    pub.start()
    try:
        wait_for(lambda: len(pub.confirmed) >= 1000 or pub.error, timeout=60, what="1000 confirms")
        t0 = time.monotonic()
        cluster.remove_node(gone)
        t_removed = time.monotonic() - t0
        st = leader.status()
        assert gone.node_id not in st["members"] and gone.node_id not in st["in_sync"], st
        assert sorted(st["members"]) == sorted([leader.node_id, keep.node_id]), st
        seen: list[str] = []
        try:
            how = wait_for(lambda: _refuses(gone, seen), timeout=30, interval=0.2,
                           what=f"removed {gone.node_id} to stop serving AMQP")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last observations: {seen[-2:]}; its log:\n"
                                 f"{gone.tail_log(8)}") from None
        t_stopped = time.monotonic() - t0
        t1 = time.monotonic()
        wait_for(lambda: pub.progress_since(t1) >= 500 or pub.error, timeout=30,
                 what="confirms after the removal")
        assert pub.error is None, pub.summary()
        kst = keep.status()
        assert gone.node_id not in kst["members"], kst
    finally:
        pub.finish(60)
    log = gone.tail_log(20)
    print(f"\nremove member: RemoveMember returned after {t_removed:.2f}s; {gone.node_id} stopped serving "
          f"after {t_stopped:.2f}s ({how})\n  {pub.summary()}\n  removed node log tail:\n"
          + "\n".join("    " + line for line in log.splitlines()[-5:]))
    assert pub.error is None, pub.summary()
    got = drain(keep, q)
    res = check_delivered({"rm": pub.confirmed}, got)
    assert res["lost_count"] == 0, f"lost {res['lost_count']}: {res['lost']['rm'][:20]}"
