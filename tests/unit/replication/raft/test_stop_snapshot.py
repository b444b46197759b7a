"""The clean stop's snapshot decision (node/replication/raft/compaction.py): a
stop with much log since the last snapshot takes one, unless snapshots are
failing (a full disk keeps the node running, and SIGTERM must not wait out the
bound for one more failure: issue 46)."""
from __future__ import annotations

from node.replication.raft.compaction import CompactionMixin, stop_snapshot_skipped

LIMIT = CompactionMixin.STOP_SNAPSHOT_BYTES


def test_a_short_log_since_the_snapshot_takes_none_and_says_nothing() -> None:
    assert stop_snapshot_skipped(0, 0, LIMIT) == ""
    assert stop_snapshot_skipped(LIMIT - 1, 3, LIMIT) == ""


def test_a_long_log_takes_one_unless_the_last_attempts_failed() -> None:
    assert stop_snapshot_skipped(LIMIT, 0, LIMIT) is None
    assert stop_snapshot_skipped(10 * LIMIT, 0, LIMIT) is None
    assert stop_snapshot_skipped(LIMIT, 2, LIMIT) == "the last 2 attempts failed"


def test_the_stop_snapshot_fits_inside_the_tests_and_the_charts_grace_periods() -> None:
    # + the raft thread's 5 s join and the listeners' 2 s: inside the e2e tests' 30 s
    assert CompactionMixin.STOP_SNAPSHOT_SECONDS + 5 + 2 < 30
