"""At most N management requests in flight per user (issue 42)."""
from __future__ import annotations

from node.http.request_limit import RequestLimit


def test_request_limit_per_user() -> None:
    limit = RequestLimit(2)
    assert limit.enter("mon") and limit.enter("mon") and not limit.enter("mon")
    assert limit.enter("other")  # another user's place is its own
    limit.leave("mon")
    assert limit.enter("mon") and limit.refused == 1
    unlimited = RequestLimit(0)
    assert all(unlimited.enter("u") for _ in range(1000))
