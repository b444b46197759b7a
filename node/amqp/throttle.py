"""Failed-login throttling per client address (pure: the caller passes the clock).

After `limit` failed logins from one address within `window` seconds, further
logins from it are refused (403) until the oldest of those failures is older
than the window. Brute force gets a few attempts a window; everyone else,
including other addresses, is unaffected."""
from __future__ import annotations

from collections import deque


class LoginThrottle:
    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit  # 0: off
        self.window = window
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, host: str, now: float) -> deque[float] | None:
        q = self._failures.get(host)
        if q is None:
            return None
        while q and now - q[0] >= self.window:
            q.popleft()
        if not q:
            del self._failures[host]
            return None
        return q

    def blocked(self, host: str, now: float) -> bool:
        if self.limit <= 0:
            return False
        q = self._recent(host, now)
        return q is not None and len(q) >= self.limit

    def failed(self, host: str, now: float) -> None:
        if self.limit <= 0:
            return
        q = self._recent(host, now)
        if q is None:
            q = self._failures[host] = deque()
        q.append(now)
        while len(q) > self.limit:  # memory stays bounded per address
            q.popleft()

    def tracked(self) -> int:
        return len(self._failures)
