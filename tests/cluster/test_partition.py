"""S25/S26 under real network partitions: 3 nodes, one network namespace each
(tests/netns.py), clients in the root namespace reaching every node on its own
address. A partition is an iptables DROP inside the cut node's namespace, so the
Raft links are gone while its AMQP clients still reach it.

S26: a node cut off in a minority never confirms what the majority does not have;
it nacks its pending publishes within a bound (default 10 s) and sends
connection.blocked until it is back; the majority keeps confirming.
S25: the leader cut off in a minority is replaced; the old leader confirms nothing;
after healing the cluster converges and no confirmed message is lost.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from harness.amqp import ConnLost, RawConn
from harness.amqp import frame as _frame
from harness.body import make_body
from harness.client import check_delivered, declare, drain, new_leader_time, uniq_queue
from harness.process import Cluster, ClusterNode
from harness.publisher import StreamPublisher
from tests.broker_proc import wait_for
from tests.netns import NetLab, ensure_iptables, require_netns

NACK_BOUND = 10.0   # default bound for nacking publishes a minority cannot replicate (S26)
SLACK = 5.0         # scheduling / detection slack on a loaded 2-core CI box
HEAL_TIMEOUT = 60.0


# ---------------------------------------------------------------- fixtures

@pytest.fixture
def lab() -> Iterator[NetLab]:
    require_netns()
    ensure_iptables()
    with NetLab(3) as lab:
        yield lab


@pytest.fixture
def ns_cluster(lab: NetLab, cluster_factory: Callable[..., Cluster]) -> Cluster:
    """3 nodes n1..n3, node i in namespace i at its own address.

    `lab` is requested first, so teardown kills the nodes (cluster_factory) before
    the namespaces go away."""
    c = cluster_factory(3, hosts=[n.addr for n in lab.nodes], netns=[n.ns for n in lab.nodes])
    c.lab = lab  # type: ignore[attr-defined]
    return c.start(timeout=90)


def idx(cluster: Cluster, node: ClusterNode) -> int:
    return cluster.nodes.index(node)


# ---------------------------------------------------------------- probe publisher

class ProbeLost(AssertionError):
    pass


class Probe:
    """A confirm-mode publisher on one node that records, per message id, whether an
    ack or a nack came back and when, plus every connection.blocked / unblocked."""

    def __init__(self, node: ClusterNode, queue: str, tag: str) -> None:
        self.node = node
        self.tag = tag
        self.conn = RawConn(node.host, node.amqp_port, timeout=10.0)
        self.conn.send_method(spec.Confirm.Select(), 1)
        self.conn.expect(spec.Confirm.SelectOk)
        self.method = pframe.marshal(spec.Basic.Publish(exchange="", routing_key=queue), 1)
        self.header = pframe.marshal(pheader.ContentHeader(0, 1024, spec.Basic.Properties(delivery_mode=2)), 1)
        self.seq = 0
        self.next_id = 0
        self.sent: dict[int, tuple[int, float]] = {}   # seq -> (id, sent at)
        self.acked: dict[int, float] = {}              # id -> latency s
        self.nacked: dict[int, float] = {}             # id -> latency s
        self.blocked_at: list[float] = []
        self.unblocked_at: list[float] = []
        self.lost: str | None = None
        self.registered: set[int] = set()

    def publish(self, n: int) -> list[int]:
        ids, out, now = [], bytearray(), time.monotonic()
        for _ in range(n):
            self.next_id += 1
            self.seq += 1
            self.sent[self.seq] = (self.next_id, now)
            ids.append(self.next_id)
            out += self.method + self.header + _frame(3, 1, make_body(self.tag, self.next_id))
        self.conn.send(bytes(out))
        return ids

    def pump(self, until: Callable[[], bool], timeout: float) -> bool:
        """Read frames until `until()` or timeout; True if the condition held."""
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                if not self.conn.fill(min(0.2, left)):
                    continue
                frames = self.conn.frames()
            except ConnLost as exc:
                self.lost = str(exc)
                raise ProbeLost(f"connection to {self.node.node_id} lost: {exc}") from None
            now = time.monotonic()
            for _ch, v in frames:
                if isinstance(v, spec.Connection.Blocked):
                    self.blocked_at.append(now)
                elif isinstance(v, spec.Connection.Unblocked):
                    self.unblocked_at.append(now)
                elif isinstance(v, spec.Basic.Ack | spec.Basic.Nack):
                    seqs = [s for s in self.sent if s <= v.delivery_tag] if v.multiple else [v.delivery_tag]
                    for s in seqs:
                        item = self.sent.pop(s, None)
                        if item is None:
                            continue
                        mid, t = item
                        (self.acked if isinstance(v, spec.Basic.Ack) else self.nacked)[mid] = now - t
        return True

    def reconnect(self) -> None:
        """A fresh connection to the same node (ids keep counting; seqs restart)."""
        self.conn.close()
        self.conn = RawConn(self.node.host, self.node.amqp_port, timeout=10.0)
        self.conn.send_method(spec.Confirm.Select(), 1)
        self.conn.expect(spec.Confirm.SelectOk)
        self.seq = 0
        self.sent.clear()

    def register(self, n: int = 5, timeout: float = 30.0) -> None:
        """Publish `n` and wait for their acks, so this connection's channel is in
        the replicated state before a fault (batches from one node commit in order);
        a node later declared down then always drops it (NodeDown)."""
        ids = self.publish(n)
        assert self.pump(lambda: self.settled(ids), timeout), f"{n} warm-up publishes not settled in {timeout}s"
        assert all(i in self.acked for i in ids), f"warm-up publishes nacked: {sorted(self.nacked)}"
        self.registered.update(ids)   # confirmed: the final drain must hold them
        self.acked.clear()

    def await_declared_down(self, timeout: float) -> float:
        """After healing: the node, once it applies the majority's NodeDown for
        itself, closes this connection with 320 CONNECTION_FORCED (its unacked
        deliveries went to other consumers meanwhile; RabbitMQ's pause_minority
        also drops its clients). A connection.unblocked may come first. Returns
        the seconds waited; reconnects to the same node."""
        t0 = time.monotonic()
        try:
            self.pump(lambda: False, timeout)
        except ProbeLost as exc:
            assert "320" in str(exc) and "declared down" in str(exc), \
                f"connection ended without the NodeDown close: {exc}"
            self.reconnect()
            return time.monotonic() - t0
        raise AssertionError(f"{self.node.node_id} kept the connection {timeout}s after healing although "
                             f"the majority declared it down")

    def settled(self, ids: list[int]) -> bool:
        return all(i in self.acked or i in self.nacked for i in ids)

    def close(self) -> None:
        self.conn.close()


def status_of(node: ClusterNode) -> dict[str, Any]:
    st = node.try_status(timeout=2.0)
    return st if st is not None else {}


def describe(cluster: Cluster) -> str:
    return "; ".join(f"{k}: " + (", ".join(f"{f}={v.get(f)}" for f in
                                           ("role", "leader", "term", "commit_index", "last_applied",
                                            "in_sync",
                                            "has_quorum", "blocked")) if v else "unreachable")
                     for k, v in cluster.statuses(cluster.nodes).items())


def healthy(c: Cluster) -> ClusterNode:
    """wait_healthy with every node's view in the failure message."""
    try:
        return c.wait_healthy(timeout=HEAL_TIMEOUT)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n  views: {describe(c)}") from None


# ---------------------------------------------------------------- S26

def test_s26_minority_node_never_confirms_and_nacks_within_bound(ns_cluster: Cluster) -> None:
    c = ns_cluster
    lab: NetLab = c.lab  # type: ignore[attr-defined]
    leader = c.leader()
    minority, other = c.followers()
    q = uniq_queue("s26")
    declare(leader, q)

    maj = StreamPublisher("maj", q, lambda: [other, leader], total=None, window=100, deadline=280)
    maj.start()
    wait_for(lambda: len(maj.confirmed) >= 200 or maj.error, timeout=30, what="majority confirms before the cut")
    assert maj.error is None, maj.summary()

    probe = Probe(minority, q, "min")
    probe.register()
    try:
        # ---- cut the minority's Raft links (clients still reach it)
        t_cut = time.monotonic()
        lab.partition(idx(c, minority), [idx(c, leader), idx(c, other)])
        wave1 = probe.publish(50)
        probe.pump(lambda: probe.settled(wave1) and bool(probe.blocked_at), NACK_BOUND + SLACK)
        print(f"\nS26 minority {minority.node_id}: wave1 acked={len(probe.acked)} nacked={len(probe.nacked)} "
              f"max nack latency={max(probe.nacked.values(), default=0):.2f}s; "
              f"blocked after {probe.blocked_at[0] - t_cut:.2f}s" if probe.blocked_at else
              f"\nS26 minority {minority.node_id}: wave1 acked={len(probe.acked)} "
              f"nacked={len(probe.nacked)}; no connection.blocked; {describe(c)}")
        assert not probe.acked, (f"the minority node confirmed {sorted(probe.acked)[:10]}... which the majority "
                                 f"cannot have: {describe(c)}")
        missing = [i for i in wave1 if i not in probe.nacked]
        assert not missing, (f"{len(missing)} of {len(wave1)} publishes on the minority got no nack within "
                             f"{NACK_BOUND}+{SLACK}s: {describe(c)}")
        slow = {i: round(t, 2) for i, t in probe.nacked.items() if t > NACK_BOUND + SLACK}
        assert not slow, f"nacks later than the bound: {slow}"
        assert probe.blocked_at, f"no connection.blocked on the minority within {NACK_BOUND + SLACK}s: {describe(c)}"

        st = status_of(minority)
        assert st.get("role") != "leader", st
        assert st.get("has_quorum") is False, f"minority says has_quorum={st.get('has_quorum')}: {st}"
        assert st.get("blocked") is True, f"minority says blocked={st.get('blocked')}: {st}"

        # ---- the majority keeps confirming (after its in-sync set dropped the minority)
        t_check = time.monotonic()
        wait_for(lambda: maj.progress_since(t_check) >= 200 or maj.error, timeout=30,
                 what="majority confirms during the partition")
        assert maj.error is None, maj.summary()
        wait_for(lambda: minority.node_id not in (status_of(leader).get("in_sync") or [minority.node_id]),
                 timeout=20, what="the leader to drop the minority from the in-sync set")
        # the minority still confirms nothing, however long it waits
        probe.pump(lambda: False, 2.0)
        assert not probe.acked, f"late ack on the minority: {sorted(probe.acked)[:10]}"

        # ---- heal
        t_heal = time.monotonic()
        lab.heal(idx(c, minority))
        healthy(c)
        t_in_sync = time.monotonic() - t_heal
        waited = probe.await_declared_down(HEAL_TIMEOUT)
        how = f"closed 320 after {waited:.2f}s, reconnected"
        # its batches from the cut still have to go through before it unblocks
        wait_for(lambda: (lambda st: st.get("has_quorum") is True and st.get("blocked") is False)(
            status_of(minority)), timeout=20, what=f"{minority.node_id} to report quorum, unblocked")
        wave3 = probe.publish(50)
        assert probe.pump(lambda: probe.settled(wave3), 30), \
            f"publishes on the healed node not settled in 30 s: {describe(c)}"
        not_acked = [i for i in wave3 if i not in probe.acked]
        assert not not_acked, f"after healing, publishes on {minority.node_id} were nacked: {not_acked[:10]}"
        print(f"  healed: in sync again after {t_in_sync:.2f}s; publisher: {how} after "
              f"{(probe.unblocked_at or [time.monotonic()])[0] - t_heal:.2f}s; wave3 acked {len(wave3)}; "
              f"majority {maj.summary()}")
    finally:
        probe.close()
        maj.stop()
        maj.join(120)

    assert maj.error is None, maj.summary()
    got = drain(leader, q)
    res = check_delivered({"maj": maj.confirmed, "min": set(probe.acked) | probe.registered}, got)
    print(f"  drain via {leader.node_id}: delivered={res['delivered']} dup={res['duplicates']} "
          f"lost={res['lost_count']}")
    assert res["lost_count"] == 0, f"confirmed but missing: { {k: v[:20] for k, v in res['lost'].items()} }"


# ---------------------------------------------------------------- S25

def test_s25_leader_in_minority(ns_cluster: Cluster) -> None:
    c = ns_cluster
    lab: NetLab = c.lab  # type: ignore[attr-defined]
    old = c.leader()
    f1, f2 = c.followers()
    term0 = status_of(old).get("term") or 0
    q = uniq_queue("s25p")
    declare(old, q)

    maj = StreamPublisher("maj", q, lambda: [f1, f2], total=None, window=100, deadline=280)
    maj.start()
    wait_for(lambda: len(maj.confirmed) >= 200 or maj.error, timeout=30, what="confirms before the cut")
    assert maj.error is None, maj.summary()

    probe = Probe(old, q, "old")
    probe.register()
    try:
        t_cut = time.monotonic()
        lab.partition(idx(c, old), [idx(c, f1), idx(c, f2)])
        wave1 = probe.publish(50)
        new, election = new_leader_time(c, [f1, f2], t_cut, timeout=30)
        t_new = t_cut + election
        wait_for(lambda: maj.progress_since(t_new) > 0 or maj.error, timeout=30,
                 what="confirms on the majority after the election")
        first = min(t for t in maj.confirm_times if t >= t_new) - t_cut
        assert maj.error is None, maj.summary()
        term1 = status_of(new).get("term") or 0
        assert term1 > term0, f"term did not grow: {term0} -> {term1}"

        probe.pump(lambda: probe.settled(wave1), NACK_BOUND + SLACK)
        print(f"\nS25 leader {old.node_id} cut off: new leader {new.node_id} (term {term1}) after "
              f"{election:.2f}s; first majority confirm {first:.2f}s after the cut; old leader: "
              f"acked={len(probe.acked)} nacked={len(probe.nacked)} "
              f"blocked={[round(t - t_cut, 2) for t in probe.blocked_at]}")
        assert not probe.acked, f"the old leader confirmed {sorted(probe.acked)[:10]} while cut off"
        missing = [i for i in wave1 if i not in probe.nacked]
        assert not missing, (f"{len(missing)} publishes on the old leader got no nack within "
                             f"{NACK_BOUND}+{SLACK}s: {describe(c)}")
        st = status_of(old)
        assert st.get("role") != "leader", f"old leader still says leader after {time.monotonic() - t_cut:.1f}s"
        assert probe.blocked_at, "no connection.blocked on the old leader"

        # ---- heal, converge
        t_heal = time.monotonic()
        lab.heal(idx(c, old))
        healthy_leader = healthy(c)
        t_healthy = time.monotonic() - t_heal
        waited = probe.await_declared_down(HEAL_TIMEOUT)
        how = f"closed 320 after {waited:.2f}s, reconnected"
        wave3 = probe.publish(20)
        assert probe.pump(lambda: probe.settled(wave3), 30)
        assert all(i in probe.acked for i in wave3), f"nacks after healing: {probe.nacked}"
    finally:
        probe.close()
        maj.stop()
        maj.join(120)
    assert maj.error is None, maj.summary()

    def converged() -> bool:
        sts = c.statuses(c.nodes)
        idxs = {st.get("commit_index") for st in sts.values() if st}
        applied = {st.get("last_applied") for st in sts.values() if st}
        return len(sts) == 3 and None not in sts.values() and len(idxs) == 1 and applied == idxs
    wait_for(converged, timeout=30, interval=0.2, what=f"commit/applied indexes to converge: {describe(c)}")
    # every node reports the same depth
    import pika
    depths = {}
    for n in c.nodes:
        conn = pika.BlockingConnection(pika.ConnectionParameters(host=n.host, port=n.amqp_port, heartbeat=0,
                                                                 socket_timeout=10))
        try:
            depths[n.node_id] = conn.channel().queue_declare(q, passive=True).method.message_count
        finally:
            conn.close()
    print(f"  healed: healthy after {t_healthy:.2f}s (leader {healthy_leader.node_id}); publisher on the "
          f"old leader: {how}; depths {depths}")
    assert len(set(depths.values())) == 1, f"nodes disagree on the queue depth: {depths}"

    got = drain(f1, q)
    res = check_delivered({"maj": maj.confirmed, "old": set(probe.acked) | probe.registered}, got)
    print(f"  drain: delivered={res['delivered']} dup={res['duplicates']} lost={res['lost_count']}")
    assert res["lost_count"] == 0, f"confirmed but missing: { {k: v[:20] for k, v in res['lost'].items()} }"
