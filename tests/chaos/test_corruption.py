"""The file-corruption actions (chaosmirrorq.corruption, issue 29): the bytes on disk
change exactly where the action records it (bit flips, truncation, a rolled-back
chunk), seeded; and one experiment end to end (a stopped follower's log segment
flipped under load: repaired from the leader, nothing lost or corrupted)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from chaosmirrorq import corruption, suite

from harness.process import ClusterNode
from tests.support.chaos_env import short_env


def _data_dir(tmp: Path) -> Path:
    d = tmp / "data"
    (d / "log").mkdir(parents=True)
    rnd = random.Random(7)
    for first in (1, 500):
        (d / "log" / f"{first:020d}.seg").write_bytes(rnd.randbytes(3000))
    (d / "log" / f"{1:020d}.seg.idx").write_bytes(rnd.randbytes(100))
    (d / "log" / "start").write_bytes(rnd.randbytes(22))
    (d / "raft.dump").write_bytes(rnd.randbytes(1000))
    (d / "raft.journal.meta").write_bytes(rnd.randbytes(60))
    return d


def test_each_kind_names_the_files_the_node_writes(tmp_path: Path) -> None:
    d = _data_dir(tmp_path)
    assert [p.name for p in corruption.files_of(d, "segment")] == [f"{1:020d}.seg", f"{500:020d}.seg"]
    assert [p.name for p in corruption.files_of(d, "index")] == [f"{1:020d}.seg.idx"]
    assert [p.name for p in corruption.files_of(d, "start")] == ["start"]
    assert [p.name for p in corruption.files_of(d, "snapshot")] == ["raft.dump"]
    assert [p.name for p in corruption.files_of(d, "meta")] == ["raft.journal.meta"]
    assert corruption.files_of(d, "lseg") == []
    with pytest.raises(ValueError):
        corruption.files_of(d, "journal")


def test_helix_regions_are_disjoint_and_seeded(tmp_path: Path) -> None:
    segs = corruption.files_of(_data_dir(tmp_path), "segment")
    picks = {r: {corruption.locate(segs, r, 3, random.Random(s)) for s in range(40)} for r in range(3)}
    # region r of 3 over 6,000 bytes laid end to end: [2000 r, 2000 (r + 1))
    for r, got in picks.items():
        for path, off in got:
            at = off + (3000 if path == segs[1] else 0)
            assert 2000 * r <= at < 2000 * (r + 1), (r, path.name, off)
    assert corruption.locate(segs, 1, 3, random.Random(5)) == corruption.locate(segs, 1, 3, random.Random(5))


def test_helix_meets_every_fault_once_stopped_and_once_running_one_member_at_a_time() -> None:
    plan = corruption.helix_plan(["n1", "n2", "n3"], ["bitflip", "truncate", "rollback"],
                                 ["stopped", "running"], 6)
    assert [nid for nid, _f, _m in plan] == ["n1", "n2", "n3", "n1", "n2", "n3"]
    assert sorted((f, m) for _n, f, m in plan) == sorted(
        (f, m) for f in ("bitflip", "truncate", "rollback") for m in ("stopped", "running"))
    experiment = json.loads((Path(suite.__file__).parents[1] / "experiments" / "corrupt-helix.json").read_text())
    (helix,) = [a for a in experiment["method"] if a["name"] == "helix"]
    assert set(helix["provider"]["arguments"]["modes"].split(",")) == {"stopped", "running"}
    with pytest.raises(ValueError):
        corruption.helix(modes="paused")


def test_bit_flips_change_exactly_the_recorded_bits(tmp_path: Path) -> None:
    seg = corruption.files_of(_data_dir(tmp_path), "segment")[0]
    before = seg.read_bytes()
    flips = corruption.flip_bits(seg, 100, 8, random.Random(3))
    after = seg.read_bytes()
    assert [f["offset"] for f in flips] == list(range(100, 108))
    diff = {i: before[i] ^ after[i] for i in range(len(before)) if before[i] != after[i]}
    assert diff == {f["offset"]: 1 << f["bit"] for f in flips}
    assert all(before[f["offset"]] == f["before"] and after[f["offset"]] == f["after"] for f in flips)
    assert corruption.flip_bits(seg, len(after) - 2, 8, random.Random(3))[-1]["offset"] == len(after) - 1


def test_truncation_and_a_rolled_back_chunk(tmp_path: Path) -> None:
    d = _data_dir(tmp_path)
    snap = d / "raft.dump"
    old = corruption.read_chunk(snap, 200, 300)
    newer = random.Random(9).randbytes(1000)
    snap.write_bytes(newer)  # the node rewrote the file since the copy
    got = corruption.write_chunk(snap, 200, old)
    now = snap.read_bytes()
    assert now[200:500] == old and now[:200] == newer[:200] and now[500:] == newer[500:]
    assert got["changed"] == sum(a != b for a, b in zip(old, newer[200:500], strict=True)) > 250
    seg = corruption.files_of(d, "segment")[1]
    assert corruption.truncate_file(seg, 1234) == {"size_before": 3000, "size_after": 1234}
    assert seg.stat().st_size == 1234


def test_a_rollback_into_a_released_segment_lands_in_the_newest_one(tmp_path: Path) -> None:
    d = _data_dir(tmp_path)
    node = ClusterNode("n9", d)  # (not started: only its data dir is used)
    gone = d / "log" / f"{3:020d}.seg"
    old = (gone, 2990, random.Random(1).randbytes(100))  # copied before the node released it
    got = corruption._damage(node, "segment", "rollback", random.Random(0), 0, 1, 8, old)
    newest = d / "log" / f"{500:020d}.seg"
    assert got["file"] == str(newest) and got["misdirected_from"] == str(gone)
    assert got["offset"] == 2900 and newest.read_bytes()[2900:] == old[2]


# 1-3 minutes: make test keeps test_log_integrity.py's flipped bits in a follower's log
# (repaired from the leader, never served) and the corruption helpers' tests above
@pytest.mark.long
def test_corrupt_stopped_follower_segment_end_to_end(tmp_path: Path) -> None:
    row = suite.run_one("corrupt-follower-segment", tmp_path, short_env(), timeout=300)
    base = tmp_path / "corrupt-follower-segment"
    print(f"\n{suite.fmt_table([row])}\n{row['reasons']}")
    journal = json.loads((base / "journal.json").read_text())
    (act,) = [r for r in journal["run"] if r["activity"]["name"] == "corrupt-follower-segment"]
    assert act["status"] == "succeeded", act.get("exception")
    out = act["output"]
    flips = out["damage"]["flips"]
    assert flips and all(f["before"] ^ f["after"] == 1 << f["bit"] for f in flips)
    # what the node said at its start: the damaged file by name, then repaired from the leader
    assert out["start"]["outcome"] == "repaired", out["start"]
    assert any(Path(out["damage"]["file"]).name in line for line in out["start"]["lines"]), out["start"]
    assert row["confirmed"] and row["confirmed"] > 100, row
    assert row["lost"] == 0 and row["corrupted"] == 0 and row["duplicates"] is not None, row
    assert row["verdict"] == "PASS", row["reasons"]
    faults = [json.loads(line) for line in (base / "history" / "faults.jsonl").read_text().splitlines()]
    assert [f["name"].split()[0] for f in faults] == ["corrupt-bitflip-segment-stopped"]
