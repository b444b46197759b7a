"""Failed-login throttling per client address (issue 7)."""
from __future__ import annotations

from node.amqp.throttle import LoginThrottle


def test_blocks_after_limit_within_window_then_recovers() -> None:
    t = LoginThrottle(limit=3, window=10.0)
    for now in (0.0, 1.0, 2.0):
        assert not t.blocked("10.0.0.5", now)
        t.failed("10.0.0.5", now)
    assert t.blocked("10.0.0.5", 2.5)
    assert not t.blocked("10.0.0.6", 2.5)  # other addresses unaffected
    assert t.blocked("10.0.0.5", 9.9)
    assert not t.blocked("10.0.0.5", 10.0)  # the first failure aged out
    t.failed("10.0.0.5", 10.5)
    assert t.blocked("10.0.0.5", 10.6)
    assert not t.blocked("10.0.0.5", 22.0)
    assert t.tracked() == 0  # forgotten once all failures aged out


def test_failures_spread_out_never_block_and_memory_is_bounded() -> None:
    t = LoginThrottle(limit=3, window=1.0)
    for i in range(100):
        t.failed("h", i * 0.6)
        assert not t.blocked("h", i * 0.6 + 0.01)
    for _ in range(1000):
        t.failed("h", 1000.0)
    assert len(t._failures["h"]) == 3


def test_zero_limit_is_off() -> None:
    t = LoginThrottle(limit=0, window=10.0)
    for _ in range(100):
        t.failed("h", 0.0)
    assert not t.blocked("h", 0.0) and t.tracked() == 0
