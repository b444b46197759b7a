"""node/broker/limit.py's topic_refusal: RabbitMQ's check_topic_authorisation
as a pure decision, failing closed for a channel whose user is unknown
(issue 42 item 10)."""
from __future__ import annotations

from node.broker.limit import topic_refusal

PERMS = {("u", "/", "t"): ("^{username}\\.", "^public\\.")}


def test_a_user_with_a_permission_is_held_to_its_patterns() -> None:
    assert topic_refusal(PERMS, "u", "/", "t", "u.orders", True) is None
    assert topic_refusal(PERMS, "u", "/", "t", "public.x", False) is None
    assert topic_refusal(PERMS, "u", "/", "t", "w.orders", True) == (
        "ACCESS_REFUSED - write access to topic 'w.orders' in exchange 't' in vhost '/' "
        "refused for user 'u'")
    assert topic_refusal(PERMS, "u", "/", "t", "u.x", False) is not None


def test_without_a_permission_of_the_user_on_the_exchange_it_is_allowed() -> None:
    assert topic_refusal(PERMS, "w", "/", "t", "anything", True) is None
    assert topic_refusal(PERMS, "u", "/", "other", "anything", True) is None
    assert topic_refusal(PERMS, "u", "v", "t", "anything", True) is None
    assert topic_refusal({}, None, "/", "t", "anything", True) is None


def test_an_unknown_user_is_refused_where_any_user_has_a_permission() -> None:
    refused = topic_refusal(PERMS, None, "/", "t", "u.orders", True)
    assert refused is not None and refused.startswith("ACCESS_REFUSED - write access")
    assert topic_refusal(PERMS, None, "/", "t", "public.x", False) is not None
    # nobody is restricted on another exchange or vhost: nothing to fail closed about
    assert topic_refusal(PERMS, None, "/", "other", "x", True) is None
    assert topic_refusal(PERMS, None, "v", "t", "x", True) is None
