"""rabbitmq-c's command-line tools (amqp-tools) against the broker."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.broker_proc import Broker, uniq
from tests.support.pika_session import Amqp

pytestmark = [pytest.mark.rabbitmq_ok,
              pytest.mark.skipif(shutil.which("amqp-publish") is None, reason="amqp-tools missing")]


def tool(broker: Broker, *args: str, stdin: bytes | None = None) -> bytes:
    url = f"amqp://{broker.user}:{broker.password}@{broker.host}:{broker.amqp_port}"
    res = subprocess.run([args[0], "--url", url, *args[1:]], input=stdin, capture_output=True,
                         timeout=20, check=False)
    assert res.returncode == 0, f"{args[0]} exited {res.returncode}: {res.stderr!r}"
    return res.stdout


def test_amqp_publish_then_get_round_trip(broker: Broker, amqp: Amqp) -> None:
    q = tool(broker, "amqp-declare-queue", "-q", uniq("tools")).decode().strip()
    amqp.queues.append(q)
    tool(broker, "amqp-publish", "-r", q, "-b", "hello from rabbitmq-c")
    tool(broker, "amqp-publish", "-r", q, "-p", stdin=b"second, persistent")
    assert amqp.count(q) == 2
    assert tool(broker, "amqp-get", "-q", q) == b"hello from rabbitmq-c"
    assert tool(broker, "amqp-get", "-q", q) == b"second, persistent"
    assert amqp.count(q) == 0


def test_amqp_consume_count(broker: Broker, amqp: Amqp) -> None:
    q = amqp.queue()
    amqp.publish(q, [b"a", b"b", b"c"])
    out = tool(broker, "amqp-consume", "-q", q, "-c", "3", "cat")
    assert out == b"abc"
    assert amqp.count(q) == 0
