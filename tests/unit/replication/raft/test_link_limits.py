"""Issue 26 item 5: the pure decisions behind the handshake deadline and the
cap on unauthenticated inbound links."""
from __future__ import annotations

from node.replication.raft.link.handshake import evictions, handshake_overdue


def test_only_inbound_unauthenticated_links_have_a_handshake_deadline() -> None:
    assert handshake_overdue(True, False, opened_at=0.0, now=10.5, deadline=10.0)
    assert not handshake_overdue(True, False, opened_at=0.0, now=9.5, deadline=10.0)
    assert not handshake_overdue(True, True, opened_at=0.0, now=1e6, deadline=10.0)  # a slow follower stays
    assert not handshake_overdue(False, False, opened_at=0.0, now=1e6, deadline=10.0)  # our own dial


def test_evictions_drop_the_oldest_beyond_the_cap() -> None:
    assert evictions(["a", "b", "c", "d"], keep=2) == ["a", "b"]
    assert evictions(["a", "b"], keep=2) == []
    assert evictions([], keep=0) == []
