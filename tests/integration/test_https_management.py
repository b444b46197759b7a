"""Issue 26 item 11: the management API over HTTPS on its own port (RabbitMQ's
management.ssl, 15671), from [tls]'s certificate (one Secret for amqps and the
console) or [http]'s own, and HTTPS-only. Real node processes."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.broker_proc import NodeProcess, free_port, wait_for

GUEST = ("guest", "guest")
T = 5.0


def _pki(tmp_path: Path) -> tuple[Path, Path, Path]:
    """CA file, server cert and key for 127.0.0.1."""
    from node.app.pki import make_ca, make_member
    tls = tmp_path / "tls"
    make_ca(tls)
    cert, key = make_member(tls, "server", ["127.0.0.1"])
    return tls / "ca.pem", cert, key


def _wait_https(port: int, ca: Path, node: NodeProcess) -> requests.Response:
    def answers() -> Any:
        if node.proc is not None and node.proc.poll() is not None:
            raise AssertionError(f"node exited:\n{node.tail_log()}")
        try:
            return requests.get(f"https://127.0.0.1:{port}/api/overview", auth=GUEST,
                                verify=str(ca), timeout=T)
        except requests.ConnectionError:
            return None
    return wait_for(answers, timeout=30, what="the HTTPS management API")  # type: ignore


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(T)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_https_port_serves_tls_certificate_and_plain_port_stays(tmp_path: Path) -> None:
    """[tls] cert/key serve HTTPS on --https-port; plain HTTP on that port fails;
    the plain --http-port still answers (tls_only is off)."""
    ca, cert, key = _pki(tmp_path)
    http_port, https_port = free_port(), free_port()
    n = NodeProcess(tmp_path / "n1", amqps=True,
                    extra_args=("--http-port", str(http_port), "--https-port", str(https_port)),
                    config=f'[tls]\ncert = "{cert}"\nkey = "{key}"\n')
    n.start()
    try:
        r = _wait_https(https_port, ca, n)
        assert r.status_code == 200 and r.json()["node"] == "n1"
        assert r.headers["Strict-Transport-Security"] == "max-age=31536000"
        listeners = {(x["protocol"], x["port"]) for x in r.json()["listeners"]}
        assert ("https", https_port) in listeners and ("http", http_port) in listeners
        # without the CA the certificate is not trusted
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"https://127.0.0.1:{https_port}/api/overview", auth=GUEST, timeout=T)
        # plain HTTP on the HTTPS port: no HTTP answer, the handshake fails
        with pytest.raises(requests.RequestException):
            requests.get(f"http://127.0.0.1:{https_port}/api/overview", auth=GUEST, timeout=T)
        plain = requests.get(f"http://127.0.0.1:{http_port}/api/overview", auth=GUEST,
                             timeout=T)
        assert plain.status_code == 200 and "Strict-Transport-Security" not in plain.headers
        # the cluster view names this node by its HTTPS URL
        cluster = requests.get(f"https://127.0.0.1:{https_port}/api/mirrorq/cluster",
                               auth=GUEST, verify=str(ca), timeout=T)
        if cluster.status_code == 200:
            assert f"https://127.0.0.1:{https_port}/" in cluster.text
    finally:
        n.stop()


def test_https_only_with_http_certificate_and_rabbitmqadmin(tmp_path: Path) -> None:
    """[http] tls_port + tls_only + its own tls_cert/tls_key: no plain HTTP listener
    at all (--http-port is ignored), HTTPS answers, rabbitmqadmin --ssl works."""
    ca, cert, key = _pki(tmp_path)
    http_port, https_port = free_port(), free_port()
    n = NodeProcess(tmp_path / "n1", extra_args=("--http-port", str(http_port)),
                    config=f'[http]\ntls_port = {https_port}\ntls_only = true\n'
                           f'tls_cert = "{cert}"\ntls_key = "{key}"\n')
    n.start()
    try:
        r = _wait_https(https_port, ca, n)
        assert r.status_code == 200
        assert {x["protocol"] for x in r.json()["listeners"]
                if x["protocol"].startswith("http")} == {"https"}
        assert _refused(http_port), "HTTPS-only: the plain HTTP port must not listen"
        unauth = requests.get(f"https://127.0.0.1:{https_port}/api/overview",
                              verify=str(ca), timeout=T)
        assert unauth.status_code == 401
        from tests import rabbitmqadmin as fetcher
        try:
            adm = fetcher.find()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"rabbitmqadmin unavailable: {exc}")
        res = subprocess.run([sys.executable, str(adm), "-H", "127.0.0.1", "-P", str(https_port),
                              "--ssl", f"--ssl-ca-cert-file={ca}", "-u", "guest", "-p", "guest",
                              "-f", "tsv", "list", "nodes", "name"],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert "n1" in res.stdout
    finally:
        n.stop()


def test_https_config_errors_exit_2(tmp_path: Path) -> None:
    """An HTTPS port without any certificate, or tls_only without an HTTPS port,
    is refused at start (exit 2, one line) rather than served plain."""
    for config in ("[http]\ntls_port = 15999\n", "[http]\ntls_only = true\n"):
        n = NodeProcess(tmp_path / "bad", config=config)
        res = subprocess.run(n.argv(), capture_output=True, text=True, timeout=30)
        assert res.returncode == 2, (config, res.stderr)
        assert "http" in res.stderr and "Traceback" not in res.stderr
