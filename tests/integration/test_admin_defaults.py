"""Issue 26 item 4: the gRPC admin API's defaults, against real node processes.
An admin port without a token refuses to start (unless --insecure-dev, loudly);
the token comes from a file or the environment, never from argv; the port
listens on loopback whatever --host says, unless --admin-listen moves it.
(local-cluster's generated token and a local user without it:
tests/cluster/test_local_cluster_cli.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from node.admin.client import call_status, call_user_list, call_user_put
from node.app.config import NodeConfig
from node.app.config_file import apply_file
from tests.broker_proc import REPO, NodeProcess, free_port, wait_for
from tests.support.cli import assert_usage_error, serve_args
from tests.support.net import connects, listening, loopback, unmapped

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                reason="mirrorq's own admin API")


@pytest.fixture(autouse=True)
def _no_admin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIRRORQ_ADMIN_TOKEN", raising=False)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIRRORQ_ADMIN_")}
    return subprocess.run([sys.executable, "-m", "node.app", *args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env=env)


def _code(fn: object, *args: object, **kw: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kw)  # type: ignore[operator]
    return err.value.code()  # type: ignore[no-any-return,attr-defined,unused-ignore]


def test_admin_port_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    """(1) Before: the node started and anyone on the machine could administer it."""
    proc = _serve(*serve_args(tmp_path, "--admin-port", str(free_port())))
    assert_usage_error(proc, "the admin API (--admin-port) needs a token")
    for option in ("--admin-token-file", "[admin] token_file", "MIRRORQ_ADMIN_TOKEN",
                   "--insecure-dev"):
        assert option in proc.stderr, (option, proc.stderr)
    # an empty or unreadable token file is no token either
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    assert_usage_error(_serve(*serve_args(tmp_path, "--admin-port", str(free_port()),
                                          "--admin-token-file", str(empty))), "admin token")
    assert_usage_error(_serve(*serve_args(tmp_path, "--admin-port", str(free_port()),
                                          "--admin-token-file", str(tmp_path / "none"))),
                       "cannot read --admin-token-file")


def test_insecure_dev_allows_a_token_less_admin_port_with_a_warning(
        tmp_path: Path, nodes: list[NodeProcess]) -> None:
    node = NodeProcess(tmp_path / "data", extra_args=("--insecure-dev",), admin_token=False)
    nodes.append(node)
    node.start()
    assert call_status("127.0.0.1", node.admin_port, token="")["node_id"] == node.node_id
    assert "INSECURE (--insecure-dev): the gRPC admin API on 127.0.0.1:" in node.tail_log()


def test_token_from_a_file_is_required_and_never_in_argv(
        tmp_path: Path, nodes: list[NodeProcess]) -> None:
    """(2) no token or a wrong one: UNAUTHENTICATED; the right one works. (4) the
    node's command line names the file, not the token (ps shows argv to all)."""
    node = NodeProcess(tmp_path / "data")
    nodes.append(node)
    node.start()
    port, token = node.admin_port, node.admin_token
    assert token
    assert _code(call_status, "127.0.0.1", port, token="") == grpc.StatusCode.UNAUTHENTICATED
    assert _code(call_status, "127.0.0.1", port, token=token[:-1]) \
        == grpc.StatusCode.UNAUTHENTICATED
    assert _code(call_user_put, "127.0.0.1", port, "evil", "pw", ["administrator"], token="") \
        == grpc.StatusCode.UNAUTHENTICATED
    assert call_status("127.0.0.1", port, token=token)["node_id"] == node.node_id
    assert "evil" not in {u["name"] for u in call_user_list("127.0.0.1", port,
                                                            token=token)["users"]}
    assert node.proc is not None
    argv = Path(f"/proc/{node.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert token.encode() not in b" ".join(argv)
    assert b"--admin-token-file" in argv


def test_environment_token_works(tmp_path: Path, nodes: list[NodeProcess],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIRRORQ_ADMIN_TOKEN", "from-the-environment")  # the node inherits it
    node = NodeProcess(tmp_path / "data", admin_token=False)
    nodes.append(node)
    node.start()
    assert call_status("127.0.0.1", node.admin_port, token="from-the-environment")
    assert _code(call_status, "127.0.0.1", node.admin_port, token="") \
        == grpc.StatusCode.UNAUTHENTICATED


def test_admin_listens_on_loopback_whatever_the_host(tmp_path: Path,
                                                     nodes: list[NodeProcess]) -> None:
    """(3) Before: admin listened on --host, which a multi-host cluster must make
    routable. 127.0.0.2 is another address of this machine (all 127/8 is lo)."""
    node = NodeProcess(tmp_path / "data", extra_args=("--host", "127.0.0.2"))
    nodes.append(node)
    node.start()
    assert node.proc is not None
    admin = {unmapped(a) for a, p in listening(node.proc.pid) if p == node.admin_port}
    assert admin == {"127.0.0.1"}, admin
    assert not connects("127.0.0.2", node.admin_port)
    metrics = {unmapped(a) for a, p in listening(node.proc.pid) if p == node.metrics_port}
    assert metrics == {"127.0.0.2"}, metrics  # metrics (read-only) stay on --host
    assert call_status("127.0.0.1", node.admin_port, token=node.admin_token)


def test_admin_listen_moves_the_port(tmp_path: Path, nodes: list[NodeProcess]) -> None:
    node = NodeProcess(tmp_path / "data", extra_args=("--admin-listen", "127.0.0.2"))
    nodes.append(node)
    node.start()
    assert node.proc is not None
    pid = node.proc.pid
    wait_for(lambda: node.admin_port in {p for _a, p in listening(pid)}, timeout=10,
             what="the admin port")
    admin = {unmapped(a) for a, p in listening(pid) if p == node.admin_port}
    assert admin == {"127.0.0.2"} and all(loopback(a) for a in admin), admin
    assert not connects("127.0.0.1", node.admin_port)
    assert call_status("127.0.0.2", node.admin_port, token=node.admin_token)["node_id"] == "n1"


def test_admin_listen_and_token_file_in_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "admin.token").write_text("tok-from-file\n")
    cfg = tmp_path / "node.toml"
    cfg.write_text('[admin]\nlisten = "[::1]"\ntoken_file = "admin.token"\n')
    node_cfg = NodeConfig(node_id="n1", data_dir=str(tmp_path / "d"))
    apply_file(node_cfg, str(cfg))  # token_file: relative to the config file
    assert (node_cfg.admin.listen, node_cfg.admin.token) == ("::1", "tok-from-file")
    cfg.write_text('[admin]\nlisten = ""\n')
    assert_usage_error(_serve(*serve_args(tmp_path, "--config", str(cfg))), "admin.listen")
