"""At most `limit` management API requests in flight per user (issue 42).

A request counts from its dispatch to its answer: one waiting for the shared
rows (node/replication/row_cache.py) holds its place. Beyond the limit the
request is answered 429 without reading rows or building anything, the
answer held a second (app.py REFUSAL_HOLD) so a looping client cannot spin.
RabbitMQ has no such limit (its management API answers every request, each
from the stats database); browsers open at most six connections to a host,
so one console never meets the default.
"""
from __future__ import annotations

# default of [http] max_requests_per_user (node/app/config.py)
MAX_REQUESTS_PER_USER = 8


class RequestLimit:
    """Counts requests in flight per user name (pure; the app enters and leaves)."""

    def __init__(self, limit: int = MAX_REQUESTS_PER_USER) -> None:
        self.limit = limit
        self._in_flight: dict[str, int] = {}
        self.refused = 0

    def enter(self, user: str) -> bool:
        """Take a place for `user`'s request; False (nothing taken) when the
        user already has `limit` in flight (0: no limit)."""
        n = self._in_flight.get(user, 0)
        if self.limit and n >= self.limit:
            self.refused += 1
            return False
        self._in_flight[user] = n + 1
        return True

    def leave(self, user: str) -> None:
        n = self._in_flight.get(user, 0) - 1
        if n > 0:
            self._in_flight[user] = n
        else:
            self._in_flight.pop(user, None)

    def in_flight(self, user: str) -> int:
        return self._in_flight.get(user, 0)
