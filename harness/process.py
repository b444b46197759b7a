"""Real mirrorq node processes, one or many: start, SIGKILL, SIGSTOP, restart, add and
remove members (ClusterNode, Cluster), and the port and polling helpers around them.

    c = Cluster(tmp_path, n=3).start()     # waits for a leader and every member in sync
    leader = c.leader(); f1, f2 = c.followers()
    leader.kill9(); c.leader(timeout=10)   # a new one among the survivors

Every process started here is registered in LIVE and SIGKILLed by
Cluster.kill_all() (the `cluster` fixture calls it) and, as a last resort,
at interpreter exit (kill_leftovers).
"""
from __future__ import annotations

import atexit
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from harness.datafs import DataFs

T = TypeVar("T")


def _repo_root() -> Path:
    """Where `python -m node.app` runs from: the checkout that holds the `node` package."""
    try:
        import node
        return Path(node.__file__).resolve().parent.parent
    except ImportError:  # pragma: no cover - harness/ inside a checkout
        return Path(__file__).resolve().parents[1]


REPO = _repo_root()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free port BELOW the kernel's ephemeral range. A port the kernel picked
    for us (bind to 0) lies inside that range, and until the node binds it, any
    outgoing connection (a node dialling its peers, a client) may be given the
    same port as its source: "address already in use" at start-up. Ports below
    the range are never handed out implicitly; each is checked bindable and
    given out once per process (random start: parallel test processes rarely
    meet, and a clash still shows as a failed bind check)."""
    lo, _hi = _ephemeral_range()
    first = max(1025, lo - 20000)
    span = lo - first
    start = int.from_bytes(os.urandom(4), "little") % span
    for i in range(span):
        port = first + (start + i) % span
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False



def wait_for(cond: Callable[[], T | None], timeout: float = 20.0, interval: float = 0.05,
             what: str = "condition") -> T:
    """Poll `cond` until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last one
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last error: {last_exc!r}")

CLUSTER_PASSWORD = "mirrorq-test-cluster"
BASE_CONFIG = f'[raft]\npassword = "{CLUSTER_PASSWORD}"\n'

LIVE: dict[int, subprocess.Popen[bytes]] = {}

# `python -c` of a node whose source_dir is set: that directory goes first on sys.path,
# before the cwd and before the venv's editable install of this checkout (whose finder
# comes after sys.path anyway), and the node says which package it imported (first
# line of its log: harness.release.imported_from).
RUN_FROM_SOURCE = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import node; "
                   "print('mirrorq: node package', node.__file__, flush=True); "
                   "runpy.run_module('node.app', run_name='__main__', alter_sys=True)")


def write_token_file(path: Path, token: str | None = None) -> str:
    """An admin token in `path`, mode 0600 as `local-cluster` writes it (a node
    refuses an admin port without one); returns the token."""
    token = token or secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def kill_leftovers() -> None:
    for pid, proc in list(LIVE.items()):
        if proc.poll() is None:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        LIVE.pop(pid, None)


atexit.register(kill_leftovers)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of `pid` from /proc, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[19])


def _children(pid: int) -> list[tuple[int, int]]:
    """The child processes of `pid` (every thread's) as (pid, start time)."""
    out: list[tuple[int, int]] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                for k in f.read().split():
                    st = _stat(int(k))
                    if st is not None:
                        out.append((int(k), st[1]))
    except OSError:  # gone meanwhile, or no /proc
        pass
    return out


def _wait_gone(kids: list[tuple[int, int]], timeout: float) -> None:
    """Wait until each child is gone or a zombie (its files, sockets included,
    are closed); the start time tells a reused pid apart."""
    deadline = time.monotonic() + timeout
    for pid, started in kids:
        while True:
            st = _stat(pid)
            if st is None or st[1] != started or st[0] in ("Z", "X"):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"child {pid} of a killed node still running after {timeout}s")
            time.sleep(0.01)


class ClusterNode:
    """One `mirrorq serve` process of a cluster; ports stay fixed across restarts."""

    user = "guest"
    password = "guest"

    def __init__(self, node_id: str, data_dir: Path, host: str = "127.0.0.1",
                 netns: str | None = None, config_path: Path | None = None,
                 extra_args: Iterable[str] = ()) -> None:
        self.node_id = node_id
        self.host = host
        self.netns = netns
        self.data_dir = data_dir
        self.amqp_port = free_port()
        self.raft_port = free_port()
        self.admin_port = free_port()
        self.metrics_port = free_port()
        # the admin port's token: in a 0600 file named on the command line, never in argv
        self.admin_token_file = data_dir.parent / f"{node_id}.admin-token"
        self.admin_token = secrets.token_urlsafe(24)
        self.config_path = config_path
        self.extra_args = list(extra_args)
        self.env: dict[str, str] = {}  # added to the inherited environment (e.g. MIRRORQ_RAFT_PASSWORD)
        self.peers: dict[str, str] = {}  # the other members: id -> host:raftport
        self.log_path = data_dir.parent / f"{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.datafs: DataFs | None = None  # own tmpfs / FUSE mount of data_dir (harness.datafs)
        # a directory holding another build's node/ package (an older release,
        # harness.release): the process imports node from there, not from this checkout
        self.source_dir: Path | None = None

    # -------------------------------------------------------------- identity
    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def url(self) -> str:
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.amqp_port}/%2F"

    def __repr__(self) -> str:
        return f"<{self.node_id} amqp={self.amqp_port} pid={self.pid}>"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -------------------------------------------------------------- process
    def argv(self, join: bool = False) -> list[str]:
        if self.source_dir is None:
            launch = [sys.executable, "-m", "node.app"]
        else:
            launch = [sys.executable, "-c", RUN_FROM_SOURCE, str(self.source_dir)]
        args = [*launch, "serve", "--node-id", self.node_id,
                "--host", self.host,
                "--amqp-port", str(self.amqp_port), "--raft-port", str(self.raft_port),
                "--admin-port", str(self.admin_port), "--metrics-port", str(self.metrics_port),
                "--admin-token-file", str(self.admin_token_file), "--data-dir", str(self.data_dir)]
        if self.host != "127.0.0.1":  # admin listens on loopback by default; the tests dial host
            args += ["--admin-listen", self.host]
        if self.peers:
            args += ["--peers", ",".join(f"{k}={v}" for k, v in sorted(self.peers.items()))]
        if join:
            args.append("--join")
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        args += self.extra_args
        if self.netns:
            args = ["ip", "netns", "exec", self.netns, *args]
        return args

    def start(self, join: bool = False, wait: bool = True, timeout: float = 30.0) -> ClusterNode:
        assert not self.alive(), f"{self.node_id} already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        write_token_file(self.admin_token_file, self.admin_token)
        if self.datafs is not None:
            self.datafs.mount()  # before the node opens anything in data_dir
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== start {time.strftime('%H:%M:%S')} join={join}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv(join), cwd=str(self.source_dir or REPO), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.env} if self.env else None)
        LIVE[self.proc.pid] = self.proc
        self.paused = False
        if wait:
            self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not port_open(self.amqp_port, self.host):
            if not self.alive():
                raise AssertionError(f"{self.node_id} exited with {self.proc and self.proc.returncode}:\n"
                                     f"{self.tail_log(12)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.node_id} not accepting AMQP after {timeout}s:\n"
                                     f"{self.tail_log(12)}")
            time.sleep(0.05)

    def _signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill9(self) -> None:
        """SIGKILL and reap the node, then wait until its forked children (a
        snapshot writer: SIGKILLed with it, but tearing down a copy of a large
        heap at nice 19 takes a while) are gone: they hold the node's listening
        sockets, and a restart at once would fail with "Address already in use"."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kids = _children(self.proc.pid)
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            _wait_gone(kids, timeout=30)
        LIVE.pop(self.proc.pid, None)
        self.paused = False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (graceful), SIGKILL after `timeout`."""
        if self.proc is None:
            return
        if self.paused:
            self.resume()
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        LIVE.pop(self.proc.pid, None)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def restart(self, join: bool = False, wait: bool = True) -> ClusterNode:
        self.stop()
        return self.start(join=join, wait=wait)

    # -------------------------------------------------------------- admin
    def status(self, timeout: float = 3.0) -> dict[str, Any]:
        from node.admin.client import call_status
        return call_status(self.host, self.admin_port, timeout=timeout, token=self.admin_token)

    @property
    def admin_cli(self) -> list[str]:
        """The `mirrorq` admin CLI's options that reach this node (its token by file)."""
        return ["--admin", f"{self.host}:{self.admin_port}",
                "--token-file", str(self.admin_token_file)]

    def try_status(self, timeout: float = 2.0) -> dict[str, Any] | None:
        if not self.alive() or self.paused:
            return None
        try:
            return self.status(timeout)
        except Exception:  # noqa: BLE001 - unreachable: no status
            return None

    def tail_log(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def log_mark(self) -> int:
        """Where the log ends now: log_since(mark) is what the node wrote after it
        (a test on a shared cluster looks only at the lines its own doing caused)."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, mark: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(mark)
                return f.read().decode(errors="replace")
        except OSError:
            return ""


class Cluster:
    """N ClusterNodes n1..nN that list each other as peers."""

    def __init__(self, base_dir: Path, n: int = 3, hosts: list[str] | None = None,
                 netns: list[str] | None = None, extra_args: Iterable[str] = (),
                 config: str = "", loopback_users: list[str] | None = None,
                 data_fs_mb: int | None = None, slow_fs: bool = False, lazy_fs: bool = False,
                 mounts_registry: Path | None = None,
                 node_env: Callable[[str], dict[str, str]] | None = None) -> None:
        """Opt-ins for the disk and clock faults: `data_fs_mb` (each data dir on
        its own tmpfs of that size), `slow_fs` (each data dir a FUSE passthrough
        mount with a switchable fsync delay), `lazy_fs` (the FUSE mount is
        harness.lazyfs: unsynced writes are dropped by DataFs.crash_drop), `mounts_registry` (where the mounts
        are recorded for a clean-up after a crash), `node_env(node_id)` (extra
        environment of that node's process: chaosmirrorq.clock's hook)."""
        self.base_dir = Path(base_dir)
        self.data_fs_mb = data_fs_mb
        self.slow_fs = slow_fs
        self.lazy_fs = lazy_fs
        self.mounts_registry = mounts_registry
        self.node_env = node_env
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.base_dir / "cluster.toml"
        # clients reach namespaced nodes from another address: guest must be
        # allowed there unless the caller says otherwise
        if loopback_users is None:
            loopback_users = [] if netns else ["guest"]
        top = "loopback_users = [" + ", ".join(f'"{u}"' for u in loopback_users) + "]\n"
        self.config_path.write_text(top + BASE_CONFIG + config)
        self.extra_args = tuple(extra_args)
        self.nodes: list[ClusterNode] = []
        self.removed: list[ClusterNode] = []
        for i in range(n):
            self.nodes.append(self._new_node(f"n{i + 1}", hosts[i] if hosts else "127.0.0.1",
                                             netns[i] if netns else None))
        for node in self.nodes:
            node.peers = {o.node_id: o.raft_address for o in self.nodes if o is not node}

    def _new_node(self, node_id: str, host: str, netns: str | None) -> ClusterNode:
        node = ClusterNode(node_id, self.base_dir / node_id / "data", host=host, netns=netns,
                           config_path=self.config_path, extra_args=self.extra_args)
        if self.data_fs_mb or self.slow_fs or self.lazy_fs:
            node.datafs = DataFs(node.data_dir, size_mb=self.data_fs_mb, slow=self.slow_fs,
                                 registry=self.mounts_registry, lazy=self.lazy_fs)
        if self.node_env is not None:
            node.env.update(self.node_env(node_id))
        return node

    def unmount_all(self) -> None:
        """Undo every node's data filesystem (after the nodes are stopped)."""
        for n in self.nodes + self.removed:
            if n.datafs is not None:
                n.datafs.unmount()

    # -------------------------------------------------------------- lookup
    def node(self, node_id: str) -> ClusterNode:
        for n in self.nodes + self.removed:
            if n.node_id == node_id:
                return n
        raise KeyError(node_id)

    def node_for(self, ref: str | None) -> ClusterNode | None:
        """A node from a status' leader field (node id, or HOST:RAFTPORT in older builds)."""
        if ref is None:
            return None
        for n in self.nodes + self.removed:
            if ref in (n.node_id, n.raft_address):
                return n
        return None

    def live(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.alive() and not n.paused]

    def statuses(self, nodes: Iterable[ClusterNode] | None = None) -> dict[str, dict[str, Any] | None]:
        return {n.node_id: n.try_status() for n in (nodes if nodes is not None else self.live())}

    # -------------------------------------------------------------- life
    def start(self, timeout: float = 60.0) -> Cluster:
        for n in self.nodes:
            n.start(wait=False)
        try:
            for n in self.nodes:
                n.wait_serving(timeout)
            self.wait_healthy(timeout)
        except BaseException:
            self.dump_logs()
            raise
        return self

    def kill_all(self) -> None:
        for n in self.nodes + self.removed:
            n.kill9()

    def stop_all(self) -> None:
        for n in self.nodes + self.removed:
            n.stop()

    def dump_logs(self, n: int = 30) -> None:
        for node in self.nodes + self.removed:
            sys.stderr.write(f"---- {node.node_id} log tail ----\n{node.tail_log(n)}\n")

    # -------------------------------------------------------------- health
    def leader_view(self, nodes: list[ClusterNode]) -> tuple[ClusterNode | None, str]:
        sts = self.statuses(nodes)
        down = [k for k, v in sts.items() if v is None]
        if down:
            return None, f"admin unreachable on {down}"
        leaders = {self.node_for(st.get("leader")) for st in sts.values() if st}
        if len(leaders) != 1 or None in leaders:
            views = ", ".join(f"{k}: {v.get('leader') if v else None}" for k, v in sts.items())
            return None, f"no agreed leader: {views}"
        leader = leaders.pop()
        assert leader is not None
        lst = sts.get(leader.node_id) or leader.try_status()
        if not lst or lst.get("role") != "leader":
            return None, f"{leader.node_id} is named leader but says {lst and lst.get('role')}"
        return leader, "ok"

    def leader(self, timeout: float = 20.0, among: list[ClusterNode] | None = None) -> ClusterNode:
        """The leader every live node (or `among`) agrees on."""
        why = ["?"]

        def probe() -> ClusterNode | None:
            leader, why[0] = self.leader_view(among if among is not None else self.live())
            return leader
        try:
            return wait_for(probe, timeout=timeout, interval=0.02, what="an agreed leader")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {why[0]}") from None

    def followers(self, timeout: float = 20.0) -> list[ClusterNode]:
        leader = self.leader(timeout)
        return [n for n in self.live() if n is not leader]

    def wait_healthy(self, timeout: float = 30.0, nodes: list[ClusterNode] | None = None) -> ClusterNode:
        """Agreed leader, and every node in `nodes` (default: every cluster member) is a
        member and in the leader's in-sync set. Returns the leader."""
        want = nodes if nodes is not None else self.nodes
        why = ["?"]

        def probe() -> ClusterNode | None:
            for n in want:
                if not n.alive():
                    raise AssertionError(f"{n.node_id} is not running:\n{n.tail_log(15)}")
            leader, why[0] = self.leader_view(want)
            if leader is None:
                return None
            st = leader.try_status()
            if st is None:
                why[0] = "leader status unreachable"
                return None
            ids = {n.node_id for n in want}
            if "members" in st and not ids <= set(st["members"]):
                why[0] = f"members {st['members']} lack {sorted(ids - set(st['members']))}"
                return None
            if "in_sync" in st and not ids <= set(st["in_sync"]):
                why[0] = f"in_sync {st['in_sync']} lacks {sorted(ids - set(st['in_sync']))}"
                return None
            return leader
        try:
            return wait_for(probe, timeout=timeout, interval=0.05, what="a healthy cluster")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {why[0]}") from None

    # -------------------------------------------------------------- membership
    def add_node(self, host: str = "127.0.0.1", netns: str | None = None,
                 timeout: float = 60.0) -> ClusterNode:
        """AddMember through the leader's admin API, then start the node with --join."""
        from node.admin.client import call_add_member
        node_id = f"n{len(self.nodes) + len(self.removed) + 1}"
        node = self._new_node(node_id, host, netns)
        node.peers = {o.node_id: o.raft_address for o in self.nodes}
        leader = self.leader(timeout)
        call_add_member(leader.host, leader.admin_port, node_id, node.raft_address, timeout=timeout,
                        token=leader.admin_token)
        self.nodes.append(node)
        for o in self.nodes:
            if o is not node:
                o.peers[node_id] = node.raft_address  # so a later restart of `o` knows it
        node.start(join=True, wait=True, timeout=timeout)
        return node

    def remove_node(self, node: ClusterNode, timeout: float = 60.0) -> dict[str, Any]:
        """RemoveMember through the leader's admin API (the process keeps running:
        the caller checks that it stops serving)."""
        from node.admin.client import call_remove_member
        leader = self.leader(timeout)
        res = call_remove_member(leader.host, leader.admin_port, node.node_id, timeout=timeout,
                                 token=leader.admin_token)
        self.nodes.remove(node)
        self.removed.append(node)
        for o in self.nodes:
            o.peers.pop(node.node_id, None)
        return res
