"""A follower that installs the leader's snapshot (issue 16, found by chaos
follower-slow-disk and packet-loss: messages delivered twice with
redelivered=false).

- A snapshot at or below what the follower has applied is dropped: installing
  it rewound the state and applied the entries after it again, emitting their
  deliveries a second time (`RaftShim._snapshot_moves_forward`; the leader
  names the index in every chunk, `_BrokerLog._send_snapshot`).
- A snapshot past it skips entries whose effects never left the node:
  `skipped_effects` closes (320) each local connection that may be owed one,
  and only those (pure, folded here through apply_batch as the other state
  machine suites do); RaftNode.restore_state holds them in log order.
"""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from node.broker.ids import ConnId
from node.replication.config import RaftConfig
from node.replication.effect import ConnectionFailure
from node.replication.machine import SKIPPED_TEXT, BrokerState, skipped_effects
from node.replication.raft.replicator import CATCH_UP_STALL, CatchUp, _Flow
from node.replication.raft.shim import RaftShim, _BrokerLog
from node.replication.raft_node import RaftNode
from tests.support.machine import (
    Harness,
    ack,
    chan,
    consume,
    delivers,
    pub,
    qdecl,
)
from tests.support.snapshot import snapshot_copy


def _setup() -> tuple[Harness, Any, Any, Any]:
    """n2 has two connections: conn 1 consumes q, conn 2 publishes to p.
    n1 publishes to q."""
    h = Harness()
    n1 = h.open(chan(1, 1, "n1"))
    c_cons = h.open(chan(1, 1, "n2"))
    c_pub = h.open(chan(1, 2, "n2"))
    h.run(qdecl(n1, "q"), qdecl(n1, "p"))
    h.run(consume(c_cons, "q", "ct", credit=100), node="n2", incarnation=7)
    return h, n1, c_cons, c_pub


def _copy(st: BrokerState) -> BrokerState:
    return snapshot_copy(st)  # what a snapshot is: the state written and read back


def test_skipped_delivery_closes_only_the_consuming_connection() -> None:
    h, n1, c_cons, _c_pub = _setup()
    old = _copy(h.state)
    fx = h.run(pub(n1, "q", b"x"))  # delivered to n2's consumer: an effect n2 never emits
    assert [d.chan for d in delivers(fx)] == [c_cons]
    owed = skipped_effects(old, _copy(h.state), "n2", 7)
    assert owed == [ConnectionFailure(ConnId("n2", 1), 320, SKIPPED_TEXT, 0, 0)]
    # the publishing node's own batch was skipped too: its connection may be owed a reply
    assert [e.conn for e in skipped_effects(old, _copy(h.state), "n1", 1)] == [ConnId("n1", 1)]
    assert skipped_effects(old, _copy(h.state), "n3", 1) == []  # no connection there


def test_own_commands_in_the_skipped_entries_close_every_local_connection() -> None:
    h, _n1, _c_cons, c_pub = _setup()
    old = _copy(h.state)
    h.run(pub(c_pub, "p", b"y", seq=1), node="n2", incarnation=7)  # its confirm was skipped
    owed = skipped_effects(old, _copy(h.state), "n2", 7)
    assert sorted(e.conn for e in owed) == [ConnId("n2", 1), ConnId("n2", 2)]
    assert all(isinstance(e, ConnectionFailure) and e.reply_code == 320 for e in owed)


def test_entries_for_other_nodes_only_close_nothing() -> None:
    h, n1, _c_cons, _c_pub = _setup()
    old = _copy(h.state)
    h.run(pub(n1, "p", b"z"), qdecl(n1, "r"))  # no consumer on p; nothing for n2
    assert skipped_effects(old, _copy(h.state), "n2", 7) == []


def test_an_ack_by_another_incarnation_does_not_count_as_ours() -> None:
    h, n1, c_cons, _c_pub = _setup()
    h.run(pub(n1, "q", b"x"))
    old = _copy(h.state)
    h.run(ack(c_cons, 1), node="n2", incarnation=6)  # a batch of an older process of n2
    assert skipped_effects(old, _copy(h.state), "n2", 7) == []


# ------------------------------------------------------ RaftNode.restore_state


def test_restore_state_holds_the_closes_at_the_snapshot_index(tmp_path: Path) -> None:
    asyncio.run(_restore(tmp_path))


async def _restore(tmp_path: Path) -> None:
    h, n1, _c_cons, _c_pub = _setup()
    node = RaftNode("n2", str(tmp_path), asyncio.get_running_loop(), sink=None,  # type: ignore[arg-type]
                    config=RaftConfig())
    node.incarnation = 7
    node.state = copy.deepcopy(h.state)
    node.state.members.update(n1="127.0.0.1:1", n2="127.0.0.1:2")  # a live member, not a start
    node._held.append((40, ("n1", 1, 3), []))
    h.run(pub(n1, "q", b"x"))
    node.restore_state(_copy(h.state), 57)
    assert node.skipped_closes == 1
    assert [i for i, _k, _fx in node._held] == [40, 57]  # after what was held: log order
    index, _key, owed = node._held[-1]
    assert owed == [ConnectionFailure(ConnId("n2", 1), 320, SKIPPED_TEXT, 0, 0)]
    node.restore_state(_copy(h.state), 60)  # nothing changed since: nothing more owed
    assert node.skipped_closes == 1 and len(node._held) == 2


def test_restore_state_at_start_owes_nothing(tmp_path: Path) -> None:
    asyncio.run(_restore_at_start(tmp_path))


async def _restore_at_start(tmp_path: Path) -> None:
    # our own dump, loaded before any client: its connections are a former process's
    h, n1, _c_cons, _c_pub = _setup()
    h.run(pub(n1, "q", b"x"))
    node = RaftNode("n2", str(tmp_path), asyncio.get_running_loop(), sink=None,  # type: ignore[arg-type]
                    config=RaftConfig())
    assert not node.state.members
    node.restore_state(_copy(h.state), 57)
    assert node.skipped_closes == 0 and not node._held
    assert node.state.queues.keys() == {"q", "p"}


# ------------------------------------------------- the snapshot chunks themselves


class _SentLog:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, dict[str, Any]]] = []

    def send(self, node: Any, msg: dict[str, Any]) -> bool:
        self.sent.append((node, msg))
        return True


def _shim(applied: int, commit: int) -> tuple[RaftShim, _SentLog]:
    shim = RaftShim.__new__(RaftShim)
    sent = _SentLog()
    shim._so = SimpleNamespace(raftLastApplied=applied, raftCommitIndex=commit,  # type: ignore[assignment]
                               transport=lambda: sent)
    shim.refused_snapshots = 0
    return shim, sent


def test_a_snapshot_at_or_below_the_applied_index_is_dropped_and_the_leader_sent_on() -> None:
    for index in (4997, 5175):
        shim, sent = _shim(applied=5175, commit=5180)
        ok = shim._snapshot_moves_forward("n1", {"type": "append_entries", "term": 3,
                                                 "serialized": [b"..", True, False], "snapshot_index": index})
        assert ok is False
        assert sent.sent == [("n1", {"type": "next_node_idx", "next_node_idx": 5181,
                                     "reset": True, "success": False})]
        assert shim.refused_snapshots == 1


def test_a_snapshot_past_the_applied_index_or_unnamed_is_installed() -> None:
    for msg in ({"serialized": [b"..", True, False], "snapshot_index": 5176},
                {"serialized": [b"..", True, False]}):  # a leader of an older version
        shim, sent = _shim(applied=5175, commit=5180)
        assert shim._snapshot_moves_forward("n1", {"type": "append_entries", "term": 3, **msg}) is True
        assert sent.sent == [] and shim.refused_snapshots == 0


class _Serializer:
    """pysyncobj's transmission protocol: (data, is_first, is_last) chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.pos = 0
        self.cancelled: list[Any] = []

    def getTransmissionData(self, node: Any) -> tuple[bytes, bool, bool]:  # noqa: N802
        if self.pos < len(self.chunks):
            data = self.chunks[self.pos]
            self.pos += 1
            return data, self.pos == 1, False
        self.pos = 0
        return b"", False, True


class _Window(_SentLog):
    def unsent_bytes(self, node: Any) -> int:
        return 0


def test_the_leader_names_the_transmitted_index_in_every_chunk_and_resumes_after_it() -> None:
    leader = SimpleNamespace(_SyncObj__serializer=_Serializer([b"a", b"b"]), _SyncObj__raftNextIndex={"n3": 10},
                             _catch_up={}, _owner=SimpleNamespace(config=RaftConfig()))
    flow, transport = _Flow(), _Window()
    journal = [(b"", 4996, 2), (b"", 4997, 2), (b"", 4998, 3)]
    _BrokerLog._send_snapshot(leader, "n3", flow, transport, 3, 5000, 1 << 20, journal)  # type: ignore[arg-type]
    assert [m["snapshot_index"] for _n, m in transport.sent] == [4997, 4997, 4997]
    assert [m["serialized"][1:] for _n, m in transport.sent] == [[True, False], [False, False], [False, True]]
    assert leader._SyncObj__raftNextIndex["n3"] == 4998
    assert flow.snapshot_index is None  # the transmission is over
    assert flow.snapshot_chunks == 3  # its progress, as the hold sees it
    assert leader._catch_up["n3"].mark == 4997  # its catch-up is not: the leader holds its snapshots


def _holder(*, leader: bool = True, pid: int = 0, applied: int = 100, match: int = 50,
            sending: bool = False, since: float = 0.0, used: int = 0, mark: int = 100,
            chunks: int = 0, progress: tuple[int, int] | None = None, progress_at: float | None = None) -> Any:
    """A leader with a follower n3 catching up from a snapshot since `since` (clock),
    which must reach `mark` (the leader's applied index at the previous look); by
    default it made progress at the last look (its match index and the chunks sent
    to it as they are now, at `since`)."""
    flow = _Flow()
    flow.snapshot_index = 40 if sending else None
    flow.snapshot_chunks = chunks
    seen = progress if progress is not None else (match, chunks)
    return SimpleNamespace(
        _isLeader=lambda: leader, _SyncObj__serializer=SimpleNamespace(_Serializer__pid=pid),
        raftLastApplied=applied, _SyncObj__raftMatchIndex={"n3": match}, _SyncObj__otherNodes={"n3"},
        _flow={"n3": flow},
        _catch_up={"n3": CatchUp(since, mark, seen, since if progress_at is None else progress_at)},
        _SyncObj__raftLog=SimpleNamespace(bytes_used=lambda: used),
        _owner=SimpleNamespace(config=RaftConfig()))


def test_the_leader_holds_its_snapshots_while_a_follower_catches_up_from_one_within_bounds() -> None:
    from pysyncobj.monotonic import monotonic as clock
    now = clock()
    hold = _BrokerLog._holds_compaction
    # sending the snapshot, then sending the entries after it: held, and the
    # mark moves to what the leader has applied meanwhile
    h = _holder(sending=True, since=now, match=0, mark=40, applied=120)
    assert hold(h) and h._catch_up["n3"][:2] == (now, 120)
    assert hold(_holder(sending=False, since=now, match=99, mark=100))
    # it holds what the leader had applied at the last look: released, and forgotten
    h = _holder(sending=False, since=now, match=100, mark=100, applied=130)
    assert not hold(h) and h._catch_up == {}
    # ... but not while the transfer is still under way
    assert hold(_holder(sending=True, since=now, match=100, mark=100))
    # a transfer of minutes is held as long as it makes progress: chunks go out ...
    stall = CATCH_UP_STALL
    long_ago = now - 10 * stall
    h = _holder(sending=True, since=long_ago, chunks=7, progress=(50, 6), progress_at=long_ago)
    assert hold(h) and h._catch_up["n3"].progress == (50, 7) and h._catch_up["n3"].progress_at >= now
    # ... or the follower acknowledges entries
    h = _holder(since=long_ago, match=60, progress=(50, 0), progress_at=long_ago)
    assert hold(h) and h._catch_up["n3"].progress == (60, 0)
    # no progress for CATCH_UP_STALL (a dead or stuck follower): snapshots resume
    h = _holder(sending=True, since=long_ago, progress_at=now - stall - 1)
    assert not hold(h) and h._catch_up == {}
    assert hold(_holder(sending=True, since=long_ago, progress_at=now - stall + 5))
    # the log grew past catch_up_hold_bytes: snapshots go on, the catch-up is still known
    cfg = RaftConfig()
    assert cfg.catch_up_hold_bytes >= 4 * cfg.compaction_max_bytes
    assert hold(_holder(sending=True, since=now, used=cfg.catch_up_hold_bytes))
    h = _holder(sending=True, since=now, used=cfg.catch_up_hold_bytes + 1)
    assert not hold(h) and "n3" in h._catch_up
    # a snapshot being written is always collected
    assert not hold(_holder(sending=True, since=now, pid=1234))
    # no longer the leader: nothing held, nothing remembered
    h = _holder(leader=False, sending=True, since=now)
    assert not hold(h) and h._catch_up == {}
    # a member removed meanwhile
    h = _holder(sending=True, since=now)
    h._SyncObj__otherNodes = set()
    assert not hold(h) and h._catch_up == {}
