"""The Raft log's meta file (term, vote, commit index): synced only on term/vote
changes, in our codec, an older build's pickle read without unpickling (the
log itself: test_segment_log.py)."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from node.replication.codec import encode
from node.replication.raft.log import SegmentLog
from node.replication.raft.log.meta import (
    META_MAGIC,
    META_MAGIC_V1,
    FsyncMetaStorer,
    decode_meta,
    legacy_meta,
)


def test_meta_syncs_only_term_and_vote_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    m = FsyncMetaStorer(str(tmp_path / "raft.journal.meta"))
    m.storeMeta({"currentTerm": 1, "votedForNodeId": None, "raftCommitIndex": 1})
    first = len(synced)
    assert first >= 1  # a new term: file and directory synced
    m.storeMeta({"currentTerm": 1, "votedForNodeId": None, "raftCommitIndex": 900})
    assert len(synced) == first  # commit index only: no sync
    m.storeMeta({"currentTerm": 2, "votedForNodeId": "n2", "raftCommitIndex": 900})
    assert len(synced) > first
    assert m.getMeta()["raftCommitIndex"] == 900


# ------------------------------------------- the meta file without pickle (issue 26)
def test_meta_is_written_in_our_codec_and_read_back(tmp_path: Path) -> None:
    m = FsyncMetaStorer(str(tmp_path / "raft.journal.meta"))
    meta = {"currentTerm": 7, "votedForNodeId": "10.0.0.2:25672", "raftCommitIndex": 12345}
    m.storeMeta(meta)
    data = (tmp_path / "raft.journal.meta").read_bytes()
    assert data.startswith(META_MAGIC) and not data.startswith(b"\x80")
    assert m.getMeta() == meta
    assert FsyncMetaStorer(str(tmp_path / "absent")).getMeta() == {}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_an_older_builds_pickled_meta_is_read_without_unpickling(tmp_path: Path, protocol: int) -> None:
    """What pysyncobj's MetaStorer wrote (pickle), parsed opcode by opcode."""
    for meta in ({"currentTerm": 3, "votedForNodeId": None, "raftCommitIndex": 1 << 40},
                 {"currentTerm": 300, "votedForNodeId": "n2:1", "raftCommitIndex": 5}, {}):
        path = tmp_path / f"meta{protocol}"
        path.write_bytes(pickle.dumps(meta, protocol=protocol))
        assert FsyncMetaStorer(str(path)).getMeta() == meta
        assert legacy_meta(pickle.dumps(meta, protocol=protocol)) == meta


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/mirrorq-meta-pwned",))


def test_a_meta_pickle_that_builds_anything_else_is_refused_unrun(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "raft.journal.meta"
    for evil in (pickle.dumps({"currentTerm": _Boom()}), pickle.dumps(_Boom()), b"cos\nsystem\n(S'id'\ntR.",
                 pickle.dumps({"currentTerm": [1]}), pickle.dumps({"other": 1}), b"\x80\x05garbage", b""):
        with pytest.raises(ValueError):
            decode_meta(evil)
        path.write_bytes(evil)
        assert FsyncMetaStorer(str(path)).getMeta() == {}  # as pysyncobj did, but said:
    assert "journal meta" in caplog.text and "unreadable" in caplog.text
    assert not os.path.exists("/tmp/mirrorq-meta-pwned")


def test_the_segment_log_reads_its_meta_through_our_storer(tmp_path: Path) -> None:
    path = str(tmp_path / "raft.journal.meta")
    FsyncMetaStorer(path).storeMeta({"currentTerm": 9, "votedForNodeId": "x:1", "raftCommitIndex": 4})
    j = SegmentLog(str(tmp_path / "log"), path)
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (9, "x:1", 1)  # empty log: clamped
    j._destroy()


def test_every_flipped_bit_in_the_meta_file_is_detected(tmp_path: Path) -> None:
    # chaos corruption (issue 29): a flip in the unchecked file read back as term 7e16
    path = tmp_path / "raft.journal.meta"
    meta = {"currentTerm": 7, "votedForNodeId": "10.0.0.2:25672", "raftCommitIndex": 12345}
    FsyncMetaStorer(str(path)).storeMeta(meta)
    data = path.read_bytes()
    assert decode_meta(data) == meta
    for bit in range(len(data) * 8):
        bad = bytearray(data)
        bad[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(ValueError):
            decode_meta(bytes(bad))


def test_a_meta_file_of_the_previous_version_without_checksum_is_read(tmp_path: Path) -> None:
    meta = {"currentTerm": 9, "votedForNodeId": None, "raftCommitIndex": 77}
    assert decode_meta(META_MAGIC_V1 + encode(meta)) == meta


def test_a_log_whose_meta_file_is_damaged_says_so(tmp_path: Path) -> None:
    """(the shim then takes no votes from the member until a leader has repaired it)"""
    meta = tmp_path / "raft.journal.meta"
    j = SegmentLog(str(tmp_path / "log"), str(meta))
    j.setCurrentTerm(5, "n2")
    j._destroy()
    assert not SegmentLog(str(tmp_path / "log"), str(meta)).meta_damaged
    data = bytearray(meta.read_bytes())
    data[len(META_MAGIC) + 2] ^= 0x04
    meta.write_bytes(bytes(data))
    k = SegmentLog(str(tmp_path / "log"), str(meta))
    assert k.meta_damaged and k.getCurrentTerm() == 0
    k._destroy()


def test_a_commit_index_alone_is_fdatasynced_before_it_replaces_the_meta_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It replaces the term/vote file, and a later fsync of the directory (a
    snapshot's) makes the new name durable: with unsynced bytes behind it, a
    power loss left an empty meta file, term 0, no vote (harness.lazyfs,
    tests/chaos/test_lazyfs.py). Its own bytes only: no fsync, no directory sync."""
    path = tmp_path / "raft.journal.meta"
    m = FsyncMetaStorer(str(path))
    m.storeMeta({"currentTerm": 3, "votedForNodeId": "n2", "raftCommitIndex": 10})
    datasynced: list[bytes] = []
    fsynced: list[int] = []
    real = os.fdatasync
    tmp = tmp_path / "raft.journal.meta.tmp"  # (the fd is write-only: read what it synced by name)
    monkeypatch.setattr(os, "fdatasync", lambda fd: (real(fd), datasynced.append(tmp.read_bytes())))
    monkeypatch.setattr(os, "fsync", lambda fd: fsynced.append(fd))
    m.storeMeta({"currentTerm": 3, "votedForNodeId": "n2", "raftCommitIndex": 900})
    assert fsynced == []
    assert datasynced == [path.read_bytes()]  # what is in place was synced, all of it
    assert FsyncMetaStorer(str(path)).getMeta()["raftCommitIndex"] == 900
