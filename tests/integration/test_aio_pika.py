"""aio-pika round trips: publish with confirms, consume, ack; nack with requeue."""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pytest

from tests.broker_proc import Broker, uniq

pytestmark = pytest.mark.rabbitmq_ok


def run(coro: object, timeout: float = 30.0) -> object:
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def test_aio_pika_confirm_consume_ack_round_trip(broker: Broker) -> None:
    async def main() -> None:
        conn = await aio_pika.connect(broker.url, timeout=10)
        try:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(uniq("aio"), auto_delete=False)
            try:
                for i in range(20):
                    confirmation = await ch.default_exchange.publish(
                        aio_pika.Message(f"m{i}".encode(),
                                         delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=q.name)
                    assert confirmation is not None
                await ch.set_qos(prefetch_count=5)
                got = []
                async with q.iterator() as it:
                    async for msg in it:
                        got.append(msg.body)
                        assert msg.redelivered is False
                        await msg.ack()
                        if len(got) == 20:
                            break
                assert got == [f"m{i}".encode() for i in range(20)]
                res = await ch.declare_queue(q.name, passive=True)
                assert res.declaration_result.message_count == 0
            finally:
                await q.delete(if_unused=False, if_empty=False)
        finally:
            await conn.close()
    run(main())


def test_aio_pika_nack_requeue(broker: Broker) -> None:
    async def main() -> None:
        conn = await aio_pika.connect(broker.url, timeout=10)
        try:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(uniq("aio"))
            try:
                await ch.default_exchange.publish(aio_pika.Message(b"again"), routing_key=q.name)
                first = await q.get(timeout=5)
                assert first.redelivered is False
                await first.nack(requeue=True)
                second = await q.get(timeout=5)
                assert second.body == b"again" and second.redelivered is True
                await second.ack()
                assert await q.get(fail=False) is None
            finally:
                await q.delete(if_unused=False, if_empty=False)
        finally:
            await conn.close()
    run(main())


def test_aio_pika_returned_unroutable_mandatory(broker: Broker) -> None:
    async def main() -> None:
        conn = await aio_pika.connect(broker.url, timeout=10)
        try:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            with pytest.raises(aio_pika.exceptions.DeliveryError):
                await ch.default_exchange.publish(aio_pika.Message(b"x"),
                                                  routing_key=uniq("nowhere"), mandatory=True)
        finally:
            await conn.close()
    run(main())


@pytest.mark.parametrize("kind", ["missing", "internal"])
def test_aio_pika_publish_that_closes_the_channel_raises_the_channel_error(
        broker: Broker, kind: str) -> None:
    """Issue 14: a confirm-channel publish to a missing exchange (404) or an internal
    one (403) gets only the channel.close, no basic.nack: aio-pika raises the
    channel error its users handle (ChannelNotFoundEntity / ChannelAccessRefused),
    not a DeliveryError. Checked against RabbitMQ too (rabbitmq_ok)."""
    async def main() -> None:
        conn = await aio_pika.connect(broker.url, timeout=10)
        try:
            ch = await conn.channel(publisher_confirms=True)
            name = uniq("aio-x")
            if kind == "internal":
                await ch.declare_exchange(name, internal=True, auto_delete=True)
                expected: type[Exception] = aiormq.exceptions.ChannelAccessRefused
            else:
                expected = aiormq.exceptions.ChannelNotFoundEntity
            x = aio_pika.Exchange(ch, name)  # not declared by us: no client-side check
            with pytest.raises(expected) as exc:
                await x.publish(aio_pika.Message(b"x"), routing_key="k", timeout=10)
            assert not isinstance(exc.value, aio_pika.exceptions.DeliveryError)
            # the connection keeps serving: another channel works
            ch2 = await conn.channel(publisher_confirms=True)
            q = await ch2.declare_queue(uniq("aio-after"), auto_delete=True)
            assert await ch2.default_exchange.publish(aio_pika.Message(b"ok"),
                                                      routing_key=q.name) is not None
        finally:
            await conn.close()
    run(main())
