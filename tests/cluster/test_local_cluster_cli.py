"""`mirrorq local-cluster up | status --json | down`, and its one-line errors (exit 2)."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from node.amqp.config import ipv6_available
from node.app import local_cluster as lc
from tests.broker_proc import REPO, wait_for
from tests.support.net import listening, loopback


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.app", "local-cluster", *args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _free_base(nodes: int) -> int:
    for _ in range(50):
        base = random.randrange(21000, 35000)
        try:
            lc.check_ports_free(lc.layout(nodes, base))
            return base
        except lc.ClusterError:
            continue
    pytest.skip("no free port block found")


def _assert_usage_error(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode == 2, f"exit {res.returncode}: {res.stdout!r} {res.stderr!r}"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mirrorq: error:"), res.stderr
    assert needle in lines[0], lines[0]


def _creds(d: Path) -> tuple[str, str]:
    """The generated administrator of the local cluster in `d` (issue 42)."""
    return lc.ADMIN_USER, (d / lc.PASSWORD_FILE).read_text().strip()


def _params(d: Path, host: str, port: int) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host, port, heartbeat=0,
                                     credentials=pika.PlainCredentials(*_creds(d)))


def _kill_recorded(d: Path) -> None:
    """Last-resort clean-up: SIGKILL every pid cluster.json still records."""
    try:
        state = json.loads((d / "cluster.json").read_text())
    except (OSError, ValueError):
        return
    for n in state["nodes"]:
        if lc.pid_alive(n.get("pid"), n["id"]):
            os.kill(n["pid"], signal.SIGKILL)


def test_local_cluster_up_status_down_round_trip(tmp_path: Path) -> None:
    d = tmp_path / "lc"
    base = _free_base(3)
    try:
        up = _cli("up", "--nodes", "3", "--base-port", str(base), "--dir", str(d), "--timeout", "60")
        assert up.returncode == 0, f"up failed: {up.stderr}\n{up.stdout}"
        for i in range(3):
            assert f"amqp://admin@127.0.0.1:{base + i}/" in up.stdout, up.stdout
        assert f"its password in {d / lc.PASSWORD_FILE} (mode 0600)" in up.stdout, up.stdout
        state = json.loads((d / "cluster.json").read_text())
        pids = [n["pid"] for n in state["nodes"]]
        assert all(lc.pid_alive(p) for p in pids), state

        st = _cli("status", "--dir", str(d), "--json")
        assert st.returncode == 0, st.stderr
        rows = json.loads(st.stdout)["nodes"]
        assert [r["id"] for r in rows] == ["n1", "n2", "n3"]
        assert [r["pid"] for r in rows] == pids
        assert [r["amqp_port"] for r in rows] == [base, base + 1, base + 2]
        assert [r["http_port"] for r in rows] == [base + 10000, base + 10001, base + 10002]
        assert [r["admin_port"] for r in rows] == [base + 10010, base + 10011, base + 10012]
        assert all(r["alive"] for r in rows)
        roles = sorted(r["role"] for r in rows)
        assert roles == ["follower", "follower", "leader"], rows
        leader = next(r["id"] for r in rows if r["role"] == "leader")
        assert all(r["leader"] == leader for r in rows), rows
        human = _cli("status", "--dir", str(d))
        assert human.returncode == 0 and "leader" in human.stdout
        # each node's cluster view links every member's console (--http-member-url)
        import requests
        view = requests.get(f"http://127.0.0.1:{base + 10001}/api/mirrorq/cluster",
                            auth=_creds(d), timeout=15).json()
        assert {m["name"]: m["http_url"] for m in view["members"]} == {
            f"n{i + 1}": f"http://127.0.0.1:{base + 10000 + i}/" for i in range(3)}

        # every node serves AMQP: publish on n1, get on n3
        c1 = pika.BlockingConnection(_params(d, "127.0.0.1", base))
        ch = c1.channel()
        ch.queue_declare("lc-cli", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "lc-cli", b"hello", pika.BasicProperties(delivery_mode=2))
        c1.close()
        c3 = pika.BlockingConnection(_params(d, "127.0.0.1", base + 2))
        m, _p, body = c3.channel().basic_get("lc-cli", auto_ack=True)
        assert m is not None and body == b"hello"
        c3.close()

        # a second `up` on a running cluster is refused
        _assert_usage_error(_cli("up", "--nodes", "3", "--base-port", str(base), "--dir", str(d)),
                            "already running")

        down = _cli("down", "--dir", str(d), timeout=60)
        assert down.returncode == 0, down.stderr
        assert not any(lc.pid_alive(p) for p in pids), "processes left after down"
        state = json.loads((d / "cluster.json").read_text())
        assert [n["pid"] for n in state["nodes"]] == [None, None, None]
        assert all((d / f"n{i}").is_dir() and (d / f"n{i}.log").exists() for i in (1, 2, 3)), \
            "down removes nothing but the pids"
        st = json.loads(_cli("status", "--dir", str(d), "--json").stdout)["nodes"]
        assert [(r["alive"], r["role"]) for r in st] == [(False, "down")] * 3
        # the data is kept: the same layout comes back with the queue and its message
        up2 = _cli("up", "--nodes", "3", "--base-port", str(base), "--dir", str(d), "--timeout", "60")
        assert up2.returncode == 0, up2.stderr
        c2 = pika.BlockingConnection(_params(d, "127.0.0.1", base + 1))
        q = c2.channel().queue_declare("lc-cli", passive=True)
        assert q.method.message_count == 0  # consumed above: stays consumed
        c2.close()
        assert _cli("down", "--dir", str(d), timeout=60).returncode == 0
        # another layout on the same dir is refused
        _assert_usage_error(_cli("up", "--nodes", "2", "--base-port", str(base), "--dir", str(d)),
                            "another layout")
    finally:
        _kill_recorded(d)


def test_local_cluster_bad_args_exit_2(tmp_path: Path) -> None:
    d = str(tmp_path / "bad")
    _assert_usage_error(_cli("up", "--nodes", "0", "--dir", d), "--nodes")
    _assert_usage_error(_cli("up", "--nodes", "11", "--dir", d), "--nodes")
    _assert_usage_error(_cli("up", "--nodes", "x", "--dir", d), "--nodes")
    _assert_usage_error(_cli("up", "--nodes", "3", "--base-port", "50000", "--dir", d), "65535")
    _assert_usage_error(_cli("up", "--nodes", "3", "--base-port", "0", "--dir", d), "port")
    _assert_usage_error(_cli("up", "--nodes", "3"), "--dir")
    _assert_usage_error(_cli("status", "--dir", d), "no local cluster")
    _assert_usage_error(_cli("down", "--dir", d), "no local cluster")
    _assert_usage_error(_cli("sideways", "--dir", d), "invalid choice")
    # a port of the layout already taken: refused before anything starts
    base = _free_base(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + 10001))  # n2's admin port
        s.listen(1)
        _assert_usage_error(_cli("up", "--nodes", "2", "--base-port", str(base), "--dir", d), "in use")
    assert not (Path(d) / "cluster.json").exists(), "nothing is recorded when the ports are taken"


def test_local_cluster_refuses_a_dir_another_user_owns_or_may_write(tmp_path: Path) -> None:
    """Issue 42 item 10: --dir holds the keys, the token and the password, so
    one line and exit 2 for a directory its group or others may write in, or
    another user owns; nothing is written in it. Before: `up` used it."""
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    _assert_usage_error(_cli("up", "--nodes", "1", "--base-port", str(_free_base(1)),
                             "--dir", str(loose)), "writable by its group or others (mode 0777)")
    assert list(loose.iterdir()) == [], "nothing is written in a refused dir"
    if os.geteuid() != 0:
        return  # chown to another user needs root
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    _assert_usage_error(_cli("up", "--nodes", "1", "--base-port", str(_free_base(1)),
                             "--dir", str(theirs)), "is owned by uid 65534, not by you")
    assert list(theirs.iterdir()) == []


def test_local_cluster_user_config_without_password_gets_the_generated_one(tmp_path: Path) -> None:
    """Nodes with peers refuse to start without a Raft password: `up` hands a --config
    that sets none the directory's generated password (cluster.toml, mode 0600)."""
    d = tmp_path / "lc-cfg"
    cfg = tmp_path / "mine.toml"
    cfg.write_text("heartbeat = 30\n[raft]\nelection_min = 0.5\n")
    base = _free_base(2)
    try:
        up = _cli("up", "--nodes", "2", "--base-port", str(base), "--dir", str(d),
                  "--config", str(cfg), "--timeout", "60")
        assert up.returncode == 0, f"up failed: {up.stderr}\n{up.stdout}"
        generated = d / "cluster.toml"
        assert generated.stat().st_mode & 0o777 == 0o600
        assert "password" in generated.read_text() and "password" not in cfg.read_text()
        for pid in (n["pid"] for n in json.loads((d / "cluster.json").read_text())["nodes"]):
            assert b"password" not in Path(f"/proc/{pid}/cmdline").read_bytes()  # not in ps
    finally:
        _cli("down", "--dir", str(d), timeout=60)
        _kill_recorded(d)


def test_foreground_supervisor_exits_nonzero_once_every_node_is_gone(tmp_path: Path) -> None:
    """`make run` stays in the foreground; when every node has died it says which
    and how, and exits non-zero instead of supervising nothing."""
    d = tmp_path / "fg"
    out = tmp_path / "fg.out"
    base = _free_base(2)
    with open(out, "wb") as f:
        sup = subprocess.Popen([sys.executable, "-m", "node.app", "local-cluster", "up", "--nodes",
                                "2", "--base-port", str(base), "--dir", str(d), "--timeout", "60",
                                "--foreground"], cwd=str(REPO), stdout=f, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: sup.poll() is not None or b"Ctrl-C stops" in out.read_bytes(),
                 timeout=90, what="the cluster to come up in the foreground")
        assert sup.poll() is None, out.read_text()
        pids = [n["pid"] for n in json.loads((d / "cluster.json").read_text())["nodes"]]
        os.kill(pids[0], signal.SIGKILL)
        wait_for(lambda: b"node n1 exited" in out.read_bytes(), timeout=10,
                 what="the supervisor to report n1")
        assert sup.poll() is None, "one node left: the supervisor keeps running"
        os.kill(pids[1], signal.SIGKILL)
        try:
            code = sup.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"supervisor still running with no node: {out.read_text()}") \
                from None
        text = out.read_text()
        assert code != 0, text
        for node_id in ("n1", "n2"):
            assert f"node {node_id} exited (killed by SIGKILL" in text, text
        assert "every node has exited" in text, text
        assert [n["pid"] for n in json.loads((d / "cluster.json").read_text())["nodes"]] \
            == [None, None]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait(timeout=10)
        _kill_recorded(d)


@pytest.fixture(scope="module")
def loopback_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 2-node `local-cluster up` with the defaults; its cluster.json."""
    d = tmp_path_factory.mktemp("lc-loopback") / "c"
    base = _free_base(2)
    try:
        up = _cli("up", "--nodes", "2", "--base-port", str(base), "--dir", str(d), "--timeout", "60")
        assert up.returncode == 0, f"up failed: {up.stderr}\n{up.stdout}"
        yield json.loads((d / "cluster.json").read_text())
    finally:
        _cli("down", "--dir", str(d), timeout=60)
        _kill_recorded(d)


def test_local_cluster_keeps_amqp_admin_and_metrics_on_loopback(
        loopback_cluster: dict[str, Any]) -> None:
    for n in loopback_cluster["nodes"]:
        socks = listening(n["pid"])
        ports = {port for _addr, port in socks}
        assert {n["amqp_port"], n["http_port"], n["admin_port"], n["metrics_port"]} <= ports, \
            (n, socks)
        outside = {(a, p) for a, p in socks if p != n["raft_port"] and not loopback(a)}
        assert not outside, f"{n['id']} listens beyond loopback: {sorted(outside)}"
        amqp = {a for a, p in socks if p == n["amqp_port"]}
        if ipv6_available("::1"):  # for clients that resolve localhost to ::1 first
            assert amqp == {"127.0.0.1", "::1"}, amqp
            d = Path(loopback_cluster["config"]).parent
            conn = pika.BlockingConnection(_params(d, "::1", n["amqp_port"]))
            conn.close()


def test_local_cluster_keeps_raft_on_loopback(loopback_cluster: dict[str, Any]) -> None:
    for n in loopback_cluster["nodes"]:
        raft = {a for a, p in listening(n["pid"]) if p == n["raft_port"]}
        assert raft and all(loopback(a) for a in raft), f"{n['id']} Raft listens on {raft}"


def test_local_cluster_keys_password_and_data_are_private(loopback_cluster: dict[str, Any]) -> None:
    """Issue 26 items 4 and 12: the private keys, cluster.toml (the Raft password) and
    admin.token are 0600 in a 0700 directory,
    the tls/ and data directories 0700, every data file and node log 0600."""
    d = Path(loopback_cluster["config"]).parent
    modes = {p.relative_to(d).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in
             [d, d / "cluster.toml", d / "admin.token", d / lc.PASSWORD_FILE, d / "tls",
              *(d / "tls").glob("*.key"),
              *d.glob("n*.log")]}
    for n in loopback_cluster["nodes"]:
        data = d / n["id"]
        modes.update({p.relative_to(d).as_posix(): stat.S_IMODE(p.stat().st_mode)
                      for p in [data, *data.rglob("*")]})
    assert len([k for k in modes if k.endswith(".key")]) == 3, modes  # ca, n1, n2
    loose = {k: f"{m:04o}" for k, m in modes.items()
             if m != (0o700 if (d / k).is_dir() else 0o600)}
    assert loose == {}, loose


def _mirrorq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MIRRORQ_ADMIN_")}
    return subprocess.run([sys.executable, "-m", "node.app", *args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**clean, **(env or {})})


def test_local_cluster_admin_needs_its_generated_token(loopback_cluster: dict[str, Any]) -> None:
    """Issue 26 item 4: `local-cluster up` generates D/admin.token and every node
    requires it; the admin CLI works with --token-file (or MIRRORQ_ADMIN_TOKEN),
    not without; no token is an option or in a node's argv (ps). Before: no
    token at all."""
    d = Path(loopback_cluster["config"]).parent
    token_file = d / "admin.token"
    token = token_file.read_text().strip()
    assert len(token) >= 32
    n1 = loopback_cluster["nodes"][0]
    admin = f"127.0.0.1:{n1['admin_port']}"
    proc = _mirrorq("status", "--admin", admin, "--token-file", str(token_file), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["node_id"] == "n1", proc.stderr
    proc = _mirrorq("users", "--admin", admin, "list", env={"MIRRORQ_ADMIN_TOKEN": token})
    assert proc.returncode == 0 and "admin" in proc.stdout, proc.stderr
    _assert_usage_error(_mirrorq("status", "--admin", admin), "UNAUTHENTICATED")
    _assert_usage_error(_mirrorq("status", "--admin", admin, f"--token={token}"), "--token-file")
    _assert_usage_error(_mirrorq("status", "--admin", admin, "--token"), "--token-file")
    # local-cluster's own commands carry it
    st = _cli("status", "--dir", str(d), "--json")
    assert st.returncode == 0 and all(r["role"] != "down" for r in json.loads(st.stdout)["nodes"])
    for n in loopback_cluster["nodes"]:
        argv = Path(f"/proc/{n['pid']}/cmdline").read_bytes()
        assert token.encode() not in argv and b"--admin-token-file" in argv


def test_another_local_user_cannot_administer_a_local_cluster(
        loopback_cluster: dict[str, Any]) -> None:
    """Issue 26 item 4, the issue's reproduction: a process running as `nobody`
    cannot read the token file, and its admin call without the token (raw gRPC
    with curl: nobody cannot run this checkout's Python) is refused, so it
    creates no administrator. Before: UserPut succeeded."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as nobody")
    import pwd
    import shutil
    import tempfile

    from node.admin import admin_pb2 as pb
    from node.admin.client import call_user_list
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl")
    d = Path(loopback_cluster["config"]).parent
    token_file = d / "admin.token"

    def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL, cwd="/", user=nobody.pw_uid,
                              group=nobody.pw_gid, extra_groups=[])

    read = as_nobody("cat", str(token_file))
    assert read.returncode != 0 and "Permission denied" in read.stderr, read
    # a gRPC frame: uncompressed flag, length, the UserPutRequest; in a directory
    # nobody can read (pytest's own temporary directories are root's, 0700)
    msg = pb.UserPutRequest(name="evil", password="pw", tags=["administrator"]).SerializeToString()
    port = loopback_cluster["nodes"][0]["admin_port"]
    with tempfile.TemporaryDirectory(prefix="mirrorq-nobody-") as shared:
        os.chmod(shared, 0o755)
        body = Path(shared) / "userput.bin"
        body.write_bytes(b"\0" + len(msg).to_bytes(4, "big") + msg)
        body.chmod(0o644)
        call = as_nobody(curl, "-sS", "--http2-prior-knowledge", "-D", "-", "-o", "/dev/null",
                         "-H", "content-type: application/grpc", "-H", "te: trailers",
                         "--data-binary", f"@{body}",
                         f"http://127.0.0.1:{port}/mirrorq.Admin/UserPut")
    assert call.returncode == 0, call.stderr  # it reached the admin API
    assert "grpc-status: 16" in call.stdout, call.stdout  # UNAUTHENTICATED
    users = call_user_list("127.0.0.1", port, token=token_file.read_text().strip())["users"]
    assert "evil" not in {u["name"] for u in users}, users


def test_local_cluster_seeds_a_generated_administrator_and_no_guest(
        loopback_cluster: dict[str, Any]) -> None:
    """Issue 42 item 11: `local-cluster up` (and so `make run`) seeds no
    guest/guest, which any local OS user could use to make themselves an
    administrator over HTTP; its one user, `admin`, has a generated password
    in D/admin.password (0600, like admin.token). Before: guest/guest worked
    and there was no such file."""
    import requests
    d = Path(loopback_cluster["config"]).parent
    path = d / lc.PASSWORD_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    user, password = _creds(d)
    assert len(password) >= 32
    n1 = loopback_cluster["nodes"][0]
    api = f"http://127.0.0.1:{n1['http_port']}/api"
    me = requests.get(f"{api}/whoami", auth=(user, password), timeout=15)
    assert me.status_code == 200 and "administrator" in me.json()["tags"], me.text
    users = requests.get(f"{api}/users", auth=(user, password), timeout=15).json()
    assert [u["name"] for u in users] == ["admin"], users
    assert requests.get(f"{api}/whoami", auth=("guest", "guest"), timeout=15).status_code == 401
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", n1["amqp_port"], heartbeat=0,
            credentials=pika.PlainCredentials("guest", "guest")))
    conn = pika.BlockingConnection(_params(d, "127.0.0.1", n1["amqp_port"]))
    conn.close()
    for n in loopback_cluster["nodes"]:  # the password is in no node's argv (ps)
        assert password.encode() not in Path(f"/proc/{n['pid']}/cmdline").read_bytes()
