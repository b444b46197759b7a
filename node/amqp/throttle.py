"""Login throttling per client address, shared by AMQP and HTTP basic auth
(pure: every call takes the clock).

Slow down rather than lock out (NATed clients share an address): the first
`limit` failed logins from an address within `window` seconds cost nothing;
from then on the answer to every login attempt from it, right or wrong, is
withheld for `delay` seconds, doubling with each further failure up to
`max_delay`. Attempts from one address are answered one after another (a
client cannot open many connections and guess on all of them at once), so a
guesser gets about one try per `max_delay`; a right password still gets in,
after the delay. An address whose queue of withheld answers reaches
`max_wait` seconds, or a node holding `max_pending` answers in all, gets an
immediate refusal without its password being looked at. Memory is bounded:
at most `max_tracked` addresses (the least recently seen is forgotten) and a
bounded number of failures each.

Failures are counted per address only: bounding them per user name as well
would let anyone slow down a named user's logins from everywhere.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


class LoginGate(Protocol):
    """What a login asks before it answers (the AMQP connection, the HTTP app)."""

    def wait(self, host: str, now: float) -> float | None: ...
    def record(self, host: str, ok: bool, now: float) -> None: ...


@dataclass
class _Address:
    failures: deque[float] = field(default_factory=deque)
    busy_until: float = 0.0  # when the last answer scheduled for this address goes out


class LoginThrottle:
    def __init__(self, limit: int, window: float, delay: float = 1.0, max_delay: float = 10.0,
                 max_wait: float | None = None, max_pending: int = 1000,
                 max_tracked: int = 10_000) -> None:
        self.limit = limit  # free failures per window; 0: off
        self.window = window
        self.delay = delay
        self.max_delay = max(delay, max_delay)
        self.max_wait = 3 * self.max_delay if max_wait is None else max_wait
        self.max_pending = max_pending
        self.max_tracked = max_tracked
        # enough failures past the limit to reach max_delay by doubling
        steps = 0
        while delay > 0 and delay * 2 ** steps < self.max_delay:
            steps += 1
        self._keep = limit + steps + 1
        self._addresses: dict[str, _Address] = {}  # least recently seen first
        self._due: list[float] = []  # heap: when each withheld answer goes out

    def _get(self, host: str, now: float) -> _Address | None:
        a = self._addresses.get(host)
        if a is None:
            return None
        q = a.failures
        while q and now - q[0] >= self.window:
            q.popleft()
        if not q and a.busy_until <= now:
            del self._addresses[host]
            return None
        return a

    def _touch(self, host: str, a: _Address) -> None:
        self._addresses.pop(host, None)
        self._addresses[host] = a
        while len(self._addresses) > self.max_tracked:
            del self._addresses[next(iter(self._addresses))]

    def wait(self, host: str, now: float) -> float | None:
        """Seconds to withhold the answer to a login from `host` starting now
        (0: answer at once); None: refuse it at once, unchecked. Call once per
        attempt: a wait reserves the address's next answer slot."""
        if self.limit <= 0:
            return 0.0
        a = self._get(host, now)
        if a is None or len(a.failures) < self.limit:
            return 0.0
        due = self._due
        while due and due[0] <= now:
            heapq.heappop(due)
        at = max(now, a.busy_until) + self.step(len(a.failures))
        if at - now > self.max_wait or len(due) >= self.max_pending:
            return None
        a.busy_until = at
        heapq.heappush(due, at)
        self._touch(host, a)
        return at - now

    def step(self, failures: int) -> float:
        """The delay after `failures` recent failures (limit or more)."""
        return min(self.max_delay, self.delay * 2 ** max(0, failures - self.limit))

    def record(self, host: str, ok: bool, now: float) -> None:
        """The outcome of a login. A success forgets nothing: a guesser who owns
        one account must not reset the count by logging in with it."""
        if ok or self.limit <= 0:
            return
        a = self._get(host, now) or _Address()
        a.failures.append(now)
        while len(a.failures) > self._keep:
            a.failures.popleft()
        self._touch(host, a)

    def failures(self, host: str, now: float) -> int:
        a = self._get(host, now)
        return 0 if a is None else len(a.failures)

    def tracked(self) -> int:
        return len(self._addresses)

    def pending(self, now: float) -> int:
        """Answers withheld right now, all addresses."""
        return sum(1 for t in self._due if t > now)
