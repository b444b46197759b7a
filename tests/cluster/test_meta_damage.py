"""A member whose meta file (term and vote) was damaged never votes twice in a term.

Raft needs a member's vote durable: one vote per term. A member whose
raft.journal.meta fails its checksum at start does not know which vote it cast.
It votes in no election until a leader has brought it up to its own log's end
(repair_until), and then not in the term after the leader's either: it may have
voted there in a campaign the leader never heard of. Nor does it campaign in
that term itself (a vote for itself). The cost is at most one more election round.

Here the follower's meta file is overwritten with random bytes while it is
stopped; after its repair the leader is SIGKILLed. The next leader's term is at
least two above the old one (without the floor it is one above: the damaged
member's vote made the first campaign win), and every confirmed message is there.
"""
from __future__ import annotations

import os
from collections.abc import Callable

from harness.client import declare, publish_confirmed, queue_depth, uniq_queue
from harness.process import Cluster, wait_for


def test_a_member_with_a_damaged_meta_file_votes_in_no_term_it_may_have_voted_in(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3).start()
    leader = c.leader()
    damaged, other = c.followers()
    q = uniq_queue("meta")
    declare(leader, q)
    publish_confirmed(leader, q, n=50)
    damaged.stop()
    meta = damaged.data_dir / "raft.journal.meta"
    assert meta.exists()
    meta.write_bytes(os.urandom(meta.stat().st_size))
    publish_confirmed(leader, q, n=50)
    damaged.start()
    c.wait_healthy(60)
    wait_for(lambda: "voting again" in damaged.tail_log(400), timeout=60, interval=0.2,
             what=f"{damaged.node_id} repaired from the leader")
    log = damaged.tail_log(400)
    assert "journal meta damaged" in log, log
    term = leader.status()["term"]
    assert f"(in terms above {term + 1})" in log, (term, log)

    leader.kill9()
    survivors = [damaged, other]
    new = c.leader(timeout=60, among=survivors)
    st = new.status()
    assert st["term"] >= term + 2, (term, st["term"], {n.node_id: n.status() for n in survivors})
    assert queue_depth(new, q) == 100
