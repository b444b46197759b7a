"""File corruption on a minority (issue 29): bit flips, truncation and rolled-back
chunks in one kind of file of one node's data dir, the node stopped or running.

File kinds (node/replication/raft: log/segment.py, log/index.py, log/start.py,
snapshot/, log/meta.py): `segment` log/*.seg, `lseg` log/*.lseg (entries a leader's snapshot
brought), `index` log/*.idx, `start` log/start, `snapshot` raft.dump, `meta`
raft.journal.meta (term, vote, commit index).

- `corrupt_file(target, kind, fault, mode, ...)`: `fault` is `bitflip` (`bits`
  bits, each in its own byte from a seeded offset), `truncate` (to a seeded length)
  or `rollback` (a chunk copied now is written back over the file `rollback_after`
  seconds later: a lost or misdirected write). `mode` `stopped`: SIGTERM, damage,
  start; `running`: damage under the live process, watch it `observe` s (a node
  that exits on a checksum failure is started again, as its supervisor would),
  then SIGKILL and start it so its start meets whatever is still damaged. Then: healthy
  (repaired from its peers) or refused, with the log line naming file and offset.
- `helix(kinds, faults, rounds, regions, modes)`: round i damages member i mod N in
  region i mod `regions` of the concatenated files of its kind (different nodes,
  different regions), stopped or running by turns (`modes`); each round waits until
  healthy before the next, so damage is never on more than one node (a minority) at
  once.
- `replace_damaged_member(kind, fault)`: damage a stopped follower, leave it down,
  RemoveMember it and AddMember a fresh node (membership under damage).
- `damage_leader_snapshot_then_add_member()`: bits flipped in the running leader's
  raft.dump, then AddMember: the new member needs that snapshot.

Every touched byte is recorded (file, offset, bits, before/after), in the result
and in the fault's name window (faults.jsonl). Rollback of the experiment:
`heal_all` (starts a node left down).
"""
from __future__ import annotations

import os
import random
import re
import time
import zlib
from pathlib import Path
from typing import Any

from chaosmirrorq import actions
from chaosmirrorq.fault import STATE, as_bool, as_float, cluster, pick, record_fault, wait_healthy
from harness.process import ClusterNode, port_open

__all__ = ["corrupt_file", "helix", "helix_plan", "replace_damaged_member", "damage_leader_snapshot_then_add_member", "files_of", "locate", "flip_bits",
           "truncate_file", "read_chunk", "write_chunk", "KINDS", "FAULTS"]

KINDS = ("segment", "lseg", "index", "start", "snapshot", "meta")
FAULTS = ("bitflip", "truncate", "rollback")
# the node's line when damage found at its start (or on a read) makes it stop
_REFUSAL = re.compile(r"raft log damaged|mirrorq: error|cannot rebuild its state")


def files_of(data_dir: Path, kind: str) -> list[Path]:
    """The non-empty files of `kind` in a node's data dir, in name order."""
    log = data_dir / "log"
    found: list[Path]
    if kind == "segment":
        found = list(log.glob("*.seg"))
    elif kind == "lseg":
        found = list(log.glob("*.lseg"))
    elif kind == "index":
        found = list(log.glob("*.idx"))
    elif kind == "start":
        found = [log / "start"]
    elif kind == "snapshot":
        found = [data_dir / "raft.dump"]
    elif kind == "meta":
        found = [data_dir / "raft.journal.meta"]
    else:
        raise ValueError(f"unknown file kind {kind!r} (one of {', '.join(KINDS)})")
    return sorted(p for p in found if p.is_file() and p.stat().st_size > 0)


def locate(files: list[Path], region: int, regions: int, rng: random.Random,
           sizes: list[int] | None = None) -> tuple[Path, int]:
    """A seeded (file, offset) inside region `region` of `regions` equal parts of
    the files' bytes (`sizes`, default their sizes) laid end to end (the helix:
    other regions for other nodes)."""
    sizes = sizes if sizes is not None else [p.stat().st_size for p in files]
    total = sum(sizes)
    if total == 0:
        raise RuntimeError("nothing to damage: the files are empty")
    lo, hi = total * region // regions, max(total * (region + 1) // regions, total * region // regions + 1)
    at = rng.randrange(lo, hi)
    for p, n in zip(files, sizes, strict=True):
        if at < n:
            return p, at
        at -= n
    raise AssertionError("offset past the files")  # (unreachable: at < total)


def flip_bits(path: Path, offset: int, bits: int, rng: random.Random) -> list[dict[str, int]]:
    """Flip one seeded bit in each of `bits` bytes from `offset` on (fewer at the
    file's end); fsync'd. Returns what changed: offset, bit, byte before and after."""
    out = []
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        for off in range(offset, min(offset + bits, size)):
            bit = rng.randrange(8)
            (before,) = os.pread(fd, 1, off)
            after = before ^ (1 << bit)
            os.pwrite(fd, bytes([after]), off)
            out.append({"offset": off, "bit": bit, "before": before, "after": after})
        os.fsync(fd)
    finally:
        os.close(fd)
    return out


def truncate_file(path: Path, length: int) -> dict[str, int]:
    size = path.stat().st_size
    os.truncate(path, length)
    return {"size_before": size, "size_after": length}


def read_chunk(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def write_chunk(path: Path, offset: int, data: bytes) -> dict[str, Any]:
    """Write `data` back at `offset` (an old copy: the write that replaced it is
    lost); fsync'd. Returns how many bytes it changed."""
    fd = os.open(path, os.O_RDWR)
    try:
        now = os.pread(fd, len(data), offset)
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    changed = sum(a != b for a, b in zip(now, data, strict=False)) + abs(len(data) - len(now))
    return {"offset": offset, "bytes": len(data), "changed": changed,
            "crc_before": zlib.crc32(now), "crc_after": zlib.crc32(data)}


def _written_end(path: Path) -> int:
    """Where the data of a preallocated segment ends (the rest is zeros)."""
    data = path.read_bytes()
    return len(data.rstrip(b"\0"))


def _damage(node: ClusterNode, kind: str, fault: str, rng: random.Random, region: int, regions: int,
            bits: int, old: tuple[Path, int, bytes] | None) -> dict[str, Any]:
    if fault == "rollback":
        assert old is not None
        path, offset, data = old
        out: dict[str, Any] = {"file": str(path), "fault": fault}
        if not path.exists():  # released meanwhile (a segment below a snapshot): a misdirected write
            files = files_of(node.data_dir, kind)
            if not files:
                raise RuntimeError(f"{path} is gone and {node.node_id} has no other {kind} file")
            path = files[-1]
            offset = min(offset, max(path.stat().st_size - len(data), 0))
            out.update(file=str(path), misdirected_from=str(old[0]))
        return {**out, **write_chunk(path, offset, data)}
    files = files_of(node.data_dir, kind)
    if not files:
        raise RuntimeError(f"{node.node_id} has no {kind} file to damage")
    # a segment's preallocated zeros are not data: aim at its records
    sizes = [_written_end(p) for p in files] if kind in ("segment", "lseg") else None
    path, offset = locate(files, region, regions, rng, sizes)
    if fault == "bitflip":
        return {"file": str(path), "fault": fault, "offset": offset, "flips": flip_bits(path, offset, bits, rng)}
    if fault == "truncate":
        return {"file": str(path), "fault": fault, "offset": offset, **truncate_file(path, offset)}
    raise ValueError(f"unknown fault {fault!r} (one of {', '.join(FAULTS)})")


def _chunk_to_roll_back(node: ClusterNode, kind: str, size: int, rng: random.Random) -> tuple[Path, int, bytes]:
    """A chunk that later writes will change: a segment's bytes at and after its
    written end (records appended there are what the rollback loses), or a
    seeded chunk of a file that is rewritten whole (snapshot, meta, start)."""
    files = files_of(node.data_dir, kind)
    if not files:
        raise RuntimeError(f"{node.node_id} has no {kind} file to roll back")
    if kind in ("segment", "lseg"):
        path = files[-1]
        offset = max(_written_end(path) - size // 2, 0)
    else:
        path = files[-1]
        offset = rng.randrange(max(path.stat().st_size - size, 0) + 1)
    return path, offset, read_chunk(path, offset, size)


def _log_since(node: ClusterNode, mark: int) -> str:
    with open(node.log_path, "rb") as f:
        f.seek(mark)
        return f.read().decode(errors="replace")


def _log_size(node: ClusterNode) -> int:
    try:
        return node.log_path.stat().st_size
    except FileNotFoundError:
        return 0


def _start_and_judge(node: ClusterNode, mark: int, timeout: float = 90.0) -> dict[str, Any]:
    """Start `node` and wait until it serves (then: repaired, once healthy) or exits
    (refused: its log line, which must name the file)."""
    node.start(wait=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not node.alive():
            lines = [ln for ln in _log_since(node, mark).splitlines() if _REFUSAL.search(ln)]
            return {"outcome": "refused", "exit": node.proc and node.proc.returncode, "lines": lines[-3:]}
        if port_open(node.amqp_port, node.host):
            break
        time.sleep(0.05)
    else:
        return {"outcome": "hung", "log": node.tail_log(12)}
    healthy = wait_healthy()
    repaired = [ln for ln in _log_since(node, mark).splitlines() if re.search(r"damaged|not loaded|unreadable", ln)]
    return {"outcome": "repaired" if healthy else "unhealthy", "lines": repaired[-3:]}


def _after_refusal(node: ClusterNode, damage: dict[str, Any], judged: dict[str, Any]) -> None:
    """A refusal must name the damaged file (and its offset, where the log is
    concerned); then the operator's remedy: an empty data dir, refilled by the
    leader."""
    text = "\n".join(judged.get("lines") or [])
    name = os.path.basename(str(damage.get("file", "")))
    if name not in text:
        raise RuntimeError(f"{node.node_id} refused to start without naming {name}: {judged}")
    stale = node.data_dir.with_name(node.data_dir.name + f".refused-{int(time.time())}")
    os.replace(node.data_dir, stale)
    judged["data_dir_kept_as"] = str(stale)
    judged["after_wipe"] = _start_and_judge(node, _log_size(node))


def corrupt_file(target: str = "follower", kind: str = "segment", fault: str = "bitflip",
                 mode: str = "stopped", bits: int = 8, region: int = 0, regions: int = 1,
                 seed: int | None = None, chunk_bytes: int = 65536, rollback_after: float = 3.0,
                 observe: float = 5.0, restart: bool = True) -> dict[str, Any]:
    """Damage one `kind` file of `target` (see the module doc); record the fault
    window until the cluster is healthy again. restart=False (stopped mode): the
    node is left down with its damaged files (the window stays open until
    heal_all or replace_damaged_member)."""
    if fault not in FAULTS or mode not in ("stopped", "running") or kind not in KINDS:
        raise ValueError(f"fault {fault!r} mode {mode!r} kind {kind!r}")
    rng = random.Random(None if seed in (None, "") else int(seed))  # type: ignore[arg-type]
    node = (rng.choice(sorted(cluster().followers(timeout=30), key=lambda n: n.node_id))
            if target == "follower" else pick(target))  # (the seed picks the follower too)
    name = f"corrupt-{fault}-{kind}-{mode} {node.node_id}"
    t0 = time.time()
    out: dict[str, Any] = {"node": node.node_id, "kind": kind, "fault": fault, "mode": mode,
                           "fault_name": name, "start_ts": t0}
    old = None
    if fault == "rollback":
        old = _chunk_to_roll_back(node, kind, int(chunk_bytes), rng)
        out["copied"] = {"file": str(old[0]), "offset": old[1], "bytes": len(old[2])}
        time.sleep(as_float(rollback_after))  # the node writes on over it meanwhile
    if fault != "rollback" and not files_of(node.data_dir, kind):
        raise RuntimeError(f"{node.node_id} has no {kind} file to damage")
    mark = _log_size(node)
    if mode == "stopped":
        node.stop()
        try:
            out["damage"] = _damage(node, kind, fault, rng, int(region), int(regions), int(bits), old)
        except Exception:
            node.start(wait=True, timeout=60)  # (nothing damaged: the file went away meanwhile)
            raise
        if not as_bool(restart):
            STATE.setdefault("open_faults", {})[node.node_id] = (name, t0)
            return out
    else:
        out["damage"] = _damage(node, kind, fault, rng, int(region), int(regions), int(bits), old)
        end = time.monotonic() + as_float(observe)
        while time.monotonic() < end and node.alive():
            time.sleep(0.1)
        out["exited_while_running"] = None if node.alive() else node.proc and node.proc.returncode
        # a crash, not a stop: a clean stop's snapshot may release the damaged segment unread
        node.kill9()  # (a no-op when it exited on the damage)
    out["file_left_at_start"] = os.path.exists(out["damage"]["file"])  # (or released meanwhile)
    judged = _start_and_judge(node, mark)
    if judged["outcome"] == "refused":
        _after_refusal(node, out["damage"], judged)
    out["start"] = judged
    healthy = wait_healthy()
    record_fault(name, t0, time.time())
    out["healthy_after"] = healthy
    if not healthy or judged.get("outcome") == "hung":
        raise RuntimeError(f"{node.node_id} after {name}: {judged}")
    return out


def helix_plan(members: list[str], faults: list[str], modes: list[str],
               rounds: int) -> list[tuple[str, str, str]]:
    """Round i: (member i mod N, fault i mod F, mode i mod M) (the kind is the i-th
    of the list, or the next one the member has): with 3 faults and 2 modes, six
    rounds meet every fault once stopped and once running."""
    return [(members[i % len(members)], faults[i % len(faults)], modes[i % len(modes)])
            for i in range(rounds)]


def helix(kinds: str = "segment,index,snapshot,meta", faults: str = "bitflip,truncate", rounds: int = 3,
          regions: int = 3, bits: int = 8, seed: int | None = None, interval: float = 1.0,
          modes: str = "stopped") -> list[dict[str, Any]]:
    """`rounds` corruptions, round i on member i mod N (in id order), region i mod
    `regions`, kind, fault and mode (stopped, running) cycling through their lists;
    one node at a time (each round waits until healthy). A member that has no file of
    the kind (no snapshot yet) gets the next kind."""
    kind_list = [k for k in str(kinds).split(",") if k]
    fault_list = [f for f in str(faults).split(",") if f]
    mode_list = [m for m in str(modes).split(",") if m]
    if not kind_list or not fault_list or not mode_list or set(mode_list) - {"stopped", "running"}:
        raise ValueError(f"helix: kinds {kinds!r}, faults {faults!r}, modes {modes!r}")
    base = 0 if seed in (None, "") else int(seed)  # type: ignore[arg-type]
    members = sorted(cluster().nodes, key=lambda n: n.node_id)
    plan = helix_plan([n.node_id for n in members], fault_list, mode_list, int(rounds))
    out = []
    for i, (nid, fault, mode) in enumerate(plan):
        if i:
            time.sleep(as_float(interval))
        node = next(n for n in cluster().nodes if n.node_id == nid)
        for j in range(len(kind_list)):
            kind = kind_list[(i + j) % len(kind_list)]
            if files_of(node.data_dir, kind):
                break
        else:
            raise RuntimeError(f"{node.node_id} has none of the files {kind_list}")
        out.append(corrupt_file(node.node_id, kind, fault, mode, bits=bits,
                                region=i % int(regions), regions=regions, seed=base + i))
    return out


def replace_damaged_member(kind: str = "segment", fault: str = "bitflip", seed: int | None = None) -> dict[str, Any]:
    """Damage a stopped follower's `kind` files and leave it down; RemoveMember it,
    AddMember a fresh node (a replacement), wait until healthy."""
    damaged = corrupt_file("follower", kind, fault, "stopped", seed=seed, restart=False)
    nid = damaged["node"]
    removed = actions.remove_member(nid)
    STATE.get("open_faults", {}).pop(nid, None)
    added = actions.add_member()
    record_fault(damaged["fault_name"], damaged["start_ts"], time.time())
    return {"damaged": damaged, "removed": removed, "added": added}


def damage_leader_snapshot_then_add_member(bits: int = 8, seed: int | None = None,
                                           timeout: float = 60.0) -> dict[str, Any]:
    """Flip bits in the running leader's snapshot file (waiting up to `timeout` s for
    one), then AddMember a fresh node: it needs that snapshot. The leader checks the
    file before sending and writes a new one; the member catches up."""
    rng = random.Random(None if seed in (None, "") else int(seed))  # type: ignore[arg-type]
    leader = pick("leader")
    dump = leader.data_dir / "raft.dump"
    deadline = time.monotonic() + as_float(timeout)
    while not dump.exists() or (leader.data_dir / "raft.dump.part").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{leader.node_id} wrote no snapshot within {timeout} s")
        time.sleep(0.1)
    mark = _log_size(leader)
    t0 = time.time()
    name = f"corrupt-bitflip-snapshot-leader {leader.node_id}"
    damage = {"file": str(dump), "flips": flip_bits(dump, rng.randrange(dump.stat().st_size), int(bits), rng)}
    added = actions.add_member()
    record_fault(name, t0, time.time())
    said = [ln for ln in _log_since(leader, mark).splitlines() if "own snapshot" in ln]
    return {"leader": leader.node_id, "damage": damage, "added": added, "leader_lines": said[-2:]}
