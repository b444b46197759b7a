"""At-least-once dead-lettering for quorum queues (machine version 5;
node/replication/machine/dead_letter.py), folded through apply_batch.

What RabbitMQ 4.3 does, from its source: rabbit_quorum_queue:dlh
(at-least-once needs a dead-letter exchange and overflow reject-publish,
else at-most-once), rabbit_fifo_dlx (the discards kept in the queue's state,
counted by is_over_limit, purged with the queue, deleted on a strategy
switch: switch_from), rabbit_fifo_dlx_worker (forward / redeliver0: every
target must confirm, a target that confirmed is not sent it again, an
unroutable message or a missing DLX keeps it, retried later).
"""
from __future__ import annotations

from typing import Any

from node.replication.command import (
    PolicyClear,
    PolicySet,
    QueueDelete,
    QueuePurge,
    SetMachineVersion,
    Tick,
)
from node.replication.effect import Confirm
from node.replication.machine import BrokerState, apply_batch, default_state
from node.replication.machine.version import DEAD_LETTER_STORE
from node.replication.raft.snapshot import iter_messages
from tests.support.machine import (
    Harness,
    ack,
    chan,
    confirms,
    errors,
    get,
    gets,
    pub,
    qbind,
    qdecl,
    reject,
    replies,
    xdecl,
)
from tests.support.snapshot import assert_same_state, snapshot_bytes, snapshot_copy

ALO = {"x-queue-type": "quorum", "x-overflow": "reject-publish",
       "x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "at-least-once"}


def harness(version: int = DEAD_LETTER_STORE) -> Harness:
    h = Harness()
    h.run(SetMachineVersion(version))
    return h


def source(h: Harness, **args: Any) -> Any:
    """A channel, a fanout DLX with no binding yet and the at-least-once queue 'src'."""
    c = h.open(chan())
    h.run(xdecl(c, "dlx", "fanout"))
    h.run(qdecl(c, "src", durable=True, arguments={**ALO, **args}))
    return c


def die(h: Harness, c: Any, body: bytes = b"m", queue: str = "src") -> None:
    """Publish `body` to `queue` and reject it (dead-lettered: rejected)."""
    h.run(pub(c, queue, body))
    [g] = gets(h.run(get(c, queue)))
    assert g.body == body
    h.run(reject(c, g.delivery_tag, requeue=False))


def kept(h: Harness, queue: str = "src") -> list[bytes]:
    store = h.state.dead_letters[queue]
    return [d.message.body or b"" for d in store]


def drain(h: Harness, c: Any, queue: str) -> list[Any]:
    out = []
    while True:
        got = gets(h.run(get(c, queue, no_ack=True)))
        if not got:
            return out
        out.extend(got)


def held_bytes(state: BrokerState) -> int:
    """What message_bytes must be: every message the state holds."""
    return sum(m.size for m in iter_messages(state))


def test_an_unroutable_dead_letter_is_kept_until_a_binding_gives_it_a_route() -> None:
    h = harness()
    c = source(h)
    die(h, c, b"lost?")
    assert kept(h) == [b"lost?"]
    assert h.state.queues["src"].ready_count() == 0
    assert h.state.message_bytes == held_bytes(h.state) == 5
    h.run(qdecl(c, "dead"))
    assert kept(h) == [b"lost?"]  # declared, not bound: still no route
    h.run(qbind(c, "dead", "dlx"))  # the bind retries at once
    assert kept(h) == []
    [g] = drain(h, c, "dead")
    assert g.body == b"lost?" and g.exchange == "dlx" and g.routing_key == "src"
    [death] = g.props["headers"]["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == ("rejected", "src", 1)
    assert h.state.message_bytes == 0


def test_a_missing_dead_letter_exchange_keeps_them_in_order() -> None:
    h = harness()
    c = h.open(chan())
    h.run(qdecl(c, "src", durable=True, arguments=ALO))
    for i in range(40):  # more than one retry window
        die(h, c, b"m%d" % i)
    assert len(kept(h)) == 40
    h.run(xdecl(c, "dlx", "fanout"), qdecl(c, "dead"))
    h.run(qbind(c, "dead", "dlx"))
    got = [g.body for g in drain(h, c, "dead")]
    assert got == [b"m%d" % i for i in range(40)]
    assert kept(h) == [] and h.state.message_bytes == 0


def test_a_full_target_keeps_it_until_drained_then_a_tick_delivers_it() -> None:
    h = harness()
    c = source(h)
    h.run(qdecl(c, "dead", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}),
          qbind(c, "dead", "dlx"))
    h.run(pub(c, "dead", b"first"))
    die(h, c, b"second")
    assert kept(h) == [b"second"]
    h.now += 1
    h.run(Tick())
    assert kept(h) == [b"second"]  # still full
    [g] = gets(h.run(get(c, "dead")))
    h.run(ack(c, g.delivery_tag))
    h.now += 1
    h.run(Tick())
    assert kept(h) == []
    assert [g.body for g in drain(h, c, "dead")] == [b"second"]


def test_every_target_gets_it_once_and_it_stays_until_the_last_took_it() -> None:
    h = harness()
    c = source(h)
    h.run(qdecl(c, "roomy"), qdecl(c, "tight", arguments={"x-max-length": 1,
                                                         "x-overflow": "reject-publish"}))
    h.run(qbind(c, "roomy", "dlx"), qbind(c, "tight", "dlx"), pub(c, "tight", b"filler"))
    die(h, c, b"dl")
    [d] = h.state.dead_letters["src"]
    assert list(d.settled) == ["roomy"]
    for _ in range(3):
        h.now += 1
        h.run(Tick())
    assert [g.body for g in drain(h, c, "roomy")] == [b"dl"]  # once, not per retry
    assert drain(h, c, "tight") and kept(h) == [b"dl"]
    h.now += 1
    h.run(Tick())
    assert kept(h) == []
    assert [g.body for g in drain(h, c, "tight")] == [b"dl"]
    assert drain(h, c, "roomy") == []


def test_kept_dead_letters_count_towards_the_source_limit() -> None:
    h = harness()
    c = source(h, **{"x-max-length": 2})
    die(h, c, b"a")
    h.run(pub(c, "src", b"b", seq=1))
    # 1 kept + 1 ready = the limit of 2, not over it: taken, and now over (S32)
    assert confirms(h.run(pub(c, "src", b"c", seq=2))) == [Confirm(c, 2, True)]
    assert confirms(h.run(pub(c, "src", b"d", seq=3))) == [Confirm(c, 3, False)]
    h.run(qdecl(c, "dead"), qbind(c, "dead", "dlx"))  # the kept one goes: 2 ready
    assert confirms(h.run(pub(c, "src", b"e", seq=4))) == [Confirm(c, 4, False)]
    [g] = gets(h.run(get(c, "src")))
    h.run(ack(c, g.delivery_tag))  # 1 ready: at 80% of 2 (rounded down)
    assert confirms(h.run(pub(c, "src", b"f", seq=5))) == [Confirm(c, 5, True)]


def test_without_reject_publish_or_on_a_classic_queue_it_falls_back_to_at_most_once() -> None:
    h = harness()
    c = h.open(chan())
    h.run(xdecl(c, "dlx", "fanout"))
    drop_head = {k: v for k, v in ALO.items() if k != "x-overflow"}
    classic = {k: v for k, v in ALO.items() if k not in ("x-queue-type", "x-dead-letter-strategy")}
    # the argument is a quorum queue's: a classic queue refuses it (as 4.3.6
    # does), a policy's dead-letter-strategy does not apply to it
    [e] = errors(h.run(qdecl(c, "cl", arguments=ALO | {"x-queue-type": "classic"})))
    assert e.reply_code == 406 and e.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue 'cl' in vhost '/' "
        "of queue type rabbit_classic_queue")
    c = h.open(chan())
    h.run(PolicySet(False, "/", "alo", "^cl$", "queues", 0, {"dead-letter-strategy": "at-least-once"}))
    h.run(qdecl(c, "dh", durable=True, arguments=drop_head), qdecl(c, "cl", arguments=classic))
    assert h.state.dead_letters == {}
    die(h, c, b"x", "dh")
    die(h, c, b"y", "cl")
    h.run(qdecl(c, "dead"), qbind(c, "dead", "dlx"))
    assert drain(h, c, "dead") == []  # gone: at most once, and there was no route
    assert h.state.message_bytes == 0


def test_the_argument_wins_over_the_policy_and_a_switch_deletes_the_kept_ones() -> None:
    h = harness()
    c = h.open(chan())
    h.run(xdecl(c, "dlx", "fanout"))
    base = {"x-queue-type": "quorum", "x-overflow": "reject-publish",
            "x-dead-letter-exchange": "dlx"}
    h.run(qdecl(c, "pol", durable=True, arguments=base),
          qdecl(c, "arg", durable=True, arguments={**base,
                                                    "x-dead-letter-strategy": "at-most-once"}))
    h.run(PolicySet(False, "/", "alo", ".*", "queues", 0,
                    {"dead-letter-strategy": "at-least-once"}))
    assert list(h.state.dead_letters) == ["pol"]
    die(h, c, b"kept", "pol")
    assert kept(h, "pol") == [b"kept"]
    assert h.state.message_bytes == 4
    h.run(PolicyClear(False, "/", "alo"))  # rabbit_fifo_dlx switch_from: deleted
    assert h.state.dead_letters == {} and h.state.message_bytes == 0
    h.run(qdecl(c, "dead"), qbind(c, "dead", "dlx"))
    assert drain(h, c, "dead") == []


def test_purge_counts_and_takes_them_delete_drops_them() -> None:
    h = harness()
    c = source(h)
    die(h, c, b"a")
    die(h, c, b"bb")
    h.run(pub(c, "src", b"ready"))
    [r] = [r for r in replies(h.run(QueuePurge(c, "src", False))) if r.method == "Queue.PurgeOk"]
    assert r.fields["message_count"] == 3
    assert kept(h) == [] and h.state.message_bytes == 0
    die(h, c, b"again")
    h.run(QueueDelete(c, "src", False, False, False))
    assert h.state.dead_letters == {} and h.state.message_bytes == 0 and h.state.live == {}


def test_the_store_survives_a_snapshot_and_replays_identically() -> None:
    h = harness()
    c = source(h)
    h.run(qdecl(c, "roomy"), qdecl(c, "tight", arguments={"x-max-length": 1,
                                                         "x-overflow": "reject-publish"}))
    h.run(qbind(c, "roomy", "dlx"), qbind(c, "tight", "dlx"), pub(c, "tight", b"filler"))
    die(h, c, b"one")
    die(h, c, b"two")
    restored = snapshot_copy(h.state)
    assert_same_state(h.state, restored)
    assert [list(d.settled) for d in restored.dead_letters["src"]] == [["roomy"], ["roomy"]]
    # a fresh member folding the same log reaches the same bytes
    replica = default_state()
    for b in h.batches:
        apply_batch(replica, b)
    assert snapshot_bytes(replica) == snapshot_bytes(h.state)
    # the restored state goes on: drain the full target, a tick forwards both
    h.state = restored
    drain(h, c, "tight")
    h.now += 1
    h.run(Tick())
    assert [g.body for g in drain(h, c, "tight")] == [b"one"]  # its limit is 1
    h.now += 1
    h.run(Tick())
    assert [g.body for g in drain(h, c, "tight")] == [b"two"]
    assert [g.body for g in drain(h, c, "roomy")] == [b"one", b"two"]
    assert h.state.message_bytes == 0


def test_before_version_5_it_is_at_most_once_and_the_switch_starts_keeping() -> None:
    h = harness(4)
    c = source(h)
    assert h.state.dead_letters == {}
    die(h, c, b"gone")
    assert h.state.message_bytes == 0
    h.run(SetMachineVersion(5))
    assert list(h.state.dead_letters) == ["src"]
    die(h, c, b"kept")
    assert kept(h) == [b"kept"]


def test_the_strategy_argument_is_checked_from_version_5() -> None:
    h = harness(4)
    c = h.open(chan())
    assert errors(h.run(qdecl(c, "old", arguments={"x-dead-letter-strategy": "maybe"}))) == []
    h.run(SetMachineVersion(5))
    qq = {"x-queue-type": "quorum"}
    [e] = errors(h.run(qdecl(c, "new", durable=True, arguments=qq | {"x-dead-letter-strategy": "maybe"})))
    assert e.reply_code == 406
    assert e.reply_text == ("PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for "
                            "queue 'new' in vhost '/': invalid_dlx_strategy")
    c2 = h.open(chan(2))
    [e] = errors(h.run(qdecl(c2, "new", durable=True, arguments=qq | {"x-dead-letter-strategy": 1})))
    assert "unacceptable_type" in e.reply_text


def test_expired_messages_are_kept_too() -> None:
    h = harness()
    c = source(h, **{"x-message-ttl": 1000})
    h.run(pub(c, "src", b"old"))
    h.now += 2
    h.run(Tick())
    assert kept(h) == [b"old"]
    h.run(qdecl(c, "dead"), qbind(c, "dead", "dlx"))
    [g] = drain(h, c, "dead")
    assert g.props["headers"]["x-death"][0]["reason"] == "expired"
