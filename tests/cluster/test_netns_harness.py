"""The namespace harness itself (tests/netns.py): reachability, partition, heal, isolate, clean-up."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from harness.process import wait_for
from tests.netns import NetLab, require_netns

PORT = 7450

LISTENER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"ok")
    c.close()
"""

CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        c.settimeout(float(sys.argv[3]))
        sys.exit(0 if c.recv(2) == b"ok" else 3)
except OSError:
    sys.exit(1)
"""


@pytest.fixture
def lab():
    require_netns()
    with NetLab(3) as lab:
        yield lab


def from_root(addr: str, timeout: float = 1.5) -> bool:
    try:
        with socket.create_connection((addr, PORT), timeout=timeout) as c:
            c.settimeout(timeout)
            return c.recv(2) == b"ok"
    except OSError:
        return False


def from_ns(lab: NetLab, src: int, addr: str, timeout: float = 1.5) -> bool:
    res = lab.run_in(src, sys.executable, "-c", CONNECT, addr, str(PORT), str(timeout),
                     check=False, timeout=timeout + 10)
    return res.returncode == 0


def start_listener(lab: NetLab, i: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(lab.exec_argv(i, [sys.executable, "-c", LISTENER, lab.addr(i), str(PORT)]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "listening", line
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_namespaces_reach_each_other_and_partition_cuts_and_heals(lab: NetLab) -> None:
    listeners = [start_listener(lab, i) for i in range(3)]
    try:
        # every node listens on the same port on its own address
        for i in range(3):
            assert from_root(lab.addr(i)), f"root namespace cannot reach node {i}"
            for j in range(3):
                if i != j:
                    assert from_ns(lab, j, lab.addr(i)), f"node {j} cannot reach node {i}"

        lab.partition(0, [1, 2])
        assert "-A INPUT -s" in lab.rules(0)
        assert not from_ns(lab, 1, lab.addr(0)), "partition did not cut 1 -> 0"
        assert not from_ns(lab, 0, lab.addr(2)), "partition did not cut 0 -> 2"
        assert from_ns(lab, 1, lab.addr(2)), "the majority side must stay connected"
        assert from_root(lab.addr(0)), "clients in the root namespace must still reach node 0"

        lab.heal(0)
        assert "DROP" not in lab.rules(0)
        assert from_ns(lab, 1, lab.addr(0)), "heal did not restore 1 -> 0"
        assert from_ns(lab, 0, lab.addr(2)), "heal did not restore 0 -> 2"

        lab.partition_groups([0, 1], [2])
        assert from_ns(lab, 0, lab.addr(1))
        assert not from_ns(lab, 2, lab.addr(0))
        assert not from_ns(lab, 1, lab.addr(2))
        lab.heal()
        assert from_ns(lab, 2, lab.addr(0))

        lab.isolate(1)
        assert not from_root(lab.addr(1)), "isolated node still reachable from the root namespace"
        assert not from_ns(lab, 0, lab.addr(1))
        lab.unisolate(1)
        deadline = time.monotonic() + 5
        while not from_root(lab.addr(1)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert from_root(lab.addr(1)), "unisolate did not restore reachability"
        assert from_ns(lab, 2, lab.addr(1))
    finally:
        for p in listeners:
            stop(p)


def test_teardown_removes_everything_even_after_an_error() -> None:
    require_netns()
    names: list[str] = []
    links: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []
    with pytest.raises(RuntimeError, match="boom"):
        with NetLab(2) as lab:
            names = [n.ns for n in lab.nodes]
            links = [n.veth for n in lab.nodes] + [lab.bridge]
            # a process left running inside a namespace is killed by the teardown
            procs.append(subprocess.Popen(lab.exec_argv(0, ["sleep", "300"])))
            # raise only once it is inside the namespace: before its setns the
            # teardown cannot see it, deletes the namespace, and `ip netns exec`
            # then fails by itself (exit 1/255, not -9): a race, not the harness
            pid = str(procs[0].pid)
            wait_for(lambda: pid in subprocess.run(["ip", "netns", "pids", names[0]], capture_output=True,
                                                   text=True).stdout.split(), timeout=10)
            raise RuntimeError("boom")
    assert procs[0].wait(timeout=10) == -9
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for ns in names:
        assert ns not in listed
    for link in links:
        assert subprocess.run(["ip", "link", "show", link], capture_output=True).returncode != 0
