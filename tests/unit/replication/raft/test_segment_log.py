"""The segmented, checksummed Raft log (raft/log/): pysyncobj's journal
interface, roll-over, truncation at both ends, recovery from torn tails and
damage, retention of segments below a snapshot, and the upgrade from
pysyncobj's FileJournal format."""
from __future__ import annotations

import os
import random
import tracemalloc
from pathlib import Path

import pytest
from crc32c import crc32c

from node.replication.raft.log.segment import HEADER_SIZE, LogDamaged
from node.replication.raft.log.upgrade import old_records, open_log
from tests.support.segment_log import SEG
from tests.support.segment_log import entries as _all
from tests.support.segment_log import fill as _fill
from tests.support.segment_log import flip as _flip
from tests.support.segment_log import open_log as _open


def test_append_read_slices_and_reopen(tmp_path: Path) -> None:
    j = _open(tmp_path, cache_bytes=10_000)  # a small cache: most reads are preads
    entries = _fill(j, 300)
    assert len(j) == 300 and j[0] == entries[0] and j[-1] == entries[-1] and j[1] == entries[1]
    assert j[10:20] == entries[10:20] and j[290:] == entries[290:]
    assert len(os.listdir(tmp_path / "log")) > 5  # rolled over (64 KiB segments)
    assert j.read(50, 3, 10) == entries[49][0][3:13]
    j.flush()
    j._destroy()
    k = _open(tmp_path)
    assert _all(k) == entries and k.recovered == []
    k.add(b"next", 301, 9)
    assert k[-1] == (b"next", 301, 9)
    with pytest.raises(ValueError):
        k.add(b"gap", 303, 9)
    k._destroy()


def test_delete_entries_from_spans_segments_and_survives_reopen(tmp_path: Path) -> None:
    j = _open(tmp_path)
    entries = _fill(j, 200)
    j.deleteEntriesFrom(37)  # position 37: index 38 on
    assert _all(j) == entries[:37]
    j.add(b"new", 38, 50)
    j.flush()
    j._destroy()
    k = _open(tmp_path)  # nothing of the old suffix comes back
    assert _all(k) == [*entries[:37], (b"new", 38, 50)] and k.recovered == []
    k._destroy()


def test_delete_entries_to_drops_whole_segments_and_keeps_the_start(tmp_path: Path) -> None:
    j = _open(tmp_path)
    entries = _fill(j, 300)
    before = len(os.listdir(tmp_path / "log"))
    j.deleteEntriesTo(250)
    assert _all(j) == entries[250:] and j[0][1] == 251
    assert len(os.listdir(tmp_path / "log")) < before
    with pytest.raises(IndexError):
        j.read(10, 0, 1)  # below the start, not retained: gone
    j._destroy()
    k = _open(tmp_path)
    assert _all(k) == entries[250:]  # starts at 251 although its first segment starts lower
    k._destroy()


def test_clear_then_snapshot_entries(tmp_path: Path) -> None:
    j = _open(tmp_path)
    _fill(j, 100)
    j.clear()
    assert len(j) == 0
    j.add(b"s0", 5000, 7)
    j.add(b"s1", 5001, 7)
    j._destroy()
    k = _open(tmp_path)
    assert _all(k) == [(b"s0", 5000, 7), (b"s1", 5001, 7)]
    k._destroy()


def test_retained_segments_stay_readable_until_released(tmp_path: Path) -> None:
    live = {42}  # a live message lives in entry 42
    j = _open(tmp_path, retain=lambda first, last: any(first <= i <= last for i in live))
    entries = _fill(j, 300)
    j.deleteEntriesTo(250)
    assert j[0][1] == 251
    assert j.read(42, 0, 5) == entries[41][0][:5]  # hidden from Raft, still readable
    with pytest.raises(IndexError):
        j.read(150, 0, 1)  # no live message there: deleted
    assert len(j.hidden) == 1
    live.clear()
    j.release()
    assert j.hidden == []
    with pytest.raises(IndexError):
        j.read(42, 0, 1)
    j._destroy()


def _seg_files(tmp: Path) -> list[Path]:
    return sorted((tmp / "log").glob("*.seg"))


def test_torn_tail_is_truncated_silently(tmp_path: Path) -> None:
    j = _open(tmp_path)
    entries = _fill(j, 50)
    j.flush()
    last = _seg_files(tmp_path)[-1]
    j._destroy()
    # a write cut by a crash: the last record's second half never reached the disk
    size = last.stat().st_size
    data = bytearray(last.read_bytes())
    end = len(data.rstrip(b"\0"))
    cut = end - len(entries[-1][0]) // 2 - 1
    data[cut:] = bytes(size - cut)
    last.write_bytes(bytes(data))
    k = _open(tmp_path, repairable=False)
    assert _all(k) == entries[:-1] and k.recovered == []
    k._destroy()




def test_a_flipped_bit_drops_that_record_and_everything_after(tmp_path: Path) -> None:
    j = _open(tmp_path)
    entries = _fill(j, 300)
    j.flush()
    files = _seg_files(tmp_path)
    j._destroy()
    victim = files[len(files) // 2]
    first = int(victim.name.split(".")[0])
    _flip(victim, HEADER_SIZE + 24 + 5)  # inside the payload of the segment's first record
    k = _open(tmp_path)
    assert _all(k) == entries[:first - 1]
    assert len(k.recovered) == 1 and str(victim) in k.recovered[0] and f"offset {HEADER_SIZE}" in k.recovered[0]
    assert all(f.name < victim.name for f in _seg_files(tmp_path))  # it (now empty) and the later ones are gone
    k._destroy()


def test_single_node_refuses_damage_below_its_commit_index(tmp_path: Path) -> None:
    j = _open(tmp_path)
    _fill(j, 300)
    j.setRaftCommitIndex(290)
    j._destroy()  # stores the meta
    victim = _seg_files(tmp_path)[1]
    _flip(victim, HEADER_SIZE + 3)  # the crc field of its first record
    with pytest.raises(LogDamaged) as err:
        _open(tmp_path, repairable=False)
    assert str(victim) in str(err.value) and f"offset {HEADER_SIZE}" in str(err.value)
    assert "\n" not in str(err.value)
    assert victim.exists()  # nothing dropped: the operator decides


def _set_header_version(seg: Path, version: int, fix_crc: bool) -> None:
    data = bytearray(seg.read_bytes())
    data[8] = version
    if fix_crc:  # as a newer build writes it
        data[24:28] = crc32c(bytes(data[:24])).to_bytes(4, "little")
    seg.write_bytes(bytes(data))


def test_a_newer_format_is_refused_not_dropped(tmp_path: Path) -> None:
    j = _open(tmp_path)
    _fill(j, 10)
    j._destroy()
    _set_header_version(_seg_files(tmp_path)[0], 99, fix_crc=True)
    with pytest.raises(LogDamaged, match="version 99"):
        _open(tmp_path)


def test_a_flipped_bit_in_the_header_version_is_damage_not_a_newer_format(tmp_path: Path) -> None:
    # chaos corruption (issue 29): a member refused to start for good ("format version 3")
    j = _open(tmp_path)
    written = _fill(j, 200)
    j._destroy()
    segs = _seg_files(tmp_path)
    assert len(segs) > 1
    _set_header_version(segs[-1], 3, fix_crc=False)
    j = _open(tmp_path)  # a member: dropped from there on, re-fetched from the leader
    assert j.recovered and "bad segment header" in j.recovered[0]
    assert _all(j) == written[:len(j)] and 0 < len(j) < len(written)


def test_enospc_via_file_size_limit_appends_nothing(tmp_path: Path) -> None:
    """A failed write (here EFBIG from RLIMIT_FSIZE, as ENOSPC on a full disk)
    leaves nothing appended; appends continue once it passes."""
    import resource
    import signal
    j = _open(tmp_path)
    j.RESERVE = 4096
    _fill(j, 3)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    try:
        with pytest.raises(OSError):
            for i in range(4, 100):
                j.add(os.urandom(3000), i, 1)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    n = len(j)
    j.add(b"after", n + 1, 1)
    j.flush()
    j._destroy()
    k = _open(tmp_path)
    assert len(k) == n + 1 and k[-1] == (b"after", n + 1, 1) and k.recovered == []
    k._destroy()


def test_heap_does_not_grow_with_entries(tmp_path: Path) -> None:
    j = _open(tmp_path, cache_bytes=1 << 20)
    j.segment_bytes = 64 << 20
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    body = os.urandom(1024)
    for i in range(1, 50_001):
        j.add(body, i, 1)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    j._destroy()
    # 50k x 1 KiB = 51 MB of entries; the index is 12 B each, the cache 1 MiB
    assert grown < 3 << 20, grown


def test_upgrade_from_pysyncobj_journal(tmp_path: Path) -> None:
    from pysyncobj.journal import FileJournal  # writes the old format, as main did
    old = FileJournal(str(tmp_path / "raft.journal"))
    entries = [(os.urandom(1 + i * 7), i + 1, 1 + i // 10) for i in range(100)]
    for e in entries:
        old.add(*e)
    old.setCurrentTerm(11, "n2")
    old.flush()
    old._destroy()
    assert list(old_records(str(tmp_path / "raft.journal"))) == entries
    j = open_log(str(tmp_path), repairable=False, segment_bytes=SEG)
    assert _all(j) == entries and j.getCurrentTerm() == 11 and j.getVotedForNodeId() == "n2"
    assert not (tmp_path / "raft.journal").exists() and not (tmp_path / "log.upgrade").exists()
    j._destroy()


def _log_bytes(tmp: Path) -> int:
    return sum(p.stat().st_size for p in (tmp / "log").iterdir() if p.suffix in (".seg", ".lseg"))


def test_mostly_dead_retained_segments_are_compacted_into_their_live_records(tmp_path: Path) -> None:
    """Issue 27 item 4: one entry in 100 stays live (messages never settled)
    below the snapshot: without compaction every segment stays on disk;
    with it their live records move into sparse .lseg segments, the rest is
    freed, every live entry reads back the same (also after a reopen), and
    a damaged record is never copied."""
    live: set[int] = set()
    granule = 16

    def retain(first: int, last: int) -> bool:
        return any(first <= i <= last for i in live)

    j = _open(tmp_path, retain=retain, granule=granule)
    j.COMPACT_MIN_BYTES = 16 * 1024
    rnd = random.Random(3)
    entries = [(rnd.randbytes(rnd.randrange(100, 300)), i, 1) for i in range(1, 3001)]
    for e in entries:
        j.add(*e)
    live.update(i for i in range(1, 3001) if i % 100 == 3)
    before = _log_bytes(tmp_path)
    j.deleteEntriesTo(len(j) - 1)  # a snapshot: everything below the last entry leaves Raft's part
    bad = j.handle(1503)  # one live record damaged: its segment is left as it is, never copied
    with open(bad.seg.path, "r+b") as f:
        f.seek(bad.start + bad.size - 5)
        f.write(b"\xff\x00\xff")
    live.discard(1503)
    live.add(1503)
    for _ in range(200):  # one segment per call, as the tick does every second
        if not j.compact():
            break
    assert j.compactions >= 5
    raft_part = sum(os.path.getsize(s.path) for s in j._segs)  # the last segment: Raft's
    after = _log_bytes(tmp_path) - raft_part - os.path.getsize(bad.seg.path)
    assert after < before // 5, (before, after)  # ~16%: the live entries' 16-entry blocks
    assert [s for s in j.hidden if s.idxs is None] == [bad.seg]  # only the damaged one not compacted
    with pytest.raises(LogDamaged):
        j.read(1503, 0, 1)
    live.discard(1503)
    for e in entries:
        if e[1] in live:
            assert j.read(e[1], 0, len(e[0])) == e[0]
    assert not j.has(entries[50][1])  # a dead one (not in a live block) is gone
    assert j.missing([3, 51, 103, 203, 2999]) == [51]  # what a snapshot's check asks
    j._destroy()
    again = _open(tmp_path, retain=retain, granule=granule)
    assert again.recovered  # the damaged segment is cut at its bad record (the snapshot check repairs)
    for e in entries:
        if e[1] in live and not bad.seg.first <= e[1] <= bad.seg.last:
            assert again.read(e[1], 0, len(e[0])) == e[0]
    live.clear()
    again.release()  # nothing live: every retained segment goes
    assert not list((tmp_path / "log").glob("*.lseg"))
    again._destroy()


def test_the_entry_cache_keeps_only_what_was_appended_since_the_last_aging(tmp_path: Path) -> None:
    """A drained or idle node does not keep up to cache_bytes of old entries:
    each age_cache() call (every 10 s on the raft thread) drops the entries
    appended before the previous one; what is read after comes from disk, intact."""
    j = _open(tmp_path)
    written = _fill(j, 200)
    assert j._cache_bytes > 0 and len(j._cache) == 200
    assert j.age_cache() == 0  # the first call only marks where the log ends
    more = _fill(j, 20, first=201, seed=2)
    assert j.age_cache() == 200  # entries 1..200 are older than the last mark
    assert sorted(j._cache) == list(range(201, 221))
    assert j._cache_bytes == sum(len(e[0]) for e in more)
    assert j.age_cache() == 20 and not j._cache and j._cache_bytes == 0
    assert _all(j) == written + more  # read back from the segments
    j._destroy()
