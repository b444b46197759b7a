"""Login throttling per (client address, user name), with a higher bound
per address, shared by AMQP and HTTP basic auth (pure: every call takes the
clock).

Slow down rather than lock out (NATed clients share an address): the first
`limit` failed logins for a user name from an address within `window`
seconds cost nothing; from then on the answer to every login attempt for
that name from it, right or wrong, is withheld for `delay` seconds, doubling
with each further failure up to `max_delay`. Keyed by the name too, since
behind a LoadBalancer's SNAT or an ingress every client shares one address:
one user's failures must not hold another user's right password. A guesser
spraying many names from one address is bounded by the address's own count:
past `address_limit` failures (any names) every login from it is held the
same way. Attempts held on one key are answered one after another (a client
cannot open many connections and guess on all of them at once), so a
guesser gets about one try per `max_delay` per name; a right password still
gets in, after the delay. A key whose queue of withheld answers reaches
`max_wait` seconds, or a node holding `max_pending` answers in all, gets an
immediate refusal without its password being looked at. Memory is bounded:
at most `max_tracked` addresses and as many (address, name) pairs (the
least recently seen are forgotten), a bounded number of failures each, and
names cut to `NAME_KEY` characters.

Failures are not counted per user name across addresses: that would let
anyone slow down a named user's logins from everywhere.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

_K = TypeVar("_K", str, tuple[str, str])


class LoginGate(Protocol):
    """What a login asks before it answers (the AMQP connection, the HTTP app)."""

    def wait(self, host: str, now: float, user: str = "") -> float | None: ...
    def record(self, host: str, ok: bool, now: float, user: str = "") -> None: ...


NAME_KEY = 256  # characters of a user name that key its failures (names are not bounded)
ADDRESS_LIMIT = 100  # failures from one address, any names, before all its logins are held


@dataclass
class _Key:
    failures: deque[float] = field(default_factory=deque)
    busy_until: float = 0.0  # when the last answer scheduled for this key goes out


class LoginThrottle:
    def __init__(self, limit: int, window: float, delay: float = 1.0, max_delay: float = 10.0,
                 max_wait: float | None = None, max_pending: int = 1000,
                 max_tracked: int = 10_000, address_limit: int = ADDRESS_LIMIT) -> None:
        self.limit = limit  # free failures per (address, name) per window; 0: off
        # free failures per address, any names (never under `limit`; 0: no address bound)
        self.address_limit = max(limit, address_limit) if address_limit > 0 else 0
        self.window = window
        self.delay = delay
        self.max_delay = max(delay, max_delay)
        self.max_wait = 3 * self.max_delay if max_wait is None else max_wait
        self.max_pending = max_pending
        self.max_tracked = max_tracked
        # enough failures past a limit to reach max_delay by doubling
        steps = 0
        while delay > 0 and delay * 2 ** steps < self.max_delay:
            steps += 1
        self._keep = limit + steps + 1
        self._keep_address = max(self.address_limit, limit) + steps + 1
        self._pairs: dict[tuple[str, str], _Key] = {}  # least recently seen first
        self._addresses: dict[str, _Key] = {}  # likewise
        self._due: list[float] = []  # heap: when each withheld answer goes out

    def _get(self, table: dict[_K, _Key], key: _K, now: float) -> _Key | None:
        a = table.get(key)
        if a is None:
            return None
        q = a.failures
        while q and now - q[0] >= self.window:
            q.popleft()
        if not q and a.busy_until <= now:
            del table[key]
            return None
        return a

    def _touch(self, table: dict[_K, _Key], key: _K, a: _Key) -> None:
        table.pop(key, None)
        table[key] = a
        while len(table) > self.max_tracked:
            del table[next(iter(table))]

    def wait(self, host: str, now: float, user: str = "") -> float | None:
        """Seconds to withhold the answer to a login for `user` from `host`
        starting now (0: answer at once); None: refuse it at once, unchecked.
        Call once per attempt: a wait reserves the key's next answer slot."""
        if self.limit <= 0:
            return 0.0
        pair_key = (host, user[:NAME_KEY])
        pair = self._get(self._pairs, pair_key, now)
        address = self._get(self._addresses, host, now)
        pair_step = self._step(pair, self.limit)
        address_step = self._step(address, self.address_limit)
        if not pair_step and not address_step:
            return 0.0
        due = self._due
        while due and due[0] <= now:
            heapq.heappop(due)
        at = now
        if pair is not None and pair_step:
            at = max(at, max(now, pair.busy_until) + pair_step)
        if address is not None and address_step:
            at = max(at, max(now, address.busy_until) + address_step)
        if at - now > self.max_wait or len(due) >= self.max_pending:
            return None
        heapq.heappush(due, at)
        if pair is not None and pair_step:
            pair.busy_until = at
            self._touch(self._pairs, pair_key, pair)
        if address is not None and address_step:
            address.busy_until = at
            self._touch(self._addresses, host, address)
        return at - now

    def _step(self, key: _Key | None, limit: int) -> float:
        if key is None or limit <= 0 or len(key.failures) < limit:
            return 0.0
        return self.step(len(key.failures), limit)

    def step(self, failures: int, limit: int | None = None) -> float:
        """The delay after `failures` recent failures (`limit`, default the
        per-name one, or more)."""
        free = self.limit if limit is None else limit
        return min(self.max_delay, self.delay * 2 ** max(0, failures - free))

    def record(self, host: str, ok: bool, now: float, user: str = "") -> None:
        """The outcome of a login. A success forgets nothing: a guesser who owns
        one account must not reset the count by logging in with it."""
        if ok or self.limit <= 0:
            return
        self._fail(self._pairs, (host, user[:NAME_KEY]), self._keep, now)
        self._fail(self._addresses, host, self._keep_address, now)

    def _fail(self, table: dict[_K, _Key], key: _K, keep: int, now: float) -> None:
        a = self._get(table, key, now) or _Key()
        a.failures.append(now)
        while len(a.failures) > keep:
            a.failures.popleft()
        self._touch(table, key, a)

    def failures(self, host: str, now: float, user: str | None = None) -> int:
        """Recent failures from `host`: all names, or `user`'s."""
        if user is None:
            a = self._get(self._addresses, host, now)
        else:
            a = self._get(self._pairs, (host, user[:NAME_KEY]), now)
        return 0 if a is None else len(a.failures)

    def tracked(self) -> int:
        """Addresses tracked (each has its pairs tracked too)."""
        return len(self._addresses)

    def pending(self, now: float) -> int:
        """Answers withheld right now, all keys."""
        return sum(1 for t in self._due if t > now)
