"""Login throttling decided at login time and shared by AMQP and HTTP basic
auth; max_connections counting opened connections, with bounded sockets in
the handshake (issue 26, item 7 and part of item 12). Real node processes,
raw sockets (bound to other loopback addresses to play other clients).

Before: the throttle was asked at accept, so 60 sockets opened first were
all allowed 59 wrong passwords at once and then the right one; HTTP basic
auth had no limit (~5,800 guesses/s); 15 idle sockets filled
max_connections = 5 and a real client got 530."""
from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from harness.amqp import IO_TIMEOUT, Address, RawClient
from tests.broker_proc import NodeProcess, start_http_node, wait_for

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")), reason="mirrorq's own limits")


class Client(RawClient):
    """A RawClient whose socket is bound to `source` (another loopback address is
    another client address to the node)."""

    def __init__(self, node: NodeProcess, source: str = "127.0.0.1", header: bool = True) -> None:
        self.broker = Address("127.0.0.1", node.amqp_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind((source, 0))
        self.sock.settimeout(IO_TIMEOUT)
        self.sock.connect(("127.0.0.1", node.amqp_port))
        self._init_state(IO_TIMEOUT)
        if header:
            self.send(pframe.marshal(pheader.ProtocolHeader(), 0))
            self.expect(spec.Connection.Start)

    def login(self, password: str, timeout: float = 30.0,
              user: str = "guest") -> tuple[float, object]:
        """Start-ok as `user`; how long the answer took and the answer."""
        t0 = time.monotonic()
        self.send_frame(spec.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))
        _, answer = self.read_frame(timeout)
        return time.monotonic() - t0, answer

    def open(self) -> None:
        """After a Tune: finish the handshake."""
        self.send_frame(spec.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
        self.send_frame(spec.Connection.Open(virtual_host="/"))
        self.expect(spec.Connection.OpenOk)


def refused_unchecked(answer: object) -> bool:
    return isinstance(answer, spec.Connection.Close) and "too many login attempts" in answer.reply_text


def login_failed(answer: object) -> bool:
    return isinstance(answer, spec.Connection.Close) and answer.reply_code == 403 \
        and "Login was refused" in answer.reply_text


def closed_by_node(s: socket.socket, timeout: float) -> bool:
    """The node closed the socket within `timeout` (EOF or reset; frames before are read)."""
    deadline = time.monotonic() + timeout
    while True:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not s.recv(65536):
                return True
        except ConnectionError:
            return True
        except TimeoutError:
            return False


@pytest.fixture()
def node_factory(tmp_path: Path) -> Iterator[list[NodeProcess]]:
    nodes: list[NodeProcess] = []
    yield nodes
    for n in nodes:
        n.kill9()


def amqp_node(tmp_path: Path, nodes: list[NodeProcess], config: str) -> NodeProcess:
    n = NodeProcess(tmp_path / "n1", config=config)
    nodes.append(n)
    n.start()
    return n


def http_node(tmp_path: Path, nodes: list[NodeProcess], config: str) -> NodeProcess:
    n = start_http_node(tmp_path / "n1", config=config)
    nodes.append(n)
    return n


# ------------------------------------------------------------------ HTTP helpers

def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Http:
    """One keep-alive HTTP/1.1 connection from `source`."""

    def __init__(self, node: NodeProcess, source: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((source, 0))
        self.sock.settimeout(60)
        self.sock.connect(("127.0.0.1", node.http_port))  # type: ignore[attr-defined]
        self.f = self.sock.makefile("rb")

    def get(self, authorization: str, path: str = "/api/whoami") -> int:
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\n"
                          "\r\n".encode())
        status = int(self.f.readline().split()[1])
        length = 0
        while True:
            line = self.f.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        self.f.read(length)
        return status

    def timed(self, authorization: str) -> tuple[float, int]:
        t0 = time.monotonic()
        status = self.get(authorization)
        return time.monotonic() - t0, status

    def close(self) -> None:
        self.f.close()
        self.sock.close()


GUEST, WRONG = basic("guest", "guest"), basic("guest", "wrong")


# ------------------------------------------------------------------ tests

@pytest.mark.slow  # waits out the throttle: make test runs it, make test-fast does not
def test_opening_connections_first_does_not_bypass_the_throttle(
        tmp_path: Path, node_factory: list[NodeProcess]) -> None:
    """60 sockets opened first, then wrong passwords on them one by one: after
    5 free failures each answer is held longer (0.1, 0.2, then 0.4 s each), so 25
    guesses past the limit take >= 9 s (old code: all answered at once, then the
    right password in); the right password still gets in, after its delay;
    guessing on many sockets at once gains nothing (answers come one by one,
    the rest refused unchecked)."""
    n = amqp_node(tmp_path, node_factory,
                  "login_failure_limit = 5\nlogin_failure_window = 600\n"
                  "login_failure_delay = 0.1\nlogin_failure_max_delay = 0.4\n"
                  "handshake_timeout = 120\n")
    clients = [Client(n) for _ in range(60)]
    took: list[float] = []
    for c in clients[:30]:
        elapsed, answer = c.login("wrong")
        assert login_failed(answer), answer
        took.append(elapsed)
    assert max(took[:5]) < 0.3, took[:5]  # the free failures
    assert took[5] >= 0.09 and took[6] >= 0.18, took[5:7]
    assert min(took[7:]) >= 0.36, took[7:]  # capped at 0.4 s
    assert sum(took[5:]) >= 9.0, f"{25 / sum(took[5:]):.1f} guesses/s past the limit"
    elapsed, answer = clients[30].login("guest")  # a NATed user with the right password
    assert isinstance(answer, spec.Connection.Tune), answer
    assert elapsed >= 0.36, elapsed
    clients[30].open()
    # the other 29 sockets guess at once: answered one by one, 0.4 s apart; what
    # would wait over 1.2 s (max_wait: 3 x max_delay) is refused without a look
    for c in clients[31:]:
        c.send_frame(spec.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN", response="\0guest\0wrong", locale="en_US"))
    t0 = time.monotonic()
    checked: list[float] = []
    unchecked = 0
    for c in clients[31:]:
        _, answer = c.read_frame(30)
        if refused_unchecked(answer):
            unchecked += 1
        else:
            assert login_failed(answer), answer
            checked.append(time.monotonic() - t0)
    assert len(checked) <= 4 and unchecked >= 25, (checked, unchecked)
    for c in clients:
        c.abort()


@pytest.mark.slow  # waits out the throttle: make test runs it, make test-fast does not
def test_http_basic_auth_is_throttled_per_address(
        tmp_path: Path, node_factory: list[NodeProcess]) -> None:
    """200 wrong guesses on one keep-alive connection take >= 9 s (old code:
    ~0.05 s), while another address (127.0.0.2) is answered at once; the right
    password from the throttled address still works, after its delay; a
    connection that already authenticated is not held (no new guess)."""
    n = http_node(tmp_path, node_factory,
                  "login_failure_limit = 5\nlogin_failure_window = 600\n"
                  "login_failure_delay = 0.025\nlogin_failure_max_delay = 0.05\n"
                  "[http]\nidle_timeout = 60\n")  # `proven` waits out the storm
    proven = Http(n)
    assert proven.get(GUEST) == 200  # before the storm
    attacker = Http(n)
    t0 = time.monotonic()
    statuses = [attacker.get(WRONG) for _ in range(200)]
    took = time.monotonic() - t0
    assert statuses == [401] * 200
    assert took >= 9.0, f"200 guesses took {took:.2f} s"
    other = Http(n, "127.0.0.2")
    elapsed, status = other.timed(GUEST)
    assert status == 200 and elapsed < 0.5, (status, elapsed)
    elapsed, status = other.timed(WRONG)
    assert status == 401 and elapsed < 0.5, (status, elapsed)
    elapsed, status = proven.timed(GUEST)  # same credentials on its connection: not held
    assert status == 200 and elapsed < 0.04, (status, elapsed)
    nat_user = Http(n)
    elapsed, status = nat_user.timed(GUEST)
    assert status == 200 and elapsed >= 0.045, (status, elapsed)
    for h in (proven, attacker, other, nat_user):
        h.close()


def test_amqp_and_http_failures_share_one_budget(
        tmp_path: Path, node_factory: list[NodeProcess]) -> None:
    """3 AMQP failures + 2 HTTP failures from 127.0.0.3 use up the 5 free ones:
    the next login there, HTTP or AMQP, right or wrong, is held; the same from
    127.0.0.4 after 5 HTTP failures holds its AMQP login. 127.0.0.5 is not held."""
    n = http_node(tmp_path, node_factory,
                  "login_failure_limit = 5\nlogin_failure_window = 600\n"
                  "login_failure_delay = 1.0\nlogin_failure_max_delay = 1.0\n")
    for _ in range(3):
        elapsed, answer = Client(n, "127.0.0.3").login("wrong")
        assert login_failed(answer) and elapsed < 0.5
    h = Http(n, "127.0.0.3")
    for _ in range(2):
        elapsed, status = h.timed(WRONG)
        assert status == 401 and elapsed < 0.5
    elapsed, status = Http(n, "127.0.0.3").timed(GUEST)
    assert status == 200 and elapsed >= 0.95, (status, elapsed)
    h4 = Http(n, "127.0.0.4")
    for _ in range(5):
        assert h4.get(WRONG) == 401
    c = Client(n, "127.0.0.4")
    elapsed, answer = c.login("guest")
    assert isinstance(answer, spec.Connection.Tune) and elapsed >= 0.95, (answer, elapsed)
    c.open()
    elapsed, answer = Client(n, "127.0.0.5").login("guest")
    assert isinstance(answer, spec.Connection.Tune) and elapsed < 0.5


def test_one_names_failures_do_not_hold_another_users_login(
        tmp_path: Path, node_factory: list[NodeProcess]) -> None:
    """Issue 42 item 7, with the default throttle: behind SNAT every client
    shares 127.0.0.1. 12 wrong logins for alice there (the 11th and 12th held
    1 and 2 s), then guest's right login from the same address, over AMQP and
    over HTTP, is answered at once. Before: held 4 s each (keyed on the address
    only; 28 s and a refusal unchecked in the issue)."""
    n = http_node(tmp_path, node_factory, "")
    took = []
    for _ in range(12):
        elapsed, answer = Client(n).login("wrong", user="alice")
        assert login_failed(answer), answer
        took.append(elapsed)
    assert took[10] >= 0.9 and took[11] >= 1.9, took  # alice's guesses are slowed down
    c = Client(n)
    elapsed, answer = c.login("guest")
    assert isinstance(answer, spec.Connection.Tune) and elapsed < 0.5, (answer, elapsed)
    c.open()
    elapsed, status = Http(n).timed(GUEST)
    assert status == 200 and elapsed < 0.5, (status, elapsed)
    c.abort()


def test_spraying_user_names_is_bounded_per_address(
        tmp_path: Path, node_factory: list[NodeProcess]) -> None:
    """Each fresh name has its free failures, but past
    login_failure_address_limit failures from one address (any names) every
    login from it is held, the right ones too; another address is not."""
    n = http_node(tmp_path, node_factory,
                  "login_failure_limit = 3\nlogin_failure_address_limit = 10\n"
                  "login_failure_window = 600\nlogin_failure_delay = 0.5\n"
                  "login_failure_max_delay = 0.5\n")
    h = Http(n, "127.0.0.7")
    for i in range(10):
        elapsed, status = h.timed(basic(f"user{i}", "wrong"))
        assert status == 401 and elapsed < 0.3, (i, elapsed)
    elapsed, status = h.timed(basic("user10", "wrong"))
    assert status == 401 and elapsed >= 0.45, elapsed
    elapsed, answer = Client(n, "127.0.0.7").login("guest")
    assert isinstance(answer, spec.Connection.Tune) and elapsed >= 0.45, (answer, elapsed)
    elapsed, status = Http(n, "127.0.0.8").timed(GUEST)
    assert status == 200 and elapsed < 0.3, (status, elapsed)


def test_idle_sockets_do_not_fill_max_connections(
        tmp_path: Path, node_factory: list[NodeProcess]) -> None:
    """max_connections = 5 and 15 idle sockets (some sent the protocol header,
    none logged in): a real client still opens (old code: 530, the idle ones
    counted); the handshake timeout closes the idle ones; beyond
    max_handshakes_per_address a new socket from that address is closed, beyond
    max_handshakes the oldest one is; opened connections count, a sixth is 530."""
    n = amqp_node(tmp_path, node_factory,
                  "max_connections = 5\nhandshake_timeout = 3\n"
                  "max_handshakes = 30\nmax_handshakes_per_address = 20\n")
    idle = [Client(n, header=i % 2 == 0) for i in range(15)]
    real = Client(n, "127.0.0.2")
    _, answer = real.login("guest")
    assert isinstance(answer, spec.Connection.Tune), answer
    real.open()
    opened = [real]
    for _ in range(4):
        c = Client(n, "127.0.0.2")
        _, answer = c.login("guest")
        assert isinstance(answer, spec.Connection.Tune)
        c.open()
        opened.append(c)
    sixth = Client(n, "127.0.0.2")
    sixth.login("guest")
    sixth.send_frame(spec.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    sixth.send_frame(spec.Connection.Open(virtual_host="/"))
    _, close = sixth.read_frame()
    assert isinstance(close, spec.Connection.Close) and close.reply_code == 530, close
    assert "connection limit (5)" in close.reply_text
    t0 = time.monotonic()
    for c in idle:  # closed by the handshake timeout (3 s), the opened ones stay
        assert closed_by_node(c.sock, 3 + 2.5 - (time.monotonic() - t0)), "idle socket stayed"
    assert time.monotonic() - t0 >= 1.0  # not at once: they had their 3 s
    for c in opened:
        assert not closed_by_node(c.sock, 0.05)
    # the caps on sockets in the handshake
    per_address = [Client(n, "127.0.0.3", header=False) for _ in range(20)]
    extra = Client(n, "127.0.0.3", header=False)
    assert closed_by_node(extra.sock, 2.0), "a 21st socket from one address was kept"
    others = [Client(n, "127.0.0.4", header=False) for _ in range(10)]  # 30 in all: full
    newcomer = Client(n, "127.0.0.5", header=False)  # evicts the oldest
    assert closed_by_node(per_address[0].sock, 2.0), "the oldest was not evicted"
    assert not closed_by_node(per_address[1].sock, 0.05)
    newcomer.send(pframe.marshal(pheader.ProtocolHeader(), 0))
    newcomer.expect(spec.Connection.Start)
    for c in opened[1:]:
        c.close()

    def slot_free() -> bool:
        probe = Client(n, "127.0.0.6")
        _, answer = probe.login("guest")
        probe.send_frame(spec.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
        probe.send_frame(spec.Connection.Open(virtual_host="/"))
        _, reply = probe.read_frame()
        probe.abort()
        return isinstance(reply, spec.Connection.OpenOk)
    wait_for(slot_free, timeout=10, interval=0.2, what="a connection slot once others closed")
    for c in [*per_address, *others, newcomer, sixth, real]:
        c.abort()
