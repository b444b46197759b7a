"""The shim's journal (syncobj._Journal): compaction writes the remaining
records in one block, in pysyncobj's file format (a plain FileJournal reads
it back), and the meta storer syncs only term/vote changes."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from node.replication.raft.journal import FileJournal, FsyncMetaStorer, _Journal


def test_compaction_keeps_the_tail_readable_by_pysyncobj(tmp_path: Path) -> None:
    path = str(tmp_path / "raft.journal")
    j = FileJournal(path)
    j.__class__ = _Journal
    entries = [(os.urandom(1 + (i * 37) % 3000), i + 1, 1 + i // 50) for i in range(400)]
    for e in entries:
        j.add(*e)
    j.deleteEntriesTo(250)
    assert [j[i] for i in range(len(j))] == entries[250:]
    j.add(b"after", 401, 9)  # appends continue after the rewritten block
    j._destroy()
    back = FileJournal(path)
    assert [back[i] for i in range(len(back))] == [*entries[250:], (b"after", 401, 9)]
    back._destroy()


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
