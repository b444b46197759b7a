"""Start, kill -9 and restart real mirrorq node processes for tests.

MIRRORQ_TARGET=amqp://user:pass@host:port/ points the semantic tests at an
already running broker instead (e.g. RabbitMQ, to prove a test encodes
RabbitMQ's behaviour); tests that must kill or restart the node skip there.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

import pytest

from harness.process import (  # one copy: the harness package
    free_port,
    port_open,
    wait_for,
    write_token_file,
)

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent




def uniq(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"



class Broker:
    """A broker the tests talk to over real sockets."""

    host = "127.0.0.1"
    amqp_port: int
    user = "guest"
    password = "guest"
    own = False

    @property
    def url(self) -> str:
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.amqp_port}/%2F"

    def kill9(self) -> None:
        pytest.skip("needs a mirrorq node of its own")

    def start(self) -> None:
        pytest.skip("needs a mirrorq node of its own")

    def stop(self) -> None:
        pass


class RemoteBroker(Broker):
    def __init__(self, url: str) -> None:
        u = urlparse(url)
        self.host = u.hostname or "127.0.0.1"
        self.amqp_port = u.port or 5672
        self.user = u.username or "guest"
        self.password = u.password or "guest"


class NodeProcess(Broker):
    """One `mirrorq serve` process with its own ports and data dir."""

    own = True
    ready_host = "127.0.0.1"  # where start() waits for the listener (::1 for an IPv6-only node)

    def __init__(self, data_dir: Path, node_id: str = "n1", extra_args: tuple[str, ...] = (),
                 config: str | None = None, amqps: bool = False, tls_only: bool = False,
                 admin_token: bool = True) -> None:
        """amqps: also listen for AMQP over TLS on self.amqps_port (--amqps-port; the
        config must carry [tls] cert and key); tls_only: the config says [tls] only =
        true, so readiness is the amqps port (--amqp-port is still passed, and ignored).
        The admin port gets a generated token (`admin_token`, in the 0600 file
        `admin_token_file` passed as --admin-token-file) unless `config` has an
        [admin] table of its own (its token is the test's business then) or
        `admin_token` is False."""
        self.data_dir = data_dir
        self.node_id = node_id
        self.amqp_port = free_port()
        self.amqps_port: int | None = free_port() if amqps or tls_only else None
        self.tls_only = tls_only
        self.raft_port = free_port()
        self.admin_port = free_port()
        self.metrics_port = free_port()
        self.extra_args = extra_args
        self.admin_token: str | None = None
        self.admin_token_file: Path | None = None
        if admin_token and (config is None or "[admin]" not in config):
            self.admin_token_file = data_dir.parent / f"{node_id}-{uuid.uuid4().hex[:6]}.token"
            self.admin_token = write_token_file(self.admin_token_file)
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = data_dir.parent / f"{node_id}-{uuid.uuid4().hex[:6]}.toml"
            self.config_path.write_text(config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{node_id}.log"

    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "node.app", "serve", "--node-id", self.node_id,
                "--amqp-port", str(self.amqp_port), "--raft-port", str(self.raft_port),
                "--admin-port", str(self.admin_port), "--metrics-port", str(self.metrics_port),
                "--data-dir", str(self.data_dir)]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        if self.amqps_port is not None:
            args += ["--amqps-port", str(self.amqps_port)]
        if self.admin_token_file is not None:
            args += ["--admin-token-file", str(self.admin_token_file)]
        return args + list(self.extra_args)

    def start(self, timeout: float = 30.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}: {self.tail_log()}")
            return port_open(self.ready_port, self.ready_host)

        try:
            wait_for(ready, timeout=timeout, what=f"node {self.node_id} to accept AMQP")
        except BaseException:
            self.kill9()
            raise

    @property
    def ready_port(self) -> int:
        """The port that opens once the node serves clients."""
        if self.tls_only:
            assert self.amqps_port is not None
            return self.amqps_port
        return self.amqp_port

    @property
    def admin_cli(self) -> list[str]:
        """The `mirrorq` admin CLI's options that reach this node."""
        tokens = ["--token-file", str(self.admin_token_file)] if self.admin_token_file else []
        return ["--admin", f"127.0.0.1:{self.admin_port}", *tokens]

    def tail_log(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()

    def restart(self) -> None:
        self.stop()
        self.start()


def node_metric(broker: Broker, name: str) -> float | None:
    """A value from the node's Prometheus endpoint (None for a remote broker)."""
    port = getattr(broker, "metrics_port", None)
    if port is None:
        return None
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            key, _, value = line.partition(" ")
            if key.split("{", 1)[0] == f"mirrorq_{name}":
                return float(value)
    raise AssertionError(f"metric mirrorq_{name} not exported")


def start_http_node(data_dir: Path, config: str | None = None) -> NodeProcess:
    """A started node with the management HTTP API on a free port (`.http_port`),
    once the API answers (any status: auth is the tests' business)."""
    import urllib.error
    import urllib.request

    http_port = free_port()
    kw = {} if config is None else {"config": config}
    n = NodeProcess(data_dir, extra_args=("--http-port", str(http_port)), **kw)
    n.http_port = http_port  # type: ignore[attr-defined]
    n.start()

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/overview", timeout=2)
        except urllib.error.HTTPError:
            return True  # 401 without credentials: it answers
        except OSError:
            return False
        return True

    try:
        wait_for(answers, timeout=20, what="the HTTP API")
    except BaseException:
        n.stop()
        raise
    return n
