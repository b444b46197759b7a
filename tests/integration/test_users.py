"""Replicated users (issue 7, first part): the first leader seeds the cluster
with its configured users; `mirrorq users add|delete|list` changes them over the
admin API; the wire authenticates against the replicated salted SHA-256 hashes
(RabbitMQ's format); a failed login is 403 ACCESS_REFUSED. Real node, real
pika, the real CLI."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.broker_proc import NodeProcess, wait_for
from tests.support.cli import assert_usage_error, run_cli

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own admin API")


def connect(node: NodeProcess, user: str, password: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=node.amqp_port, credentials=pika.PlainCredentials(user, password),
        heartbeat=0, connection_attempts=1, socket_timeout=10))


def refused(node: NodeProcess, user: str, password: str) -> bool:
    try:
        connect(node, user, password).close()
    except pika.exceptions.ProbableAuthenticationError as exc:
        assert "ACCESS_REFUSED" in str(exc) or "403" in str(exc), str(exc)
        return True
    return False


def closed_by_broker(conn: pika.BlockingConnection,
                     timeout: float = 15.0) -> pika.exceptions.ConnectionClosedByBroker:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn.process_data_events(time_limit=0.2)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            return exc
    raise AssertionError("the broker did not close the connection")


def users(node: NodeProcess) -> dict[str, list[str]]:
    proc = run_cli("users", *node.admin_cli, "list", "--json")
    assert proc.returncode == 0, proc.stderr
    return {u["name"]: u["tags"] for u in json.loads(proc.stdout)["users"]}


def test_users_seeded_added_used_deleted(own_node: NodeProcess) -> None:
    own_node.start()
    admin = own_node.admin_cli
    assert users(own_node) == {"guest": ["administrator"]}  # the configured default, now replicated
    # (with RabbitMQ's default_user_tags: the management API needs a tag)
    proc = run_cli("users", *admin, "add", "alice", "s3cret", "--tags", "administrator")
    assert proc.returncode == 0, proc.stderr
    assert users(own_node) == {"alice": ["administrator"], "guest": ["administrator"]}
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as exc:  # no permissions yet
        connect(own_node, "alice", "s3cret")
    assert "530" in str(exc.value) and "access to vhost '/' refused" in str(exc.value), exc.value
    proc = run_cli("permissions", *admin, "set", "alice", ".*", ".*", ".*")
    assert proc.returncode == 0, proc.stderr
    conn = connect(own_node, "alice", "s3cret")
    ch = conn.channel()
    ch.queue_declare("users-q")
    conn.close()
    assert refused(own_node, "alice", "wrong")
    assert refused(own_node, "mallory", "s3cret")
    # password change: the old one stops working
    assert run_cli("users", *admin, "add", "alice", "n3w").returncode == 0
    assert refused(own_node, "alice", "s3cret")
    connect(own_node, "alice", "n3w").close()
    # survives a restart (replicated state, journal + snapshot)
    own_node.kill9()
    own_node.start()
    connect(own_node, "alice", "n3w").close()
    held = connect(own_node, "alice", "n3w")
    assert run_cli("users", *admin, "delete", "alice").returncode == 0
    assert refused(own_node, "alice", "n3w")
    # RabbitMQ closes a deleted user's connections
    closed = closed_by_broker(held)
    assert closed.reply_code == 320 and "user 'alice' was deleted" in closed.reply_text, closed
    connect(own_node, "guest", "guest").close()
    assert_usage_error(run_cli("users", *admin, "delete", "alice"), "no user")
    assert_usage_error(run_cli("users", *admin, "frob"), "invalid choice")
    assert_usage_error(run_cli("users", "list"), "--admin-port")


def test_failed_logins_slow_down_without_locking_out(tmp_path: Path) -> None:
    """After the free failures a login's answer is held (tests/integration/
    test_login_throttle.py has the figures): pika, a real client, waits it out and
    the right password gets in."""
    cfg = tmp_path / "node.toml"
    cfg.write_text("login_failure_limit = 3\nlogin_failure_window = 60\n"
                   "login_failure_delay = 1\nlogin_failure_max_delay = 1\n")
    node = NodeProcess(tmp_path / "data", extra_args=("--config", str(cfg)))
    try:
        node.start()
        for _ in range(3):
            assert refused(node, "guest", "wrong")
        t0 = time.monotonic()
        connect(node, "guest", "guest").close()  # the right password, held ~1 s
        assert time.monotonic() - t0 >= 0.9
    finally:
        node.kill9()


def test_max_connections_per_node(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text("max_connections = 2\n")
    node = NodeProcess(tmp_path / "data", extra_args=("--config", str(cfg)))
    try:
        node.start()
        a, b = connect(node, "guest", "guest"), connect(node, "guest", "guest")
        with pytest.raises(pika.exceptions.AMQPConnectionError) as err:
            connect(node, "guest", "guest")
        assert "connection limit (2)" in repr(err.value), repr(err.value)
        a.channel().queue_declare("still-serving")  # the others keep working
        b.close()

        def third_gets_in() -> bool:
            try:
                connect(node, "guest", "guest").close()
            except pika.exceptions.AMQPConnectionError:
                return False
            return True
        wait_for(third_gets_in, timeout=10, interval=0.2, what="a free connection slot")
        a.close()
    finally:
        node.kill9()
