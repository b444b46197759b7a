"""`mirrorq local-cluster up|status|down`: N node processes on one machine.

Layout for `--nodes N --base-port P` (node i = 0..N-1 is called n{i+1}):
    AMQP P+i, management HTTP P+10000+i, gRPC admin P+10010+i,
    metrics P+10020+i, Raft P+20000+i
so `--base-port 5672` gives n1 5672 / 15672 (HTTP, RabbitMQ's management
port) / 15682 (admin) / 15692 / 25672. Everything lives under --dir D: D/cluster.json (layout and
pids), D/cluster.toml (generated Raft password, mode 0600), D/admin.token (the
generated admin token every node requires, mode 0600; the admin ports listen on
loopback), D/admin.password (the generated password of the cluster's first
administrator, `admin`, mode 0600: a new cluster seeds no guest/guest, issue
42), D/nI/ (data) and D/nI.log (stdout and stderr of the node). D must be the
user's own and writable by nobody else (it holds keys and credentials). A cluster needs a Raft password: a
`--config` that sets none gets the generated one through MIRRORQ_RAFT_PASSWORD.
With more than one node, D/tls/ holds a cluster CA (ca.pem, ca.key) and a
certificate per member (nI.pem, nI.key), generated once: the members' Raft
links use mutual TLS.

`down` stops the processes and forgets their pids; it removes no data, so a
later `up` with the same layout restarts the same cluster with its queues.
Every user error is one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from node.amqp.config import ipv6_available
from node.app.config import DEFAULT_PASS_ENV, DEFAULT_USER_ENV
from node.app.pki import make_ca, make_member
from node.broker.loopback import is_loopback

EXIT_USAGE = 2
MAX_NODES = 10  # HTTP (P+10000+i), admin (P+10010+i), metrics (P+10020+i) stay apart
HTTP_OFFSET = 10000
ADMIN_OFFSET = 10010
METRICS_OFFSET = 10020
RAFT_OFFSET = 20000
STATE_FILE = "cluster.json"
CONFIG_FILE = "cluster.toml"
TOKEN_FILE = "admin.token"
PASSWORD_FILE = "admin.password"
ADMIN_USER = "admin"  # the first administrator a new local cluster seeds (no guest)


class ClusterError(Exception):
    """A user-facing problem: one line, exit 2."""


# ---------------------------------------------------------------- layout

def layout(nodes: int, base_port: int, host: str = "127.0.0.1") -> list[dict[str, Any]]:
    if not 1 <= nodes <= MAX_NODES:
        raise ClusterError(f"--nodes must be between 1 and {MAX_NODES}, got {nodes}")
    if base_port < 1:
        raise ClusterError(f"--base-port must be positive, got {base_port}")
    top = base_port + RAFT_OFFSET + nodes - 1
    if top > 65535:
        raise ClusterError(f"--base-port {base_port} is too high: node n{nodes}'s Raft port would be "
                           f"{top} (> 65535); use a base port <= {65535 - RAFT_OFFSET - nodes + 1}")
    out = []
    listen = amqp_listen(host)
    # every node runs here: the admin API (all power) stays on loopback
    admin_host = host if is_loopback(host, peer=False) else "127.0.0.1"
    for i in range(nodes):
        out.append({
            "id": f"n{i + 1}",
            "host": host,
            "admin_host": admin_host,
            "listen": listen,
            "amqp_port": base_port + i,
            "http_port": base_port + HTTP_OFFSET + i,
            "admin_port": base_port + ADMIN_OFFSET + i,
            "metrics_port": base_port + METRICS_OFFSET + i,
            "raft_port": base_port + RAFT_OFFSET + i,
            "pid": None,
        })
    return out


def amqp_listen(host: str) -> list[str]:
    """Where a node's AMQP listener binds: the cluster's host, plus ::1 beside
    127.0.0.1 so that clients resolving `localhost` to ::1 first (Node.js)
    connect too, while everything stays on loopback."""
    if host == "127.0.0.1" and ipv6_available("::1"):
        return [host, "::1"]
    return [host]


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports_free(nodes: list[dict[str, Any]]) -> None:
    for n in nodes:
        for kind in ("amqp_port", "http_port", "admin_port", "metrics_port", "raft_port"):
            if not n.get(kind):
                continue
            hosts = (n.get("listen") or [n["host"]]) if kind == "amqp_port" \
                else [admin_host(n)] if kind == "admin_port" else [n["host"]]
            for host in hosts:
                if not port_free(host, n[kind]):
                    raise ClusterError(f"port {n[kind]} ({n['id']} {kind.removesuffix('_port')}) "
                                       f"on {host} is in use")


def peers_arg(nodes: list[dict[str, Any]], me: str) -> str:
    return ",".join(f"{n['id']}={n['host']}:{n['raft_port']}" for n in nodes if n["id"] != me)


def admin_host(n: dict[str, Any]) -> str:
    return str(n.get("admin_host") or "127.0.0.1")  # cluster.json of an older build: none


def amqp_url(n: dict[str, Any], user: str | None = None) -> str:
    """The node's AMQP URL: as `user` (its password in admin.password, not
    printed) or, for a cluster an older build seeded, guest/guest."""
    if user is None:
        return f"amqp://guest:guest@{n['host']}:{n['amqp_port']}/"
    return f"amqp://{user}@{n['host']}:{n['amqp_port']}/"


def dir_refusal(path: Path, owner: int, mode: int, me: int) -> str | None:
    """Why --dir may not hold a cluster's keys and credentials: another user
    owns it, or its group or others may write in it (they could replace the
    token, the password or the CA; issue 42). None: it is private enough."""
    if owner != me:
        return (f"{path} is owned by uid {owner}, not by you (uid {me}): use a directory "
                f"of your own")
    if mode & 0o022:
        return (f"{path} is writable by its group or others (mode {mode & 0o7777:04o}): "
                f"chmod go-w it or use another --dir")
    return None


# ---------------------------------------------------------------- state file

def load_state(d: Path) -> dict[str, Any] | None:
    path = d / STATE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ClusterError(f"{path} is not a mirrorq local-cluster file")
    return data


def save_state(d: Path, state: dict[str, Any]) -> None:
    path = d / STATE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def exit_status(pid: int) -> str:
    """How our dead child ended (" (killed by SIGKILL)", " (exit 1)"), or "" when
    it is no longer ours to reap: an empty log alone does not say (a CI run
    once saw a node leave with nothing logged)."""
    try:
        rpid, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return ""
    if rpid == 0:
        return " (still running, but not as our node)"
    if os.WIFSIGNALED(status):
        return f" (killed by {signal.Signals(os.WTERMSIG(status)).name})"
    return f" (exit {os.WEXITSTATUS(status)})"


def pid_alive(pid: int | None, node_id: str | None = None) -> bool:
    """The pid runs, is not a zombie, and (when readable) is our node."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)
    if node_id is not None:
        # pid reuse guard: it must be `... node.app serve --node-id <id> ...`
        return b"node.app" in cmdline and node_id.encode() in cmdline
    return True


# ---------------------------------------------------------------- admin

def node_status(n: dict[str, Any], token: str | None,
                timeout: float = 2.0) -> dict[str, Any] | None:
    from node.admin.client import call_status
    try:
        return call_status(admin_host(n), n["admin_port"], timeout=timeout, token=token or "")
    except Exception:  # noqa: BLE001 - unreachable is a status, not an error
        return None


def _leader_id(st: dict[str, Any], nodes: list[dict[str, Any]]) -> str | None:
    """Status reports the leader as a node id (or, in older builds, HOST:RAFTPORT)."""
    leader = st.get("leader")
    if leader is None:
        return None
    for n in nodes:
        if leader in (n["id"], f"{n['host']}:{n['raft_port']}"):
            return str(n["id"])
    return str(leader)


def healthy(nodes: list[dict[str, Any]], token: str | None) -> tuple[bool, str]:
    """A leader that every node agrees on, and every node in the in-sync set."""
    statuses = {}
    for n in nodes:
        st = node_status(n, token)
        if st is None:
            return False, f"{n['id']} admin API not answering"
        statuses[n["id"]] = st
    leaders = {_leader_id(st, nodes) for st in statuses.values()}
    if None in leaders or len(leaders) != 1:
        return False, f"no agreed leader yet ({sorted(str(x) for x in leaders)})"
    leader = leaders.pop()
    lst = statuses.get(str(leader))
    if lst is None or lst.get("role") != "leader":
        return False, f"{leader} does not report itself leader yet"
    if "in_sync" in lst:
        missing = sorted({n["id"] for n in nodes} - set(lst.get("in_sync") or []))
        if missing:
            return False, f"not in sync yet: {', '.join(missing)}"
    return True, f"leader {leader}"


# ---------------------------------------------------------------- commands

def _spawn(d: Path, n: dict[str, Any], nodes: list[dict[str, Any]], config: Path,
           log_level: str, raft_password: str | None = None,
           admin_password: str | None = None) -> int:
    argv = [sys.executable, "-m", "node.app", "serve", "--node-id", n["id"], "--host", n["host"],
            "--listen", ",".join(n.get("listen") or [n["host"]]), "--raft-listen", n["host"],
            "--amqp-port", str(n["amqp_port"]), "--raft-port", str(n["raft_port"]),
            "--admin-port", str(n["admin_port"]), "--admin-listen", admin_host(n),
            "--admin-token-file", str(d / TOKEN_FILE), "--metrics-port", str(n["metrics_port"]),
            "--data-dir", str(d / n["id"]), "--config", str(config), "--log-level", log_level]
    if n.get("http_port"):  # cluster.json written before the HTTP API has none
        argv += ["--http-port", str(n["http_port"])]
        for other in nodes:  # the cluster view and the console link to the others
            if other["id"] != n["id"] and other.get("http_port"):
                host = f"[{other['host']}]" if ":" in other["host"] else other["host"]
                argv += ["--http-member-url",
                         f"{other['id']}=http://{host}:{other['http_port']}/"]
    peers = peers_arg(nodes, n["id"])
    if peers:
        argv += ["--peers", peers]
        # mutual TLS between members, from this directory's own cluster CA
        tls = d / "tls"
        cert, key = make_member(tls, n["id"], [n["host"]])
        argv += ["--raft-tls-cert", str(cert), "--raft-tls-key", str(key), "--raft-tls-ca", str(tls / "ca.pem")]
    env = dict(os.environ)
    if raft_password is not None:
        env["MIRRORQ_RAFT_PASSWORD"] = raft_password  # in the environment, never in argv (ps)
    if admin_password is not None:  # the only configured user: a new cluster seeds it alone
        env[DEFAULT_USER_ENV], env[DEFAULT_PASS_ENV] = ADMIN_USER, admin_password
    src = str(Path(__file__).resolve().parent.parent.parent)  # the directory holding node/
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with os.fdopen(os.open(d / f"{n['id']}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                   "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, cwd=str(d))
    return proc.pid


def _config_file(d: Path) -> Path:
    path = d / CONFIG_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# generated by `mirrorq local-cluster up`; shared by every node of this cluster\n"
                    f"[raft]\npassword = \"{secrets.token_hex(16)}\"\n")
    return path


def _token_file(d: Path) -> str:
    """D/admin.token: generated once (0600), required by every node's admin port;
    its content, for this process's own admin calls."""
    path = d / TOKEN_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            # hex: a token never starts with "-", which a CLI would read as an option
            f.write(secrets.token_hex(32) + "\n")
    return read_token(d) or ""


def read_token(d: Path) -> str | None:
    try:
        return (d / TOKEN_FILE).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _admin_password(d: Path, new_cluster: bool) -> str | None:
    """D/admin.password's content: generated (0600) for a new cluster; None
    for a cluster an older build created without one (its users are its own)."""
    path = d / PASSWORD_FILE
    if not path.exists():
        if not new_cluster:
            return None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(16) + "\n")
    try:
        password = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterError(f"cannot read {path}: {exc}") from exc
    if not password:
        raise ClusterError(f"{path} is empty; remove it (a new cluster generates one)")
    return password


def _sets_users(config: Path) -> bool:
    """The user's --config (or the environment) names the users itself."""
    if os.environ.get(DEFAULT_USER_ENV):
        return True
    try:
        return "users" in tomllib.loads(config.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def _sets_raft_password(config: Path) -> bool:
    """The user's --config (or the environment) already authenticates the Raft port.
    An unreadable or invalid file counts as no: the node itself reports what is wrong."""
    if os.environ.get("MIRRORQ_RAFT_PASSWORD"):
        return True
    try:
        raft = tomllib.loads(config.read_text()).get("raft")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return isinstance(raft, dict) and bool(raft.get("password") or raft.get("password_file"))


def _generated_password(d: Path) -> str:
    path = _config_file(d)
    try:
        password = tomllib.loads(path.read_text())["raft"]["password"]
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ClusterError(f"{path} holds no [raft] password; remove it to generate one") from exc
    return str(password)


def cmd_up(args: argparse.Namespace) -> int:
    d = Path(args.dir).resolve()
    nodes = layout(args.nodes, args.base_port, args.host)
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new one private (keys, password)
    except OSError as exc:
        raise ClusterError(f"cannot create {d}: {exc.strerror}") from exc
    if not os.access(d, os.W_OK):
        raise ClusterError(f"{d} is not writable")
    st = d.stat()
    refused = dir_refusal(d, st.st_uid, st.st_mode, os.geteuid())
    if refused is not None:
        raise ClusterError(refused)
    old = load_state(d)
    if old is not None:
        running = [n["id"] for n in old["nodes"] if pid_alive(n.get("pid"), n["id"])]
        if running:
            raise ClusterError(f"a cluster is already running in {d} ({', '.join(running)}); "
                               f"run `mirrorq local-cluster down --dir {args.dir}` first")
        same = [(n["id"], n["amqp_port"], n["raft_port"], n["host"]) for n in old["nodes"]] == \
               [(n["id"], n["amqp_port"], n["raft_port"], n["host"]) for n in nodes]
        if not same:
            raise ClusterError(f"{d} holds a cluster with another layout ({len(old['nodes'])} nodes from "
                               f"port {old['nodes'][0]['amqp_port']}); use another --dir or remove it")
    check_ports_free(nodes)
    config = Path(args.config).resolve() if args.config else _config_file(d)
    # a --config without a Raft password still gets this directory's generated one
    password = None if _sets_raft_password(config) else _generated_password(d)
    # the first administrator: generated, never guest/guest (unless the config names users)
    fresh = old is None and not any((d / n["id"]).exists() for n in nodes)
    admin_password = None if _sets_users(config) else _admin_password(d, fresh)
    user = ADMIN_USER if admin_password is not None else None
    state = {"nodes": nodes, "base_port": args.base_port, "host": args.host,
             "config": str(config), "started_at": time.time(), "user": user}
    token = _token_file(d)
    if len(nodes) > 1:
        make_ca(d / "tls")
    for n in nodes:
        n["pid"] = _spawn(d, n, nodes, config, args.log_level, password, admin_password)
        save_state(d, state)  # record each pid as soon as it exists: `down` can always find it
    deadline = time.monotonic() + args.timeout
    why = "starting"
    while time.monotonic() < deadline:
        dead = [n["id"] for n in nodes if not pid_alive(n["pid"], n["id"])]
        if dead:
            node = next(n for n in nodes if n["id"] == dead[0])
            how = exit_status(node["pid"])
            tail = _tail(d / f"{dead[0]}.log")
            _stop(d, state)
            raise ClusterError(f"node {dead[0]} exited during start-up{how}: {tail}")
        ok, why = healthy(nodes, token)
        if ok:
            break
        time.sleep(0.2)
    else:
        _stop(d, state)
        raise ClusterError(f"cluster not healthy within {args.timeout:g}s ({why}); stopped it, "
                           f"see {d}/n*.log")
    print(f"mirrorq local cluster of {len(nodes)} nodes up in {d} ({why})")
    for n in nodes:
        http = f"http://{n['host']}:{n['http_port']}/  " if n.get("http_port") else ""
        print(f"  {n['id']}  {amqp_url(n, user)}  pid {n['pid']}  {http}admin {admin_host(n)}:"
              f"{n['admin_port']}  metrics http://{n['host']}:{n['metrics_port']}/metrics  "
              f"raft {n['raft_port']}")
    if user is not None:
        print(f"user {user} (administrator; AMQP, HTTP API, console), its password in "
              f"{d / PASSWORD_FILE} (mode 0600): curl -u {user}:$(cat {d / PASSWORD_FILE}) "
              f"http://{nodes[0]['host']}:{nodes[0]['http_port']}/api/whoami")
    elif _sets_users(config):
        print("users: as your --config (or MIRRORQ_DEFAULT_USER) names them")
    else:
        print(f"users: this cluster's own (created by an older build: guest/guest, loopback "
              f"only, unless you changed them; no {PASSWORD_FILE})")
    print(f"admin CLI (token in {d / TOKEN_FILE}, mode 0600): mirrorq status --admin-port "
          f"{nodes[0]['admin_port']} --token-file {d / TOKEN_FILE}")
    sys.stdout.flush()
    if args.foreground:
        return _foreground(d, state)
    return 0


def _exit_status(pid: int, node_id: str) -> str | None:
    """How node `pid` ended ("exit code 1", "killed by SIGKILL"), or None while it
    runs. The nodes are this process's children: waiting reaps them and tells how."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (or already reaped)
        return None if pid_alive(pid, node_id) else "exited"
    if not done:
        return None
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _foreground(d: Path, state: dict[str, Any]) -> int:
    """Report each node that exits; Ctrl-C stops the cluster (0). Once every node
    has exited there is nothing left to supervise: say so and exit 1, so that
    `make run` does not sit there serving nothing."""
    print("Ctrl-C stops the cluster (data stays in " f"{d})", flush=True)
    stop = {"now": False}

    def on_signal(_sig: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    gone: dict[str, str] = {}
    while not stop["now"]:
        for n in state["nodes"]:
            how = None if n["id"] in gone else _exit_status(n["pid"], n["id"])
            if how is not None:
                gone[n["id"]] = how
                print(f"mirrorq: node {n['id']} exited ({how}; log: {d}/{n['id']}.log)",
                      flush=True)
        if len(gone) == len(state["nodes"]):
            _stop(d, state)  # nothing to stop: records that no pid runs
            sys.stderr.write("mirrorq: every node has exited ("
                             + ", ".join(f"{k}: {v}" for k, v in gone.items())
                             + f"); logs in {d}\n")
            return 1
        time.sleep(0.2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abort the stop
    print("stopping the cluster...", flush=True)
    _stop(d, state)
    print("stopped", flush=True)
    return 0


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def _stop(d: Path, state: dict[str, Any], timeout: float = 10.0) -> list[str]:
    """SIGTERM every live node, wait, SIGKILL leftovers; forget the pids."""
    live = [n for n in state["nodes"] if pid_alive(n.get("pid"), n["id"])]
    for n in live:
        try:
            os.kill(n["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(n["pid"], n["id"]) for n in live):
        _reap()
        time.sleep(0.05)
    killed = []
    for n in live:
        if pid_alive(n["pid"], n["id"]):
            killed.append(n["id"])
            try:
                os.kill(n["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while killed and time.monotonic() < deadline and any(pid_alive(n["pid"], n["id"]) for n in live):
        _reap()
        time.sleep(0.05)
    for n in state["nodes"]:
        n["pid"] = None
    state["stopped_at"] = time.time()
    save_state(d, state)
    return killed


def _reap() -> None:
    """Collect our own exited children (when `up` stops what it just started)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def cmd_status(args: argparse.Namespace) -> int:
    d = Path(args.dir).resolve()
    state = load_state(d)
    if state is None:
        raise ClusterError(f"no local cluster in {d} (no {STATE_FILE})")
    rows = []
    token = read_token(d)
    for n in state["nodes"]:
        alive = pid_alive(n.get("pid"), n["id"])
        st = node_status(n, token) if alive else None
        rows.append({
            "id": n["id"], "pid": n.get("pid") if alive else None, "alive": alive,
            "amqp_port": n["amqp_port"], "http_port": n.get("http_port"),
            "admin_port": n["admin_port"],
            "metrics_port": n["metrics_port"], "raft_port": n["raft_port"],
            "url": amqp_url(n, state.get("user")),
            "role": str(st.get("role")) if st else "down",
            "leader": _leader_id(st, state["nodes"]) if st else None,
            "term": st.get("term") if st else None,
            "in_sync": st.get("in_sync") if st else None,
        })
    if args.json:
        print(json.dumps({"dir": str(d), "nodes": rows}, indent=2))
    else:
        print(f"{'id':<5} {'pid':>7} {'alive':<5} {'amqp':>5} {'admin':>5} {'role':<9} leader")
        for r in rows:
            print(f"{r['id']:<5} {r['pid'] or '-':>7} {'yes' if r['alive'] else 'no':<5} "
                  f"{r['amqp_port']:>5} {r['admin_port']:>5} {r['role']:<9} {r['leader'] or '-'}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    d = Path(args.dir).resolve()
    state = load_state(d)
    if state is None:
        raise ClusterError(f"no local cluster in {d} (no {STATE_FILE})")
    live = [n["id"] for n in state["nodes"] if pid_alive(n.get("pid"), n["id"])]
    killed = _stop(d, state, timeout=args.timeout)
    if not live:
        print(f"no node of {d} was running")
    else:
        extra = f" ({', '.join(killed)} needed SIGKILL)" if killed else ""
        print(f"stopped {', '.join(live)}{extra}; data kept in {d}")
    return 0


def add_parser(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Wire `local-cluster up|status|down` into the `mirrorq` parser."""
    from node.app.main import _port

    lc = sub.add_parser("local-cluster", help="run N nodes on this machine (development, CI)")
    lsub = lc.add_subparsers(dest="lc_command", required=True, parser_class=parser_class)
    up = lsub.add_parser("up", help="start N nodes and wait until they form a healthy cluster")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--base-port", type=_port, default=5672,
                    help="AMQP port of n1; HTTP +10000, admin +10010, metrics +10020, raft "
                         "+20000 (+i for node i)")
    up.add_argument("--dir", required=True, help="where cluster.json, data and logs live")
    up.add_argument("--host", default="127.0.0.1",
                    help="the address every node listens on and advertises (AMQP, HTTP, "
                         "metrics, Raft; admin stays on loopback); default 127.0.0.1: loopback "
                         "only (AMQP also on ::1)")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a healthy cluster")
    up.add_argument("--config", help="TOML given to every node (without a raft.password, the "
                                     "directory's generated one is used; the admin token is "
                                     "always the directory's admin.token)")
    up.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    up.add_argument("--foreground", action="store_true",
                    help="stay in the foreground after start-up, reporting nodes that exit; "
                         "Ctrl-C runs `down`; exits 1 once every node has exited")
    status = lsub.add_parser("status", help="list the nodes: pid, alive, ports, role")
    status.add_argument("--dir", required=True)
    status.add_argument("--json", action="store_true")
    down = lsub.add_parser("down", help="SIGTERM every node (SIGKILL after --timeout); keeps data")
    down.add_argument("--dir", required=True)
    down.add_argument("--timeout", type=float, default=10.0)


def run(args: argparse.Namespace) -> int:
    try:
        if args.lc_command == "up":
            return cmd_up(args)
        if args.lc_command == "status":
            return cmd_status(args)
        return cmd_down(args)
    except ClusterError as exc:
        sys.stderr.write(f"mirrorq: error: {exc}\n")
        return EXIT_USAGE
