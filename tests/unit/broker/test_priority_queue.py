"""A priority queue's ready messages (node/broker/queue.py): one packed FIFO per
priority band, returned messages in a heap. Random pushes, pops and requeues
folded through a Queue and through a reference (every ready message in one
list, the head the smallest (band, sequence) key) give the same messages in
the same order, for x-max-priority queues and a quorum queue's 32 levels; a
snapshot keeps that order (S04: a requeued message goes back to its place)."""
from __future__ import annotations

import heapq
import random
import sys
import tracemalloc

import pytest

from node.broker.fifo import CHUNK
from node.broker.message import Message
from node.broker.queue import QUORUM_DEFAULT_PRIORITY, QUORUM_LEVELS, Queue
from node.broker.vhost import ResourceKey
from node.replication.machine import BrokerState
from node.replication.machine.version import MACHINE_VERSION
from node.replication.message_store import make_loc
from tests.support.snapshot import snapshot_copy


def _queue(mode: str) -> Queue:
    args: dict[str, object] = {"x-queue-type": "quorum"} if mode == "levels" else \
        {"x-max-priority": int(mode)}
    q = Queue(ResourceKey("/\x00pq"), True, None, False, args, "n1", 0.0)
    q.levels = mode == "levels"
    return q


def _ref_key(q: Queue, m: Message, returned: bool) -> int:
    if q.levels:
        return m.seq if returned else ((QUORUM_LEVELS - m.priority) << 64) | m.seq
    mp = q.max_priority
    assert mp is not None
    return ((mp - min(m.priority, mp)) << 64) | m.seq


def _new(rng: random.Random, i: int, top: int) -> Message:
    return Message(0, "amq.direct", "rk", None, None, rng.random() < 0.9, None,
                   make_loc(i + 1, 10, 20), rng.randrange(1, 2000), rng.choice([0, 0, 0, rng.randrange(top)]))


def _fold(q: Queue, rng: random.Random, steps: int, top: int) -> dict[int, tuple[int, Message]]:
    """Random operations on q and the reference; returns the reference
    (id of message -> (key, message)) after checking every head."""
    ref: dict[int, tuple[int, Message]] = {}
    out: list[Message] = []
    for i in range(steps):
        r = rng.random()
        if r < 0.55 or not ref:
            m = _new(rng, i, top)
            if q.levels:
                m.priority = min(m.priority, QUORUM_LEVELS - 1) if m.priority else QUORUM_DEFAULT_PRIORITY
            q.push(m)
            ref[m.seq] = (_ref_key(q, m, False), m)
        elif r < 0.9:
            want = min(ref.values(), key=lambda km: km[0])[1]
            head = q.peek()
            assert head is not None and head.seq == want.seq
            got = q.pop()
            assert got.seq == want.seq and got.priority == want.priority and got.size == want.size
            del ref[want.seq]
            out.append(got)
        elif out:  # return a delivered one
            m = out.pop(rng.randrange(len(out)))
            m.redelivered = True
            q.requeue(m)
            ref[m.seq] = (_ref_key(q, m, True), m)
        assert q.ready_count() == len(ref)
        assert q.ready_bytes == sum(m.size for _k, m in ref.values())
    return ref


def _drain_matches(q: Queue, ref: dict[int, tuple[int, Message]]) -> None:
    order = [m.seq for _k, m in sorted(ref.values(), key=lambda km: km[0])]
    got = []
    while q.ready_count():
        got.append(q.pop().seq)
    assert got == order
    assert q.peek() is None and q.ready_bytes == 0 and not q.bands and not q.band_order


@pytest.mark.parametrize("mode", ["10", "255", "1", "levels"])
def test_priority_bands_serve_what_one_ordered_list_would_S04(mode: str) -> None:
    rng = random.Random(hash(mode) & 0xFFFF)
    q = _queue(mode)
    ref = _fold(q, rng, 6000, 40)
    _drain_matches(q, ref)


@pytest.mark.parametrize("mode", ["10", "levels"])
def test_a_snapshot_keeps_a_priority_queue_in_order_S04(mode: str) -> None:
    rng = random.Random(7)
    st = BrokerState()
    st.machine_version = MACHINE_VERSION  # quorum levels from version 3 on
    q = _queue(mode)
    st.queues[q.name] = q
    ref = _fold(q, rng, 3000, 40)
    for _ in range(3):  # a quorum queue serves returned ones first: return some last
        m = q.pop()
        m.redelivered = True
        q.requeue(m)
        ref[m.seq] = (_ref_key(q, m, True), m)
    assert q.banded and q.returned  # both kinds are in the snapshot
    restored = snapshot_copy(st).queues[q.name]
    assert restored.banded == q.banded  # never-delivered ones back in their bands
    assert len(restored.returned) == len(q.returned)
    _drain_matches(restored, ref)


def test_a_priority_queue_held_in_the_heap_loads_into_bands() -> None:
    """Snapshots from builds before the bands hold every message of an
    x-max-priority queue in the heap: they load into the packed bands."""
    st = BrokerState()
    q = _queue("10")
    st.queues[q.name] = q
    rng = random.Random(3)
    ref = {}
    for i in range(2000):
        m = _new(rng, i, 12)
        m.seq = q.next_seq
        q.next_seq += 1
        key = _ref_key(q, m, False)
        q.returned.append((key, m))
        q.ready_bytes += m.size
        ref[m.seq] = (key, m)
    heapq.heapify(q.returned)
    restored = snapshot_copy(st).queues[q.name]
    assert not restored.returned and restored.banded + len(restored.ready) == 2000
    _drain_matches(restored, ref)


def test_a_priority_backlog_costs_tens_of_bytes_per_message_not_an_object() -> None:
    """Before the bands every message of an x-max-priority queue was a
    Message in the heap (~250 B with its key and tuple)."""
    q = _queue("10")
    n = 50 * CHUNK  # 11 bands: most chunks full
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):  # each Message dropped once pushed, as a publish's is
        q.push(Message(0, "amq.direct", "rk", None, None, True, None, make_loc(i + 1, 10, 20), 1024, i % 11))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert q.ready_count() == n and not q.returned and len(q.band_order) == 10
    one = Message(0, "amq.direct", "rk", None, None, True, None, make_loc(1, 10, 20), 1024, 3)
    assert used / n < 56, f"{used / n:.0f} B per message"
    assert used / n < sys.getsizeof(one) / 2
