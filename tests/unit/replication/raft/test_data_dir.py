"""The data dir's modes (issue 26 item 12): directories 0700, files 0600, ours only."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from node.replication.raft.data_dir import make_private_dir, open_private, tighten, wanted_mode


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_wanted_mode() -> None:
    assert wanted_mode(stat.S_IFDIR | 0o755) == 0o700
    assert wanted_mode(stat.S_IFDIR | 0o700) is None
    assert wanted_mode(stat.S_IFREG | 0o644) == 0o600
    assert wanted_mode(stat.S_IFREG | 0o600) is None
    assert wanted_mode(stat.S_IFLNK | 0o777) is None  # never followed


def test_make_private_dir_creates_and_tightens(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh" / "data"
    make_private_dir(str(fresh))
    assert mode(fresh) == 0o700
    old = tmp_path / "old"
    (old / "sub").mkdir(parents=True)
    old.chmod(0o755)
    (old / "sub").chmod(0o2775)
    (old / "raft.journal").write_bytes(b"j")
    (old / "raft.journal").chmod(0o664)
    (old / "link").symlink_to("/etc/hostname")
    make_private_dir(str(old))
    assert [mode(old), mode(old / "sub"), mode(old / "raft.journal")] == [0o700, 0o700, 0o600]
    assert tighten(str(old)).changed == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_entries_of_another_user_are_left_alone(tmp_path: Path) -> None:
    f = tmp_path / "theirs"
    f.write_bytes(b"x")
    f.chmod(0o644)
    os.chown(f, 65534, -1)
    done = tighten(str(tmp_path))
    assert mode(f) == 0o644 and done.foreign == [f"{f} (0644)"]


def test_open_private_resets_an_existing_files_mode(tmp_path: Path) -> None:
    f = tmp_path / "raft.dump.part"
    f.write_bytes(b"old")
    f.chmod(0o644)
    with os.fdopen(open_private(str(f)), "wb") as out:
        out.write(b"new")
    assert f.read_bytes() == b"new" and mode(f) == 0o600
