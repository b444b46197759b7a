"""bench/failover.py: the figures it derives (no cluster, no network)."""
from __future__ import annotations

import time
from typing import Any

import pytest

from bench.failover import FailoverPublisher, confirm_gaps, summarize, table


def test_confirm_gaps_count_from_the_kill() -> None:
    # confirms before the kill are ignored; the kill is the start of the first gap
    gaps = confirm_gaps(10.0, [9.0, 9.9, 15.5, 15.6, 17.0])
    assert gaps[0] == pytest.approx((0.0, 5.5))
    assert gaps[1] == pytest.approx((5.6, 1.4))
    assert [round(g, 3) for _s, g in gaps] == [5.5, 1.4, 0.1]


def test_confirm_gaps_without_confirms_after_the_kill() -> None:
    assert confirm_gaps(10.0, [1.0, 2.0]) == []


def test_summarize_min_median_max_and_failed_rounds() -> None:
    rounds: list[dict[str, Any]] = [
        {"next_confirm_s": 5.0, "longest_gap_s": 5.1, "leader_agreed_s": 1.0, "rejoin_s": 0.5},
        {"next_confirm_s": 7.0, "longest_gap_s": 7.0, "leader_agreed_s": 2.0, "rejoin_s": 0.7},
        {"next_confirm_s": 6.0, "longest_gap_s": 6.5, "leader_agreed_s": 3.0, "rejoin_s": 0.6},
        {"round": 4, "error": "no confirm", "leader_agreed_s": None},
    ]
    s = summarize(rounds, lost=0)
    assert s["rounds"] == 4 and s["rounds_ok"] == 3
    assert (s["next_confirm_min_s"], s["next_confirm_median_s"], s["next_confirm_max_s"]) == (5.0, 6.0, 7.0)
    assert (s["longest_gap_median_s"], s["longest_gap_max_s"]) == (6.5, 7.0)
    assert s["leader_agreed_median_s"] == 2.0 and s["rejoin_median_s"] == 0.6
    assert s["lost"] == 0
    text = table([("mirrorq", "leader", s)])
    assert "3/4" in text and "5.00 / 6.00 / 7.00" in text and "2.00 [-]" in text


def test_summarize_nothing_measured() -> None:
    s = summarize([{"round": 1, "error": "x"}], lost=None)
    assert s["next_confirm_median_s"] is None and s["rounds_ok"] == 0
    assert "-" in table([("rabbitmq", "follower", s)])


def test_publisher_notes_first_confirm_of_a_message_published_after_the_kill() -> None:
    pub = FailoverPublisher("t", "q", lambda: [], total=None)
    pub.bodies.make("t", 1)  # published before the kill
    t_kill = time.monotonic()
    pub.kill_time = t_kill
    pub.bodies.make("t", 2)  # after it
    pub.confirmed.add(1)  # already safe before the kill: "any" confirm only
    assert pub.first_any_confirm is not None and pub.first_new_confirm is None
    pub.confirmed.add(2)
    assert pub.first_new_confirm is not None and pub.first_new_confirm >= pub.first_any_confirm
    assert pub.confirmed == {1, 2}


def test_publisher_pacing() -> None:
    pub = FailoverPublisher("t", "q", lambda: [], total=None, window=1000, rate=100.0)
    ids = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:
        mid = pub._take_id()
        if mid is None:
            time.sleep(0.001)
            continue
        ids.append(mid)
    # 100/s for 0.3 s, plus the initial burst (rate * 0.02 -> 2)
    assert 25 <= len(ids) <= 36
    pub._retry.append(7)  # republishes are never held back
    pub._tokens = 0.0
    assert pub._take_id() == 7
