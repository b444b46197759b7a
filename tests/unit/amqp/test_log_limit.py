"""node/amqp/log_limit.py: one line per cause per interval, and the next
line says how many of its cause were left out (issue 42 item 10)."""
from __future__ import annotations

from node.amqp.log_limit import LogLimit, suppressed_note


def test_one_line_per_cause_per_interval_with_the_count_left_out() -> None:
    lim = LogLimit(interval=10.0)
    assert lim.admit("per-address", 0.0) == 0
    assert [lim.admit("per-address", t) for t in (1.0, 2.0, 9.9)] == [None, None, None]
    assert lim.admit("total", 5.0) == 0  # another cause has its own line
    assert lim.admit("per-address", 10.0) == 3  # the three left out since
    assert lim.admit("per-address", 21.0) == 0


def test_the_note_names_the_lines_left_out() -> None:
    assert suppressed_note(0) == ""
    assert "3 more" in suppressed_note(3)
