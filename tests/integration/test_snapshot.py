"""Snapshots (log compaction) are written by a forked child and installed
atomically: messages confirmed before, during and after one survive kill -9."""
from __future__ import annotations

import pickle
import subprocess
from pathlib import Path

import pika
import pytest

from tests.broker_proc import REPO, NodeProcess, node_metric, wait_for

pytestmark = pytest.mark.own_node


def test_s19_confirmed_messages_survive_kill9_across_snapshots(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", config="[raft]\ncompaction_min_entries = 40\n")
    try:
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.queue_declare("snap", durable=True)
        ch.confirm_delivery()
        n = 600
        for i in range(n):  # one publish per batch: many Raft entries, several snapshots
            ch.basic_publish("", "snap", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: (node_metric(node, "snapshots_total") or 0) >= 2, timeout=30,
                 what="at least two snapshots")
        assert (node.data_dir / "raft.dump").read_bytes()[:8] == b"\x89MQSNAP\n"  # ours, no pickle
        conn.close()
        node.kill9()
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        got = []
        while True:
            method, _props, body = ch.basic_get("snap", auto_ack=True)
            if method is None:
                break
            got.append(body)
        assert got == [b"m%d" % i for i in range(n)], "every confirmed message, in order"
        conn.close()
    finally:
        node.kill9()


def test_journal_bytes_force_a_snapshot_and_bodies_survive_kill9(tmp_path: Path) -> None:
    """Issue 11: compaction by entry count alone let a journal of big random
    bodies grow to GBs (mapped into memory); past compaction_max_bytes a
    snapshot is forced. Random 64 KiB bodies, few entries, one forced
    snapshot, kill -9, every body back intact."""
    import os
    node = NodeProcess(tmp_path / "data", config="[raft]\ncompaction_min_entries = 100000\n"
                                                 "compaction_max_bytes = 2000000\ncompaction_min_gap = 1\n")
    try:
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.queue_declare("bigsnap", durable=True)
        ch.confirm_delivery()
        bodies = [os.urandom(64 * 1024) for _ in range(60)]  # ~3.8 MB: past the 2 MB bound
        for body in bodies:
            ch.basic_publish("", "bigsnap", body, pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: (node_metric(node, "forced_compactions_total") or 0) >= 1
                 and (node_metric(node, "snapshots_total") or 0) >= 1, timeout=30,
                 what="a snapshot forced by journal bytes")
        conn.close()
        node.kill9()
        node.start()
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        got = []
        while (msg := ch.basic_get("bigsnap", auto_ack=True))[0] is not None:
            got.append(msg[2])
        assert got == bodies, "every confirmed body, intact and in order"
        conn.close()
    finally:
        node.kill9()


# ----------------------------------------- a snapshot file this build cannot load (issue 26)
class _Boom:
    """What an older build's pickled snapshot could hold: a call made on load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os
        return (os.system, (f"touch {self.marker}",))


def _publish(node: NodeProcess, queue: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    for i in range(n):  # one publish per batch: one Raft entry each
        ch.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2, headers={"i": i}))
    conn.close()


def _drain(node: NodeProcess, queue: str) -> list[tuple[bytes, object]]:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    got = []
    while (msg := ch.basic_get(queue, auto_ack=True))[0] is not None:
        got.append((msg[2], msg[1].headers))
    conn.close()
    return got


def _refused(node: NodeProcess) -> str:
    """Start the node expecting it to refuse: its exit code 3 and what it logged."""
    done = subprocess.run(node.argv(), cwd=str(REPO), capture_output=True, timeout=60, check=False)
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 3, out
    assert "Traceback" not in out, out
    return out


def test_a_damaged_or_pickled_snapshot_is_never_loaded_and_the_node_says_what_to_do(tmp_path: Path) -> None:
    """The node's own raft.dump, bit-flipped or replaced by a pickle (as an
    older build wrote it), after the journal was compacted past what only the
    snapshot held: the node refuses to start, naming the problem and the way
    out, and the pickle is never loaded (its call would touch the marker)."""
    marker = tmp_path / "pwned"
    node = NodeProcess(tmp_path / "data", config="[raft]\ncompaction_min_entries = 40\n")
    try:
        node.start()
        _publish(node, "snap", 150)
        wait_for(lambda: (node_metric(node, "snapshots_total") or 0) >= 1, timeout=30, what="a snapshot")
        node.stop()
        dump = node.data_dir / "raft.dump"
        good = dump.read_bytes()
        assert good[:8] == b"\x89MQSNAP\n", "our format, not a pickle"
        damaged = bytearray(good)
        damaged[len(good) // 2] ^= 0x01
        dump.write_bytes(bytes(damaged))
        out = _refused(node)
        assert "CRITICAL" in out and "checksum mismatch" in out and "Restore the data directory from a backup" in out
        dump.write_bytes(pickle.dumps((_Boom(marker), None), protocol=5))
        assert "pickled snapshot of an older build" in _refused(node)
        assert not marker.exists()
        dump.write_bytes(good)  # the operator puts the good one back: it starts, everything there
        node.start()
        assert [b for b, _h in _drain(node, "snap")] == [b"m%d" % i for i in range(150)]
    finally:
        node.kill9()


def test_an_old_pickled_snapshot_is_set_aside_when_the_journal_holds_everything(tmp_path: Path) -> None:
    """No compaction yet: the journal holds every entry from index 1, so a
    pickled raft.dump (an older build's) is moved aside unread and the state
    is rebuilt from the journal."""
    marker = tmp_path / "pwned"
    node = NodeProcess(tmp_path / "data", config="[raft]\ncompaction_min_entries = 100000\n"
                                                 "compaction_min_time = 100000\n")
    try:
        node.start()
        _publish(node, "journal-only", 30)
        node.stop()
        dump = node.data_dir / "raft.dump"
        assert not dump.exists()
        dump.write_bytes(pickle.dumps((_Boom(marker), None), protocol=5))
        node.start()
        assert not dump.exists() and (node.data_dir / "raft.dump.pickle").exists()
        assert "the state is rebuilt from it" in node.log_path.read_text(errors="replace")
        assert _drain(node, "journal-only") == [(b"m%d" % i, {"i": i}) for i in range(30)]
        assert not marker.exists()
    finally:
        node.kill9()
