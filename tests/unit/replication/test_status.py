"""NodeStatus.to_dict(): the keys and order the generic readers (gRPC Status, the
Prometheus text, `mirrorq status --json`) have always had; the app's fields appear
only once the app has filled them, the members' addresses only once the API has."""
from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest

from tests.support.status import node_status, peer

RAFT_KEYS = [
    "node_id", "role", "leader", "term", "commit_index", "last_applied", "log_len", "members",
    "in_sync", "draining", "has_quorum", "mirrored_index", "blocked", "pending_batches",
    "resends", "nacked_publishes", "failed_batches", "queues", "journal_flushes", "snapshots",
    "last_snapshot_seconds", "last_snapshot_bytes", "applied_batches", "message_bytes",
    "published", "confirmed", "nacked", "delivered", "redelivered", "acked", "leader_changes",
    "deferred_elections", "prevote_rounds", "ignored_votes", "fast_elections", "peer_rejects",
    "peer_mac_failures", "peer_tls", "encoded_appends", "longest_raft_stall_ms", "longest_flush_ms",
    "journal_write_errors", "journal_flush_errors", "installed_snapshots", "refused_snapshots",
    "damaged_snapshots", "failed_snapshots", "log_segments", "log_compactions",
    "skipped_closes", "longest_fork_ms", "longest_owner_tick_ms", "forced_compactions",
    "longest_leader_gap_ms", "longest_send_gap_ms", "in_sync_size", "machine_version", "runs_machine_version",
    "confirm_latency", "peers",
]


def test_raft_node_status_has_the_keys_in_order() -> None:
    st = node_status(node_id="n1", peers=[peer("n2", match_index=7)])
    d = st.to_dict()
    assert list(d) == RAFT_KEYS
    assert d["peers"] == [{"member": "n2", "address": "h:n2", "match_index": 7,
                           "connected": True, "lost": False, "reply_age": None,
                           "machine_version": 0}]


APP_KEYS = ["connections", "amqp_port", "amqps_port", "connection_held_bytes", "mem_used",
            "mem_limit", "mem_alarm"]


def test_app_fields_follow_once_filled_even_when_none() -> None:
    st = replace(node_status(node_id="n1"), connections=2, amqp_port=5672, amqps_port=None,
                 connection_held_bytes=0, mem_used=0, mem_limit=0, mem_alarm=False)
    d = st.to_dict()
    assert list(d) == [*RAFT_KEYS, *APP_KEYS]
    assert d["amqps_port"] is None  # no TLS listener: still reported, as before
    # TLS only: no plain port, still the app's fields (the amqps port among them)
    d = replace(st, amqp_port=None, amqps_port=5671).to_dict()
    assert list(d)[-len(APP_KEYS):] == APP_KEYS
    assert d["amqp_port"] is None and d["amqps_port"] == 5671
    d = replace(st, member_addresses={"n1": "h:1"}).to_dict()
    assert list(d)[-1] == "member_addresses" and d["member_addresses"] == {"n1": "h:1"}


def test_status_is_immutable() -> None:
    st = node_status(node_id="n1")
    with pytest.raises(FrozenInstanceError):
        st.term = 4  # type: ignore[misc]
