"""The login throttle (issue 26 item 7), folded through by hand: pure, the
clock is an argument. Slow down rather than lock out: free failures, then
every answer from the address is held, doubling up to a cap, one after
another; a right password still gets in; memory stays bounded."""
from __future__ import annotations

from node.amqp.throttle import LoginThrottle

H = "10.0.0.5"


def fail(t: LoginThrottle, host: str, now: float, n: int = 1) -> None:
    for _ in range(n):
        assert t.wait(host, now) is not None
        t.record(host, False, now)


def test_free_failures_then_delays_double_up_to_the_cap() -> None:
    t = LoginThrottle(limit=3, window=60.0, delay=1.0, max_delay=8.0, max_wait=1e9)
    for _ in range(3):
        assert t.wait(H, 0.0) == 0.0  # the first `limit` failures cost nothing
        t.record(H, False, 0.0)
    now, waits = 0.0, []
    for _ in range(6):
        w = t.wait(H, now)
        assert w is not None
        waits.append(w)
        t.record(H, False, now)
        now += w  # a sequential guesser asks again when the answer came
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert t.wait("10.0.0.6", now) == 0.0  # other addresses unaffected


def test_parallel_attempts_are_answered_one_after_another() -> None:
    """60 connections opened first, all guessing at once: the answers are spaced
    out (the old accept-time check let all of them through at once)."""
    t = LoginThrottle(limit=3, window=60.0, delay=1.0, max_delay=2.0, max_wait=1e9)
    fail(t, H, 0.0, 3)
    waits = []
    for _ in range(57):
        w = t.wait(H, 0.0)
        assert w is not None
        waits.append(w)
        t.record(H, False, 0.0)
    assert waits[:3] == [1.0, 3.0, 5.0]  # 1, then +2 each (the cap)
    assert waits[-1] == 1.0 + 2.0 * 56  # about one guess per max_delay
    assert t.pending(0.0) == 57


def test_right_password_still_gets_in_after_the_delay_and_resets_nothing() -> None:
    t = LoginThrottle(limit=2, window=60.0, delay=1.0, max_delay=10.0)
    fail(t, H, 0.0, 4)
    w = t.wait(H, 100.0)  # failures aged out of the window: no delay
    assert w == 0.0
    fail(t, H, 100.0, 3)
    w = t.wait(H, 101.0)
    assert w == 2.0  # 3 failures, limit 2: 1 * 2**1
    t.record(H, True, 101.0)  # the NATed user got in, after the wait...
    assert t.failures(H, 101.0) == 3  # ...and a guesser who owns an account resets nothing


def test_full_queue_refuses_at_once() -> None:
    t = LoginThrottle(limit=1, window=60.0, delay=1.0, max_delay=4.0, max_wait=10.0)
    fail(t, H, 0.0)
    got = []
    for _ in range(6):
        w = t.wait(H, 0.0)
        got.append(w)
        if w is not None:  # a refused attempt is not checked: no failure either
            t.record(H, False, 0.0)
    assert got == [1.0, 3.0, 7.0, None, None, None]  # 1, +2, +4, then 15 > 10 s
    assert t.wait(H, 9.0) is not None  # the queue drained: accepted again
    g = LoginThrottle(limit=1, window=60.0, max_pending=2, max_wait=1e9)
    for h in ("a", "b", "c"):
        fail(g, h, 0.0)
    assert g.wait("a", 0.0) is not None and g.wait("b", 0.0) is not None
    assert g.wait("c", 0.0) is None  # the node holds max_pending answers already
    assert g.wait("c", 1.5) is not None  # once they went out


def test_memory_is_bounded() -> None:
    t = LoginThrottle(limit=3, window=60.0, delay=1.0, max_delay=8.0, max_tracked=100)
    for i in range(1000):
        t.record(f"10.1.{i // 256}.{i % 256}", False, 0.0)
    assert t.tracked() == 100  # the least recently seen are forgotten
    for _ in range(10_000):
        t.record(H, False, 0.0)
    assert len(t._pairs[(H, "")].failures) == 3 + 3 + 1  # limit + doublings to the cap + 1
    assert len(t._addresses[H].failures) == 100 + 3 + 1  # the address bound likewise
    assert t.failures("10.1.0.0", 0.0) == 0  # evicted


def test_forgets_an_address_once_its_failures_age_out() -> None:
    t = LoginThrottle(limit=3, window=10.0)
    fail(t, H, 0.0, 3)
    assert t.wait(H, 5.0) == 1.0
    assert t.tracked() == 1
    assert t.wait(H, 20.0) == 0.0 and t.tracked() == 0


def test_zero_limit_is_off() -> None:
    t = LoginThrottle(limit=0, window=10.0)
    for _ in range(100):
        t.record(H, False, 0.0)
        assert t.wait(H, 0.0) == 0.0
    assert t.tracked() == 0


def test_failures_for_one_name_do_not_hold_another_names_login() -> None:
    """Issue 42 item 7: behind SNAT every client shares an address. Failures for
    alice hold alice's next answers only; bob's right login is answered at once
    (before: held 4 s after 12 failures, as the address's)."""
    t = LoginThrottle(limit=10, window=60.0, delay=1.0, max_delay=10.0)
    now = 0.0
    for _ in range(12):
        w = t.wait(H, now, "alice")
        assert w is not None
        t.record(H, False, now, "alice")
        now += w
    assert t.wait(H, now, "alice") == 4.0
    assert t.wait(H, now, "bob") == 0.0
    assert t.failures(H, now) == 12 and t.failures(H, now, "bob") == 0


def test_spraying_names_is_bounded_per_address() -> None:
    """Each fresh name has its free failures, but past address_limit failures
    from the address (any names) every login from it is held, one after another."""
    t = LoginThrottle(limit=3, window=60.0, delay=1.0, max_delay=4.0, max_wait=1e9,
                      address_limit=20)
    for i in range(20):
        assert t.wait(H, 0.0, f"u{i}") == 0.0
        t.record(H, False, 0.0, f"u{i}")
    waits = []
    for i in range(20, 24):
        w = t.wait(H, 0.0, f"u{i}")
        assert w is not None
        waits.append(w)
        t.record(H, False, 0.0, f"u{i}")
    assert waits == [1.0, 3.0, 7.0, 11.0]  # 1, +2, +4, then +4 (the cap)
    assert t.wait("10.0.0.6", 0.0, "u0") == 0.0  # other addresses unaffected
    assert t.wait(H, 0.0, "bob") == 15.0  # a right login queues too: the bound is the address's
    long = LoginThrottle(limit=3, window=60.0, address_limit=0)  # no address bound
    for i in range(500):
        long.record(H, False, 0.0, f"u{i}")
    assert long.wait(H, 0.0, "fresh") == 0.0


def test_long_names_share_a_key() -> None:
    t = LoginThrottle(limit=2, window=60.0)
    for i in range(2):
        t.record(H, False, 0.0, "x" * 10_000 + str(i))  # only the first 256 characters key
    assert t.wait(H, 0.0, "x" * 300) == 1.0
