"""Vhosts and per-vhost configure / write / read permissions (issue 7), end to
end: a real node, the real `mirrorq vhosts|permissions|users` CLI over the
admin API, real pika clients. Each denied operation is a 403 ACCESS_REFUSED
channel error that closes only that channel; a wrong or unknown vhost is a
530 at connection.open; the node keeps serving everyone else."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from harness.amqp import RawClient
from tests.broker_proc import NodeProcess, uniq
from tests.support.cli import run_cli

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own admin API")

VHOST = "app"


def cli_ok(node: NodeProcess, *args: str) -> str:
    proc = run_cli(args[0], *node.admin_cli, *args[1:])
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = NodeProcess(Path(tmp_path_factory.mktemp("perm")) / "data")
    n.start()
    try:
        cli_ok(n, "vhosts", "add", VHOST)
        # (user, configure, write, read) on VHOST; RabbitMQ's "" = nothing
        for user, conf, write, read in (("full", ".*", ".*", ".*"),
                                        ("noconf", "", ".*", ".*"),
                                        ("nowrite", ".*", "^amq\\.gen", ".*"),
                                        ("noread", ".*", ".*", "^nothing$"),
                                        ("only-own", "^own-", "^own-", "^own-")):
            cli_ok(n, "users", "add", user, "pw")
            cli_ok(n, "permissions", "set", user, conf, write, read, "--vhost", VHOST)
        yield n
    finally:
        n.stop()


def connect(node: NodeProcess, user: str, vhost: str = VHOST) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=node.amqp_port, virtual_host=vhost,
        credentials=pika.PlainCredentials(user, "pw" if user != "guest" else "guest"),
        heartbeat=0, connection_attempts=1, socket_timeout=10))


def refused_open(node: NodeProcess, user: str, vhost: str, why: str) -> None:
    """connection.open refused with 530 (pika reports it as access denied)."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as exc:
        connect(node, user, vhost)
    assert "530" in str(exc.value) and why in str(exc.value), exc.value


def denied(exc: pytest.ExceptionInfo[pika.exceptions.ChannelClosedByBroker], what: str) -> None:
    assert exc.value.reply_code == 403, exc.value
    assert "ACCESS_REFUSED" in exc.value.reply_text and what in exc.value.reply_text, exc.value


def still_serving(conn: pika.BlockingConnection) -> None:
    """The connection survives a channel error: a new channel works."""
    ch = conn.channel()
    ch.queue_declare("", exclusive=True)
    ch.close()


def test_permission_denied_declare(node: NodeProcess) -> None:
    with connect(node, "noconf") as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().queue_declare(uniq("decl"))
        denied(exc, "configure access to queue")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().exchange_declare(uniq("x"), "fanout")
        denied(exc, "configure access to exchange")
        conn.channel().basic_qos(prefetch_count=1)  # the connection survives the channel errors
    with connect(node, "only-own") as conn:
        conn.channel().queue_declare(uniq("own"), auto_delete=True)  # matches ^own-
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().queue_declare(uniq("other"))
        denied(exc, "'other-")
        still_serving_own(conn)


def still_serving_own(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.queue_declare(uniq("own"), exclusive=True)
    ch.close()


def test_permission_denied_publish(node: NodeProcess) -> None:
    q = uniq("pubq")
    with connect(node, "full") as conn:
        conn.channel().queue_declare(q)
    with connect(node, "nowrite") as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch.basic_publish("", q, b"x")  # the default exchange is amq.default
        denied(exc, "write access to exchange 'amq.default'")
        still_serving(conn)
    with connect(node, "full") as conn:
        ch = conn.channel()
        assert ch.queue_declare(q, passive=True).method.message_count == 0  # nothing got in
        ch.queue_delete(q)


def test_permission_denied_consume(node: NodeProcess) -> None:
    q = uniq("conq")
    with connect(node, "full") as conn:
        ch = conn.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"kept")
    with connect(node, "noread") as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch = conn.channel()
            ch.basic_consume(q, lambda *a: None)
            conn.process_data_events(time_limit=5)
        denied(exc, "read access to queue")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().basic_get(q)
        denied(exc, "read access to queue")
        still_serving(conn)
    with connect(node, "full") as conn:
        ch = conn.channel()
        method, _props, body = ch.basic_get(q, auto_ack=True)
        assert body == b"kept" and not method.redelivered
        ch.queue_delete(q)


def test_permission_denied_bind(node: NodeProcess) -> None:
    q, x = uniq("bindq"), uniq("bindx")
    with connect(node, "full") as conn:
        ch = conn.channel()
        ch.queue_declare(q)
        ch.exchange_declare(x, "fanout")
    # binding writes to the queue and reads from the exchange
    with connect(node, "noread") as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().queue_bind(q, x)
        denied(exc, f"read access to exchange '{x}'")
    with connect(node, "nowrite") as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().queue_bind(q, x)
        denied(exc, f"write access to queue '{q}'")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().exchange_bind(x, "amq.fanout")
        denied(exc, f"write access to exchange '{x}'")
    with connect(node, "full") as conn:
        ch = conn.channel()
        ch.queue_bind(q, x)
        ch.queue_delete(q)
        ch.exchange_delete(x)


def test_wrong_vhost_is_refused_at_connection_open(node: NodeProcess) -> None:
    for user, vhost, why in (("full", "nope", "vhost nope not found"),
                             ("guest", VHOST, f"access to vhost '{VHOST}' refused for user 'guest'"),
                             ("full", "/", "access to vhost '/' refused for user 'full'")):
        refused_open(node, user, vhost, why)
    connect(node, "guest", "/").close()  # the seeded user keeps "/"


def test_vhosts_are_isolated_and_deleting_one_closes_its_clients(node: NodeProcess) -> None:
    other = uniq("vh")
    cli_ok(node, "vhosts", "add", other)
    cli_ok(node, "permissions", "set", "full", ".*", ".*", ".*", "--vhost", other)
    q = uniq("iso")
    with connect(node, "full") as a, connect(node, "full", other) as b:
        ca, cb = a.channel(), b.channel()
        ca.queue_declare(q)
        cb.queue_declare(q)
        ca.confirm_delivery()
        ca.basic_publish("", q, b"in-app")
        assert cb.queue_declare(q, passive=True).method.message_count == 0
        assert ca.queue_declare(q, passive=True).method.message_count == 1
        listed = json.loads(cli_ok(node, "vhosts", "list", "--json"))
        assert other in json.dumps(listed)
        cli_ok(node, "vhosts", "delete", other)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
            b.process_data_events(time_limit=10)
            b.channel()
        assert exc.value.reply_code == 320, exc.value
        ca.queue_delete(q)
    refused_open(node, "full", other, f"vhost {other} not found")


def test_permissions_cli_lists_and_clears(node: NodeProcess) -> None:
    cli_ok(node, "users", "add", "temp", "pw")
    cli_ok(node, "permissions", "set", "temp", ".*", ".*", ".*", "--vhost", VHOST)
    connect(node, "temp").close()
    perms = json.loads(cli_ok(node, "permissions", "list", "--vhost", VHOST, "--json"))
    assert "temp" in json.dumps(perms)
    cli_ok(node, "permissions", "clear", "temp", "--vhost", VHOST)
    refused_open(node, "temp", VHOST, f"access to vhost '{VHOST}' refused for user 'temp'")
    proc = run_cli("permissions", *node.admin_cli, "set", "temp", "(", ".*",
                   ".*", "--vhost", VHOST)
    assert proc.returncode == 2 and "regular expression" in proc.stderr, proc.stderr
    proc = run_cli("permissions", *node.admin_cli, "set", "temp", ".*",
                   ".*", ".*", "--vhost", "missing")
    assert proc.returncode == 2 and "missing" in proc.stderr, proc.stderr


def _raw_start(node: NodeProcess) -> RawClient:
    c = RawClient(node)
    c.send(pframe.marshal(pheader.ProtocolHeader(), 0))
    c.expect(spec.Connection.Start)
    return c


def test_unauthenticated_clients_get_nothing(node: NodeProcess) -> None:
    # 1. skips start-ok: the first method must be it (503), no channel opens
    c = _raw_start(node)
    try:
        c.send_frame(spec.Connection.Open(virtual_host="/"), 0)
        closes = [v for _, v in c.read_until_closed() if isinstance(v, spec.Connection.Close)]
        assert closes and closes[0].reply_code == 503, closes
    finally:
        c.close()
    # 2. an empty / malformed PLAIN response and an unknown user: 403, closed
    for response in ("", "\0guest", "\0nobody\0pw"):
        c = _raw_start(node)
        try:
            c.send_frame(spec.Connection.StartOk(
                client_properties={"capabilities": {"authentication_failure_close": True}},
                mechanism="PLAIN", response=response, locale="en_US"), 0)
            closes = [v for _, v in c.read_until_closed() if isinstance(v, spec.Connection.Close)]
            assert closes and closes[0].reply_code == 403, (response, closes)
            assert "ACCESS_REFUSED" in closes[0].reply_text
        finally:
            c.close()
    # 3. an unknown mechanism: refused as well
    c = _raw_start(node)
    try:
        c.send_frame(spec.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="EXTERNAL", response="", locale="en_US"), 0)
        closes = [v for _, v in c.read_until_closed() if isinstance(v, spec.Connection.Close)]
        assert closes and closes[0].reply_code == 403, closes
    finally:
        c.close()
    connect(node, "full").close()  # others keep being served
