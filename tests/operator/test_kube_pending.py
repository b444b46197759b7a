"""The operator's in-flight membership change guard (status.pendingChange)."""
from __future__ import annotations

from mirrorq_operator import kube


def test_pending_change_settles_when_the_member_set_shows_it() -> None:
    assert kube._settled("AddMember mq-3 1700000000", {"mq-0", "mq-3"})
    assert not kube._settled("AddMember mq-3 1700000000", {"mq-0"})
    assert kube._settled("RemoveMember mq-4 1700000000", {"mq-0"})
    assert not kube._settled("RemoveMember mq-4", {"mq-4"})


def test_uncertain_pending_change_expires_after_every_call_timeout() -> None:
    t = 1_700_000_000.0
    assert not kube._expired(f"AddMember mq-3 {t:.0f}", t + 60)
    assert kube._expired(f"AddMember mq-3 {t:.0f}", t + kube.PENDING_EXPIRY + 1)
    assert not kube._expired("AddMember mq-3", t)          # old format: never expires by itself
    assert not kube._expired("AddMember mq-3 garbage", t)
