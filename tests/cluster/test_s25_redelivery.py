"""S25 / S07: deliveries unacked on a node that is SIGKILLed are redelivered,
with redelivered=true, to a consumer on a surviving node; what was acked
before the kill stays acked; the surviving consumer keeps consuming (also
through a leader change)."""
from __future__ import annotations

import time

import pika
import pytest

from harness.client import new_leader_time, pika_conn, pump, uniq_queue
from harness.process import Cluster
from tests.broker_proc import wait_for

N = 20
ACKED_BEFORE = 5
SIZE = 1000


@pytest.mark.parametrize("victim_role", ["follower", "leader"])
def test_s25_unacked_on_killed_node_redelivered_to_survivor(cluster: Cluster, victim_role: str) -> None:
    leader = cluster.leader()
    f1, f2 = cluster.followers()
    victim = leader if victim_role == "leader" else f1
    survivor = f2
    q = uniq_queue("redeliver")

    sconn = pika_conn(survivor)
    sch = sconn.channel()
    sch.queue_declare(q, durable=True)
    sch.confirm_delivery()
    for i in range(N):
        sch.basic_publish("", q, f"{i:04d}".encode().ljust(SIZE, b"."), pika.BasicProperties(delivery_mode=2))
    bytes_full = wait_for(lambda: survivor.status()["message_bytes"], timeout=10, what="message_bytes")

    # the victim's consumer takes all N (prefetch N) and acks the first few
    vconn = pika_conn(victim)
    vch = vconn.channel()
    vch.basic_qos(prefetch_count=N)
    vgot: list[tuple[bytes, int]] = []
    vch.basic_consume(q, lambda _c, m, _p, b: vgot.append((b, m.delivery_tag)))
    pump(vconn, lambda: len(vgot) == N, timeout=15, what=f"{N} deliveries on {victim.node_id}")
    for _b, tag in vgot[:ACKED_BEFORE]:
        vch.basic_ack(tag)
    vconn.process_data_events(time_limit=0)
    # the acks are applied on the survivor once its copy of the queue holds fewer bytes
    want = bytes_full * (N - ACKED_BEFORE) // N
    wait_for(lambda: survivor.status()["message_bytes"] <= want, timeout=10,
             what=f"the survivor to apply {ACKED_BEFORE} acks (message_bytes <= {want})")

    # a consumer on the survivor, attached before the kill: it gets nothing yet (all checked out)
    got: list[tuple[bytes, bool, int]] = []
    cch = sconn.channel()
    cch.basic_qos(prefetch_count=N)
    cch.basic_consume(q, lambda _c, m, _p, b: got.append((b, m.redelivered, m.delivery_tag)))
    sconn.process_data_events(time_limit=0.2)
    assert got == [], f"the survivor's consumer got messages still checked out on the victim: {got}"

    t_kill = time.monotonic()
    victim.kill9()
    try:
        vconn.close()
    except Exception:  # noqa: BLE001 - its node is dead
        pass
    failover = None
    if victim_role == "leader":
        _new, failover = new_leader_time(cluster, [f1, f2], t_kill, timeout=30)
    pump(sconn, lambda: len(got) >= N - ACKED_BEFORE, timeout=45,
         what=f"{N - ACKED_BEFORE} redeliveries on {survivor.node_id}")
    t_redelivered = time.monotonic() - t_kill
    for _b, _r, tag in got:
        cch.basic_ack(tag, multiple=False)
    expected = sorted(b for b, _t in vgot[ACKED_BEFORE:])
    assert sorted(b for b, _r, _t in got) == expected, "exactly the unacked messages come back"
    assert all(r for _b, r, _t in got), f"redelivered flags: {[r for _b, r, _t in got]}"

    # the surviving consumer keeps consuming new messages
    sch.basic_publish("", q, b"after-kill", pika.BasicProperties(delivery_mode=2))
    pump(sconn, lambda: len(got) > N - ACKED_BEFORE, timeout=15, what="a fresh delivery after the kill")
    assert got[-1][0] == b"after-kill" and got[-1][1] is False, got[-1]
    cch.basic_ack(got[-1][2])
    assert len(got) == N - ACKED_BEFORE + 1, "acked messages must not come back"
    print(f"\nS25 redelivery ({victim_role} {victim.node_id} killed): "
          + (f"new leader after {failover:.3f}s, " if failover is not None else "")
          + f"{N - ACKED_BEFORE} unacked redelivered to {survivor.node_id} {t_redelivered:.2f}s after the kill")
    sconn.close()
    if failover is not None:
        assert failover < 2.0, f"new leader only {failover:.2f}s after SIGKILL of the leader (want < 2 s)"
