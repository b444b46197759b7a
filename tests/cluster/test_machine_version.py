"""A rolling upgrade's machine version with real node processes: one member
runs as a build of the older machine version (the test hook
MIRRORQ_MACHINE_VERSION=1) and holds the whole cluster at version 1, with
confirms and deliveries working; once it is restarted at this build's version
the leader raises it and every member reports the same version in its status.
Started again as the older build, the member refuses the log (exit code 4,
one clear line) instead of diverging."""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable

from harness.client import declare, drain, pika_conn, uniq_queue
from harness.process import Cluster, ClusterNode, wait_for
from node.replication.machine.version import MACHINE_VERSION

OLD = MACHINE_VERSION - 1


def _publish(node: ClusterNode, queue: str, n: int) -> list[str]:
    """`n` random bodies, each confirmed; their sha256."""
    conn = pika_conn(node)
    sent = []
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(n):
            body = os.urandom(200 + 37 * i)
            ch.basic_publish("", queue, body)
            sent.append(hashlib.sha256(body).hexdigest())
    finally:
        conn.close()
    return sent


def _versions(cluster: Cluster) -> dict[str, tuple[int, int] | None]:
    """member -> (the cluster's machine version as applied there, the one it runs)."""
    return {n.node_id: (st["machine_version"], st["runs_machine_version"]) if st else None
            for n, st in ((n, n.try_status()) for n in cluster.nodes)}


def _leader_heard(cluster: Cluster, want: dict[str, int]) -> bool:
    """The leader's status shows each follower's reported version as `want`."""
    leader = cluster.leader()
    st = leader.try_status()
    if st is None:
        return False
    heard = {p["member"]: p["machine_version"] for p in st["peers"]}
    return all(heard.get(m) == v for m, v in want.items() if m != leader.node_id)


def test_an_older_member_holds_the_machine_version_until_it_is_upgraded(
        cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory(3, node_env=lambda nid: {"MIRRORQ_MACHINE_VERSION": str(OLD)}
                              if nid == "n3" else {})
    cluster.start()
    n1, _n2, n3 = cluster.nodes
    q = uniq_queue("machver")
    declare(n1, q)
    sent = _publish(n1, q, 40) + _publish(n3, q, 40)  # proposed by either build
    # the leader has heard every member's version, and still the cluster stays at the old one
    wait_for(lambda: _leader_heard(cluster, {"n1": MACHINE_VERSION, "n2": MACHINE_VERSION, "n3": OLD}),
             30, what="the leader to hear every member's machine version")
    assert _versions(cluster) == {"n1": (OLD, MACHINE_VERSION), "n2": (OLD, MACHINE_VERSION),
                                  "n3": (OLD, OLD)}

    # the rolling update reaches n3: the version switches, the same on every member
    n3.env.pop("MIRRORQ_MACHINE_VERSION")
    n3.restart()
    want = {n.node_id: (MACHINE_VERSION, MACHINE_VERSION) for n in cluster.nodes}
    wait_for(lambda: _versions(cluster) == want, 30, what=f"every member at machine version {MACHINE_VERSION}")
    sent += _publish(n3, q, 40)
    cluster.wait_healthy(30)
    got = drain(n1, q)
    assert Counter(hashlib.sha256(b).hexdigest() for b, _ in got) == Counter(sent)

    # an older build never applies the newer cluster's log: it stops, saying why
    n3.stop()
    n3.env["MIRRORQ_MACHINE_VERSION"] = str(OLD)
    n3.start(wait=False)
    assert n3.proc is not None
    code = n3.proc.wait(timeout=60)
    assert code == 4, (code, n3.tail_log(20))
    assert f"the cluster runs machine version {MACHINE_VERSION}, this build runs {OLD}" in n3.tail_log(20)
    assert _versions(cluster)["n1"] == (MACHINE_VERSION, MACHINE_VERSION)
