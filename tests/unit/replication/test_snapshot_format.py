"""The snapshot format (node/replication/raft/snapshot/, issue 26 item 1):
a rich state round-trips exactly, and crafted bytes (a pickle, random bytes,
unknown records, truncation, bit flips) raise SnapshotFormatError and never
build anything but the broker's own records."""
from __future__ import annotations

import datetime
import decimal
import io
import os
import pickle
import random
import struct
import zlib

import pytest

from node.broker.channel import Channel, Consumer
from node.broker.exchange import Binding, Exchange
from node.broker.policy_index import PolicyIndex
from node.broker.queue import Message, Queue
from node.broker.topic import TopicTrie, _Node
from node.replication.codec import encode
from node.replication.command import (
    BasicQos,
    ChannelOpen,
    PermissionSet,
    QueueDelete,
    SetMachineVersion,
    SetMember,
    UserPut,
    VhostPut,
)
from node.replication.format import SNAPSHOT, SNAPSHOT_VERSION_SINCE, snapshot_version
from node.replication.machine import BrokerState
from node.replication.machine.version import (
    CLUSTER_METADATA,
    COUNTED_RECORDS,
    DEAD_LETTER_STORE,
    FIRST_VERSION,
    LIMITS,
    MACHINE_VERSION,
    PACKED_SNAPSHOTS,
    QUORUM_SEMANTICS,
)
from node.replication.message_store import BUCKET_SHIFT
from node.replication.raft.snapshot import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    RaftMeta,
    SnapshotFormatError,
    check,
    check_file,
    encode_snapshot,
    iter_fields,
    read_meta,
    read_snapshot,
    snapshot_size,
    write_snapshot,
)
from node.replication.raft.snapshot.envelope import _HEADER
from node.replication.raft.snapshot.reader import _Reader
from node.replication.raft.snapshot.section import SECTIONS, Section, section
from tests.support.machine import (
    Harness,
    chan,
    consume,
    delivers,
    get,
    gets,
    nack,
    pub,
    qbind,
    qdecl,
    xbind,
    xdecl,
)
from tests.support.snapshot import META, assert_same_state, snapshot_copy

# every type an AMQP field table holds (pamqp's decoding), nested too
ALL_FIELD_TYPES = {
    "s": "text ünïcode", "i8": -5, "i64": -(1 << 62), "u64": (1 << 64) - 1, "f": 1.5,
    "nan": float("nan"), "inf": float("-inf"), "t": True, "no": False, "d": decimal.Decimal("3.14159"),
    "ts": datetime.datetime(2026, 11, 26, 10, 0, 0), "tz": datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
    "bin": bytes(range(256)), "void": None, "arr": [1, "two", b"\x00\xff", [3.0, {"k": None}]],
    "tbl": {"nested": {"deep": [decimal.Decimal("-1E+3")]}},
}


def rich_state() -> Harness:
    """Several vhosts, users and permissions, exchanges of every type with
    queue and exchange bindings, classic / priority / TTL / quorum-like
    queues holding random binary bodies with every field type in their
    headers, consumers with unacked deliveries, a requeued heap, a fanout that
    shares one body between queues, and a queue deleted while a delivery from
    it is still unacked."""
    rnd = random.Random(26)
    h = Harness()
    h.run(SetMember("n1", "127.0.0.1:1", True), SetMember("n2", "127.0.0.1:2", False))
    h.run(VhostPut("prod"), VhostPut("dev"), UserPut("alice", "hash", ("administrator",)),
          UserPut("bob", "", ()), PermissionSet("alice", "prod", ".*", ".*", ".*"),
          PermissionSet("bob", "dev", "^q", "", "x"))
    c = h.open(chan(1, 1))
    c2 = chan(2, 1)
    h.run(ChannelOpen(c2, "prod"))
    h.run(BasicQos(c, 3, False))
    h.run(qdecl(c, "plain", durable=True), qdecl(c, "prio", arguments={"x-max-priority": 9}),
          qdecl(c, "ttl", arguments={"x-message-ttl": 60000, "x-expires": 900000, "x-dead-letter-exchange": "dlx"}),
          qdecl(c, "quorum", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 3}),
          qdecl(c, "excl", exclusive=True), qdecl(c, "doomed"))
    h.run(qdecl(c2, "plain", durable=True))  # same name, vhost prod
    h.run(xdecl(c, "fan", "fanout"), xdecl(c, "top", "topic"), xdecl(c, "hdr", "headers"),
          xdecl(c, "dlx", "direct"), xdecl(c, "inner", "direct", internal=True))
    h.run(qbind(c, "plain", "fan"), qbind(c, "prio", "fan"), qbind(c, "ttl", "top", "a.*.#"),
          qbind(c, "quorum", "hdr", arguments={"x-match": "any", "k": decimal.Decimal("1.5")}),
          xbind(c, "inner", "top", "#"), qbind(c, "doomed", "inner", "x.y"),
          qbind(c, "plain", "amq.direct", "rk"))
    for i in range(40):
        props = {"headers": dict(ALL_FIELD_TYPES, n=i), "priority": i % 10, "delivery_mode": 2,
                 "content_type": "application/octet-stream", "timestamp": datetime.datetime(2026, 1, 1)}
        h.run(pub(c, "", rnd.randbytes(rnd.randrange(0, 3000)), exchange="fan", props=props))
        h.run(pub(c, "a.b.c", rnd.randbytes(64), exchange="top", props={"expiration": "50000"}))
        h.run(pub(c, "k", rnd.randbytes(10), exchange="hdr", props={"headers": {"k": decimal.Decimal("1.5")}}))
        h.run(pub(c2, "plain", b"prod %d" % i))
    h.run(pub(c, "excl", b""), pub(c, "doomed", b"\x00" * 100))
    # consumers with unacked deliveries, a nack that requeues into the heap
    fx = h.run(consume(c, "plain", "ct-plain"), consume(c, "quorum", "ct-q", exclusive=True))
    assert delivers(fx)
    fx = h.run(*[get(c, "prio") for _ in range(4)])
    tags = [g.delivery_tag for g in gets(fx)]
    h.run(nack(c, tags[2]), nack(c, tags[0]))
    fx = h.run(get(c, "doomed"))
    assert gets(fx)
    h.run(QueueDelete(c, "doomed", False, False, False))  # its delivery is still unacked
    h.now += 5
    return h


def test_a_rich_state_round_trips_exactly() -> None:
    h = rich_state()
    st = h.state
    assert len(st.vhosts) == 3 and st.permissions and st.users and st.members
    assert any(q.returned for q in st.queues.values()) and any(ch.unacked for ch in st.channels.values())
    assert any(not q.deleted for q in st.queues.values()) and "doomed" not in st.queues
    restored = snapshot_copy(st)
    assert_same_state(st, restored)
    # the fanout's body is one object in both queues after the load, as before
    plain, prio = restored.queues["plain"], restored.queues["prio"]
    shared = {id(m.body) for m in plain.ready} & {id(m.body) for m in [*prio.ready, *(m for _k, m in prio.returned)]}
    assert shared
    # the deleted queue an unacked delivery names came back, as the same object the consumer-less delivery holds
    unacked = [d for ch in restored.channels.values() for d in ch.unacked.values()]
    assert any(q.deleted for q, _m, _k in unacked)
    # and the state works on: the same commands give the same effects
    h2 = Harness()
    h2.state, h2.seqs, h2.now = restored, dict(h.seqs), h.now
    c = chan(1, 1)
    for cmd in (pub(c, "", b"after", exchange="fan"), get(c, "prio"), get(c, "ttl"), consume(c, "prio", "ct2")):
        assert repr(h.run(cmd)) == repr(h2.run(cmd))
    assert_same_state(h.state, h2.state)


def test_the_format_names_every_slot_of_every_record() -> None:
    """A slot added to a broker class must be written (or named derived) by the format."""
    for cls, fields in iter_fields():
        assert sorted(fields) == sorted(cls.__slots__), cls.__name__  # type: ignore[attr-defined]


def test_an_empty_state_and_the_raft_position_round_trip() -> None:
    data = encode_snapshot(BrokerState(), META)
    state, meta = read_snapshot(data)
    assert meta == META and isinstance(meta.last[0], bytes)
    assert_same_state(BrokerState(), state)
    # below machine version 3 the file is of version 3, which builds before it read
    assert data[:8] == MAGIC and struct.unpack_from("<H", data, 8)[0] == 3


def test_from_machine_version_3_the_format_is_4_and_carries_the_acquired_count() -> None:
    h = rich_state()
    h.run(SetMachineVersion(3))
    msgs = [m for q in h.state.queues.values() for m in q.ready]
    for i, m in enumerate(msgs):
        m.acquired_count, m.delivery_count = i + 7, i % 3
    data = encode_snapshot(h.state, META)
    assert struct.unpack_from("<H", data, 8)[0] == 4
    restored = read_snapshot(data)[0]
    assert_same_state(h.state, restored)
    back = [m for q in restored.queues.values() for m in q.ready]
    assert [(m.acquired_count, m.delivery_count) for m in back] == [
        (i + 7, i % 3) for i in range(len(msgs))]


def test_from_machine_version_5_ready_messages_are_written_as_columns() -> None:
    """Format 5 (issue 27): the packed index's columns; the rich state (inline
    messages: objects in the index) comes back the same, and so does a
    backlog of messages in the log (tests/unit/replication/test_message_store.py)."""
    h = rich_state()
    h.run(SetMachineVersion(PACKED_SNAPSHOTS))
    data = encode_snapshot(h.state, META)
    assert struct.unpack_from("<H", data, 8)[0] == FORMAT_VERSION == 5
    restored = read_snapshot(data)[0]
    assert_same_state(h.state, restored)
    assert encode_snapshot(restored, META) == data


@pytest.mark.parametrize("machine_version", range(FIRST_VERSION, MACHINE_VERSION + 1))
def test_the_format_a_cluster_writes_follows_its_machine_version(machine_version: int) -> None:
    """format.snapshot_version is the writer's choice: version 3 below machine
    version 3 (what builds before it read), 4 from QUORUM_SEMANTICS on, 5 from
    PACKED_SNAPSHOTS on; the header says so."""
    want = (5 if machine_version >= PACKED_SNAPSHOTS
            else 4 if machine_version >= QUORUM_SEMANTICS else 3)
    assert snapshot_version(machine_version) == want
    state = BrokerState()
    state.machine_version = machine_version
    assert struct.unpack_from("<H", encode_snapshot(state, META), 8)[0] == want


def test_the_snapshot_versions_start_at_the_machine_versions_that_bring_them() -> None:
    assert SNAPSHOT_VERSION_SINCE == {3: FIRST_VERSION, 4: QUORUM_SEMANTICS, 5: PACKED_SNAPSHOTS}
    assert (SNAPSHOT.version, SNAPSHOT.since) == (FORMAT_VERSION, PACKED_SNAPSHOTS)


@pytest.mark.parametrize("machine_version", range(FIRST_VERSION, MACHINE_VERSION + 1))
def test_the_trailing_sections_are_written_from_their_machine_versions(machine_version: int) -> None:
    assert [(s.name, s.version, s.since) for s in SECTIONS] == [
        ("policies", 1, FIRST_VERSION), ("machine", 1, COUNTED_RECORDS), ("access", 1, LIMITS),
        ("dead-letters", 1, DEAD_LETTER_STORE), ("cluster", 1, CLUSTER_METADATA)]
    state = BrokerState()
    state.machine_version = machine_version
    data = encode_snapshot(state, META)
    r = _Reader(data, check(data))
    r.entries()
    r.meta()
    r.state()
    tags = []
    while r.pos < len(data):  # an empty state: each section is one value (no dead letters)
        tags.append(r.value()[0])
    assert tags == [s.name for s in SECTIONS if machine_version >= s.since]
    assert read_snapshot(data)[0].machine_version == machine_version


def test_a_section_is_registered_once_and_after_those_of_older_clusters() -> None:
    with pytest.raises(TypeError, match="two snapshot sections named 'access'"):
        section("access", 1, MACHINE_VERSION + 1)(type("Again", (Section,), {}))
    with pytest.raises(TypeError, match="is written after every section of older clusters"):
        section("early", 1, FIRST_VERSION)(type("Early", (Section,), {}))
    assert len(SECTIONS) == 5


def test_the_writer_streams_to_a_file_at_an_offset() -> None:
    h = rich_state()
    buf = io.BytesIO()
    buf.write(b"junk")
    n = write_snapshot(buf, h.state, META)
    assert buf.tell() == 4 + n
    assert_same_state(h.state, read_snapshot(buf.getvalue()[4:])[0])


# ------------------------------------------------------------ crafted bytes
class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/mirrorq-pwned",))


def _reframe(body: bytes, version: int = 3) -> bytes:
    """A body under a valid header (right length and CRC): only the decoder stands in the way."""
    return struct.pack("<8sHHQI", MAGIC, version, 0, len(body), zlib.crc32(body)) + body


def _loads_or_raises(data: bytes) -> None:
    with pytest.raises(SnapshotFormatError) as err:
        read_snapshot(data)
    assert str(err.value)


def test_a_pickle_stream_is_refused_unread(tmp_path: object) -> None:
    # the old exploit shape: a pickle that calls something when loaded, as a file and as a body
    for evil in (pickle.dumps((_Boom(), None), protocol=5), pickle.dumps(Queue), b"cos\nsystem\n(S'id'\ntR."):
        with pytest.raises(SnapshotFormatError, match="pickle|magic"):
            read_snapshot(evil)
        _loads_or_raises(_reframe(evil))
    assert not os.path.exists("/tmp/mirrorq-pwned")


def test_random_bytes_wrong_version_unknown_records_and_trailing_bytes_are_refused() -> None:
    rnd = random.Random(1)
    for n in (0, 1, 7, HEADER_SIZE, 100, 5000):
        _loads_or_raises(rnd.randbytes(n))
        _loads_or_raises(MAGIC + rnd.randbytes(n))
        _loads_or_raises(_reframe(rnd.randbytes(n)))
    good = encode_snapshot(BrokerState(), META)
    body = good[HEADER_SIZE:]
    with pytest.raises(SnapshotFormatError, match="version 6"):
        read_snapshot(_reframe(body, version=6))
    assert body[:8] == bytes(8)  # version 3: an empty log-entries section, then as before
    read_snapshot(_reframe(body[8:], version=1))  # version 1 (before typed header values) still loads
    read_snapshot(_reframe(body[8:], version=2))  # version 2 (before index-only messages) still loads
    with pytest.raises(SnapshotFormatError, match="trailing|header says"):
        read_snapshot(good + b"\x00")
    # after the policies section only the machine section may follow, nothing after it
    with pytest.raises(SnapshotFormatError, match="machine section"):
        read_snapshot(_reframe(body + encode(None)))
    with pytest.raises(SnapshotFormatError, match="unknown section 'future'"):
        read_snapshot(_reframe(body + encode(("future", 1, 2))))
    # after the machine section only the access section (machine version 3), nothing after it
    machine = encode(("machine", 1, 3))
    with pytest.raises(SnapshotFormatError, match="access section"):
        read_snapshot(_reframe(body + machine + encode(None)))
    access = encode(("access", 1, {}, {}, {}, {}))
    read_snapshot(_reframe(body + machine + access))
    # after the access section only the dead-letter section (machine version 5), nothing after it
    with pytest.raises(SnapshotFormatError, match="dead-letter section"):
        read_snapshot(_reframe(body + machine + access + encode(None)))
    with pytest.raises(SnapshotFormatError, match="dead-letter store's queue"):
        read_snapshot(_reframe(body + machine + access
                               + encode(("dead-letters", 1, [("/\x00gone", [])]))))
    dead = encode(("dead-letters", 1, []))
    read_snapshot(_reframe(body + machine + access + dead))
    # after the dead-letter section only the cluster section (machine version 6),
    # nothing after it
    with pytest.raises(SnapshotFormatError, match="cluster section"):
        read_snapshot(_reframe(body + machine + access + dead + encode(None)))
    with pytest.raises(SnapshotFormatError, match="protected vhosts"):
        read_snapshot(_reframe(body + machine + access + dead
                               + encode(("cluster", 1, {}, ["no-such-vhost"]))))
    with pytest.raises(SnapshotFormatError, match="global parameter"):
        read_snapshot(_reframe(body + machine + access + dead
                               + encode(("cluster", 1, {"p": b"bytes"}, []))))
    cluster = encode(("cluster", 1, {"cluster_name": "c"}, []))
    read_snapshot(_reframe(body + machine + access + dead + cluster))
    with pytest.raises(SnapshotFormatError, match="trailing"):
        read_snapshot(_reframe(body + machine + access + dead + cluster + encode(None)))
    # an unknown record id / an unknown tag where the raft position should be
    for bad in (b"R\xfe", b"\x07", b"Z"):
        _loads_or_raises(_reframe(body[:8] + bad + body[8:]))
    # a command record (a codec record, but not a snapshot value) where the state is
    meta = encode(tuple(META))
    _loads_or_raises(_reframe(body[:8] + meta + encode(ChannelOpen(chan(), "/")) + body[8 + len(meta):]))


def test_truncated_and_bit_flipped_snapshots_are_refused() -> None:
    data = encode_snapshot(rich_state().state, META)
    for cut in (1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, len(data) // 2, len(data) - 1):
        _loads_or_raises(data[:cut])
    rnd = random.Random(7)
    for _ in range(200):
        i = rnd.randrange(len(data))
        flipped = bytearray(data)
        flipped[i] ^= 1 << rnd.randrange(8)
        with pytest.raises(SnapshotFormatError):
            read_snapshot(bytes(flipped))


def test_check_file_streams_the_crc_of_what_a_leader_is_about_to_send() -> None:
    data = encode_snapshot(rich_state().state, META)
    check_file(io.BytesIO(data + b"entries follow"), snapshot_size(data[:HEADER_SIZE]))
    rnd = random.Random(8)
    for _ in range(100):  # past the magic (snapshot_size refuses those first) and the reserved field
        i = rnd.choice([8, 9, *range(12, len(data))])
        flipped = bytearray(data)
        flipped[i] ^= 1 << rnd.randrange(8)
        with pytest.raises(SnapshotFormatError):
            check_file(io.BytesIO(bytes(flipped)), snapshot_size(bytes(flipped[:HEADER_SIZE])))
    with pytest.raises(SnapshotFormatError, match="cut short"):
        check_file(io.BytesIO(data[:-5]), len(data))


def test_crafted_bodies_under_a_valid_checksum_build_only_broker_records() -> None:
    """A peer can send any bytes with a matching CRC: mutate the body, fix the
    checksum, and whatever loads holds nothing but the broker's records and
    plain values (no callable, no foreign class)."""
    data = encode_snapshot(rich_state().state, META)
    body = data[HEADER_SIZE:]
    rnd = random.Random(11)
    # (TopicTrie, _Node: an exchange's routing trie, derived from its bindings)
    allowed = (BrokerState, Exchange, Binding, TopicTrie, _Node, Queue, Message, Channel, Consumer, dict, list,
               tuple, str, bytes,
               int, float, bool, type(None), decimal.Decimal, datetime.datetime)
    loaded = 0
    for _ in range(300):
        b = bytearray(body)
        for _ in range(rnd.randrange(1, 4)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        try:
            state, _meta = read_snapshot(_reframe(bytes(b)))
        except SnapshotFormatError:
            continue
        loaded += 1
        _only(state, allowed, set())
    assert loaded < 300  # most are refused; those that load are checked above


def _only(v: object, allowed: tuple[type, ...], seen: set[int]) -> None:
    if id(v) in seen:
        return
    seen.add(id(v))
    if isinstance(v, PolicyIndex):
        # derived after the load: the policies read, with patterns compiled by RE2
        _only(v.plain(), allowed, seen)
        return
    if not isinstance(v, allowed) or callable(v):
        raise AssertionError(f"built a {type(v).__name__}")
    if isinstance(v, dict):
        for k, x in v.items():
            _only(k, allowed, seen)
            _only(x, allowed, seen)
    elif isinstance(v, list | tuple):
        for x in v:
            _only(x, allowed, seen)
    elif hasattr(type(v), "__slots__") and not isinstance(v, tuple):
        for name in type(v).__slots__:  # type: ignore[attr-defined]
            x = getattr(v, name, None)
            if name == "ready":
                x = list(x)
            elif name == "bands":
                x = {b: list(f) for b, f in x.items()}
            _only(x, allowed, seen)


def test_check_refuses_a_damaged_file_before_decoding() -> None:
    data = encode_snapshot(BrokerState(), META)
    assert check(data) == HEADER_SIZE
    with pytest.raises(SnapshotFormatError, match="checksum"):
        check(data[:-1] + bytes([data[-1] ^ 0x40]))


def test_raft_meta_is_plain() -> None:
    m = read_meta(encode_snapshot(BrokerState(), RaftMeta((b"x", 9, 2), (b"y", 8, 2), ("h:1",))))
    assert m == RaftMeta((b"x", 9, 2), (b"y", 8, 2), ("h:1",))


@pytest.mark.parametrize("col", [
    [], [7], [5, 5, 5, 9, 9, 12], [5, 3, 5, 7], [9, 9, 4, 4], [3, 3, 3, 2, 3],
])
def test_live_counts_of_packed_records_in_or_out_of_log_order(col: list[int]) -> None:
    """_count_packed counts a queue's records per Raft entry: in log order by
    runs (each run one value, runs rising), any other order one by one; both
    give the per-bucket counts of the plain fold."""
    from array import array

    r = _Reader(bytes(_HEADER.size), 0)
    r.logged = array("Q", sorted(set(col)))
    r._count_packed(array("q", col))
    want: dict[int, int] = {}
    for v in col:
        b = v >> BUCKET_SHIFT
        want[b] = want.get(b, 0) + 1
    assert r.live == want
