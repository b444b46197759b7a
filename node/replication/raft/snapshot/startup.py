"""Our own snapshot at start, read before pysyncobj starts (load_own_snapshot):
pysyncobj would log a bad one and go on from the journal's tail with an
empty state.

A member whose snapshot or retained entries are damaged or missing at start
forgets its log and state and is repaired by the leader; until it has
caught up again it grants no votes (it may have acknowledged entries it no
longer has). A node without peers refuses to start instead, saying why.
"""
from __future__ import annotations

import logging
import os
import time
from io import BytesIO

from node.replication.machine.state import BrokerState
from node.replication.raft.log import SegmentLog
from node.replication.raft.log.fs import _fsync_dir
from node.replication.raft.snapshot.envelope import RaftMeta, SnapshotFormatError
from node.replication.raft.snapshot.reader import read_entries, read_snapshot

log = logging.getLogger("node.replication.raft.snapshot")  # the package's: log lines as before


class OwnSnapshotMixin:
    """RaftShim's start-up check of its own snapshot (a base of SnapshotMixin)."""

    data_dir: str
    _dump_path: str
    # a snapshot read ahead (at start, or received whole): (path, state, position)
    _loaded: tuple[str, BrokerState, RaftMeta] | None
    # log buckets the latest snapshot's messages are in (its segments are kept)
    snapshot_buckets: frozenset[int] = frozenset()
    # a member that forgot a damaged log at start: no votes until applied up to here
    repair_until: int = 0

    def load_own_snapshot(self, journal: SegmentLog, repairable: bool) -> None:
        """Read our snapshot file before pysyncobj does, and check that the log
        holds every entry its messages are in. A file this build cannot load
        (damaged, a pickle of an older build, another format version) is never
        loaded: when the log still holds every entry from index 1 it is moved
        aside and the node starts from the log. Otherwise a member of a cluster
        forgets its log and state and is repaired by the leader (no votes
        until then); a node without peers refuses to start, saying what to do."""
        path = self._dump_path
        began = time.monotonic()
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        first = int(journal[0][1]) if len(journal) else 1
        try:
            state, meta = read_snapshot(data)
        except SnapshotFormatError as exc:
            aside = path + (".pickle" if data[:1] == b"\x80" else ".refused")
            if first <= 1:
                os.replace(path, aside)
                log.warning("snapshot %s not loaded (%s); the journal holds every entry from "
                            "index 1, so the state is rebuilt from it (the file is kept as %s)",
                            path, exc, aside)
                return
            self._forget(journal, repairable, f"snapshot {path} not loaded ({exc})", aside)
            return
        entries = read_entries(BytesIO(data))
        missing = journal.missing(entries)
        if missing:
            self._forget(journal, repairable, f"the log lacks {len(missing)} of the {len(entries)} entries "
                         f"the messages of snapshot {path} are in (from index {missing[0]}; damaged or "
                         "removed segments)", path + ".refused")
            return
        self.snapshot_buckets = frozenset(state.live)
        self._loaded = (path, state, meta)
        log.info("snapshot at index %d read in %.2f s: %d MB, %d log entries hold its messages",
                 meta.last[1], time.monotonic() - began, len(data) >> 20, len(entries))

    def _forget(self, journal: SegmentLog, repairable: bool, why: str, aside: str) -> None:
        """Our state cannot be rebuilt here. A member of a cluster starts over
        empty and is repaired by the leader; alone, refuse to start."""
        if not repairable:
            raise SnapshotFormatError(
                f"{why}, and the journal starts after entries only the snapshot held: this node "
                "cannot rebuild its state and has no peers to repair it from. Restore the data "
                "directory from a backup (docs/operations.md, Snapshots and restart).")
        os.replace(self._dump_path, aside)
        _fsync_dir(self.data_dir)
        applied = journal.getRaftCommitIndex()
        journal.reset()
        self.repair_until = max(applied, 1)
        log.error("%s: the snapshot is kept as %s, the log and state are forgotten and the "
                  "leader repairs this member (no votes from it until it has applied index %d "
                  "again)", why, aside, self.repair_until)
