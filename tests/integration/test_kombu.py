"""kombu (py-amqp transport) round trips: confirmed publish, consume, ack, requeue."""
from __future__ import annotations

import kombu
import pytest

from tests.broker_proc import Broker, uniq
from tests.support.kombu_client import connect

pytestmark = pytest.mark.rabbitmq_ok


def test_kombu_confirm_consume_ack_round_trip(broker: Broker) -> None:
    name = uniq("kombu")
    with connect(broker) as conn:
        q = kombu.Queue(name, exchange=kombu.Exchange(""), routing_key=name)
        q(conn.default_channel).declare()
        try:
            prod = conn.Producer()
            for i in range(10):
                prod.publish({"i": i}, routing_key=name, serializer="json",
                             delivery_mode=2, retry=False)
            got: list[int] = []

            def on_message(body: dict, message: kombu.Message) -> None:
                got.append(body["i"])
                message.ack()

            with conn.Consumer(q, callbacks=[on_message], prefetch_count=3):
                while len(got) < 10:
                    try:
                        conn.drain_events(timeout=10)
                    except TimeoutError as exc:
                        raise AssertionError(f"only {got} consumed") from exc
            assert got == list(range(10))
            _n, count, _c = q(conn.default_channel).queue_declare(passive=True)
            assert count == 0
        finally:
            q(conn.default_channel).delete()


def test_kombu_reject_requeue(broker: Broker) -> None:
    name = uniq("kombu")
    with connect(broker) as conn:
        q = kombu.Queue(name, exchange=kombu.Exchange(""), routing_key=name)
        bound = q(conn.default_channel)
        bound.declare()
        try:
            conn.Producer().publish("again", routing_key=name, retry=False)
            m = bound.get(no_ack=False)
            assert m is not None and m.delivery_info["redelivered"] is False
            m.requeue()
            m2 = bound.get(no_ack=False)
            assert m2 is not None and m2.payload == "again"
            assert m2.delivery_info["redelivered"] is True
            m2.ack()
            assert bound.get(no_ack=False) is None
        finally:
            bound.delete()


def test_kombu_deletes_the_queue_it_consumes_from_without_consumer_cancelled(
        broker: Broker) -> None:
    """Issue 14: `Queue(...).delete()` on the consuming channel gets queue.delete-ok
    before the broker's basic.cancel of that channel's consumer (RabbitMQ's order);
    a cancel first made kombu raise ConsumerCancelled inside delete()."""
    name = uniq("kombu-del")
    with connect(broker) as conn:
        ch = conn.channel()
        q = kombu.Queue(name, exchange=kombu.Exchange(""), routing_key=name)
        bound = q(ch)
        bound.declare()
        got: list[str] = []
        consumer = kombu.Consumer(ch, [q], callbacks=[lambda body, m: got.append(body)],
                                  accept=["json"])
        consumer.consume()
        try:
            result = bound.delete()  # raised amqp.exceptions.ConsumerCancelled before
        finally:
            ch.close()
        assert result == 0, result  # message_count of delete-ok
        # the queue is gone
        check = conn.channel()
        try:
            with pytest.raises(Exception, match="NOT_FOUND|404"):
                q(check).queue_declare(passive=True)
        finally:
            try:
                check.close()
            except Exception:  # noqa: BLE001 - closed by the 404
                pass
