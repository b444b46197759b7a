"""The `mirrorq` command line: user errors are one line and exit code 2;
a running node answers on its admin (gRPC) and metrics ports."""
from __future__ import annotations

import json
import os
import socket
import urllib.request
from pathlib import Path

import pika
import pytest

from tests.broker_proc import NodeProcess, wait_for
from tests.support.cli import assert_usage_error, run_cli, serve_args

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own CLI")


@pytest.mark.parametrize("argv,needle", [
    (["serve", "--amqp-port", "5672", "--data-dir", "x"], "--node-id"),
    (["serve", "--node-id", "a", "--amqp-port", "70000", "--data-dir", "x"], "invalid port"),
    (["serve", "--node-id", "a", "--amqp-port", "5672", "--data-dir", "x", "--bogus"], "--bogus"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_bad_flags_exit_2_with_one_line(argv: list[str], needle: str) -> None:
    assert_usage_error(run_cli(*argv), needle)


def test_bad_peers_and_node_id(tmp_path: Path) -> None:
    assert_usage_error(run_cli(*serve_args(tmp_path, "--peers", "n2=nohostport")), "bad peer")
    args = serve_args(tmp_path)
    args[args.index("c1")] = "bad id!"
    assert_usage_error(run_cli(*args), "node id")


def test_port_in_use_exit_2(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        args = serve_args(tmp_path)
        args[args.index("--amqp-port") + 1] = str(taken)
        assert_usage_error(run_cli(*args), f":{taken}")


def test_unwritable_data_dir_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    args = serve_args(tmp_path)
    args[args.index("--data-dir") + 1] = str(blocker / "data")  # root can't mkdir under a file
    assert_usage_error(run_cli(*args), "not writable")


@pytest.mark.parametrize("text,needle", [
    ("heartbeat = ", "not valid TOML"),
    ("no_such_key = 1", "unknown key"),
    ("frame_max = 100", "frame_max"),
    ("heartbeat = -1", "heartbeat"),
    ("[users]\nguest = 5", "users"),
    ("loopback_users = 5", "loopback_users"),
])
def test_bad_config_file_exit_2(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text(text)
    assert_usage_error(run_cli(*serve_args(tmp_path, "--config", str(cfg))), needle)
    assert_usage_error(run_cli(*serve_args(tmp_path, "--config", str(tmp_path / "missing.toml"))),
                       "cannot read config")


def test_admin_status_and_metrics(own_node: NodeProcess) -> None:
    own_node.start()
    proc = run_cli("status", *own_node.admin_cli, "--json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["node_id"] == own_node.node_id and status["role"] == "leader"
    assert status["amqp_port"] == own_node.amqp_port
    # real traffic, then every metric issue 3 names must be there with its value
    conn = pika.BlockingConnection(pika.URLParameters(own_node.url))
    ch = conn.channel()
    ch.queue_declare("metrics-q")
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", "metrics-q", b"%d" % i)
    got = 0
    for method, _props, _body in ch.consume("metrics-q", inactivity_timeout=5):
        assert method is not None
        got += 1
        if got == 2:
            ch.basic_nack(method.delivery_tag, requeue=True)  # comes back redelivered
        else:
            ch.basic_ack(method.delivery_tag)
        if got == 6:
            break
    ch.cancel()
    ch.queue_declare("metrics-q2")
    ch.basic_publish("", "metrics-q2", b"held")
    node = own_node.node_id

    def metrics() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{own_node.metrics_port}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def settled() -> dict[str, float] | None:
        m = metrics()
        return m if m.get(f'mirrorq_acked_total{{node="{node}"}}') == 5 else None

    m = wait_for(settled, timeout=10, what="acks counted")
    conn.close()
    assert m[f'mirrorq_is_leader{{node="{node}"}}'] == 1
    assert m[f'mirrorq_published_total{{node="{node}"}}'] == 6
    assert m[f'mirrorq_confirmed_total{{node="{node}"}}'] == 6
    assert m[f'mirrorq_nacked_total{{node="{node}"}}'] == 0
    assert m[f'mirrorq_delivered_total{{node="{node}"}}'] == 6
    assert m[f'mirrorq_redelivered_total{{node="{node}"}}'] == 1
    assert m[f'mirrorq_leader_changes_total{{node="{node}"}}'] == 0
    assert m[f'mirrorq_in_sync_size{{node="{node}"}}'] == 1
    assert m[f'mirrorq_term{{node="{node}"}}'] >= 1 and f'mirrorq_commit_index{{node="{node}"}}' in m
    # aggregated by default (issue 42): the queues' sum, no queue or vhost names
    assert m[f'mirrorq_queue_messages_ready{{node="{node}"}}'] == 1
    assert not any("queue=" in k or "vhost=" in k for k in m)
    assert m[f'mirrorq_confirm_latency_seconds_count{{node="{node}"}}'] == 6
    assert m[f'mirrorq_confirm_latency_seconds_bucket{{node="{node}",le="+Inf"}}'] == 6
    assert "mirrorq_journal_flushes_total" in " ".join(m)
    own_node.kill9()
    assert_usage_error(run_cli("status", *own_node.admin_cli), "cannot reach")


def test_drain_and_revive_cli(own_node: NodeProcess) -> None:
    own_node.start()
    admin = own_node.admin_cli
    assert_usage_error(run_cli("drain", *admin, "--node-id", "ghost"), "drain refused")
    assert_usage_error(run_cli("drain"), "--admin-port")
    proc = run_cli("drain", *admin, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"]["draining"] == [own_node.node_id]
    # a single member stays in sync (never below a majority), but serves no clients

    def refused() -> bool:
        try:
            socket.create_connection(("127.0.0.1", own_node.amqp_port), timeout=2).close()
        except OSError:
            return True
        return False
    wait_for(refused, timeout=10, what="the AMQP listener to close")
    assert doc["status"]["in_sync"] == [own_node.node_id]
    proc = run_cli("revive", *admin, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"]["draining"] == []
    wait_for(lambda: not refused(), timeout=10, what="the AMQP listener to reopen")


def test_sigterm_stops_cleanly(own_node: NodeProcess) -> None:
    own_node.start()
    assert own_node.proc is not None
    own_node.proc.terminate()
    assert own_node.proc.wait(timeout=15) == 0
    assert "Traceback" not in own_node.tail_log(200)
