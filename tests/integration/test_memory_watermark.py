"""Issue 26 item 6: what connections hold. Unfinished bodies on many channels
and messages held in an open transaction are counted (the node's
connection_held_bytes figure); a connection over its buffer
(max_connection_buffer) gets connection.blocked and is not read past its next
publish, the node's RSS stays bounded, a commit frees it, and other
connections are served meanwhile. Held bytes are in the node's resident set,
so they can raise the node-wide memory alarm (issue 27: RSS-based) too.
Real node, raw frames (harness/amqp.py)."""
from __future__ import annotations

import os
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from harness.amqp import RawClient
from node.amqp.connection import BUFFER_FULL
from tests.broker_proc import NodeProcess, node_metric, uniq, wait_for
from tests.support.memory import idle_rss, metric, rss

pytestmark = [pytest.mark.own_node,
              pytest.mark.skipif(bool(os.environ.get("MIRRORQ_TARGET")),
                                 reason="needs a mirrorq node of its own")]

SHARE = 12_500_000  # each connection's buffer (issue 26: a quarter of a 50 MB watermark)
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    # the node's memory alarm at its default (a fraction of RAM): only the
    # per-connection buffer acts here
    base = Path(tmp_path_factory.mktemp("watermark"))
    n = NodeProcess(base / "data", config=f"max_connection_buffer = {SHARE}\n")
    n.start()
    try:
        yield n
    finally:
        n.kill9()


def held(node: NodeProcess) -> int:
    value = node_metric(node, "connection_held_bytes")
    assert value is not None
    return int(value)


def send_until_stalled(c: RawClient, data: bytes, stall: float = 3.0) -> int:
    """Write `data` while the node reads it; -> bytes written before the socket
    stayed unwritable for `stall` seconds (the node stopped reading), or all."""
    sock = c.sock
    sock.setblocking(False)
    sent = 0
    view = memoryview(data)
    try:
        while sent < len(data):
            _, w, _ = select.select([], [sock], [], stall)
            if not w:
                return sent
            try:
                sent += sock.send(view[sent:sent + 65536])
            except BlockingIOError:
                continue
    finally:
        sock.setblocking(True)
        sock.settimeout(c.timeout)
    return sent


def await_blocked(c: RawClient, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not c.blocked:
        assert time.monotonic() < deadline, "no connection.blocked"
        c.fill(max(0.0, deadline - time.monotonic()))
        c.frames()


def served_meanwhile(node: NodeProcess) -> None:
    """Another connection publishes and gets a message back while the first is blocked."""
    other = RawClient(node)
    try:
        other.handshake()
        other.open_channel(1)
        q = uniq("meanwhile")
        other.call(spec.Queue.Declare(queue=q), spec.Queue.DeclareOk)
        other.publish("", q, b"still served")
        ok = wait_for(lambda: _get(other, q), timeout=10, what="a message on another connection")
        assert ok == b"still served"
    finally:
        other.close()


def _get(c: RawClient, q: str) -> bytes | None:
    c.send_method(spec.Basic.Get(queue=q, no_ack=True), 1)
    _, reply = c.read_frame()
    if isinstance(reply, spec.Basic.GetEmpty):
        return None
    assert isinstance(reply, spec.Basic.GetOk), reply
    c.expect(pheader.ContentHeader)
    _, body = c.expect(ContentBody)
    return bytes(body.value)


def test_unfinished_bodies_on_many_channels_block_the_connection(node: NodeProcess) -> None:
    channels, announced, trickled = 40, 8 * MIB, 4 * MIB  # 160 MiB offered, 320 MiB announced
    c = RawClient(node)
    try:
        c.handshake()
        for n in range(1, channels + 1):
            c.open_channel(n)
        before = rss(node)
        head = b"".join(
            pframe.marshal(spec.Basic.Publish(exchange="", routing_key="nowhere"), n)
            + pframe.marshal(pheader.ContentHeader(0, announced, spec.Basic.Properties()), n)
            for n in range(1, channels + 1))
        chunk = b"x" * (c.frame_max - 8)
        rounds = trickled // len(chunk)
        # round-robin: every channel's body grows a frame at a time
        body = b"".join(pframe.marshal(ContentBody(chunk), n)
                        for _ in range(rounds) for n in range(1, channels + 1))
        sent = send_until_stalled(c, head + body)
        await_blocked(c)
        assert c.blocked_reason == BUFFER_FULL
        figure = held(node)
        grown = rss(node) - before
        print(f"offered {len(body) / MIB:.0f} MiB, the node read {sent / MIB:.1f} MiB, "
              f"holds {figure / MIB:.1f} MiB, RSS +{grown / MIB:.1f} MiB")
        assert sent < len(head + body) / 2, "the node kept reading"
        assert SHARE < figure <= SHARE + c.frame_max  # held at its share
        assert grown < 64 * MIB
        served_meanwhile(node)
    finally:
        c.abort()
    wait_for(lambda: held(node) == 0, timeout=10, what="the aborted connection's bytes freed")


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_open_transaction_over_its_share_is_blocked_until_it_ends(node: NodeProcess,
                                                                   end: str) -> None:
    c = RawClient(node)
    q = uniq("tx")
    body = b"t" * 500_000
    try:
        c.handshake()
        c.open_channel(1)
        c.call(spec.Queue.Declare(queue=q), spec.Queue.DeclareOk)
        c.call(spec.Tx.Select(), spec.Tx.SelectOk)
        published = 0
        while not c.blocked:
            assert published * len(body) < 3 * SHARE, "never blocked"
            c.publish("", q, body)
            published += 1
            # a synchronous request behind each publish: the node has read it
            c.send_method(spec.Queue.Declare(queue=q, passive=True), 1)
            while True:
                c.fill(10.0)
                if any(isinstance(v, spec.Queue.DeclareOk) for _, v in c.frames()):
                    break
        assert published * len(body) > SHARE
        assert held(node) == published * len(body)
        served_meanwhile(node)
        if end == "commit":
            c.send_method(spec.Tx.Commit(), 1)
        else:
            c.send_method(spec.Tx.Rollback(), 1)
        reply = spec.Tx.CommitOk if end == "commit" else spec.Tx.RollbackOk
        deadline = time.monotonic() + 10
        got: list[object] = []
        while c.blocked or not any(isinstance(v, reply) for v in got):
            assert time.monotonic() < deadline, f"no {reply.__name__} and unblocked: {got}"
            c.fill(max(0.0, deadline - time.monotonic()))
            got += [v for _, v in c.frames()]
        assert held(node) == 0
        declared = c.call(spec.Queue.Declare(queue=q, passive=True), spec.Queue.DeclareOk)
        assert declared.message_count == (published if end == "commit" else 0)
    finally:
        c.close()


def test_a_held_connection_that_hangs_up_is_released(node: NodeProcess) -> None:
    """Over its share and not read (a publish waits), the client closes its socket
    (FIN, no AMQP close): the node sees it through the paused socket and frees
    what the connection held."""
    c = RawClient(node)
    try:
        c.handshake()
        c.open_channel(1)
        c.call(spec.Tx.Select(), spec.Tx.SelectOk)
        for _ in range(13):  # 13 MB > the 12.5 MB share
            c.publish("", "nowhere", b"f" * 1_000_000)
        await_blocked(c)
        c.publish("", "nowhere", b"g")  # held: the node stops reading here
        wait_for(lambda: held(node) == 13_000_000, timeout=10, what="13 MB held")
    finally:
        c.close()  # everything sent has reached the node: FIN follows
    wait_for(lambda: held(node) == 0, timeout=10, what="the closed connection's bytes freed")


HELD = 25_000_000  # at most in one transaction: under its 30 MB buffer
FIRST = 10_000_000  # the other transaction's: with HELD, over the 30 MB headroom


@pytest.fixture
def small_node(tmp_path: Path) -> Iterator[NodeProcess]:
    # the node's watermark 30 MB above an idle node's RSS, each connection's buffer 30 MB
    idle = idle_rss(tmp_path / "probe")
    n = NodeProcess(tmp_path / "data", config=f"memory_high_watermark = {idle + 30 * MIB}\n"
                                              f"max_connection_buffer = {30 * MIB}\n")
    n.start()
    try:
        yield n
    finally:
        n.kill9()


def test_held_bytes_raise_the_node_alarm_and_transactions_can_still_commit(
        small_node: NodeProcess) -> None:
    """Held bytes are in the node's memory: two open transactions under their
    own buffers take its RSS over the watermark and block every publisher
    ("low on memory", the node-wide alarm). Blocked connections are still read
    up to their next publish, so a transaction whose publishes were all read
    commits while blocked (a blocked socket would have held its transaction,
    and the alarm, for good); once the memory is freed it is unblocked."""
    node = small_node
    q = uniq("txalarm")
    clients = [RawClient(node) for _ in range(2)]
    sent, read = [0, 0], [0, 0]  # publishes sent; answered by the request behind each
    body = 500_000

    def pump(i: int, timeout: float) -> None:
        clients[i].fill(timeout)
        read[i] += sum(isinstance(v, spec.Queue.DeclareOk) for _, v in clients[i].frames())

    try:
        for c in clients:
            c.handshake()
            c.open_channel(1)
            c.call(spec.Queue.Declare(queue=q), spec.Queue.DeclareOk)
            c.call(spec.Tx.Select(), spec.Tx.SelectOk)
        deadline = time.monotonic() + 60
        # the first holds 10 MB (its RSS alone stays under the watermark), all read;
        # the second publishes until the alarm blocks it (a request behind each
        # publish is answered once the node has read it)
        for i, limit in ((0, FIRST), (1, HELD)):
            c = clients[i]
            while not c.blocked and sent[i] * body < limit:
                c.publish("", q, os.urandom(body))
                c.send_method(spec.Queue.Declare(queue=q, passive=True), 1)
                sent[i] += 1
                while not c.blocked and read[i] < sent[i]:
                    assert time.monotonic() < deadline, "neither read nor blocked"
                    pump(i, 1.0)
            assert i == 1 or read[0] * body == FIRST == held(node), "the first was blocked"
        for c in clients:
            await_blocked(c)
            assert c.blocked_reason == "low on memory"
        assert metric(node, "mem_alarm") == 1 and held(node) > FIRST
        # blocked, the first is still read up to its next publish: its commit is answered
        clients[0].call(spec.Tx.Commit(), spec.Tx.CommitOk)
        assert clients[0].blocked
        # the second hangs up (its transaction's bytes are freed) and a purge frees
        # the first's queued bodies: RSS falls once trimmed, the first is unblocked
        clients[1].abort()
        wait_for(lambda: held(node) == 0, timeout=10, what="the aborted transaction freed")
        purger = RawClient(node)
        try:
            purger.handshake()
            purger.open_channel(1)
            deadline = time.monotonic() + 30
            while clients[0].blocked:
                assert time.monotonic() < deadline, \
                    f"not unblocked after purges (RSS {rss(node) / MIB:.0f} MiB)"
                purger.call(spec.Queue.Purge(queue=q), spec.Queue.PurgeOk)
                clients[0].fill(0.2)
                clients[0].frames()
        finally:
            purger.close()
        assert metric(node, "mem_alarm") == 0
    finally:
        for c in clients:
            c.close()
