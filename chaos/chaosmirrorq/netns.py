"""Network namespaces for partition tests on one machine (needs root and `ip netns`).

    with NetLab(3) as lab:                 # 3 namespaces + a bridge in the root namespace
        lab.nodes[0].addr                  # "10.213.X.10": node 0 listens here
        lab.exec_argv(0, [sys.executable, "-m", "node.app", ...])   # run inside node 0's namespace
        lab.partition(0, [1, 2])           # node 0 drops every packet from/to nodes 1 and 2
        lab.heal(0)                        # flush node 0's rules
        lab.isolate(2)                     # node 2's veth down: nobody reaches it, clients neither
        lab.unisolate(2)
        lab.partition_one_way(0, 1)        # node 0 hears node 1, node 1 does not hear node 0
        lab.partition_pair(0, 2)           # 0 and 2 cannot reach each other, both reach 1 (bridge)
        lab.delay(1, 100, 20)              # tc netem delay 100ms 20ms on both ends of node 1's veth
        lab.lose(1, 10)                    # 10 % of the packets node 1 sends are dropped
        lab.clear_qdiscs()                 # remove every netem qdisc (heal() flushes the rules)

Layout: a bridge `mqb<suffix>` in the root namespace carries 10.213.X.0/24 (X picked at
random among the /24s no local route uses); the bridge holds 10.213.X.1, so clients in the
root namespace reach every node directly; node i lives in namespace `mqn<suffix>-<i>`
with `eth0` = 10.213.X.(10+i) (the other end of veth `mqv<suffix><i>`, a bridge port)
and `lo` up. A partition is a pair of iptables DROP rules inside the node's own namespace
(INPUT from the peer, OUTPUT to the peer), so traffic from the bridge address (the
clients) still passes. Everything is removed in `close()` / on leaving the `with`, even
when setting up failed half way; processes still running inside a namespace at that
point are SIGKILLed by pid (they can only have been started through this lab).

Only addresses of this subnet are ever used; nothing leaves the machine.

`require_netns()` skips the calling test when not root or `ip netns` is unusable.
The Debian package `iptables` is needed for partition(); if it is missing,
`ensure_iptables()` installs it (apt-get) once.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

SUBNET_PREFIX = "10.213"
IPTABLES_APT_PACKAGES = ("iptables",)  # Debian 12: iptables (nft backend) pulls libnftables etc.


class NetnsError(RuntimeError):
    pass


def _run(*argv: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"mqprobe{uuid.uuid4().hex[:6]}"
    try:
        res = _run("ip", "netns", "add", probe, check=False)
        if res.returncode != 0:
            return f"`ip netns add` does not work here: {res.stderr.strip()}"
        res = _run("ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up", check=False)
        if res.returncode != 0:
            return f"`ip netns exec` does not work here: {res.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def require_netns() -> None:
    """pytest.skip the caller when not root or `ip netns` is unavailable."""
    reason = netns_unavailable_reason()
    if reason is not None:
        import pytest
        pytest.skip(reason)


_iptables_checked = False


def ensure_iptables() -> str:
    """Path of iptables, installing the Debian package if it is missing."""
    global _iptables_checked
    path = shutil.which("iptables")
    if path is None and not _iptables_checked:
        _iptables_checked = True
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-qq", *IPTABLES_APT_PACKAGES],
                       capture_output=True, env=env, timeout=600)
        path = shutil.which("iptables")
    if path is None:
        raise NetnsError("iptables is not installed (apt-get install -y iptables)")
    return path


_netem_reason: list[str | None] = []


def netem_unavailable_reason() -> str | None:
    """Why `tc qdisc ... netem` cannot be used here (probed once in a scratch
    namespace), or None when it can."""
    if _netem_reason:
        return _netem_reason[0]
    reason = netns_unavailable_reason()
    if reason is None and shutil.which("tc") is None:
        reason = "`tc` (iproute2) is not installed"
    if reason is None:
        probe = f"mqprobe{uuid.uuid4().hex[:6]}"
        try:
            _run("ip", "netns", "add", probe)
            _run("ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up")
            res = _run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                       "netem", "delay", "1ms", check=False)
            if res.returncode != 0:
                reason = (f"the kernel has no sch_netem qdisc (kernel {os.uname().release}: "
                          f"`tc qdisc add dev lo root netem delay 1ms` -> {res.stderr.strip()})")
        except NetnsError as exc:
            reason = str(exc)
        finally:
            _run("ip", "netns", "del", probe, check=False)
    _netem_reason.append(reason)
    return reason


def _pick_subnet() -> ipaddress.IPv4Network:
    """A random 10.213.X.0/24 that no address or route of the root namespace overlaps."""
    used = _run("ip", "-4", "route", "show", "table", "all", check=False).stdout \
        + _run("ip", "-4", "addr", "show", check=False).stdout
    free = [x for x in range(1, 255) if f"{SUBNET_PREFIX}.{x}." not in used]
    if not free:
        raise NetnsError(f"no free {SUBNET_PREFIX}.X.0/24 subnet")
    x = free[int.from_bytes(os.urandom(2), "big") % len(free)]
    return ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{x}.0/24")


@dataclass
class NsNode:
    index: int
    ns: str          # namespace name
    veth: str        # root-namespace end of the veth pair (a bridge port)
    addr: str        # the node's address inside its namespace (eth0)



class NetLab:
    """N namespaces on a private bridge. Use as a context manager (or call close())."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("need at least one namespace")
        self.n = n
        self.suffix = uuid.uuid4().hex[:6]
        self.bridge = f"mqb{self.suffix}"
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge_addr = ""
        self.nodes: list[NsNode] = []
        self._created_ns: list[str] = []
        self._created_links: list[str] = []
        self._closed = False

    # ------------------------------------------------------------- life
    def __enter__(self) -> NetLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _build(self) -> None:
        self.subnet = _pick_subnet()
        hosts = list(self.subnet.hosts())
        self.bridge_addr = str(hosts[0])  # .1
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._created_links.append(self.bridge)
        _run("ip", "addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            ns = f"mqn{self.suffix}-{i}"
            veth = f"mqv{self.suffix}{i}"
            peer = f"mqp{self.suffix}{i}"
            addr = str(hosts[9 + i])  # .10, .11, ...
            _run("ip", "netns", "add", ns)
            self._created_ns.append(ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            self._created_links.append(veth)
            _run("ip", "link", "set", peer, "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            nsx = ("ip", "netns", "exec", ns)
            _run(*nsx, "ip", "link", "set", "lo", "up")
            _run(*nsx, "ip", "link", "set", peer, "name", "eth0")
            _run(*nsx, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
            _run(*nsx, "ip", "link", "set", "eth0", "up")
            self.nodes.append(NsNode(i, ns, veth, addr))

    def close(self) -> None:
        """Kill what still runs inside the namespaces (by pid), delete namespaces, veths, bridge."""
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for ns in self._created_ns:
            res = _run("ip", "netns", "pids", ns, check=False)
            for tok in res.stdout.split():
                if tok.isdigit():
                    try:
                        os.kill(int(tok), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for ns in self._created_ns:
            res = _run("ip", "netns", "del", ns, check=False)
            if res.returncode != 0:
                errors.append(f"netns del {ns}: {res.stderr.strip()}")
        for link in reversed(self._created_links):  # veths first, bridge last
            res = _run("ip", "link", "del", link, check=False)
            # deleting a namespace removes its veth pair asynchronously: gone is fine
            if res.returncode != 0 and "Cannot find device" not in res.stderr:
                errors.append(f"link del {link}: {res.stderr.strip()}")
        if errors:
            raise NetnsError("; ".join(errors))

    # ------------------------------------------------------------ access
    def node(self, ref: int | NsNode | str) -> NsNode:
        if isinstance(ref, NsNode):
            return ref
        if isinstance(ref, int):
            return self.nodes[ref]
        for nd in self.nodes:
            if ref in (nd.ns, nd.addr):
                return nd
        raise KeyError(ref)

    def addr(self, ref: int | NsNode | str) -> str:
        return self.node(ref).addr

    def ns(self, ref: int | NsNode | str) -> str:
        return self.node(ref).ns

    def exec_argv(self, ref: int | NsNode | str, argv: list[str]) -> list[str]:
        """argv wrapped so that it runs inside the node's namespace."""
        return ["ip", "netns", "exec", self.ns(ref), *argv]

    def run_in(self, ref: int | NsNode | str, *argv: str, check: bool = True,
               timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        return _run(*self.exec_argv(ref, list(argv)), check=check, timeout=timeout)

    # ------------------------------------------------------------ faults
    def partition(self, ref: int | NsNode | str, from_nodes: list[int | NsNode | str]) -> None:
        """Inside `ref`'s namespace drop every packet from and to each of `from_nodes`.

        The link is cut in both directions at one end; the bridge address (clients in
        the root namespace) keeps reaching the node."""
        iptables = ensure_iptables()
        me = self.node(ref)
        for other in from_nodes:
            peer = self.node(other)
            if peer.index == me.index:
                continue
            self.run_in(me, iptables, "-w", "-A", "INPUT", "-s", peer.addr, "-j", "DROP")
            self.run_in(me, iptables, "-w", "-A", "OUTPUT", "-d", peer.addr, "-j", "DROP")

    def partition_groups(self, *groups: list[int]) -> None:
        """Cut every link between different groups, e.g. partition_groups([0], [1, 2])."""
        for gi, group in enumerate(groups):
            others = [o for gj, g in enumerate(groups) if gj != gi for o in g]
            for ref in group:
                self.partition(ref, list(others))

    def partition_pair(self, a: int | NsNode | str, b: int | NsNode | str) -> None:
        """Cut the link between `a` and `b` only (DROP rules inside both namespaces);
        each keeps reaching every other node. Two pairs cut around one node B make
        Jepsen's bridge: A and C see B but not each other. Undone by heal() (of both,
        or of every node)."""
        na, nb = self.node(a), self.node(b)
        if na.index == nb.index:
            raise ValueError("a pairwise partition needs two different nodes")
        self.partition(na, [nb])
        self.partition(nb, [na])

    def heal(self, ref: int | NsNode | str | None = None) -> None:
        """Flush the DROP rules of one node (or of every node when ref is None)."""
        targets = self.nodes if ref is None else [self.node(ref)]
        if shutil.which("iptables") is None:
            return  # nothing can have been partitioned
        for nd in targets:
            self.run_in(nd, "iptables", "-w", "-F", "INPUT")
            self.run_in(nd, "iptables", "-w", "-F", "OUTPUT")

    def rules(self, ref: int | NsNode | str) -> str:
        return self.run_in(ref, "iptables", "-w", "-S").stdout

    def partition_one_way(self, hears: int | NsNode | str, deaf: int | NsNode | str) -> None:
        """`hears` keeps receiving from `deaf`; `deaf` drops (iptables INPUT, in its own
        namespace) every packet from `hears`. Undone by heal(deaf)."""
        iptables = ensure_iptables()
        a, b = self.node(hears), self.node(deaf)
        if a.index == b.index:
            raise ValueError("a one-way partition needs two different nodes")
        self.run_in(b, iptables, "-w", "-A", "INPUT", "-s", a.addr, "-j", "DROP")

    def _netem(self, nd: NsNode, args: list[str], both_ends: bool) -> None:
        reason = netem_unavailable_reason()
        if reason is not None:
            raise NetnsError(f"tc netem is unavailable: {reason}")
        # node -> bridge: eth0 inside the namespace; bridge -> node: the veth's root end
        self.run_in(nd, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *args)
        if both_ends:
            _run("tc", "qdisc", "replace", "dev", nd.veth, "root", "netem", *args)

    def delay(self, ref: int | NsNode | str, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """netem delay on both ends of the node's veth: each packet to or from the node
        waits delay_ms (+- jitter_ms); a round trip through it gains about 2*delay_ms.
        Raises NetnsError when the kernel has no sch_netem. Undone by clear_qdiscs()."""
        if float(delay_ms) < 0 or float(jitter_ms) < 0:
            raise ValueError("delay_ms and jitter_ms must be >= 0")
        args = ["delay", f"{float(delay_ms):g}ms"]
        if float(jitter_ms) > 0:
            args.append(f"{float(jitter_ms):g}ms")
        self._netem(self.node(ref), args, both_ends=True)

    def lose(self, ref: int | NsNode | str, percent: float) -> str:
        """Lose `percent` % of the node's packets in one direction (peers and clients
        alike), so a request/response round trip through it is lost with about that
        probability: netem loss on its eth0 (what it sends) where the kernel has
        sch_netem, else an iptables `statistic --mode random` DROP on its INPUT (what it
        receives; a DROP in OUTPUT would hand the local sender EPERM instead of a
        silent loss). Returns "netem" or "iptables". Undone by clear_qdiscs() + heal()."""
        pct = float(percent)
        if not 0 <= pct <= 100:
            raise ValueError(f"percent must be within 0..100, not {percent}")
        nd = self.node(ref)
        if netem_unavailable_reason() is None:
            self._netem(nd, ["loss", f"{pct:g}%"], both_ends=False)
            return "netem"
        iptables = ensure_iptables()
        self.run_in(nd, iptables, "-w", "-A", "INPUT", "-m", "statistic", "--mode", "random",
                    "--probability", f"{pct / 100:.6f}", "-j", "DROP")
        return "iptables"

    def clear_qdiscs(self, ref: int | NsNode | str | None = None) -> None:
        """Remove the netem qdiscs of one node (every node when ref is None); a device
        without one is fine."""
        if shutil.which("tc") is None:
            return
        targets = self.nodes if ref is None else [self.node(ref)]
        for nd in targets:
            for argv in (self.exec_argv(nd, ["tc", "qdisc", "del", "dev", "eth0", "root"]),
                         ["tc", "qdisc", "del", "dev", nd.veth, "root"]):
                res = _run(*argv, check=False)
                err = res.stderr
                if res.returncode != 0 and not any(
                        s in err for s in ("handle of zero", "No such file", "Cannot find device",
                                           "Invalid handle", "not exist")):
                    raise NetnsError(f"{' '.join(argv)} failed: {err.strip()}")

    def qdiscs(self, ref: int | NsNode | str) -> str:
        """`tc qdisc show` of the node's eth0 and of the veth's root end."""
        nd = self.node(ref)
        inner = self.run_in(nd, "tc", "qdisc", "show", "dev", "eth0", check=False).stdout
        outer = _run("tc", "qdisc", "show", "dev", nd.veth, check=False).stdout
        return inner + outer

    def isolate(self, ref: int | NsNode | str) -> None:
        """Take the node's veth down: it reaches nobody and nobody (clients included) reaches it."""
        _run("ip", "link", "set", self.node(ref).veth, "down")

    def unisolate(self, ref: int | NsNode | str) -> None:
        _run("ip", "link", "set", self.node(ref).veth, "up")
