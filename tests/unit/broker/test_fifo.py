"""The packed FIFO of ready messages (node/broker/fifo.py) against a deque of
the same Messages: random appends and pops folded through both give the
same messages, field by field, in the same order."""
from __future__ import annotations

import random
import sys
import tracemalloc
from collections import deque

from node.broker.fifo import CHUNK, PackedFifo
from node.broker.message import Message
from node.replication.message_store import make_loc

FIELDS = ("seq", "exchange", "routing_key", "props", "body", "loc", "size", "priority", "persistent",
          "expires_at", "redelivered", "delivery_count", "acquired_count", "deadline")


def _message(rng: random.Random, seq: int) -> Message:
    kind = rng.random()
    rk = rng.choice(["a", "b", f"k{seq}"])
    exp = rng.choice([None, None, 1000.0 + rng.random()])
    if kind < 0.75:  # the plain case: in the log
        m = Message(seq, "amq.direct", rk, None, None, rng.random() < 0.8, exp,
                    make_loc(rng.randrange(1, 1 << 40), rng.randrange(0, 1 << 20), rng.randrange(1, 300)),
                    rng.randrange(0, 1 << 27), rng.randrange(0, 256))
    elif kind < 0.85:  # inline (tools, tests) or dead-lettered with new properties
        body = rng.randbytes(rng.randrange(0, 50))
        m = Message(seq, "", rk, {"priority": 3}, body, True, exp)
    elif kind < 0.95:  # counted: kept as the object
        m = Message(seq, "x", rk, None, None, True, exp, make_loc(5, 6, 7), 10, 1)
        m.delivery_count = rng.randrange(1, 4)
        m.redelivered = True
    else:  # a props offset that does not fit a record
        m = Message(seq, "x", rk, None, None, False, exp, make_loc(9, (1 << 31) + 5, 7), 10, 0)
    return m


def _plain(m: Message) -> bool:
    return (m.loc is not None and m.props is None and m.body is None and not m.redelivered
            and not m.delivery_count and (m.loc >> 32) & 0xFFFFFFFF < 1 << 31)


def _same(a: Message, b: Message) -> None:
    for f in FIELDS:
        assert getattr(a, f) == getattr(b, f), (f, getattr(a, f), getattr(b, f))


def test_packed_fifo_gives_back_what_a_deque_would() -> None:
    rng = random.Random(27)
    ref: deque[Message] = deque()
    fifo = PackedFifo()
    seq = 0
    for _step in range(20_000):
        if rng.random() < 0.55 or not ref:
            m = _message(rng, seq)
            seq += 1
            ref.append(m)
            fifo.append(m)
        else:
            if rng.random() < 0.3:
                _same(fifo[0], ref[0])
                assert fifo.head_seq() == ref[0].seq
            _same(fifo.popleft(), ref.popleft())
        assert len(fifo) == len(ref)
        assert fifo.all_persistent() == all(m.persistent for m in ref)
        if _step % 2000 == 0:
            for a, b in zip(fifo, ref, strict=True):
                _same(a, b)
            assert fifo.log_indices() == {m.loc >> 64 for m in ref if m.loc is not None}
            back = PackedFifo.from_columns(*fifo.columns(), sum(type(m) is Message and not _plain(m)
                                                                for m in ref))
            for a, b in zip(back, ref, strict=True):
                _same(a, b)
    kept, gone = fifo.filtered(lambda m: m.seq % 3 != 0)
    assert [m.seq for m in kept] == [m.seq for m in ref if m.seq % 3 != 0]
    assert [m.seq for m in gone] == [m.seq for m in ref if m.seq % 3 == 0]
    while ref:
        _same(fifo.popleft(), ref.popleft())
    assert not fifo and len(fifo) == 0


def test_peek_and_pop_hand_out_the_same_message_object() -> None:
    fifo = PackedFifo()
    fifo.append(Message(0, "", "q", None, None, True, None, make_loc(3, 4, 5), 6, 0))
    head = fifo[0]
    assert fifo[0] is head and fifo.popleft() is head


def test_a_plain_message_costs_tens_of_bytes_not_an_object() -> None:
    n = 5 * CHUNK
    msgs = [Message(i, "amq.direct", "rk", None, None, True, None, make_loc(i + 1, 10, 20), 1024, 0)
            for i in range(n)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fifo = PackedFifo(msgs)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(fifo) == n
    assert used / n < 48, f"{used / n:.0f} B per message"
    assert used / n < sys.getsizeof(msgs[0]) / 2  # the object alone is far more
