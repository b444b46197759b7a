"""Sealed segments' index files (raft/log/index.py): a reopen takes a sealed
segment's record positions from its index file once one CRC over the
segment's bytes matches, and walks the segment record by record (finding
damage exactly as before) when the index file or the segment does not match."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from node.replication.raft.log import LogDamaged, SegmentLog
from node.replication.raft.log.segment import HEADER_SIZE
from tests.support.segment_log import entries as _all
from tests.support.segment_log import fill as _fill
from tests.support.segment_log import flip as _flip
from tests.support.segment_log import open_log as _open


def _segs(tmp: Path) -> list[Path]:
    return sorted((tmp / "log").glob("*.seg"))


def _idx(tmp: Path) -> list[Path]:
    return sorted((tmp / "log").glob("*.idx"))




def test_reopen_walks_only_the_last_segment(tmp_path: Path) -> None:
    j = _open(tmp_path)
    entries = _fill(j, 300)
    j.flush()
    j._destroy()
    segs = _segs(tmp_path)
    assert len(segs) > 5
    assert [p.name for p in _idx(tmp_path)] == [p.name + ".idx" for p in segs[:-1]]
    k = _open(tmp_path)
    assert k.walked == 1 and _all(k) == entries and k.recovered == []
    assert k.term_at(150) == entries[149][2]
    k.add(b"next", 301, 9)  # appends go on in the last segment, which has no index file
    k._destroy()
    m = _open(tmp_path)
    assert _all(m) == [*entries, (b"next", 301, 9)] and m.walked == 1
    m._destroy()


def test_a_damaged_index_file_is_ignored_and_written_again(tmp_path: Path) -> None:
    j = _open(tmp_path)
    entries = _fill(j, 300)
    j._destroy()
    idx = _idx(tmp_path)[2]
    _flip(idx, 40)  # inside its offsets array
    k = _open(tmp_path)
    assert k.walked == 2 and _all(k) == entries and k.recovered == []
    k._destroy()
    m = _open(tmp_path)
    assert m.walked == 1 and _all(m) == entries
    m._destroy()


def test_a_flipped_bit_in_an_indexed_segment_is_found_at_open(tmp_path: Path) -> None:
    """The index file's arrays are right; the segment's CRC is not: the
    segment is walked, and the damaged record and everything after leave."""
    j = _open(tmp_path)
    entries = _fill(j, 300)
    j._destroy()
    victim = _segs(tmp_path)[3]
    assert Path(str(victim) + ".idx").exists()
    first = int(victim.name.split(".")[0])
    data = bytearray(victim.read_bytes())
    end = len(data.rstrip(b"\0"))
    _flip(victim, end - 3)  # inside the payload of its last record
    k = _open(tmp_path)
    last_good = len(_all(k))
    assert first <= last_good < first + 100 and _all(k) == entries[:last_good]
    assert len(k.recovered) == 1 and str(victim) in k.recovered[0]
    assert not Path(str(victim) + ".idx").exists()  # cut: appended to again, no index
    k._destroy()


def test_an_index_file_from_before_a_rewrite_is_not_trusted(tmp_path: Path) -> None:
    """A conflict with the leader cuts a sealed segment and appends other
    entries to it: an index file of its old bytes (as if its removal was lost
    in a crash) fails the CRC, and the segment is walked."""
    j = _open(tmp_path)
    entries = _fill(j, 300)
    middle = _segs(tmp_path)[2]
    saved = Path(str(middle) + ".idx").read_bytes()
    first = int(middle.name.split(".")[0])
    j.deleteEntriesFrom(first + 1 - 1)  # position first: keeps index `first` and before
    assert not Path(str(middle) + ".idx").exists()
    new = [(b"rewritten %d" % i, i, 99) for i in range(first + 1, first + 4)]
    for e in new:
        j.add(*e)
    j._destroy()
    Path(str(middle) + ".idx").write_bytes(saved)
    k = _open(tmp_path)
    assert _all(k) == entries[:first] + new and k.recovered == []
    k._destroy()


def test_imported_and_retained_segments_keep_index_files_until_released(tmp_path: Path) -> None:
    live = {42}
    j = _open(tmp_path, retain=lambda first, last: any(first <= i <= last for i in live))
    entries = _fill(j, 300)
    j.deleteEntriesTo(250)  # segments below 251 leave Raft's part; the one holding 42 is retained
    donor = _open(tmp_path / "donor")
    records = [_rec(donor, e) for e in _fill(donor, 5, first=1000, seed=7)]
    donor._destroy()
    j.import_records(records)
    j._destroy()
    assert len(list((tmp_path / "log").glob("*.lseg.idx"))) == 1
    retained = [p for p in _segs(tmp_path) if int(p.name.split(".")[0]) <= 42]
    assert len(retained) == 1 and Path(str(retained[0]) + ".idx").exists()
    k = _open(tmp_path, retain=lambda first, last: any(first <= i <= last for i in live))
    assert k.walked == 1  # the last segment only: the retained and the imported ones by index
    assert k.read(42, 0, 5) == entries[41][0][:5] and k.has(1002)
    live.clear()
    k.release()
    k._destroy()
    names = sorted(p.name for p in (tmp_path / "log").iterdir() if p.suffix in (".seg", ".lseg", ".idx"))
    assert not Path(str(retained[0]) + ".idx").exists()  # released with its segment
    for n in names:  # every index file belongs to a segment still there
        assert not n.endswith(".idx") or n[:-4] in names, names


def test_index_files_of_removed_segments_are_removed_at_open(tmp_path: Path) -> None:
    j = _open(tmp_path)
    _fill(j, 300)
    j._destroy()
    stray = tmp_path / "log" / "00000000000000999999.seg.idx"
    shutil.copy(_idx(tmp_path)[0], stray)
    (tmp_path / "log" / "00000000000000000001.seg.idx.tmp").write_bytes(b"cut short")
    k = _open(tmp_path)
    k._destroy()
    assert not stray.exists() and not (tmp_path / "log" / "00000000000000000001.seg.idx.tmp").exists()


def _rec(j: SegmentLog, e: tuple[bytes, int, int]) -> bytes:
    return j.handle(e[1]).record()


def test_truncated_indexed_segment_is_walked(tmp_path: Path) -> None:
    j = _open(tmp_path)
    entries = _fill(j, 300)
    j._destroy()
    victim = _segs(tmp_path)[1]
    first = int(victim.name.split(".")[0])
    os.truncate(victim, HEADER_SIZE + 100)  # inside its first record
    k = _open(tmp_path)
    assert _all(k) == entries[:first - 1] and len(k.recovered) == 1
    k._destroy()


def test_segments_past_the_open_budget_are_checked_by_the_scrub(tmp_path: Path) -> None:
    j = _open(tmp_path)
    entries = _fill(j, 300)
    j._destroy()
    k = _open(tmp_path, verify_bytes=1)  # the newest sealed segment is checked, the older ones not
    sealed = len(_segs(tmp_path)) - 1
    assert len(k.unverified) == sealed - 1 and k.walked == 1 and _all(k) == entries
    damaged: list[str] = []
    k.scrub(threading.Event(), 0.0, damaged.append)
    assert damaged == [] and k.unverified == [] and all(not s.unverified for s in k.hidden + k._segs)
    k._destroy()


def test_the_scrub_finds_damage_the_open_did_not_check(tmp_path: Path) -> None:
    """A flipped bit in an old sealed segment: the fast open does not see it,
    a read of that record refuses it, the scrub reports the segment and removes
    its index file, and the next open walks it and drops the damage."""
    j = _open(tmp_path)
    entries = _fill(j, 300)
    j._destroy()
    victim = _segs(tmp_path)[1]
    first = int(victim.name.split(".")[0])
    _flip(victim, HEADER_SIZE + 24 + 5)  # the payload of its first record
    k = _open(tmp_path, verify_bytes=1)
    assert k.recovered == [] and len(k) == 300
    with pytest.raises(LogDamaged):
        k.read(first, 0, 1)
    damaged: list[str] = []
    k.scrub(threading.Event(), 0.0, damaged.append)
    assert damaged == [str(victim)] and not Path(str(victim) + ".idx").exists()
    k._destroy()
    m = _open(tmp_path, verify_bytes=1)
    assert _all(m) == entries[:first - 1] and len(m.recovered) == 1 and str(victim) in m.recovered[0]
    m._destroy()


def test_a_stopped_scrub_reports_nothing(tmp_path: Path) -> None:
    j = _open(tmp_path)
    _fill(j, 300)
    j._destroy()
    _flip(_segs(tmp_path)[1], HEADER_SIZE + 24 + 5)
    k = _open(tmp_path, verify_bytes=1)
    stop = threading.Event()
    stop.set()
    damaged: list[str] = []
    k.scrub(stop, 1.0, damaged.append)
    assert damaged == [] and k.unverified
    k._destroy()
