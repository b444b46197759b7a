"""The leader's side of Raft replication: Replicator, the base of the shim's SyncObj.

pysyncobj's own AppendEntries sending is replaced (_replicate): entries go
to each follower in chunks of at most append_chunk_bytes while fewer than
follower_window_bytes are unacknowledged (_Flow), a range of entries is
encoded once for all followers, a follower behind the log's start gets the
snapshot in bounded chunks, and while a follower catches up from a snapshot
we sent it the leader takes no snapshot of its own (CatchUp,
_holds_compaction).
"""
from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as clock

from node.replication.codec import encode
from node.replication.raft.broker_transport import BrokerTransport

if TYPE_CHECKING:
    from node.replication.raft.shim import RaftShim

log = logging.getLogger(__name__)

_NO_ENTRIES = encode([])
# a leader holds its snapshots for a follower catching up from one (_holds_compaction)
# while it made progress within this many seconds (a large state's install, after the
# last chunk and before its answer, shows none)
CATCH_UP_STALL = 60.0


class CatchUp(NamedTuple):
    """A follower catching up from a snapshot the leader sent it."""

    since: float  # when the transfer began
    mark: int  # the leader's applied index at the last look: what the follower must reach
    progress: tuple[int, int]  # (its match index, snapshot chunks sent to it) at the last look
    progress_at: float  # when that last changed


class _Flow:
    """Entry bytes sent to one follower and not yet acknowledged."""

    __slots__ = ("chunks", "inflight", "last_sent", "commit_sent", "snapshot_index", "snapshot_chunks")

    def __init__(self) -> None:
        self.chunks: deque[tuple[int, int]] = deque()  # (last index of a chunk, its bytes)
        self.inflight = 0
        self.last_sent = 0.0
        self.commit_sent = 0  # the commit index the follower was last told
        self.snapshot_index: int | None = None  # a snapshot transmission under way: its index
        self.snapshot_chunks = 0  # snapshot chunks handed to the transport (progress of a transfer)

    def sent(self, last_index: int, size: int) -> None:
        self.chunks.append((last_index, size))
        self.inflight += size

    def settle(self, match: int, next_index: int) -> None:
        chunks = self.chunks
        while chunks and chunks[0][0] <= match:
            self.inflight -= chunks.popleft()[1]
        if chunks and chunks[-1][0] >= next_index:  # nextIndex went back: resent from there
            chunks.clear()
            self.inflight = 0


class Replicator(SyncObj):  # type: ignore[misc]
    """SyncObj whose AppendEntries go out flow-controlled (_BrokerLog, shim.py,
    is this with the rest of pysyncobj's hooks replaced)."""

    _owner: RaftShim
    _flow: dict[Any, _Flow]
    # followers catching up from a snapshot we sent (kept across a broken
    # link: installing a large snapshot can outlast the link)
    _catch_up: dict[Any, CatchUp]
    _blobs: dict[tuple[int, int, int], bytes]
    _send_term: int  # the term _replicate last ran in: a new one starts fresh gaps

    # ---- pysyncobj's private hooks, replaced (name-mangled on purpose)
    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802
        self._replicate()

    def _SyncObj__tryLogCompaction(self) -> None:  # noqa: N802
        if self._holds_compaction():
            return
        SyncObj._SyncObj__tryLogCompaction(self)

    def _holds_compaction(self) -> bool:
        """True: start no snapshot now, because a follower is catching up from
        the one we sent it. A snapshot taken meanwhile drops the log up to it,
        and the follower, done with the older one, is behind the new one:
        another transfer, overtaken again for as long as the load lasts (with
        a snapshot every second, chaos corruption experiments; and under the
        kubelet, a transfer of 49 s overtaken every 50 s by 10 MB/s of
        publishes, for as long as the load lasted). Bounded by the follower's
        progress (given up after CATCH_UP_STALL seconds in which it received
        no snapshot chunk and acknowledged no entry) and by the log's size
        (catch_up_hold_bytes: then one snapshot goes ahead and the next
        transfer holds again), not by the transfer's length: a large backlog
        under load takes minutes. A snapshot being written is always collected."""
        if not self._isLeader():
            self._catch_up.clear()
            return False
        if self._SyncObj__serializer._Serializer__pid != 0:
            return False
        now = clock()
        applied = self.raftLastApplied
        match = self._SyncObj__raftMatchIndex
        hold = False
        members = self._SyncObj__otherNodes
        for node, c in list(self._catch_up.items()):
            flow = self._flow.get(node)
            sending = flow is not None and flow.snapshot_index is not None
            progress = (match.get(node, 0), flow.snapshot_chunks if flow is not None else -1)
            progress_at = now if progress != c.progress else c.progress_at
            if node not in members:
                del self._catch_up[node]
            elif not sending and match.get(node, 0) >= c.mark:
                # it holds what we had applied at the last look (under load it never
                # quite reaches the applied index of the moment): caught up
                del self._catch_up[node]
                log.info("%s caught up from a snapshot in %.1f s (index %d): snapshots resume",
                         getattr(node, "address", node), now - c.since, applied)
            elif now - progress_at >= CATCH_UP_STALL:
                del self._catch_up[node]  # gone, or stuck: it must not stop our snapshots
                log.warning("%s made no progress catching up from a snapshot for %.0f s: "
                            "snapshots resume", getattr(node, "address", node), CATCH_UP_STALL)
            else:
                hold = True
                self._catch_up[node] = CatchUp(c.since, applied, progress, progress_at)
        if hold and self._SyncObj__raftLog.bytes_used() > self._owner.config.catch_up_hold_bytes:
            return False
        return hold

    def _replicate(self) -> None:
        """AppendEntries to every connected follower: entries in chunks of at
        most append_chunk_bytes while fewer than follower_window_bytes are
        unacknowledged (the next chunk after its reply), else a heartbeat.
        A range of entries is encoded once for all followers."""
        conf = self._SyncObj__conf
        cfg = self._owner.config
        now = clock()
        period = conf.appendEntriesPeriod
        self._SyncObj__newAppendEntriesTime = now + period
        journal = self._SyncObj__raftLog
        first, last = journal[0][1], journal[-1][1]
        term, commit = self._SyncObj__raftCurrentTerm, self._SyncObj__raftCommitIndex
        next_index, match = self._SyncObj__raftNextIndex, self._SyncObj__raftMatchIndex
        connected = self._SyncObj__connectedNodes
        transport: BrokerTransport = self._SyncObj__transport
        window, chunk = cfg.follower_window_bytes, cfg.append_chunk_bytes
        if term != self._send_term:  # leader anew: gaps of an earlier leadership do not count
            self._send_term = term
            for f in self._flow.values():
                f.last_sent = 0.0
        for node in list(self._SyncObj__otherNodes):
            if node not in connected:
                self._SyncObj__serializer.cancelTransmisstion(node)
                self._flow.pop(node, None)
                continue
            flow = self._flow.get(node)
            if flow is None:
                flow = self._flow[node] = _Flow()
            nxt = next_index[node]
            flow.settle(match.get(node, 0), nxt)
            if nxt <= first:  # behind the snapshot: send it, in bounded chunks
                self._send_snapshot(node, flow, transport, term, commit, window, journal)
                self._sent_at(flow, now)
                continue
            if flow.snapshot_index is not None:
                # the follower refused it (it has applied past it) or nextIndex moved on:
                # the next snapshot for it must start from its first chunk
                self._SyncObj__serializer.cancelTransmisstion(node)
                flow.snapshot_index = None
            sent = False
            while nxt <= last and flow.inflight < window:
                budget = min(chunk, window - flow.inflight)
                i = nxt - first
                entries = [journal[i]]
                size = len(entries[0][0])
                i += 1
                while i <= last - first and size + len(journal[i][0]) <= budget:
                    entries.append(journal[i])
                    size += len(journal[i][0])
                    i += 1
                prev = journal[nxt - 1 - first]
                header = {"type": "append_entries", "term": term, "commit_index": commit,
                          "prevLogIdx": prev[1], "prevLogTerm": prev[2]}
                if not transport.send_append(node, header, self._blob(entries)):
                    break
                flow.sent(entries[-1][1], size)
                nxt = next_index[node] = entries[-1][1] + 1
                sent = True
            # an empty AppendEntries: the heartbeat, and the news of a new
            # commit index at once (a follower's consumers wait on it)
            if not sent and (commit > flow.commit_sent or now - flow.last_sent >= period / 2):
                prev = journal[nxt - 1 - first]
                transport.send_append(node, {"type": "append_entries", "term": term, "commit_index": commit,
                                             "prevLogIdx": prev[1], "prevLogTerm": prev[2]}, _NO_ENTRIES)
                sent = True
            if sent:
                self._sent_at(flow, now)
                flow.commit_sent = commit

    def _sent_at(self, flow: _Flow, now: float) -> None:
        # the leader's side of a heartbeat gap: a follower's own stalls (GIL
        # waits) lengthen the silence it measures, not this one
        if flow.last_sent and now - flow.last_sent > self._owner.longest_send_gap:
            self._owner.longest_send_gap = now - flow.last_sent
        flow.last_sent = now

    def _blob(self, entries: list[tuple[bytes, int, int]]) -> bytes:
        # (first index, last index, last term) names the range: Raft's log
        # matching makes entries up to an (index, term) identical everywhere
        key = (entries[0][1], entries[-1][1], entries[-1][2])
        blob = self._blobs.get(key)
        if blob is None:
            if len(self._blobs) >= 8:
                self._blobs.pop(next(iter(self._blobs)))
            blob = self._blobs[key] = encode(entries)
            self._owner.encoded_appends += 1
        return blob

    def _send_snapshot(self, node: Any, flow: _Flow, transport: BrokerTransport, term: int, commit: int,
                       window: int, journal: Any) -> None:
        serializer = self._SyncObj__serializer
        while transport.unsent_bytes(node) < window:
            data = serializer.getTransmissionData(node)
            if data and data[1]:  # first chunk: the dump it reads is the one the journal starts at
                flow.snapshot_index = int(journal[1][1] if len(journal) > 1 else journal[0][1])
                if node not in self._catch_up:
                    now = clock()
                    self._catch_up[node] = CatchUp(now, flow.snapshot_index, (-1, -1), now)
                    log.info("sending %s the snapshot at index %d: no snapshot here until it has "
                             "caught up (while it makes progress and the log is under %d MB)",
                             getattr(node, "address", node), flow.snapshot_index,
                             self._owner.config.catch_up_hold_bytes >> 20)
            # every chunk names the index, so that a follower that has applied past
            # it drops it instead of rewinding its state (_snapshot_moves_forward)
            transport.send(node, {"type": "append_entries", "term": term, "commit_index": commit,
                                  "serialized": None if not data else list(data),
                                  "snapshot_index": flow.snapshot_index})
            flow.snapshot_chunks += 1
            if not data:
                return
            if data[2]:  # last chunk
                if flow.snapshot_index is not None:
                    self._SyncObj__raftNextIndex[node] = flow.snapshot_index + 1
                flow.snapshot_index = None
                return
