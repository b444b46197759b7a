"""A kombu connection (py-amqp transport, publisher confirms on) to the broker under test."""
from __future__ import annotations

import kombu

from tests.broker_proc import Broker


def connect(broker: Broker) -> kombu.Connection:
    conn = kombu.Connection(broker.url.replace("amqp://", "pyamqp://"), connect_timeout=10,
                            transport_options={"confirm_publish": True})
    conn.ensure_connection(max_retries=1)
    return conn
