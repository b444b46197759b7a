"""The pure policy model: RabbitMQ's validation texts, matching, the
operator merge and the effective queue settings."""
from __future__ import annotations

from node.broker.policy import (
    Policy,
    best,
    definition_error,
    effective_definition,
    policy_error,
    queue_settings,
)


def test_definitions_are_refused_with_rabbitmqs_texts() -> None:
    assert definition_error({}, False) == "no policy provided"
    assert definition_error({"max-length": -1}, False) == "-1 is not a valid maximum length"
    assert definition_error({"expires": 0}, False) == "0 is not a valid queue expiry"
    assert definition_error({"overflow": "x"}, False) == '<<"x">> is not a valid overflow value'
    assert definition_error({"foo": 1}, False) == \
        '[{<<"foo">>,1}] are not recognised policy settings'
    assert definition_error({"max-length": True}, False) == "true is not a valid maximum length"
    # operator policies take only the keys RabbitMQ allows there
    assert definition_error({"dead-letter-exchange": "x"}, True) == \
        '[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings'
    assert definition_error({"max-length": 1, "delivery-limit": -1, "overflow": "drop-head"},
                            True) is None
    for ok in ({"dead-letter-strategy": "at-least-once"}, {"consumer-timeout": 60000},
               {"queue-leader-locator": "balanced"}, {"alternate-exchange": "ae"},
               {"queue-version": 2}, {"delivery-limit": -1}):
        assert definition_error(ok, False) is None, ok


def test_a_policy_needs_a_number_priority_a_re2_pattern_and_a_known_apply_to() -> None:
    assert policy_error(".*", {"max-length": 1}, "x", "all", False) == \
        'priority should be a number, actually was <<"x">>'
    assert "regular expression" in (policy_error("(a)\\1", {"max-length": 1}, 0, "all", False)
                                    or "")
    assert "apply-to 'nope' unrecognised" in (policy_error(".*", {"max-length": 1}, 0, "nope",
                                                           False) or "")
    assert policy_error(".*", {"max-length": 1}, 0, "quorum_queues", False) is None


def test_the_pattern_matches_anywhere_and_ties_go_to_the_lower_name() -> None:
    a = Policy("/", "b", "ob", "all", 1, {"max-length": 1})
    b = Policy("/", "a", "^jo", "queues", 1, {"max-length": 2})
    assert best([a, b], "/", "jobs", "queue") is b
    assert best([a, b], "/", "jobs", "exchange") is a
    assert best([a, b], "v", "jobs", "queue") is None


def test_the_operator_merge_keeps_the_conservative_value() -> None:
    p = Policy("/", "p", ".*", "all", 0, {"max-length": 10, "delivery-limit": -1,
                                           "overflow": "drop-head", "dead-letter-exchange": "d"})
    op = Policy("/", "o", ".*", "all", 0, {"max-length": 20, "delivery-limit": 4,
                                            "overflow": "reject-publish"})
    assert effective_definition(p, op) == {"dead-letter-exchange": "d", "delivery-limit": 4,
                                           "max-length": 10, "overflow": "reject-publish"}


def test_arguments_and_policy_resolve_per_key() -> None:
    st = queue_settings({"x-delivery-limit": 5, "x-queue-type": "quorum"}, {"delivery-limit": -1})
    assert st.delivery_limit == 5  # one unlimited: the larger
    st = queue_settings({"x-delivery-limit": 5}, {"delivery-limit": 2})
    assert st.delivery_limit == 2
    assert queue_settings({}, {"delivery-limit": -1}).delivery_limit is None
    st = queue_settings({"x-dead-letter-routing-key": "a", "x-dead-letter-exchange": "x"},
                        {"dead-letter-routing-key": "b", "expires": 10})
    assert (st.dlx, st.dlrk, st.expires) == ("x", "a", 10)
