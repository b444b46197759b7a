"""The admin CLI over the typed gRPC API: queues, members, transfer-leader,
vhosts, permissions, users with the password off the command line; --json
for machines, tables otherwise; every failure one line and exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from harness.process import Cluster
from tests.broker_proc import REPO, NodeProcess, wait_for
from tests.support.cli import assert_usage_error

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own CLI")


def run_cli(*args: str, stdin: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MIRRORQ_ADMIN_")}
    return subprocess.run([sys.executable, "-m", "node.app", *args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=90, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL,
                          env={**clean, **(env or {})})


def ok_json(*args: str, **kw: Any) -> Any:
    proc = run_cli(*args, "--json", **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def connect(node: Any, user: str = "guest", password: str = "guest",
            vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=node.amqp_port, virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password), heartbeat=0,
        connection_attempts=1, socket_timeout=10))


@pytest.fixture
def node(own_node: NodeProcess) -> NodeProcess:
    own_node.start()
    return own_node


def test_queues(node: NodeProcess) -> None:
    admin = node.admin_cli
    assert ok_json("queues", *admin) == {"queues": []}
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("cli-durable", durable=True)
    ch.queue_declare("cli-transient")
    for i in range(5):
        ch.basic_publish("", "cli-durable", f"m{i}".encode())
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume("cli-durable", lambda *_: None)  # holds 2 unacked
    ch.basic_consume("cli-transient", lambda *_: None, auto_ack=True)

    def rows() -> dict[str, Any] | None:
        doc = ok_json("queues", *admin)
        by_name = {q["name"]: q for q in doc["queues"]}
        return by_name if by_name.get("cli-durable", {}).get("unacked") == 2 else None
    try:
        by_name = wait_for(rows, timeout=20, interval=0.3, what="2 unacked deliveries")
        assert by_name == {
            "cli-durable": {"name": "cli-durable", "vhost": "/", "ready": 3, "unacked": 2,
                            "consumers": 1, "durable": True},
            "cli-transient": {"name": "cli-transient", "vhost": "/", "ready": 0, "unacked": 0,
                              "consumers": 1, "durable": False}}
        # the human form: a table with a header; --admin-port works too
        proc = run_cli("queues", "--admin-port", str(node.admin_port),
                       env={"MIRRORQ_ADMIN_TOKEN": str(node.admin_token)})
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0].split() == ["VHOST", "NAME", "READY", "UNACKED", "CONSUMERS", "DURABLE"]
        assert ["/", "cli-durable", "3", "2", "1", "yes"] in [ln.split() for ln in lines]
        assert ok_json("queues", *admin, "--vhost", "elsewhere") == {"queues": []}
        st = ok_json("status", *admin)
        assert st["queues"] == 2 and st["connections"] == 1
    finally:
        conn.close()


def test_status_table_and_members_list(node: NodeProcess) -> None:
    admin = node.admin_cli
    proc = run_cli("status", *admin)
    assert proc.returncode == 0, proc.stderr
    table = dict(line.split(None, 1) for line in proc.stdout.splitlines())
    assert table["node_id"] == node.node_id and table["role"] == "leader"
    assert ok_json("members", *admin, "list") == {
        "leader": node.node_id, "members": [node.node_id], "in_sync": [node.node_id],
        "draining": []}
    assert_usage_error(run_cli("members", *admin, "remove", node.node_id),
                       "FAILED_PRECONDITION: members remove refused")
    assert_usage_error(run_cli("members", *admin, "add", "n9", "nohostport"),
                       "HOST:PORT")
    assert_usage_error(run_cli("members", "list"), "--admin")
    assert_usage_error(run_cli("status", "--admin", "127.0.0.1"), "HOST:PORT")
    assert_usage_error(run_cli("status", *admin, "--admin-port", "1"), "not both")


@pytest.mark.slow  # make test runs it, make test-fast does not
def test_vhosts_and_permissions(node: NodeProcess) -> None:
    admin = node.admin_cli
    assert ok_json("vhosts", *admin, "list") == {"vhosts": [{"name": "/"}]}
    assert ok_json("vhosts", *admin, "add", "staging") == {"ok": True,
                                                                     "vhost": "staging"}
    proc = run_cli("vhosts", *admin, "list")
    assert proc.returncode == 0 and proc.stdout.split() == ["NAME", "/", "staging"], proc.stdout

    proc = run_cli("users", *admin, "add", "carol", "--password-stdin",
                   stdin="from-stdin\n")
    assert proc.returncode == 0, proc.stderr
    doc = ok_json("permissions", *admin, "set", "carol", "^carol-.*", ".*", ".*",
                  "--vhost", "staging")
    assert doc == {"ok": True, "user": "carol", "vhost": "staging", "configure": "^carol-.*",
                   "write": ".*", "read": ".*"}
    perms = ok_json("permissions", *admin, "list")["permissions"]
    assert {"user": "carol", "vhost": "staging", "configure": "^carol-.*", "write": ".*",
            "read": ".*"} in perms
    assert ok_json("permissions", *admin, "list", "--vhost", "staging") == {
        "permissions": [{"user": "carol", "vhost": "staging", "configure": "^carol-.*",
                         "write": ".*", "read": ".*"}]}
    proc = run_cli("permissions", *admin, "list", "--user", "carol")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:5] == ["USER", "VHOST", "CONFIGURE", "WRITE", "READ"]
    assert "^carol-.*" in proc.stdout

    # the permissions take effect on the wire
    conn = connect(node, "carol", "from-stdin", vhost="staging")
    conn.channel().queue_declare("carol-q")
    conn.close()

    assert_usage_error(run_cli("permissions", *admin, "set", "carol", "(", ".*", ".*",
                               "--vhost", "staging"), "INVALID_ARGUMENT")
    assert_usage_error(run_cli("permissions", *admin, "set", "nobody", ".*", ".*", ".*"),
                       "FAILED_PRECONDITION")
    assert_usage_error(run_cli("permissions", *admin, "set", "carol", ".*", ".*", ".*",
                               "--vhost", "missing"), "FAILED_PRECONDITION")
    assert ok_json("permissions", *admin, "clear", "carol", "--vhost", "staging") == {
        "ok": True, "user": "carol", "vhost": "staging"}
    assert_usage_error(run_cli("permissions", *admin, "clear", "carol", "--vhost",
                               "staging"), "FAILED_PRECONDITION")
    assert ok_json("vhosts", *admin, "delete", "staging") == {"ok": True,
                                                                        "deleted": "staging"}
    assert_usage_error(run_cli("vhosts", *admin, "delete", "staging"),
                       "FAILED_PRECONDITION: vhosts delete refused")
    assert ok_json("vhosts", *admin, "list") == {"vhosts": [{"name": "/"}]}


def test_user_password_off_the_command_line(node: NodeProcess) -> None:
    admin = node.admin_cli
    proc = run_cli("users", *admin, "add", "dave", "--password-env", "DAVE_PW",
                   "--tags", "monitoring", env={"DAVE_PW": "from-env"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "user dave saved (tags: monitoring)"
    assert {"name": "dave", "tags": ["monitoring"]} in ok_json("users", *admin,
                                                               "list")["users"]
    assert ok_json("permissions", *admin, "set", "dave", ".*", ".*", ".*")["ok"]
    connect(node, "dave", "from-env").close()
    assert_usage_error(run_cli("users", *admin, "add", "dave"), "password")
    assert_usage_error(run_cli("users", *admin, "add", "dave", "pw", "--password-stdin",
                               stdin="x\n"), "password")
    assert_usage_error(run_cli("users", *admin, "add", "dave", "--password-env",
                               "UNSET_PW_VAR"), "UNSET_PW_VAR")
    assert_usage_error(run_cli("users", *admin, "add", "dave", "--password-stdin",
                               stdin=""), "empty")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", n=3)
    try:
        yield c.start()
    finally:
        c.kill_all()


@pytest.mark.slow  # make test runs it, make test-fast does not
def test_transfer_leader_and_members_add_remove(cluster: Cluster) -> None:
    leader = cluster.leader()
    follower = cluster.followers()[0]
    admin = leader.admin_cli
    assert_usage_error(run_cli("transfer-leader", *follower.admin_cli,
                               "--to", leader.node_id),
                       "FAILED_PRECONDITION: transfer-leader refused")
    doc = ok_json("transfer-leader", *admin, "--to", follower.node_id)
    assert doc["ok"] is True and doc["leader"] == follower.node_id
    assert doc["status"]["leader"] == follower.node_id
    leader = cluster.wait_healthy()
    assert leader is follower
    admin = leader.admin_cli

    # members add (then the node starts with --join) and remove, through the CLI
    new = cluster._new_node("n4", "127.0.0.1", None)
    new.peers = {o.node_id: o.raft_address for o in cluster.nodes}
    doc = ok_json("members", *admin, "add", new.node_id, new.raft_address)
    assert doc["ok"] is True and new.node_id in doc["status"]["members"]
    cluster.nodes.append(new)
    new.start(join=True)
    cluster.wait_healthy(timeout=60)
    proc = run_cli("members", *admin, "remove", new.node_id)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"removed {new.node_id}\nMEMBER"), proc.stdout
    cluster.nodes.remove(new)
    cluster.removed.append(new)
    members = ok_json("members", *admin, "list")["members"]
    assert sorted(members) == ["n1", "n2", "n3"]
