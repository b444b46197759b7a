"""The snapshot files of the raft shim (issue 26 items 1 and 12): a snapshot
from the leader is received into a file that is 0600 from its first chunk and
is read in full before it replaces ours; our own snapshot is read at start,
and one this build cannot load is never applied."""
from __future__ import annotations

import logging
import os
import pickle
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode
from pysyncobj.serializer import Serializer

from node.replication.machine import BrokerState
from node.replication.message_store import PayloadCache, load, make_loc, split_loc
from node.replication.raft.log import SegmentLog, encode_record
from node.replication.raft.shim import RaftShim
from node.replication.raft.snapshot import SnapshotFormatError, SnapshotReceiver, encode_snapshot
from node.replication.raft.snapshot.raft_data import pysyncobj_raft_data, raft_meta
from node.replication.raft.snapshot.transfer import ENTRIES_MAGIC, ENTRIES_VERSION
from tests.support.machine import Harness, chan, pub, qdecl
from tests.support.snapshot import META, assert_same_state

CHUNK = 4096


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # what a process usually runs with: files 0644 unless told otherwise
    try:
        yield
    finally:
        os.umask(old)


def _state() -> BrokerState:
    h = Harness()
    c = h.open(chan())
    h.run(qdecl(c, "q", durable=True))
    h.run(*[pub(c, "q", os.urandom(1000), props={"headers": {"i": i}}) for i in range(60)])
    return h.state


class _Owner:
    def __init__(self) -> None:
        self.restored: list[tuple[BrokerState, int]] = []

    def restore_state(self, state: BrokerState, index: int) -> None:
        self.restored.append((state, index))


def _shim(data_dir: Path) -> tuple[RaftShim, _Owner]:
    shim = RaftShim.__new__(RaftShim)
    owner = _Owner()
    shim.owner = owner  # type: ignore[assignment]
    shim.data_dir = str(data_dir)
    shim._dump_path = str(data_dir / "raft.dump")
    shim._so = None
    shim._loaded = None
    shim._from_leader = False
    shim.installed_snapshots = shim.damaged_snapshots = 0
    return shim, owner


def _journal(tmp: Path, first: int) -> SegmentLog:
    """A log whose first entry is `first` (entries before it went into a snapshot)."""
    j = SegmentLog(str(tmp / "log"), str(tmp / "meta"))
    for i in range(first, first + 3):
        j.add(b"\x00", i, 1)
    j.setRaftCommitIndex(first + 2)
    return j


def _receiver(shim: RaftShim) -> Any:
    r = SnapshotReceiver(shim._dump_path, CHUNK, False, None, None, None)
    r.accept = shim._accept_snapshot
    return r


def _send(receiver: Any, data: bytes, during: Any = None) -> bool:
    chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] + [b""]
    done = False
    for i, chunk in enumerate(chunks):
        done = receiver.setTransmissionData([chunk, i == 0, i == len(chunks) - 1])
        if during is not None and i < len(chunks) - 1:
            during()
    return done


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_a_snapshot_from_the_leader_is_private_from_its_first_chunk(tmp_path: Path, umask_022: None) -> None:
    shim, owner = _shim(tmp_path)
    data = encode_snapshot(_state(), META)
    tmp = tmp_path / "raft.dump.1.tmp"
    modes: list[int] = []
    assert _send(_receiver(shim), data, during=lambda: modes.append(mode(tmp))) is True
    assert len(modes) > 10 and set(modes) == {0o600}, "never readable by others while it arrives"
    dump = tmp_path / "raft.dump"
    assert dump.read_bytes() == data and mode(dump) == 0o600 and not tmp.exists()
    # pysyncobj's own receiver, for the record: the file it writes while a snapshot arrives is 0644
    plain = Serializer(str(tmp_path / "plain.dump"), CHUNK, False, None, None, None)
    plain.setTransmissionData([data[:CHUNK], True, False])
    assert mode(tmp_path / "plain.dump.1.tmp") == 0o644


def test_the_received_snapshot_is_the_one_installed(tmp_path: Path) -> None:
    shim, owner = _shim(tmp_path)
    state = _state()
    data = encode_snapshot(state, META)
    assert _send(_receiver(shim), data)
    shim._so = type("SO", (), {"raftLastApplied": 17})()  # type: ignore[assignment]
    last, prev, cluster = shim._deserialize(shim._dump_path)
    assert (last, prev) == (META.last, META.prev)
    assert all(type(n) is TCPNode for n in cluster) and sorted(n.address for n in cluster) == list(META.members)
    (restored, index), = owner.restored
    assert index == META.prev[1] and shim.installed_snapshots == 1
    assert_same_state(state, restored)


def test_a_damaged_snapshot_from_the_leader_is_refused_and_ours_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shim, owner = _shim(tmp_path)
    ours = encode_snapshot(BrokerState(), META)
    dump = tmp_path / "raft.dump"
    dump.write_bytes(ours)
    data = bytearray(encode_snapshot(_state(), META))
    data[len(data) // 2] ^= 0x10
    with caplog.at_level(logging.ERROR):
        assert _send(_receiver(shim), bytes(data)) is False
    assert "refusing the snapshot the leader sent (checksum mismatch" in caplog.text
    assert dump.read_bytes() == ours and not (tmp_path / "raft.dump.1.tmp").exists()
    assert shim.damaged_snapshots == 1 and shim._loaded is None and owner.restored == []
    # a pickle, as an older build (or an attacker) would send it: refused unread
    assert _send(_receiver(shim), pickle.dumps({"x": 1}, protocol=5)) is False
    assert shim.damaged_snapshots == 2 and dump.read_bytes() == ours


def test_chunks_that_are_not_bytes_or_come_without_a_first_one_are_dropped(tmp_path: Path) -> None:
    shim, _owner = _shim(tmp_path)
    r = _receiver(shim)
    assert r.setTransmissionData(None) is False
    assert r.setTransmissionData(["text", True, True]) is False
    assert r.setTransmissionData([b"x", False, True]) is False  # no first chunk: nothing open
    assert not (tmp_path / "raft.dump").exists()


def test_raft_data_goes_in_and_out_as_plain_values() -> None:
    cluster = {TCPNode("10.0.0.2:25672"), TCPNode("10.0.0.1:25672")}
    meta = raft_meta(((b"\x01", 9, 2), (memoryview(b"\x01"), 8, 2), cluster))
    assert meta.members == ("10.0.0.1:25672", "10.0.0.2:25672") and type(meta.prev[0]) is bytes
    last, prev, nodes = pysyncobj_raft_data(meta)
    assert set(nodes) == cluster


# ----------------------------------------------------------- our own, at start
def test_our_own_snapshot_is_read_before_pysyncobj_starts(tmp_path: Path) -> None:
    shim, owner = _shim(tmp_path)
    journal = _journal(tmp_path, 500)
    shim.load_own_snapshot(journal, False)  # none: nothing to do
    assert shim._loaded is None
    state = _state()
    (tmp_path / "raft.dump").write_bytes(encode_snapshot(state, META))
    shim.load_own_snapshot(journal, False)
    assert shim._loaded is not None and shim._loaded[0] == shim._dump_path
    shim._so = type("SO", (), {"raftLastApplied": 1})()  # type: ignore[assignment]  # pysyncobj's start value
    shim._deserialize(shim._dump_path)
    # our own snapshot: not counted nor logged as the leader's
    assert_same_state(state, owner.restored[0][0]) and shim.installed_snapshots == 0


class _Boom:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("touch /tmp/mirrorq-snapshot-pwned",))


@pytest.mark.parametrize("kind", ["pickle", "damaged", "version"])
def test_a_snapshot_this_build_cannot_load_stops_the_start_when_the_journal_cannot_replace_it(
        tmp_path: Path, kind: str) -> None:
    shim, owner = _shim(tmp_path)
    good = encode_snapshot(_state(), META)
    bad = {"pickle": pickle.dumps((_Boom(), None), protocol=5),
           "damaged": good[:100] + bytes([good[100] ^ 1]) + good[101:],
           "version": good[:8] + b"\x09\x00" + good[10:]}[kind]
    dump = tmp_path / "raft.dump"
    dump.write_bytes(bad)
    journal = _journal(tmp_path, 812)
    with pytest.raises(SnapshotFormatError) as err:
        shim.load_own_snapshot(journal, repairable=False)
    text = str(err.value)
    assert {"pickle": "pickled snapshot of an older build", "damaged": "checksum mismatch",
            "version": "format version 9"}[kind] in text
    assert "journal starts after entries only the snapshot held" in text and "no peers" in text
    assert dump.read_bytes() == bad and shim._loaded is None and owner.restored == []
    assert journal.first_index() == 812 and len(journal) == 3  # nothing forgotten
    assert not os.path.exists("/tmp/mirrorq-snapshot-pwned")


@pytest.mark.parametrize("kind", ["damaged", "entries-missing"])
def test_a_member_that_cannot_load_its_snapshot_forgets_its_log_and_awaits_the_leader(
        tmp_path: Path, kind: str) -> None:
    """Issue 27 item 5: a member of a cluster whose snapshot is damaged, or
    whose log lacks entries the snapshot's messages are in, starts over empty
    (the snapshot kept aside, term and vote kept) and votes for nobody until
    the leader has repaired it up to its old commit index."""
    shim, owner = _shim(tmp_path)
    shim.repair_until = 0
    journal = _journal(tmp_path, 812)
    journal.setCurrentTerm(7, "peer:1")
    state = BrokerState()
    q = _state().queues
    state.queues = q
    for m in next(iter(v for v in q.values() if v.ready)).ready:
        m.loc, m.body, m.props = (400 << 64) | (0 << 32) | 1, None, None  # in entry 400: compacted away
    good = encode_snapshot(state, META)
    dump = tmp_path / "raft.dump"
    dump.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:] if kind == "damaged" else good)
    shim.load_own_snapshot(journal, repairable=True)
    assert shim._loaded is None and owner.restored == [] and not dump.exists()
    assert (tmp_path / "raft.dump.refused").exists()
    assert len(journal) == 0 and journal.getRaftCommitIndex() == 0 and shim.repair_until == 814
    assert journal.getCurrentTerm() == 7 and journal.getVotedForNodeId() == "peer:1"
    assert not list((tmp_path / "log").glob("*.seg"))


def test_a_snapshot_this_build_cannot_load_is_moved_aside_when_the_journal_holds_everything(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shim, _owner = _shim(tmp_path)
    dump = tmp_path / "raft.dump"
    dump.write_bytes(pickle.dumps((_Boom(), None), protocol=5))
    with caplog.at_level(logging.WARNING):
        shim.load_own_snapshot(_journal(tmp_path, 1), False)
    assert not dump.exists() and (tmp_path / "raft.dump.pickle").exists()
    assert "the state is rebuilt from it" in caplog.text and shim._loaded is None
    assert not os.path.exists("/tmp/mirrorq-snapshot-pwned")


def _transfer(leader_dump: Path, leader_log: SegmentLog, follower: RaftShim) -> int:
    """Send the leader's snapshot file (and the log entries it needs) chunk
    by chunk through pysyncobj's two Serializer calls; returns the chunks."""
    sender = SnapshotReceiver(str(leader_dump), CHUNK, False, None, None, None)
    sender.journal = leader_log
    receiver = _receiver(follower)
    n = 0
    while True:
        data = sender.getTransmissionData("n2")
        assert data is not None
        n += 1
        done = receiver.setTransmissionData(data)
        if data[2]:
            assert done, "the last chunk installs it"
            return n
        assert not done


@pytest.mark.parametrize("logged", [False, True])
def test_a_snapshot_travels_with_the_log_entries_its_messages_are_in(tmp_path: Path, logged: bool) -> None:
    """Issue 27 item 3: a snapshot of messages in the log names their entries;
    the leader sends them after the file, each checked; the follower stores
    them in a sparse segment and keeps the snapshot alone as its dump. A
    snapshot that needs no entry (CI: a fresh member of an empty cluster was
    refused it, 'bytes after a snapshot that needs no log entries') installs
    the same way."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    leader_log = SegmentLog(str(tmp_path / "a" / "log"), str(tmp_path / "a" / "meta"))
    state = _state()
    bodies: list[bytes] = []
    if logged:
        q = next(v for v in state.queues.values() if v.ready)
        for k, m in enumerate(q.ready):
            idx = 100 + 3 * k  # with gaps, as live entries are
            body = os.urandom(500 + k)
            for filler in range(idx - 2 if k else 1, idx):  # entries no message is in
                leader_log.add(b"x", filler, 1)
            leader_log.add(b"N" + body, idx, 1)
            m.loc, m.props, m.body, m.size = make_loc(idx, 0, 1), None, None, len(body)
            bodies.append(body)
    dump = tmp_path / "a" / "raft.dump"
    snapshot = encode_snapshot(state, META)
    dump.write_bytes(snapshot)
    follower, owner = _shim(tmp_path / "b")
    follower_log = SegmentLog(str(tmp_path / "b" / "log"), str(tmp_path / "b" / "meta"))
    follower._so = type("SO", (), {"_SyncObj__raftLog": follower_log})()  # type: ignore[assignment]
    chunks = _transfer(dump, leader_log, follower)
    assert (tmp_path / "b" / "raft.dump").read_bytes() == snapshot  # the snapshot alone
    imported = list((tmp_path / "b" / "log").glob("*.lseg"))
    if not logged:
        assert imported == []
        return
    assert chunks > len(snapshot) // CHUNK + 1 and len(imported) == 1
    q = next(v for v in state.queues.values() if v.ready)
    for m, body in zip(q.ready, bodies, strict=True):
        idx, at, n = split_loc(m.loc)
        assert load((follower_log.handle(idx), at, n, m.size), None, None, PayloadCache()) == ({}, body)
    assert not follower_log.has(101)  # only the entries the messages are in came


def test_a_damaged_entry_in_a_snapshot_transfer_is_refused(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    state = _state()
    q = next(v for v in state.queues.values() if v.ready)
    m = q.ready[0]
    m.loc, m.props, m.body, m.size = make_loc(7, 0, 1), None, None, 3
    snapshot = encode_snapshot(state, META)
    record = bytearray(encode_record(b"Nabc", 7, 1))
    record[-1] ^= 1  # a bit flipped in transit
    follower, _owner = _shim(tmp_path / "b")
    follower_log = SegmentLog(str(tmp_path / "b" / "log"), str(tmp_path / "b" / "meta"))
    follower._so = type("SO", (), {"_SyncObj__raftLog": follower_log})()  # type: ignore[assignment]
    section = struct.pack("<8sHHQ", ENTRIES_MAGIC, ENTRIES_VERSION, 0, 1) + bytes(record)
    assert not _send(_receiver(follower), snapshot + section)
    assert follower.damaged_snapshots == 1 and not (tmp_path / "b" / "raft.dump").exists()
    assert not list((tmp_path / "b" / "log").glob("*.lseg"))


def test_a_snapshot_whose_header_announces_more_than_arrived_is_refused_unread(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # issue 42 item 10: the header's u64 body length sized the read (f.read(2**62):
    # OverflowError, not OSError, out of the raft thread); now checked against the file
    shim, _owner = _shim(tmp_path)
    data = bytearray(encode_snapshot(_state(), META))
    struct.pack_into("<Q", data, 12, 1 << 62)  # the header's body length (<8sHHQI)
    with caplog.at_level(logging.ERROR):
        assert _send(_receiver(shim), bytes(data)) is False
    assert "refusing the snapshot the leader sent (a snapshot of" in caplog.text
    assert shim.damaged_snapshots == 1 and not (tmp_path / "raft.dump").exists()


def test_an_entry_whose_length_overruns_the_transfer_is_refused_unread(tmp_path: Path) -> None:
    # a record's u32 length (4 GiB) sized the read of its payload; now checked against the file
    (tmp_path / "b").mkdir()
    state = _state()
    q = next(v for v in state.queues.values() if v.ready)
    m = q.ready[0]
    m.loc, m.props, m.body, m.size = make_loc(7, 0, 1), None, None, 3
    snapshot = encode_snapshot(state, META)
    record = bytearray(encode_record(b"Nabc", 7, 1))
    struct.pack_into("<I", record, 0, 0xFFFFFFF0)  # the record's length
    follower, _owner = _shim(tmp_path / "b")
    follower_log = SegmentLog(str(tmp_path / "b" / "log"), str(tmp_path / "b" / "meta"))
    follower._so = type("SO", (), {"_SyncObj__raftLog": follower_log})()  # type: ignore[assignment]
    section = struct.pack("<8sHHQ", ENTRIES_MAGIC, ENTRIES_VERSION, 0, 1) + bytes(record)
    assert not _send(_receiver(follower), snapshot + section)
    assert follower.damaged_snapshots == 1 and not (tmp_path / "b" / "raft.dump").exists()


def test_fits_refuses_a_length_past_what_arrived() -> None:
    from node.replication.raft.snapshot.transfer import fits
    assert fits(10, 10, "x") == 10
    for length, available in ((11, 10), (-1, 10), (1 << 64, 1 << 20)):
        with pytest.raises(SnapshotFormatError):
            fits(length, available, "x")
