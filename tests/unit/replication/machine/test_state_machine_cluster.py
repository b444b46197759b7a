"""Cluster commands of the state machine: members and the in-sync set, NodeDown
(S25), and batch dedup when retried batches commit out of order."""
from __future__ import annotations

from typing import Any

from node.replication.command import (
    APPLIED,
    DUPLICATE,
    GAP,
    BasicCredit,
    Batch,
    ChannelClose,
    ChannelOpen,
    Command,
    DropMember,
    MarkInSync,
    MarkOutOfSync,
    NodeDown,
    NodeUp,
    SetDraining,
    SetMember,
    UserDelete,
    UserPut,
)
from node.replication.effect import ConnectionFailure, ConsumerCancelled, Effect
from node.replication.machine import (
    BrokerState,
    apply_batch,
    batch_verdict,
    default_state,
)
from tests.support.machine import (
    Harness,
    ack,
    bodies,
    chan,
    consume,
    delivers,
    get,
    gets,
    pub,
    qdecl,
)
from tests.support.snapshot import snapshot_bytes, snapshot_copy

C1 = chan(1)  # on n1
R1 = chan(1, conn=7, node="n2")  # on n2
R2 = chan(2, conn=7, node="n2")  # another channel of the same n2 connection
R3 = chan(1, conn=8, node="n2")  # a second n2 connection


def forced(conn_node: str) -> str:
    return f"CONNECTION_FORCED - node {conn_node} was declared down by the cluster"


def members(h: Harness, *nodes: str, in_sync: bool = True) -> None:
    assert h.run(*(SetMember(n, f"{n}:4321", in_sync) for n in nodes)) == []


# -- members and the in-sync set ------------------------------------------------------

def test_set_member_in_sync_flag_and_order() -> None:
    h = Harness()
    members(h, "n1", "n2")
    members(h, "n3", in_sync=False)
    s = h.state
    assert s.members == {"n1": "n1:4321", "n2": "n2:4321", "n3": "n3:4321"}
    assert list(s.in_sync) == ["n1", "n2"]
    # re-setting keeps the status unless in_sync=True; the address is updated
    h.run(SetMember("n2", "10.0.0.2:4321", False), SetMember("n3", "10.0.0.3:4321", False))
    assert list(s.members) == ["n1", "n2", "n3"]
    assert s.members["n2"] == "10.0.0.2:4321"
    assert list(s.in_sync) == ["n1", "n2"]
    h.run(SetMember("n3", "n3:4321", True))
    assert list(s.in_sync) == ["n1", "n2", "n3"]


def test_s26_in_sync_never_below_majority_of_three() -> None:
    h = Harness()
    members(h, "n1", "n2", "n3")
    h.run(MarkOutOfSync("n3"))
    assert list(h.state.in_sync) == ["n1", "n2"]
    h.run(MarkOutOfSync("n2"))  # would leave 1 of 3: refused
    assert list(h.state.in_sync) == ["n1", "n2"]
    h.run(MarkOutOfSync("n1"))
    assert list(h.state.in_sync) == ["n1", "n2"]


def test_s26_in_sync_never_below_majority_of_five() -> None:
    h = Harness()
    members(h, "a", "b", "c", "d", "e")
    for n in ("b", "d", "a", "e"):
        h.run(MarkOutOfSync(n))
    assert list(h.state.in_sync) == ["a", "c", "e"]  # b and d went; a and e refused


def test_mark_out_of_sync_unknown_or_already_out_is_noop() -> None:
    h = Harness()
    members(h, "n1", "n2", "n3", "n4")
    h.run(MarkOutOfSync("zz"), MarkOutOfSync("n4"), MarkOutOfSync("n4"))
    assert list(h.state.in_sync) == ["n1", "n2", "n3"]
    h.run(MarkOutOfSync("n1"))  # 2 of 4 is not a majority
    assert list(h.state.in_sync) == ["n1", "n2", "n3"]


def test_mark_in_sync_after_out_keeps_members_order() -> None:
    h = Harness()
    members(h, "n1", "n2", "n3")
    h.run(MarkOutOfSync("n1"))
    assert list(h.state.in_sync) == ["n2", "n3"]
    h.run(MarkInSync("n1"), MarkInSync("n1"))
    assert list(h.state.in_sync) == ["n1", "n2", "n3"]
    h.run(MarkInSync("stranger"))  # not a member: ignored
    assert "stranger" not in h.state.in_sync


def test_new_member_joins_out_of_sync_then_catches_up() -> None:
    h = Harness()
    members(h, "n1", "n2", "n3")
    members(h, "n4", in_sync=False)
    assert list(h.state.in_sync) == ["n1", "n2", "n3"]
    h.run(MarkInSync("n4"))
    assert list(h.state.in_sync) == ["n1", "n2", "n3", "n4"]
    # 4 members: majority is 3, so one may leave the set, not two
    h.run(MarkOutOfSync("n2"), MarkOutOfSync("n3"))
    assert list(h.state.in_sync) == ["n1", "n3", "n4"]


def test_drop_member_leaves_members_and_in_sync() -> None:
    h = Harness()
    members(h, "n1", "n2", "n3")
    h.run(MarkOutOfSync("n3"))
    h.run(DropMember("n3"))
    assert list(h.state.members) == ["n1", "n2"]
    h.run(DropMember("n2"))
    assert list(h.state.members) == ["n1"]
    assert list(h.state.in_sync) == ["n1"]
    h.run(DropMember("n9"))  # unknown: no-op
    assert list(h.state.members) == ["n1"]


def test_drop_member_drops_the_removed_nodes_clients_and_requeues() -> None:
    """A removed node's proposals never commit again, so its ConnectionClose
    would never arrive: DropMember itself releases its consumers' unacked
    deliveries (redelivered to consumers elsewhere) and its consumers."""
    h = Harness()
    members(h, "n1", "n2", "n3")
    h.open(C1)
    h.open(R1)
    h.run(qdecl(C1, "q"), pub(C1, "q", b"m"))
    assert bodies(h.run(consume(R1, "q", "on-n2"))) == [b"m"]
    fx = h.run(DropMember("n2"))
    closed = [e for e in fx if isinstance(e, ConnectionFailure)]
    assert [(e.conn, e.reply_code) for e in closed] == [(R1.conn_id, 320)]
    assert "removed from the cluster" in closed[0].reply_text
    assert not h.state.queues["q"].consumers
    again = h.run(consume(C1, "q", "on-n1"))
    assert [(d.body, d.redelivered) for d in delivers(again)] == [(b"m", True)]


def test_membership_changes_bump_config_version() -> None:
    """Only the raft thread touches the state (the loop reads a ReadModel
    rebuilt when config_version moves): every change of members, in_sync or
    draining bumps it, a no-op does not."""
    h = Harness()
    members(h, "n1", "n2", "n3")
    steps: list[tuple[Any, bool]] = [
        (MarkOutOfSync("n2"), True), (MarkOutOfSync("n2"), False),
        (SetMember("n4", "n4:1", False), True), (SetMember("n4", "n4:1", False), False),
        (MarkInSync("n2"), True), (DropMember("n3"), True), (DropMember("n3"), False),
        (SetDraining("n4", True), True), (SetDraining("n4", False), True),
        (SetDraining("n4", False), False)]
    for cmd, bumps in steps:
        before = h.state.config_version
        h.run(cmd)
        assert (h.state.config_version > before) == bumps, cmd
    assert list(h.state.members) == ["n1", "n2", "n4"]
    assert list(h.state.in_sync) == ["n1", "n2"]


# -- SetDraining (maintenance mode) ---------------------------------------------------

def drained(node: str) -> str:
    return f"CONNECTION_FORCED - node {node} is draining (maintenance mode)"


def test_s25_draining_member_leaves_in_sync_and_its_clients_are_redelivered() -> None:
    h = _two_node_setup()
    members(h, "n1", "n2", "n3")
    h.run(consume(R1, "q", "r"))
    h.run(pub(C1, "q", b"a"), pub(C1, "q", b"b"))
    h.run(consume(C1, "q", "c"))
    fx = h.run(SetDraining("n2", True))
    assert list(h.state.draining) == ["n2"]
    assert list(h.state.in_sync) == ["n1", "n3"]
    assert [e for e in fx if isinstance(e, ConnectionFailure)] == [
        ConnectionFailure(R1.conn_id, 320, drained("n2"), 0, 0),
        ConnectionFailure(R3.conn_id, 320, drained("n2"), 0, 0)]
    assert [(d.chan, d.body, d.redelivered) for d in delivers(fx)] == [(C1, b"a", True), (C1, b"b", True)]
    # the leader's catch-up rule cannot put it back while it drains
    h.run(MarkInSync("n2"))
    assert list(h.state.in_sync) == ["n1", "n3"]
    # revived: back in sync once caught up
    assert h.run(SetDraining("n2", False)) == []
    assert h.state.draining == {}
    h.run(MarkInSync("n2"))
    assert list(h.state.in_sync) == ["n1", "n2", "n3"]


def test_s26_draining_never_shrinks_in_sync_below_majority() -> None:
    h = Harness()
    members(h, "n1", "n2", "n3")
    h.run(MarkOutOfSync("n3"))
    h.run(SetDraining("n2", True))  # in sync would be 1 of 3: stays, but flagged
    assert list(h.state.in_sync) == ["n1", "n2"]
    assert list(h.state.draining) == ["n2"]
    h.run(MarkInSync("n3"), MarkOutOfSync("n2"))
    assert list(h.state.in_sync) == ["n1", "n3"]


def test_draining_unknown_member_is_ignored_and_drop_member_clears_it() -> None:
    h = Harness()
    members(h, "n1", "n2", "n3")
    assert h.run(SetDraining("n9", True)) == []
    assert h.state.draining == {}
    h.run(SetDraining("n3", True), DropMember("n3"))
    assert h.state.draining == {} and "n3" not in h.state.members
    h.run(SetMember("n3", "n3:4321", False), MarkInSync("n3"))  # added back fresh
    assert list(h.state.in_sync) == ["n1", "n2", "n3"]
    # survives a snapshot
    h.run(SetDraining("n2", True))
    assert list(snapshot_copy(h.state).draining) == ["n2"]


# -- NodeDown (S25) -------------------------------------------------------------------

def _two_node_setup() -> Harness:
    h = Harness()
    for c in (C1, R1, R2, R3):
        h.open(c)
    h.run(qdecl(C1, "q", durable=True))
    return h


def test_s25_node_down_redelivers_to_consumer_on_another_node_in_order() -> None:
    h = _two_node_setup()
    h.run(consume(R1, "q", "r"))
    h.run(*(pub(C1, "q", bytes([i]), props={"delivery_mode": 2} if i % 2 else {})
            for i in range(4)))
    assert h.state.channels[R1].unacked.keys() == {1, 2, 3, 4}
    h.run(ack(R1, 2))  # settled, must not come back
    h.run(consume(C1, "q", "c", credit=1))  # survivor, room for one delivery only
    fx = h.run(NodeDown("n2"))
    ds = delivers(fx)
    assert [(d.chan, d.body, d.redelivered, d.delivery_tag) for d in ds] == [
        (C1, b"\x00", True, 1)]
    assert [e for e in fx if isinstance(e, ConnectionFailure)] == [
        ConnectionFailure(R1.conn_id, 320, forced("n2"), 0, 0),
        ConnectionFailure(R3.conn_id, 320, forced("n2"), 0, 0)]
    # every n2 channel, consumer and connection is gone
    assert all(c.node == "n1" for c in h.state.channels)
    assert all(c.node == "n1" for c in h.state.conns)
    assert list(h.state.queues["q"].consumers) == [(C1, "c")]
    # the rest follow in their original order, then new publishes
    h.run(pub(C1, "q", b"new"))
    rest = []
    for _ in range(4):
        fx = h.run(ack(C1, 0, multiple=True), BasicCredit(C1, "c", 1))
        rest += [(d.body, d.redelivered) for d in delivers(fx)]
    assert rest == [(b"\x02", True), (b"\x03", True), (b"new", False)]
    assert h.state.message_bytes == 0


def test_s25_node_down_errors_only_that_nodes_connections() -> None:
    h = _two_node_setup()
    h.open(chan(1, conn=9, node="n3"))
    fx = h.run(NodeDown("n3"))
    assert fx == [ConnectionFailure(chan(1, conn=9, node="n3").conn_id, 320, forced("n3"), 0, 0)]
    assert R1 in h.state.channels and C1 in h.state.channels
    # a node without connections: nothing to do
    assert h.run(NodeDown("n3")) == []
    assert h.run(NodeDown("n7")) == []


def test_s25_node_down_keeps_durable_and_transient_messages() -> None:
    h = _two_node_setup()
    h.run(qdecl(R1, "tmp"), qdecl(R1, "dur2", durable=True))
    h.run(pub(R1, "tmp", b"t"), pub(R1, "dur2", b"p", props={"delivery_mode": 2}),
          pub(R1, "dur2", b"t2"), pub(C1, "q", b"x"))
    h.run(consume(R2, "tmp", "r"))  # holds b"t" unacked
    assert h.state.channels[R2].unacked
    h.run(NodeDown("n2"))
    assert {"q", "tmp", "dur2"} <= set(h.state.queues)
    got = gets(h.run(get(C1, "tmp"), get(C1, "dur2"), get(C1, "dur2"), get(C1, "q")))
    assert [(g.body, g.redelivered) for g in got] == [
        (b"t", True), (b"p", False), (b"t2", False), (b"x", False)]
    assert h.state.message_bytes == 5


def test_s25_node_down_deletes_its_exclusive_and_autodelete_queues() -> None:
    h = _two_node_setup()
    h.run(qdecl(R1, "excl", exclusive=True), qdecl(C1, "ad", auto_delete=True),
          qdecl(C1, "ad2", auto_delete=True))
    h.run(consume(R1, "ad", "r"), consume(R1, "ad2", "r2"), consume(C1, "ad2", "c"))
    h.run(pub(C1, "excl", b"gone"))
    fx = h.run(NodeDown("n2"))
    assert "excl" not in h.state.queues
    assert "ad" not in h.state.queues  # its last consumer went
    assert "ad2" in h.state.queues  # still consumed from n1
    assert not [e for e in fx if isinstance(e, ConsumerCancelled)]
    assert h.state.message_bytes == 0
    assert h.state.exclusive == {}


def test_s25_node_down_connection_with_only_exclusive_queue() -> None:
    h = Harness()
    r = h.open(chan(1, conn=5, node="n2"))
    h.run(qdecl(r, "ex", exclusive=True))
    h.run(ChannelClose(r, False))  # no channel left; the connection still owns the queue
    fx = h.run(NodeDown("n2"))
    assert fx == [ConnectionFailure(r.conn_id, 320, forced("n2"), 0, 0)]
    assert "ex" not in h.state.queues


def test_s25_node_down_keeps_dedup_and_later_node_up_still_works() -> None:
    h = _two_node_setup()
    b = Batch("n2", 1, 1, h.now, [pub(R1, "q", b"p", seq=1)])
    assert len(apply_batch(h.state, b)) == 1
    h.run(NodeDown("n2"))
    # the node was only cut off (same incarnation): its retries stay deduped
    assert apply_batch(h.state, b) == []
    assert ("n2", 1) in h.state.dedup
    assert h.state.queues["q"].ready_count() == 1
    h.run(NodeUp("n2", 2), node="n2", incarnation=2)
    assert ("n2", 1) not in h.state.dedup


# -- dedup: each proposer's batches apply once, in order ---------------------------------

def _b(seq: int, body: bytes) -> Batch:
    return Batch("n1", 1, seq, 1000.0, [pub(C1, "q", body)])


def _fresh() -> BrokerState:
    s = default_state()
    apply_batch(s, Batch("setup", 1, 1, 1000.0, [ChannelOpen(C1), qdecl(C1, "q")]))
    return s


def _all_ready(s: BrokerState) -> list[bytes]:
    q = s.queues["q"]
    return [m.body for _, m in sorted(q.returned, key=lambda x: x[0])] + [
        m.body for m in q.ready]


def test_gap_batch_is_ignored_until_resent_in_order() -> None:
    s = _fresh()
    before = snapshot_bytes(s)
    assert batch_verdict(s, _b(2, b"b")) == GAP
    assert apply_batch(s, _b(2, b"b")) == []
    assert snapshot_bytes(s) == before, "a batch after a gap changes nothing"
    # go-back-N: the proposer resends 1 then 2, then a stale duplicate arrives
    for seq, body in ((1, b"a"), (2, b"b"), (1, b"a"), (3, b"c"), (2, b"b")):
        apply_batch(s, _b(seq, body))
    assert _all_ready(s) == [b"a", b"b", b"c"], "in proposer order, each once"
    assert s.dedup[("n1", 1)] == 4


def test_batch_verdict_is_pure_and_matches_apply() -> None:
    s = _fresh()
    assert batch_verdict(s, _b(1, b"a")) == APPLIED
    assert batch_verdict(s, _b(2, b"b")) == GAP
    before = snapshot_bytes(s)
    assert batch_verdict(s, _b(1, b"a")) == APPLIED
    assert snapshot_bytes(s) == before
    apply_batch(s, _b(1, b"a"))
    assert batch_verdict(s, _b(1, b"a")) == DUPLICATE
    assert batch_verdict(s, _b(2, b"b")) == APPLIED
    assert batch_verdict(s, _b(3, b"c")) == GAP
    # another node, another incarnation: its own numbering
    assert batch_verdict(s, Batch("n9", 5, 1, 0.0, [])) == APPLIED


def test_node_up_forgets_other_incarnations_windows() -> None:
    s = _fresh()
    apply_batch(s, Batch("n2", 1, 1, 0.0, []))
    apply_batch(s, Batch("n2", 2, 1, 0.0, [NodeUp("n2", 2)]))
    assert ("n2", 1) not in s.dedup and ("n2", 2) in s.dedup


# -- determinism -------------------------------------------------------------------------

def _cluster_scenario() -> list[Batch]:
    def b(node: str, seq: int, *cmds: Command) -> Batch:
        return Batch(node, 1, seq, 1000.0 + seq, list(cmds))

    return [
        b("n1", 1, SetMember("n1", "a:1", True), SetMember("n2", "b:1", True),
          SetMember("n3", "c:1", True), ChannelOpen(C1), qdecl(C1, "q"),
          qdecl(C1, "ad", auto_delete=True)),
        b("n2", 1, ChannelOpen(R1), ChannelOpen(R3), consume(R1, "q", "r"),
          consume(R3, "ad", "r3")),
        b("n2", 3, qdecl(R1, "ex", exclusive=True)),  # after a gap: ignored
        b("n2", 2, qdecl(R1, "ex", exclusive=True)),
        b("n1", 2, *(pub(C1, "q", bytes([i])) for i in range(5)), pub(C1, "ad", b"ad")),
        b("n2", 2, ack(R1, 1)),  # duplicate: ignored
        b("n1", 3, consume(C1, "q", "c", credit=2)),
        b("n1", 4, MarkOutOfSync("n2"), MarkOutOfSync("n3"), NodeDown("n2")),
        b("n1", 3, pub(C1, "q", b"dup")),
        b("n1", 5, MarkInSync("n2"), DropMember("n3"), ack(C1, 0, True)),
    ]


def test_determinism_two_states_same_batches_snapshot_equal() -> None:
    batches = _cluster_scenario()
    s1, s2 = default_state(), default_state()
    fx1: list[list[Effect]] = [apply_batch(s1, b) for b in batches]
    fx2: list[list[Effect]] = [apply_batch(s2, b) for b in batches]
    assert fx1 == fx2
    assert snapshot_bytes(s1) == snapshot_bytes(s2)
    s3 = snapshot_copy(s1)
    assert snapshot_bytes(s3) == snapshot_bytes(s1)
    # the scenario did what it says
    assert list(s1.members) == ["n1", "n2"] and list(s1.in_sync) == ["n1", "n2"]
    assert any(isinstance(e, ConnectionFailure) for fx in fx1 for e in fx)
    assert [(d.chan, d.body, d.redelivered) for d in delivers(fx1[7])] == [
        (C1, b"\x00", True), (C1, b"\x01", True)]
    assert not delivers(fx1[9])
    assert b"dup" not in bodies([e for fx in fx1 for e in fx])
    assert s1.dedup[("n1", 1)] == 6 and s1.dedup[("n2", 1)] == 3


# -- users (replicated; the wire authenticates against them) --------------------------

def test_users_put_update_delete_and_snapshot() -> None:
    h = Harness()
    before = h.state.config_version
    assert h.run(UserPut("alice", "HASH1", ("administrator",))) == []
    assert h.state.config_version > before  # the loop's read model notices
    assert h.state.users == {"alice": ("HASH1", ("administrator",))}
    h.run(UserPut("alice", "HASH2"), UserPut("bob", "HASH3"))
    assert h.state.users == {"alice": ("HASH2", ()), "bob": ("HASH3", ())}
    h.run(UserDelete("alice"), UserDelete("nobody"))
    assert list(h.state.users) == ["bob"]
    assert snapshot_copy(h.state).users == {"bob": ("HASH3", ())}
