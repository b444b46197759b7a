"""Issue 27 item 1, first step: commands folded through the machine the way a
node applies them (encoded, appended to a real SegmentLog, decoded with the
publishes' spans, applied at their Raft index): queued messages hold a
location in the log, not their bytes; deliveries read them back (props,
body, x-delivery-count); the per-bucket live counts return to zero once
every message is gone (ack, no-ack get, purge, delete, expiry, dead-letter);
a snapshot written from such a state holds their places only."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.replication import message_store
from node.replication.codec import decode_batch, encode_batch
from node.replication.command import Batch, ChannelOpen, Command, QueueDelete, QueuePurge
from node.replication.effect import Deliver, Effect, GetOk
from node.replication.machine import apply_batch, default_state
from node.replication.machine.version import MACHINE_VERSION
from node.replication.raft.log import SegmentLog
from node.replication.raft.snapshot import (
    encode_snapshot,
    logged_entries,
    read_entries,
    read_snapshot,
    write_snapshot,
)
from tests.support.machine import ack, chan, consume, get, nack, pub, qbind, qdecl
from tests.support.snapshot import META


class LogHarness:
    """A state applied from a real log, as raft_node does it."""

    def __init__(self, tmp: Path) -> None:
        self.log = SegmentLog(str(tmp / "log"), str(tmp / "meta"), segment_bytes=1 << 16)
        self.log.add(b"\x00", 1, 1)  # (pysyncobj's first NO_OP entry)
        self.state = default_state()
        self.reader = message_store.LogReader(self.log.handle)  # what apply reads props with
        self.seq = 0
        self.cache = message_store.PayloadCache()

    def run(self, *cmds: Command) -> list[Effect]:
        self.seq += 1
        command = b"\x01" + encode_batch(Batch("n1", 1, self.seq, 1000.0, list(cmds)))
        idx = self.log.last_index() + 1
        self.log.add(command, idx, 1)
        spans: dict[int, tuple[int, int]] = {}
        batch = decode_batch(self.log[-1][0], 1, spans)
        return apply_batch(self.state, batch, idx, spans, self.reader)

    def read(self, e: Deliver | GetOk) -> tuple[dict[str, Any], bytes]:
        """What the wire sends: bytes in the effect, or read from the log."""
        if e.stored is None:
            assert e.props is not None and e.body is not None
            return e.props, e.body
        loc, size = e.stored
        idx, at, n = message_store.split_loc(loc)
        props, body = message_store.load((self.log.handle(idx), at, n, size), e.props, e.body, self.cache)
        if e.delivery_count >= 0:
            props = message_store.with_delivery_count(props, e.delivery_count)
        return props, body

    def held(self) -> list[Any]:
        return [m for q in self.state.queues.values() for m in q.take_all()]


@pytest.fixture
def h(tmp_path: Path) -> LogHarness:
    return LogHarness(tmp_path)


C = chan()


def _open(h: LogHarness, *queues: str, args: dict[str, Any] | None = None) -> None:
    h.run(ChannelOpen(C))
    for q in queues:
        h.run(qdecl(C, q, arguments=args))


def _queue(h: LogHarness, name: str) -> Any:
    return next(q for k, q in h.state.queues.items() if k.endswith("\x1f" + name) or k == name)


def test_queued_messages_hold_a_location_not_bytes(h: LogHarness) -> None:
    _open(h, "q")
    props = {"delivery_mode": 2, "headers": {"k": "v"}, "priority": 3}
    h.run(pub(C, "q", b"first", props=props), pub(C, "q", b"second" * 1000))
    q = _queue(h, "q")
    msgs = list(q.ready)
    assert [m.body for m in msgs] == [None, None] and [m.props for m in msgs] == [None, None]
    assert all(m.loc is not None for m in msgs)
    assert msgs[0].priority == 3 and msgs[1].size == 6000
    assert sum(h.state.live.values()) == 2
    fx = h.run(consume(C, "q", "c1"))
    ds = [e for e in fx if isinstance(e, Deliver)]
    assert [(d.props, d.body) for d in ds] == [(None, None), (None, None)]
    assert [h.read(d) for d in ds] == [(props, b"first"), ({}, b"second" * 1000)]
    assert h.cache.reads == 1  # one entry read (and checked) for both messages


def test_redelivery_count_and_basic_get(h: LogHarness) -> None:
    _open(h)
    h.run(qdecl(C, "q", durable=True, arguments={"x-queue-type": "quorum"}))
    h.run(pub(C, "q", b"body", props={"headers": {"a": 1}}))
    fx = h.run(get(C, "q"))
    g = next(e for e in fx if isinstance(e, GetOk))
    assert h.read(g) == ({"headers": {"a": 1, "x-delivery-count": 0}}, b"body")
    h.run(nack(C, g.delivery_tag))
    g = next(e for e in h.run(get(C, "q")) if isinstance(e, GetOk))
    assert g.redelivered and h.read(g) == ({"headers": {"a": 1, "x-delivery-count": 1}}, b"body")
    h.run(ack(C, g.delivery_tag))
    assert h.state.live == {} and h.state.message_bytes == 0


def test_counts_return_to_zero(h: LogHarness) -> None:
    _open(h, "a", "b")
    h.run(qdecl(C, "short", arguments={"x-message-ttl": 0}))
    for q in ("a", "b"):
        h.run(qbind(C, q, "amq.fanout"))
    h.run(*[pub(C, "", b"x%d" % i, exchange="amq.fanout") for i in range(10)])
    a, b = _queue(h, "a"), _queue(h, "b")
    assert {m.loc for m in a.ready} == {m.loc for m in b.ready}  # stored once, held by both
    assert sum(h.state.live.values()) == 20
    h.run(QueuePurge(C, "a", False))
    assert sum(h.state.live.values()) == 10
    fx = h.run(get(C, "b", no_ack=True))  # settled on delivery
    assert h.read(next(e for e in fx if isinstance(e, GetOk)))[1] == b"x0"
    h.run(QueueDelete(C, "b", False, False, False))
    assert h.state.live == {}
    h.run(pub(C, "short", b"gone"))  # TTL 0, no consumer: expires at once
    assert h.state.live == {} and h.state.message_bytes == 0


def test_dead_lettered_message_has_new_props_and_the_body_in_the_log(h: LogHarness) -> None:
    _open(h, "dead")
    h.run(qdecl(C, "src", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}))
    h.run(pub(C, "src", b"payload", props={"headers": {"h": 1}}))
    g = next(e for e in h.run(get(C, "src")) if isinstance(e, GetOk))
    h.run(nack(C, g.delivery_tag, requeue=False))
    dead = _queue(h, "dead")
    m = dead.ready[0]
    assert m.body is None and m.props is not None and m.loc is not None
    g = next(e for e in h.run(get(C, "dead")) if isinstance(e, GetOk))
    props, body = h.read(g)
    assert body == b"payload" and props["headers"]["h"] == 1
    assert props["headers"]["x-death"][0]["reason"] == "rejected"
    h.run(ack(C, g.delivery_tag))
    assert h.state.live == {}


def test_snapshot_holds_the_index_only_and_the_log_serves_the_bytes(h: LogHarness, tmp_path: Path) -> None:
    """Issue 27 item 3: a snapshot keeps each message's place in the log, not
    its bytes; after a load the same places read back the same properties and
    bodies, the per-bucket live counts are rebuilt, and the snapshot names
    the log entries it needs (one per publish batch, not per message)."""
    _open(h, "a", "b")
    for q in ("a", "b"):
        h.run(qbind(C, q, "amq.fanout"))
    body = bytes(range(256)) * 40
    h.run(pub(C, "", body, exchange="amq.fanout", props={"message_id": "1", "priority": 3}),
          pub(C, "", b"", exchange="amq.fanout"))
    path = tmp_path / "snap"
    with open(path, "wb") as f:
        write_snapshot(f, h.state, META)
    data = path.read_bytes()
    assert len(data) < len(body)  # no body inside
    restored, _meta = read_snapshot(data)
    with open(path, "rb") as f:
        needed = list(read_entries(f))
    assert needed == [h.log.last_index()] == list(logged_entries(h.state))
    assert restored.live == h.state.live and sum(restored.live.values()) == 4
    qs = [q for k, q in restored.queues.items() if k.endswith(("a", "b")) and q.ready]
    assert len(qs) == 2
    for q in qs:
        assert [(m.props, m.body) for m in q.ready] == [(None, None), (None, None)]
        assert [m.priority for m in q.ready] == [3, 0]
        got = []
        for m in q.ready:
            assert m.loc is not None
            idx, at, n = message_store.split_loc(m.loc)
            got.append(message_store.load((h.log.handle(idx), at, n, m.size), None, None, h.cache))
        assert got == [({"message_id": "1", "priority": 3}, body), ({}, b"")]
    assert encode_snapshot(restored, META) == data  # the same file again


def test_damaged_entry_is_never_served(h: LogHarness) -> None:
    _open(h, "q")
    h.run(pub(C, "q", b"precious" * 100))
    d = next(e for e in h.run(consume(C, "q", "c")) if isinstance(e, Deliver))
    loc, _size = d.stored
    idx = message_store.split_loc(loc)[0]
    handle = h.log.handle(idx)
    with open(handle.seg.path, "r+b") as f:  # one bit flipped inside the body
        f.seek(handle.start + handle.size - 10)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(message_store.StoredMessageError) as exc:
        h.read(d)
    assert exc.value.damaged


def test_handle_outlives_a_released_segment(h: LogHarness) -> None:
    _open(h, "q")
    h.run(pub(C, "q", b"kept"))
    d = next(e for e in h.run(consume(C, "q", "c", no_ack=True)) if isinstance(e, Deliver))
    loc, size = d.stored
    idx, at, n = message_store.split_loc(loc)
    handle = h.log.handle(idx)  # made before the segment goes (a delivery in flight)
    for _ in range(40):  # roll segments, then drop everything below the last one
        h.run(pub(C, "nowhere", b"z" * 4000))
    h.log.deleteEntriesTo(len(h.log) - 1)
    assert not Path(handle.seg.path).exists()
    assert message_store.load((handle, at, n, size), None, None, message_store.PayloadCache()) == ({}, b"kept")


@pytest.mark.parametrize("machine_version", [1, 4, MACHINE_VERSION])
def test_a_packed_backlog_survives_a_snapshot_as_it_was(h: LogHarness, machine_version: int) -> None:
    """Ready messages are packed (node/broker/fifo.py) and loaded from a
    snapshot without a Message each: plain ones (persistent or not, with a
    TTL or not, many routing keys) and the ones kept as objects (redelivered,
    dead-lettered with new properties) come back field for field, in order,
    and write the same snapshot again."""
    from tests.support.snapshot import assert_same_state, snapshot_copy

    h.state.machine_version = machine_version  # the snapshot format follows it (3, 4, 5)
    _open(h, "p", "dead")
    h.run(qdecl(C, "t", arguments={"x-message-ttl": 60_000, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": "dead"}))
    for i in range(300):
        h.run(pub(C, "p", bytes([i % 256]) * (i + 1), props={"delivery_mode": 2 if i % 3 else 1}),
              pub(C, "t", b"x" * i, props={"priority": i % 7}))
    h.run(get(C, "p"))  # one delivery, then requeued: redelivered, in the heap
    h.run(nack(C, 1))
    for tag in range(2, 5):  # three of "t" dead-lettered into "dead": new props, body in the log
        h.run(get(C, "t"))
        h.run(nack(C, tag, requeue=False))
    restored = snapshot_copy(h.state)
    assert_same_state(h.state, restored)
    assert encode_snapshot(restored, META) == encode_snapshot(h.state, META)
    for name in ("p", "t", "dead"):
        a, b = _queue(h, name), next(q for k, q in restored.queues.items() if k == _queue(h, name).name)
        assert [(m.seq, m.loc, m.size, m.persistent, m.expires_at, m.props, m.redelivered) for m in a.ready] \
            == [(m.seq, m.loc, m.size, m.persistent, m.expires_at, m.props, m.redelivered) for m in b.ready]
    assert len(_queue(h, "dead").ready) == 3 and _queue(h, "dead").ready[0].props is not None


def test_the_payload_cache_empties_once_nobody_reads() -> None:
    """A drained node gives its cached payloads back: clear_if_idle empties the
    cache only when no entry was read since the previous call."""
    cache = message_store.PayloadCache()
    cache.get(1, lambda: b"x" * 1000)
    cache.clear_if_idle()  # a read since the last call: kept
    assert cache.get(1, lambda: b"never") == b"x" * 1000
    cache.clear_if_idle()  # (a hit is not a read from the log)
    assert cache.get(1, lambda: b"y") == b"y"
    cache.clear_if_idle()
    cache.clear_if_idle()
    assert cache.get(1, lambda: b"z") == b"z"


def test_a_backlog_of_several_chunks_is_streamed_into_the_snapshot_exactly(h: LogHarness) -> None:
    """The format-5 writer streams the index a chunk at a time (a forked
    writer copies nothing of the whole): a head part-way into the first
    chunk, expiries only from the second chunk on and two routing keys come
    back column for column, and the file is the same when written again."""
    from node.broker.fifo import CHUNK
    from tests.support.snapshot import snapshot_copy

    h.state.machine_version = MACHINE_VERSION
    _open(h, "m")
    h.run(qbind(C, "m", "amq.direct", "k2"))
    n = 2 * CHUNK + 500
    for i in range(n):
        props: dict[str, Any] = {"delivery_mode": 2}
        if i >= CHUNK + 7:
            props["expiration"] = "600000"
        if i % 2:
            h.run(pub(C, "m", bytes([i % 256]) * (i % 50 + 1), props=props))
        else:
            h.run(pub(C, "k2", bytes([i % 256]) * (i % 50 + 1), props=props, exchange="amq.direct"))
    for tag in range(1, 101):  # the head moves 100 records into the first chunk
        h.run(get(C, "m"))
        h.run(ack(C, tag))
    q = _queue(h, "m")
    assert len(q.ready) == n - 100 and q.ready.has_expiry()
    restored = snapshot_copy(h.state)
    rq = next(x for k, x in restored.queues.items() if k == q.name)
    a, b = q.ready.columns(), rq.ready.columns()
    assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2] and a[3] == b[3]
    assert encode_snapshot(restored, META) == encode_snapshot(h.state, META)


def test_a_packed_record_with_a_negative_field_is_refused(h: LogHarness) -> None:
    """The reader's check that no record field is negative (it looks at each
    int64's sign byte) refuses a file written with one."""
    from node.replication.raft.snapshot import SnapshotFormatError, read_snapshot

    h.state.machine_version = MACHINE_VERSION
    _open(h, "m")
    for i in range(10):
        h.run(pub(C, "m", b"x" * (i + 1), props={"delivery_mode": 2}))
    q = _queue(h, "m")
    assert read_snapshot(encode_snapshot(h.state, META))[0] is not None
    for field in (0, 2, 3):  # (a negative log index cannot even be written: logged_entries)
        chunk = q.ready._chunks[0]
        kept = chunk.nums[4 * 3 + field]
        chunk.nums[4 * 3 + field] = -1 - field
        with pytest.raises(SnapshotFormatError, match="negative field"):
            read_snapshot(encode_snapshot(h.state, META))
        chunk.nums[4 * 3 + field] = kept


@pytest.mark.parametrize("args", [{"x-max-priority": 5}, {"x-queue-type": "quorum"}],
                         ids=["x-max-priority", "quorum-levels"])
def test_priority_publishes_from_the_log_are_packed_and_served_by_priority(
        h: LogHarness, args: dict[str, Any]) -> None:
    """A publish in the log goes into its priority's packed FIFO with no
    Message kept; deliveries come highest priority first, each with its own
    properties and body read from the log, and the counts return to zero."""
    h.state.machine_version = MACHINE_VERSION  # quorum levels from version 3 on
    h.run(ChannelOpen(C))
    h.run(qdecl(C, "pq", durable=True, arguments=args))
    prios = [0, 3, None, 5, 9, 1, 3, None, 5, 0]
    h.run(*[pub(C, "pq", b"m%d" % i, props={} if p is None else {"priority": p})
            for i, p in enumerate(prios)])
    q = _queue(h, "pq")
    assert q.ready_count() == 10 and not q.returned and q.banded
    assert all(type(r) is tuple for f in [q.ready, *q.bands.values()] for c in f._chunks for r in c.refs)
    assert sum(h.state.live.values()) == 10 and h.state.message_bytes == sum(len(b"m%d" % i) for i in range(10))

    def level(p: int | None) -> int:
        if "x-max-priority" in args:
            return min(p or 0, 5)
        return 4 if p is None else min(p, 31)

    want = sorted(range(10), key=lambda i: (-level(prios[i]), i))
    fx = h.run(consume(C, "pq", "c1"))
    got = [h.read(d) for d in fx if isinstance(d, Deliver)]
    assert [b for _p, b in got] == [b"m%d" % i for i in want]
    assert [p.get("priority") for p, _b in got] == [prios[i] for i in want]
    h.run(ack(C, 10, multiple=True))
    assert h.state.live == {} and h.state.message_bytes == 0 and not q.bands
