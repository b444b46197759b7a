"""When a starting member may first campaign (election.quiet_timeouts): a
restarted member of a cluster listens STARTUP_GRACE seconds first, a joining
one until a leader contacts it, a fresh member of a new cluster (and a single
node) campaigns on the normal timeouts."""
from __future__ import annotations

from node.replication.config import RaftConfig
from node.replication.raft.election import STARTUP_GRACE, quiet_timeouts

PEERS = {"n2": "127.0.0.1:2", "n3": "127.0.0.1:3"}


def test_a_restarted_member_waits_the_grace_before_it_may_campaign() -> None:
    c = RaftConfig(peers=PEERS)
    assert quiet_timeouts(c, fresh=False) == (c.election_min + STARTUP_GRACE, c.election_max + STARTUP_GRACE)
    assert quiet_timeouts(c) == quiet_timeouts(c, fresh=False)  # unknown: the safe side


def test_a_fresh_member_of_a_new_cluster_campaigns_on_the_normal_timeouts() -> None:
    assert quiet_timeouts(RaftConfig(peers=PEERS), fresh=True) is None


def test_a_joining_member_stays_quiet_fresh_or_not_and_a_single_node_never_waits() -> None:
    for fresh in (True, False):
        quiet = quiet_timeouts(RaftConfig(peers=PEERS, join=True), fresh=fresh)
        assert quiet is not None and quiet[0] >= 3600
        assert quiet_timeouts(RaftConfig(), fresh=fresh) is None
