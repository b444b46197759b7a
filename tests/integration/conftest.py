"""Fixtures of the integration suite: `amqp` (pika connections that clean up after
themselves, tests/support/pika_session.py) and `raw`: RawClients (harness.amqp) for the
cases where a client library would hide what the broker really sent; `nodes`: a
list a test appends the NodeProcesses it starts to, each killed afterwards."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.amqp import RawClient
from tests.broker_proc import Broker, NodeProcess
from tests.support.pika_session import Amqp


@pytest.fixture
def amqp(broker: Broker) -> Iterator[Amqp]:
    h = Amqp(broker)
    try:
        yield h
    finally:
        h.cleanup()


@pytest.fixture
def raw(broker: Broker) -> Iterator[Any]:
    """Factory of RawClients, all closed at teardown."""
    made: list[RawClient] = []

    def make(handshake: bool = True, channel: bool = True, **kw: Any) -> RawClient:
        c = RawClient(broker, **kw)
        made.append(c)
        if handshake:
            c.handshake()
            if channel:
                c.open_channel(1)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()


@pytest.fixture
def nodes() -> Iterator[list[NodeProcess]]:
    made: list[NodeProcess] = []
    try:
        yield made
    finally:
        for n in made:
            n.kill9()
