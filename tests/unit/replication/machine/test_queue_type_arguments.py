"""Declare arguments that belong to another queue type are refused from
machine version 5 on, as RabbitMQ refuses them (rabbit_amqqueue
check_arguments_key, 3.10 and 4.3 alike): `invalid arg 'K' for queue 'Q' in
vhost '/' of queue type rabbit_classic_queue`. Only the type's own arguments
are checked for their values first; unknown arguments are ignored."""
from __future__ import annotations

from typing import Any

import pytest

from node.replication.command import SetMachineVersion
from node.replication.machine.version import DEAD_LETTER_STORE
from tests.support.machine import Harness, chan, errors, qdecl

QQ = {"x-queue-type": "quorum"}


def declare(version: int, arguments: dict[str, Any], durable: bool = True) -> list[str]:
    h = Harness()
    h.run(SetMachineVersion(version))
    c = h.open(chan())
    fx = h.run(qdecl(c, "q", durable=durable, arguments=arguments))
    assert ("q" in h.state.queues) == (not errors(fx))
    return [f"{e.reply_code} {e.reply_text}" for e in errors(fx)]


@pytest.mark.parametrize("arg, value", [
    ("x-dead-letter-strategy", "at-least-once"), ("x-delivery-limit", 5),
    ("x-quorum-initial-group-size", 3), ("x-consumer-timeout", 1000),
    ("x-max-age", "1D"), ("x-initial-cluster-size", 3), ("x-max-in-memory-length", 10)])
def test_a_classic_queue_refuses_another_types_argument(arg: str, value: Any) -> None:
    want = [f"406 PRECONDITION_FAILED - invalid arg '{arg}' for queue 'q' in vhost '/' "
            "of queue type rabbit_classic_queue"]
    assert declare(DEAD_LETTER_STORE, {arg: value}) == want
    assert declare(DEAD_LETTER_STORE, {"x-queue-type": "classic", arg: value}) == want


@pytest.mark.parametrize("arg, value", [
    ("x-max-priority", 5), ("x-queue-mode", "lazy"), ("x-queue-version", 2),
    ("x-queue-master-locator", "min-masters"), ("x-stream-max-segment-size-bytes", 1000)])
def test_a_quorum_queue_refuses_another_types_argument(arg: str, value: Any) -> None:
    assert declare(DEAD_LETTER_STORE, QQ | {arg: value}) == [
        f"406 PRECONDITION_FAILED - invalid arg '{arg}' for queue 'q' in vhost '/' "
        "of queue type rabbit_quorum_queue"]


def test_own_and_unknown_arguments_are_accepted() -> None:
    assert declare(DEAD_LETTER_STORE, {"x-max-priority": 5, "x-queue-mode": "lazy", "x-queue-version": 2,
                                       "x-message-ttl": 1000, "x-my-app": "anything"}) == []
    assert declare(DEAD_LETTER_STORE, QQ | {"x-delivery-limit": 5, "x-dead-letter-strategy": "at-most-once",
                                            "x-quorum-initial-group-size": 3,
                                            "x-queue-leader-locator": "balanced", "x-my-app": 1}) == []


def test_a_foreign_argument_is_refused_by_key_before_its_value_is_looked_at() -> None:
    # RabbitMQ runs only the type's own validators: a bad value of another
    # type's argument gets the key error, a bad own value its value error
    assert declare(DEAD_LETTER_STORE, {"x-delivery-limit": "many"}) == [
        "406 PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue 'q' in vhost '/' "
        "of queue type rabbit_classic_queue"]
    assert declare(DEAD_LETTER_STORE, {"x-max-length": -1, "x-delivery-limit": 5}) == [
        "406 PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 'q' in vhost '/': "
        "{value_negative,-1}"]


def test_the_foreign_key_check_comes_before_a_quorum_queues_property_checks() -> None:
    assert declare(DEAD_LETTER_STORE, QQ | {"x-queue-mode": "lazy"}, durable=False) == [
        "406 PRECONDITION_FAILED - invalid arg 'x-queue-mode' for queue 'q' in vhost '/' "
        "of queue type rabbit_quorum_queue"]


def test_before_version_5_the_arguments_are_accepted_as_they_were() -> None:
    # a member of an older build applies the same log: the check starts with
    # the version every member runs
    assert declare(DEAD_LETTER_STORE - 1, {"x-delivery-limit": 5, "x-dead-letter-strategy": "x"}) == []
    assert declare(DEAD_LETTER_STORE - 1, QQ | {"x-queue-mode": "lazy"}) == []
