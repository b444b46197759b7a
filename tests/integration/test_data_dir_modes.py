"""Issue 26 item 12: the data dir is private to the node (directories 0700,
files 0600): the journal, its meta file and the snapshot hold every message
body and the users' password hashes."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pika
import pytest

from tests.broker_proc import NodeProcess, node_metric, wait_for

pytestmark = pytest.mark.own_node


def loose_entries(root: Path) -> list[str]:
    """Every entry under root (itself included) that is not a 0700 dir or a 0600 file."""
    bad = []
    for dirpath, dirs, files in os.walk(root):
        for p in [Path(dirpath), *(Path(dirpath) / n for n in dirs + files)]:
            mode = p.lstat().st_mode
            want = 0o700 if stat.S_ISDIR(mode) else 0o600
            if stat.S_IMODE(mode) != want:
                bad.append(f"{p.relative_to(root.parent)} {stat.S_IMODE(mode):04o}")
    return bad


def test_journal_meta_and_snapshot_are_private_and_an_old_dir_is_tightened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)  # as an older build (or NodeProcess.start) left it, whatever the umask
    old = data / "left-by-an-older-build"
    old.write_bytes(b"x")
    old.chmod(0o644)
    node = NodeProcess(data, config="[raft]\ncompaction_min_entries = 40\n")
    try:
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.queue_declare("private", durable=True)
        ch.confirm_delivery()
        for i in range(120):  # one entry each: past compaction_min_entries, a snapshot
            ch.basic_publish("", "private", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: (node_metric(node, "snapshots_total") or 0) >= 1, timeout=30,
                 what="a snapshot")
        conn.close()
        names = {p.name for p in data.iterdir()}
        assert {"log", "raft.journal.meta", "raft.dump"} <= names, names
        assert list((data / "log").glob("*.seg")), list((data / "log").iterdir())
        assert loose_entries(data) == []
        assert "made private" in node.tail_log(200), node.tail_log()
    finally:
        node.kill9()
