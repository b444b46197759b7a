"""Real multi-process mirrorq clusters (tests and chaos experiments): start, SIGKILL, SIGSTOP,
restart, add and remove members, and a confirm-tracking publisher that
survives node loss.

    c = Cluster(tmp_path, n=3).start()     # waits for a leader and every member in sync
    leader = c.leader(); f1, f2 = c.followers()
    leader.kill9(); c.leader(timeout=10)   # a new one among the survivors

Every process started here is registered in _LIVE and SIGKILLed by
Cluster.kill_all() (the `cluster` fixture calls it) and, as a last resort,
at interpreter exit.
"""
from __future__ import annotations

import atexit
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from chaosmirrorq.datafs import DataFs

T = TypeVar("T")


def _repo_root() -> Path:
    """Where `python -m node.app` runs from: the checkout that holds the `node` package."""
    try:
        import node
        return Path(node.__file__).resolve().parent.parent
    except ImportError:  # pragma: no cover - chaos/chaosmirrorq inside a checkout
        return Path(__file__).resolve().parents[2]


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


def confirmed_tags(outstanding: dict[int, Any], confirm: Any) -> list[int]:
    """The publish seqs a basic.ack / basic.nack settles, in order (S05/S14:
    multiple covers every outstanding seq up to its tag)."""
    if confirm.multiple:
        return sorted(t for t in outstanding if t <= confirm.delivery_tag)
    return [confirm.delivery_tag]


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

_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def _kill_leftovers() -> None:
    for pid, proc in list(_LIVE.items()):
        if proc.poll() is None:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _LIVE.pop(pid, None)


atexit.register(_kill_leftovers)


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
        self.config_path = config_path
        self.extra_args = list(extra_args)
        self.env: dict[str, str] = {}  # added to the inherited environment (e.g. MIRRORQ_RAFT_PASSWORD)
        self.peers: dict[str, str] = {}  # the other members: id -> host:raftport
        self.log_path = data_dir.parent / f"{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.datafs: DataFs | None = None  # own tmpfs / FUSE mount of data_dir (chaosmirrorq.datafs)

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
        args = [sys.executable, "-m", "node.app", "serve", "--node-id", self.node_id,
                "--host", self.host,
                "--amqp-port", str(self.amqp_port), "--raft-port", str(self.raft_port),
                "--admin-port", str(self.admin_port), "--metrics-port", str(self.metrics_port),
                "--data-dir", str(self.data_dir)]
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
        if self.datafs is not None:
            self.datafs.mount()  # before the node opens anything in data_dir
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== start {time.strftime('%H:%M:%S')} join={join}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv(join), cwd=str(REPO), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.env} if self.env else None)
        _LIVE[self.proc.pid] = self.proc
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
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        _LIVE.pop(self.proc.pid, None)
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
        _LIVE.pop(self.proc.pid, None)

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
        from node.admin.server import call_status
        return call_status(self.host, self.admin_port, timeout=timeout)

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


class Cluster:
    """N ClusterNodes n1..nN that list each other as peers."""

    def __init__(self, base_dir: Path, n: int = 3, hosts: list[str] | None = None,
                 netns: list[str] | None = None, extra_args: Iterable[str] = (),
                 config: str = "", loopback_users: list[str] | None = None,
                 data_fs_mb: int | None = None, slow_fs: bool = False,
                 mounts_registry: Path | None = None,
                 node_env: Callable[[str], dict[str, str]] | None = None) -> None:
        """Opt-ins for the disk and clock faults: `data_fs_mb` (each data dir on
        its own tmpfs of that size), `slow_fs` (each data dir a FUSE passthrough
        mount with a switchable fsync delay), `mounts_registry` (where the mounts
        are recorded for a clean-up after a crash), `node_env(node_id)` (extra
        environment of that node's process: chaosmirrorq.clock's hook)."""
        self.base_dir = Path(base_dir)
        self.data_fs_mb = data_fs_mb
        self.slow_fs = slow_fs
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
        if self.data_fs_mb or self.slow_fs:
            node.datafs = DataFs(node.data_dir, size_mb=self.data_fs_mb, slow=self.slow_fs,
                                 registry=self.mounts_registry)
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
    def _leader_view(self, nodes: list[ClusterNode]) -> tuple[ClusterNode | None, str]:
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
            leader, why[0] = self._leader_view(among if among is not None else self.live())
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
            leader, why[0] = self._leader_view(want)
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
        from node.admin.server import call_add_member
        node_id = f"n{len(self.nodes) + len(self.removed) + 1}"
        node = self._new_node(node_id, host, netns)
        node.peers = {o.node_id: o.raft_address for o in self.nodes}
        leader = self.leader(timeout)
        call_add_member(leader.host, leader.admin_port, node_id, node.raft_address, timeout=timeout)
        self.nodes.append(node)
        for o in self.nodes:
            if o is not node:
                o.peers[node_id] = node.raft_address  # so a later restart of `o` knows it
        node.start(join=True, wait=True, timeout=timeout)
        return node

    def remove_node(self, node: ClusterNode, timeout: float = 60.0) -> dict[str, Any]:
        """RemoveMember through the leader's admin API (the process keeps running:
        the caller checks that it stops serving)."""
        from node.admin.server import call_remove_member
        leader = self.leader(timeout)
        res = call_remove_member(leader.host, leader.admin_port, node.node_id, timeout=timeout)
        self.nodes.remove(node)
        self.removed.append(node)
        for o in self.nodes:
            o.peers.pop(node.node_id, None)
        return res


# ---------------------------------------------------------------- publisher

FRAME_END = b"\xce"


def _frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + FRAME_END


def body_frames(channel: int, body: bytes, frame_max: int = 131072) -> bytes:
    """`body` as content-body frames of at most `frame_max` bytes each."""
    step = max(1, frame_max - 8)
    if len(body) <= step:
        return _frame(3, channel, body)
    return b"".join(_frame(3, channel, body[i:i + step]) for i in range(0, len(body), step))


# ---------------------------------------------------------------- message bodies
#
# A body is `TAG:ID:CCCCCCCC:` followed by random bytes up to the requested size, where
# CCCCCCCC is the crc32 (8 lowercase hex digits) of everything else: the `TAG:ID:` head
# and the random tail. Real payloads (JSON, protobuf, compressed or encrypted data) do
# not compress; the random tail makes sure the replication path is exercised with bodies
# that zlib cannot shrink. The random bytes may contain b":": parse only the first fields.

POOL_BYTES = 8 * 1024 * 1024  # random bytes bodies are cut from (> a follower's 4 MiB window)
CHECKSUM_LEN = 8


def body_overhead(tag: str, msg_id: int) -> int:
    """Bytes of a body that are not random: `TAG:ID:CCCCCCCC:`."""
    return len(f"{tag}:{msg_id}:") + CHECKSUM_LEN + 1


_POOLS: dict[int | None, bytes] = {}
_POOLS_LOCK = threading.Lock()


def random_pool(seed: int | None = None) -> bytes:
    """POOL_BYTES random bytes (os.urandom; random.Random(seed).randbytes with a seed),
    made once per process and seed."""
    with _POOLS_LOCK:
        pool = _POOLS.get(seed)
        if pool is None:
            pool = os.urandom(POOL_BYTES) if seed is None else random.Random(seed).randbytes(POOL_BYTES)
            _POOLS[seed] = pool
        return pool


def _checksum(head: bytes, tail: bytes | memoryview) -> bytes:
    return b"%08x" % zlib.crc32(tail, zlib.crc32(head))


class RandomBodies:
    """Random checksummed bodies (see above) of `min_size`..`max_size` bytes, cut from a
    shared pool of random bytes: no random-number generation per message, only a slice
    and a crc32. Consecutive bodies take consecutive, non-overlapping slices of the pool
    (from a random start), so nothing repeats within POOL_BYTES of one maker's output.
    Sizes are log-uniform between the bounds (as many 1-2 KiB as 32-64 KiB bodies; mean
    about 15 KiB for 1-64 KiB), from random.Random(seed). Thread-safe."""

    def __init__(self, min_size: int = 1024, max_size: int | None = None,
                 seed: int | str | None = None, pool_seed: int | None = None) -> None:
        self.min_size = max(0, int(min_size))
        self.max_size = max(self.min_size, int(max_size if max_size is not None else min_size))
        self.rng = random.Random(seed)
        self.pool = random_pool(pool_seed)
        self._off = self.rng.randrange(len(self.pool))
        self._lock = threading.Lock()

    def next_size(self) -> int:
        lo, hi = self.min_size, self.max_size
        if hi <= lo or lo <= 0:
            return hi
        with self._lock:
            u = self.rng.random()
        return min(hi, max(lo, int(round(lo * (hi / lo) ** u))))

    def _take(self, n: int) -> bytes:
        pool = self.pool
        n = min(n, len(pool))
        with self._lock:
            off = self._off
            if off + n > len(pool):
                off = 0
            self._off = off + n
        return pool[off:off + n]

    def make(self, tag: str, msg_id: int, size: int | None = None) -> bytes:
        """A body of exactly `size` bytes (default: the next random size), longer only when
        `size` is below the `TAG:ID:CCCCCCCC:` overhead."""
        if size is None:
            size = self.next_size()
        head = f"{tag}:{msg_id}:".encode()
        tail = self._take(max(0, size - len(head) - CHECKSUM_LEN - 1))
        return head + _checksum(head, tail) + b":" + tail


_DEFAULT_BODIES: RandomBodies | None = None


def make_body(tag: str, msg_id: int, size: int = 1024) -> bytes:
    """`TAG:ID:CCCCCCCC:<random bytes>`, exactly `size` bytes when `size` >= the overhead
    (body_overhead); body_id() reads the id back, body_ok() checks the checksum."""
    global _DEFAULT_BODIES
    if _DEFAULT_BODIES is None:
        _DEFAULT_BODIES = RandomBodies()
    return _DEFAULT_BODIES.make(tag, msg_id, size)


def body_id(body: bytes) -> tuple[str, int]:
    """(tag, id) from a body's head. ValueError if it has none."""
    tag, mid, _ = body.split(b":", 2)
    return tag.decode(), int(mid)


def body_ok(body: bytes) -> bool:
    """True when `body` is a make_body() body whose checksum matches its content."""
    i1 = body.find(b":")
    i2 = body.find(b":", i1 + 1) if i1 >= 0 else -1
    if i1 <= 0 or i2 < 0:
        return False
    end = i2 + 1 + CHECKSUM_LEN
    if len(body) < end + 1 or body[end:end + 1] != b":":
        return False
    try:
        int(body[i1 + 1:i2])
    except ValueError:
        return False
    head = body[:i2 + 1]
    return body[i2 + 1:end] == _checksum(head, memoryview(body)[end + 1:])


class ConnLost(Exception):
    pass


class RawConn:
    """A minimal AMQP connection over a socket (pamqp frames), channel 1 only."""

    def __init__(self, host: str, port: int, user: str = "guest", password: str = "guest",
                 timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.blocked = False
        self.blocked_reason = ""
        self.close_reason: str | None = None
        self.timeout = timeout
        self.send(b"AMQP\x00\x00\x09\x01")
        self.expect(spec.Connection.Start)
        self.send_method(spec.Connection.StartOk(
            client_properties={"product": "mirrorq-cluster-tests",
                               "capabilities": {"publisher_confirms": True, "basic.nack": True,
                                                "connection.blocked": True,
                                                "consumer_cancel_notify": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"), 0)
        _, tune = self.expect(spec.Connection.Tune)
        self.frame_max = tune.frame_max or 131072
        self.send_method(spec.Connection.TuneOk(channel_max=tune.channel_max or 2047,
                                                frame_max=self.frame_max, heartbeat=0), 0)
        self.send_method(spec.Connection.Open(virtual_host="/"), 0)
        self.expect(spec.Connection.OpenOk)
        self.send_method(spec.Channel.Open(), 1)
        self.expect(spec.Channel.OpenOk)

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ConnLost(f"send: {exc!r}") from exc

    def send_method(self, method: Any, channel: int = 1) -> None:
        self.send(pframe.marshal(method, channel))

    def fill(self, timeout: float) -> bool:
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not r:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except OSError as exc:
            raise ConnLost(f"recv: {exc!r}") from exc
        if not data:
            raise ConnLost(self.close_reason or "EOF")
        self.buf += data
        return True

    def frames(self) -> list[tuple[int, Any]]:
        out = []
        while len(self.buf) >= 8:
            size = struct.unpack_from(">I", self.buf, 3)[0]
            end = 8 + size
            if len(self.buf) < end:
                break
            _n, ch, value = pframe.unmarshal(bytes(self.buf[:end]))
            del self.buf[:end]
            if isinstance(value, spec.Connection.Blocked):
                self.blocked = True
                self.blocked_reason = value.reason
            elif isinstance(value, spec.Connection.Unblocked):
                self.blocked = False
            elif isinstance(value, spec.Connection.Close):
                self.close_reason = f"connection.close {value.reply_code} {value.reply_text}"
                try:
                    self.send_method(spec.Connection.CloseOk(), 0)
                except ConnLost:
                    pass
                raise ConnLost(self.close_reason)
            elif isinstance(value, spec.Channel.Close):
                self.close_reason = f"channel.close {value.reply_code} {value.reply_text}"
                raise ConnLost(self.close_reason)
            out.append((ch, value))
        return out

    def expect(self, cls: type, timeout: float | None = None) -> tuple[int, Any]:
        deadline = time.monotonic() + (timeout or self.timeout)
        pending: list[tuple[int, Any]] = []
        while True:
            for ch, v in self.frames():
                if isinstance(v, cls):
                    return ch, v
                pending.append((ch, v))
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnLost(f"no {cls.__name__} within timeout (got {pending[-3:]!r})")
            self.fill(left)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class StreamPublisher(threading.Thread):
    """Publishes persistent messages with streaming confirms to `queue`, tracking each
    message id by delivery seq. Bodies are random and checksummed (RandomBodies,
    make_body's format): `size` bytes (default 1 KiB), or with `max_size` log-uniform
    sizes between `size` and `max_size` (`seed` for the sizes). Nacked ids and ids outstanding
    when a connection dies (uncertain) are republished, on another node if
    ours is gone. Stops after `total` ids are confirmed, or (total=None) when
    stop() is called and what is outstanding has settled."""

    def __init__(self, tag: str, queue: str, nodes: Callable[[], list[Any]], total: int | None,
                 window: int = 200, size: int = 1024, persistent: bool = True,
                 stall_timeout: float = 20.0, deadline: float = 240.0,
                 max_size: int | None = None, seed: int | str | None = None) -> None:
        super().__init__(name=f"publisher-{tag}", daemon=True)
        self.tag = tag
        self.queue = queue
        self.nodes = nodes  # candidates, preferred first; called at each (re)connect
        self.total = total
        self.window = window
        self.size = size
        self.bodies = RandomBodies(size, max_size, seed=seed)
        self.body_bytes = 0  # bytes of bodies sent (republishes included)
        self.persistent = persistent
        self.stall_timeout = stall_timeout
        self.deadline = time.monotonic() + deadline
        self.confirmed: set[int] = set()
        self.confirm_times: list[float] = []  # monotonic time of each ack frame's effect
        self.nacked = 0
        self.uncertain = 0
        self.republished = 0
        self.reconnects: list[tuple[float, str, str]] = []  # (time, node, reason)
        self.connected_to: str | None = None
        self.error: str | None = None
        self.events: list[str] = []
        self._next_id = 0
        self._retry: list[int] = []
        self._stop_ev = threading.Event()
        self._abandon_ev = threading.Event()
        self._lock = threading.Lock()

    # -- control
    def stop(self) -> None:
        """Publish nothing new; finish once what is outstanding has settled."""
        self._stop_ev.set()

    def abandon(self) -> None:
        """Give up now (e.g. every node is dead): outstanding ids stay unconfirmed."""
        self._abandon_ev.set()
        self._stop_ev.set()

    def progress_since(self, t: float) -> int:
        with self._lock:
            return sum(1 for x in self.confirm_times if x >= t)

    def finish(self, timeout: float = 120.0) -> None:
        self.stop()
        self.join(timeout)
        assert not self.is_alive(), f"publisher {self.tag} did not finish within {timeout}s: {self.summary()}"

    def summary(self) -> str:
        return (f"{self.tag}: confirmed={len(self.confirmed)} nacked={self.nacked} "
                f"uncertain={self.uncertain} republished={self.republished} "
                f"reconnects={[(round(t, 2), n, r) for t, n, r in self.reconnects]} error={self.error}")

    # -- work
    def _take_id(self) -> int | None:
        if self._retry:
            self.republished += 1
            return self._retry.pop(0)
        if self._stop_ev.is_set():
            return None
        if self.total is not None and self._next_id >= self.total:
            return None
        self._next_id += 1
        return self._next_id

    def _connect(self) -> tuple[RawConn, Any]:
        last = "no candidate node"
        while time.monotonic() < self.deadline:
            for node in self.nodes():
                try:
                    conn = RawConn(node.host, node.amqp_port, node.user, node.password,
                                   timeout=5.0)
                    conn.send_method(spec.Confirm.Select(), 1)
                    conn.expect(spec.Confirm.SelectOk)
                    return conn, node
                except (OSError, ConnLost) as exc:
                    last = f"{node.node_id}: {exc}"
            if self._abandon_ev.is_set():
                raise ConnLost(f"abandoned while disconnected ({last})")
            time.sleep(0.1)
        raise ConnLost(f"cannot connect anywhere before the deadline: {last}")

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported through .error
            self.error = f"{type(exc).__name__}: {exc}"

    def _done(self, outstanding: dict[int, int]) -> bool:
        if outstanding or self._retry:
            return False
        if self.total is not None:
            return len(self.confirmed) >= self.total
        return self._stop_ev.is_set()

    def _run(self) -> None:
        props = spec.Basic.Properties(delivery_mode=2 if self.persistent else 1)
        method = pframe.marshal(spec.Basic.Publish(exchange="", routing_key=self.queue), 1)
        headers: dict[int, bytes] = {}  # body size -> marshalled content header
        while time.monotonic() < self.deadline:
            try:
                conn, node = self._connect()
            except ConnLost as exc:
                if not self._abandon_ev.is_set():
                    self.error = str(exc)
                return
            self.connected_to = node.node_id
            seq = 0
            outstanding: dict[int, int] = {}  # seq -> id
            last_progress = time.monotonic()
            try:
                while True:
                    if self._done(outstanding) or self._abandon_ev.is_set():
                        conn.close()
                        return
                    if time.monotonic() > self.deadline:
                        raise ConnLost("deadline")
                    out = bytearray()
                    while not conn.blocked and len(outstanding) < self.window:
                        mid = self._take_id()
                        if mid is None:
                            break
                        body = self.bodies.make(self.tag, mid)
                        header = headers.get(len(body))
                        if header is None:
                            header = headers[len(body)] = pframe.marshal(
                                pheader.ContentHeader(0, len(body), props), 1)
                        seq += 1
                        outstanding[seq] = mid
                        self.body_bytes += len(body)
                        out += method + header + body_frames(1, body, conn.frame_max)
                        if len(out) > 64 * 1024:
                            conn.send(bytes(out))
                            out.clear()
                    if out:
                        conn.send(bytes(out))
                    if conn.fill(0.2):
                        now = time.monotonic()
                        for _ch, v in conn.frames():
                            if isinstance(v, spec.Basic.Ack | spec.Basic.Nack):
                                tags = confirmed_tags(outstanding, v)
                                for t in tags:
                                    mid = outstanding.pop(t, None)
                                    if mid is None:
                                        continue
                                    if isinstance(v, spec.Basic.Ack):
                                        self.confirmed.add(mid)
                                        with self._lock:
                                            self.confirm_times.append(now)
                                    else:
                                        self.nacked += 1
                                        self._retry.append(mid)
                                last_progress = now
                    if outstanding and time.monotonic() - last_progress > self.stall_timeout:
                        raise ConnLost(f"no confirm for {self.stall_timeout}s "
                                       f"(blocked={conn.blocked})")
                    if not outstanding:
                        last_progress = time.monotonic()
            except ConnLost as exc:
                conn.close()
                self.reconnects.append((time.monotonic(), node.node_id, str(exc)))
                self.uncertain += len(outstanding)
                self._retry[:0] = sorted(outstanding.values())
        self.error = f"deadline passed: {self.summary()}"


# ---------------------------------------------------------------- consuming

def drain(node: ClusterNode, queue: str, idle: float = 3.0, timeout: float = 120.0,
          prefetch: int = 500) -> list[tuple[bytes, bool]]:
    """Consume (manual ack) until the queue is empty and nothing arrived for `idle`
    seconds: [(body, redelivered)]."""
    import pika
    params = pika.ConnectionParameters(host=node.host, port=node.amqp_port, heartbeat=0,
                                       socket_timeout=10, blocked_connection_timeout=60,
                                       connection_attempts=3, retry_delay=0.5,
                                       credentials=pika.PlainCredentials(node.user, node.password))
    conn = pika.BlockingConnection(params)
    out: list[tuple[bytes, bool]] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        last = {"t": time.monotonic(), "tag": 0, "unacked": 0}

        def on_msg(chan: Any, method: Any, _props: Any, body: bytes) -> None:
            out.append((body, bool(method.redelivered)))
            last["t"] = time.monotonic()
            last["tag"] = method.delivery_tag
            last["unacked"] += 1
            if last["unacked"] >= prefetch // 4:
                chan.basic_ack(method.delivery_tag, multiple=True)
                last["unacked"] = 0

        ch.basic_consume(queue, on_msg, auto_ack=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
            if last["unacked"]:
                ch.basic_ack(last["tag"], multiple=True)
                last["unacked"] = 0
            if time.monotonic() - last["t"] > idle:
                probe = conn.channel()
                ready = probe.queue_declare(queue, passive=True).method.message_count
                probe.close()
                if ready == 0:
                    break
                last["t"] = time.monotonic()
        else:
            raise AssertionError(f"drain of {queue} on {node.node_id} did not finish in {timeout}s "
                                 f"({len(out)} received)")
        ch.close()
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
    return out


def declare(node: ClusterNode, *queues: str, durable: bool = True,
            arguments: dict[str, Any] | None = None) -> None:
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=node.host, port=node.amqp_port, heartbeat=0, socket_timeout=10,
        credentials=pika.PlainCredentials(node.user, node.password)))
    try:
        ch = conn.channel()
        for q in queues:
            ch.queue_declare(q, durable=durable, arguments=arguments)
    finally:
        conn.close()


def uniq_queue(prefix: str = "cq") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def check_delivered(confirmed: dict[str, set[int]], got: list[tuple[bytes, bool]]) -> dict[str, Any]:
    """Compare confirmed ids per publisher tag with what was delivered."""
    seen: dict[str, dict[int, int]] = {}
    for body, _red in got:
        tag, mid = body_id(body)
        seen.setdefault(tag, {})
        seen[tag][mid] = seen[tag].get(mid, 0) + 1
    lost = {tag: sorted(ids - set(seen.get(tag, {}))) for tag, ids in confirmed.items()}
    dups = sum(c - 1 for per in seen.values() for c in per.values() if c > 1)
    return {"lost": {t: v for t, v in lost.items() if v},
            "lost_count": sum(len(v) for v in lost.values()),
            "duplicates": dups,
            "delivered": len(got)}


def pika_conn(node: ClusterNode, **kw: Any) -> Any:
    import pika
    kw.setdefault("heartbeat", 0)
    kw.setdefault("socket_timeout", 10)
    kw.setdefault("blocked_connection_timeout", 60)
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=node.host, port=node.amqp_port,
        credentials=pika.PlainCredentials(node.user, node.password), **kw))


def pump(conn: Any, cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Let pika dispatch callbacks until `cond()` holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        conn.process_data_events(time_limit=0.05)


def new_leader_time(cluster: Cluster, survivors: list[ClusterNode], since: float,
                    timeout: float = 30.0) -> tuple[ClusterNode, float]:
    """Poll the survivors' admin Status until they agree on a leader among themselves:
    (leader, seconds since `since`)."""
    ids = {n.node_id for n in survivors}

    def probe() -> ClusterNode | None:
        leader, _why = cluster._leader_view(survivors)
        return leader if leader is not None and leader.node_id in ids else None
    leader = wait_for(probe, timeout=timeout, interval=0.02, what="a new leader among the survivors")
    return leader, time.monotonic() - since
