"""At-least-once dead-lettering of quorum queues with a real node, pika and
the management API (issue 28; machine version 5). S03: a rejected message
goes to the dead-letter exchange; with `x-dead-letter-strategy:
at-least-once` (and overflow reject-publish) it stays in the source queue,
shown as messages_dlx / message_bytes_dlx (RabbitMQ 4.x's queue row), until
the queues the DLX routes it to took it.

Not rabbitmq_ok: RabbitMQ retries a kept message every
dead_letter_worker_publisher_confirm_timeout (180 s), mirrorq on every Tick
and at once after a declare, bind or policy change."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import requests

from harness.body import body_id, body_ok, make_body
from harness.process import wait_for
from node.admin.client import call_status
from node.replication.machine.version import MACHINE_VERSION
from tests.broker_proc import NodeProcess, start_http_node, uniq

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="mirrorq's own node and management API")
T = 15.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = start_http_node(tmp_path_factory.mktemp("dlx") / "n1")
    try:
        # at-least-once starts at machine version 5, which a fresh node
        # proposes shortly after its start
        wait_for(lambda: call_status("127.0.0.1", n.admin_port, token=n.admin_token)
                 ["machine_version"] == MACHINE_VERSION, 20, what="the node's machine version")
        yield n
    finally:
        n.stop()


@pytest.fixture()
def ch(node: NodeProcess) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.amqp_port, heartbeat=0, connection_attempts=1, socket_timeout=10))
    c = conn.channel()
    c.confirm_delivery()
    try:
        yield c
    finally:
        conn.close()


def queue_row(node: NodeProcess, name: str) -> dict[str, Any]:
    r = requests.get(f"http://127.0.0.1:{node.http_port}/api/queues/%2F/{name}",  # type: ignore[attr-defined]
                     headers={"Authorization": f"Bearer {node.admin_token}"}, timeout=T)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()  # type: ignore[no-any-return]


def source(ch: Any, dlx: str, **args: Any) -> str:
    q = uniq("alo-src")
    ch.queue_declare(q, durable=True, arguments={
        "x-queue-type": "quorum", "x-overflow": "reject-publish",
        "x-dead-letter-exchange": dlx, "x-dead-letter-strategy": "at-least-once", **args})
    return q


def reject_one(ch: Any, queue: str, body: bytes) -> None:
    ch.basic_publish("", queue, body)  # confirmed: in the queue
    m, _p, got = ch.basic_get(queue)
    assert got == body
    ch.basic_reject(m.delivery_tag, requeue=False)


def get_eventually(ch: Any, queue: str) -> tuple[Any, bytes]:
    out: list[tuple[Any, bytes]] = []

    def one() -> bool:
        _m, p, b = ch.basic_get(queue, auto_ack=True)
        if b is not None:
            out.append((p, b))
        return bool(out)

    wait_for(one, T, what=f"a message in {queue}")
    return out[0]


def test_an_unroutable_dead_letter_is_kept_and_delivered_once_a_queue_is_bound(
        node: NodeProcess, ch: Any) -> None:
    dlx = uniq("alo-dlx")
    ch.exchange_declare(dlx, "fanout")
    src = source(ch, dlx)
    body = make_body("alo", 1, 4096)
    reject_one(ch, src, body)
    wait_for(lambda: queue_row(node, src)["messages_dlx"] == 1, T, what="the kept dead letter")
    row = queue_row(node, src)
    assert (row["messages_ready"], row["messages_unacknowledged"]) == (0, 0)
    assert row["messages"] == 1  # RabbitMQ 4.x counts them in messages
    assert row["message_bytes_dlx"] == len(body) == row["message_bytes"]
    dead = uniq("alo-dead")
    ch.queue_declare(dead, durable=True)
    ch.queue_bind(dead, dlx)
    props, got = get_eventually(ch, dead)
    assert got == body and body_ok(got)
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("rejected", src, 1)
    assert queue_row(node, src)["messages_dlx"] == 0
    _m, _p, again = ch.basic_get(dead, auto_ack=True)
    assert again is None  # once


def test_a_full_target_keeps_it_in_the_source_until_drained(node: NodeProcess, ch: Any) -> None:
    dlx = uniq("alo-dlx")
    ch.exchange_declare(dlx, "fanout")
    dead = uniq("alo-dead")
    ch.queue_declare(dead, durable=True, arguments={"x-max-length": 1,
                                                    "x-overflow": "reject-publish"})
    ch.queue_bind(dead, dlx)
    src = source(ch, dlx)
    filler, body = make_body("alo", 2, 512), make_body("alo", 3, 2048)
    ch.basic_publish("", dead, filler)
    reject_one(ch, src, body)
    wait_for(lambda: queue_row(node, src)["messages_dlx"] == 1, T, what="the kept dead letter")
    assert queue_row(node, dead)["messages"] == 1
    _p, got = get_eventually(ch, dead)  # drain the target: the next Tick forwards it
    assert got == filler
    _p, got = get_eventually(ch, dead)
    assert got == body and body_ok(got)
    wait_for(lambda: queue_row(node, src)["messages_dlx"] == 0, T, what="the source settled")


def test_kept_dead_letters_count_towards_the_limit_and_a_policy_switch_deletes_them(
        node: NodeProcess, ch: Any) -> None:
    dlx = uniq("alo-dlx")
    ch.exchange_declare(dlx, "fanout")
    base = {"x-queue-type": "quorum", "x-overflow": "reject-publish",
            "x-dead-letter-exchange": dlx, "x-max-length": 1}
    src = uniq("alo-pol")
    ch.queue_declare(src, durable=True, arguments=base)
    api = f"http://127.0.0.1:{node.http_port}/api/policies/%2F/{src}"  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {node.admin_token}"}
    r = requests.put(api, json={"pattern": f"^{src}$", "apply-to": "queues",
                                "definition": {"dead-letter-strategy": "at-least-once"}},
                     headers=auth, timeout=T)
    assert r.status_code in (201, 204), r.text
    try:
        reject_one(ch, src, make_body("alo", 4, 100))
        wait_for(lambda: queue_row(node, src)["messages_dlx"] == 1, T, what="kept")
        # 1 kept = the limit of 1, not over it: taken, and now over (S32)
        ch.basic_publish("", src, make_body("alo", 5, 100))
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", src, make_body("alo", 6, 100))
    finally:
        r = requests.delete(api, headers=auth, timeout=T)
        assert r.status_code == 204, r.text
    # at-most-once now: rabbit_fifo_dlx switch_from deletes the kept messages
    wait_for(lambda: queue_row(node, src)["messages_dlx"] == 0, T, what="deleted")
    with pytest.raises(pika.exceptions.NackError):  # 1 ready: above 80% of 1, still latched
        ch.basic_publish("", src, make_body("alo", 7, 100))
    method, _props, body = ch.basic_get(src, auto_ack=True)
    assert method is not None and body_id(body) == ("alo", 5)
    ch.basic_publish("", src, make_body("alo", 8, 100))  # empty: room again, acked
