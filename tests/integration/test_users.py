"""Replicated users (issue 7, first part): the first leader seeds the cluster
with its configured users; `mirrorq users add|delete|list` changes them over the
admin API; the wire authenticates against the replicated salted SHA-256 hashes
(RabbitMQ's format); a failed login is 403 ACCESS_REFUSED. Real node, real
pika, the real CLI."""
from __future__ import annotations

import json
import os

import pika
import pika.exceptions
import pytest

from tests.broker_proc import NodeProcess
from tests.integration.test_cli import assert_usage_error, run_cli

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


def users(node: NodeProcess) -> dict[str, list[str]]:
    proc = run_cli("users", "--admin-port", str(node.admin_port), "list")
    assert proc.returncode == 0, proc.stderr
    return {u["name"]: u["tags"] for u in json.loads(proc.stdout)["users"]}


def test_users_seeded_added_used_deleted(own_node: NodeProcess) -> None:
    own_node.start()
    port = str(own_node.admin_port)
    assert users(own_node) == {"guest": []}  # the configured default, now replicated
    proc = run_cli("users", "--admin-port", port, "add", "alice", "s3cret", "--tags", "administrator")
    assert proc.returncode == 0, proc.stderr
    assert users(own_node) == {"alice": ["administrator"], "guest": []}
    conn = connect(own_node, "alice", "s3cret")
    ch = conn.channel()
    ch.queue_declare("users-q")
    conn.close()
    assert refused(own_node, "alice", "wrong")
    assert refused(own_node, "mallory", "s3cret")
    # password change: the old one stops working
    assert run_cli("users", "--admin-port", port, "add", "alice", "n3w").returncode == 0
    assert refused(own_node, "alice", "s3cret")
    connect(own_node, "alice", "n3w").close()
    # survives a restart (replicated state, journal + snapshot)
    own_node.kill9()
    own_node.start()
    connect(own_node, "alice", "n3w").close()
    assert run_cli("users", "--admin-port", port, "delete", "alice").returncode == 0
    assert refused(own_node, "alice", "n3w")
    connect(own_node, "guest", "guest").close()
    assert_usage_error(run_cli("users", "--admin-port", port, "delete", "alice"), "no user")
    assert_usage_error(run_cli("users", "--admin-port", port, "frob"), "invalid choice")
    assert_usage_error(run_cli("users", "list"), "--admin-port")
