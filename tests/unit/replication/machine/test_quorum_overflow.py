"""S32: a quorum queue's reject-publish is rabbit_fifo's latch (machine
version 5 on): the publish that takes the queue over x-max-length (or
x-max-length-bytes) is kept, the next ones are refused until the queue is
back at or below 80% of the limit; reject-publish-dlx is drop-head. A
classic queue and a version-4 state refuse at the limit, as before."""
from __future__ import annotations

from typing import Any

from node.replication.command import PolicySet, SetMachineVersion
from node.replication.machine.version import QUORUM_OVERFLOW
from tests.support.machine import (
    Harness,
    ack,
    chan,
    confirms,
    consume,
    get,
    gets,
    pub,
    qbind,
    qdecl,
    xdecl,
)
from tests.support.snapshot import snapshot_copy

QQ = {"x-queue-type": "quorum", "x-overflow": "reject-publish"}


def setup(version: int = QUORUM_OVERFLOW, **args: Any) -> tuple[Harness, Any]:
    h = Harness()
    h.run(SetMachineVersion(version))
    c = h.open(chan())
    h.run(qdecl(c, "q", durable=True, arguments=args))
    return h, c


class Publisher:
    def __init__(self, h: Harness, c: Any) -> None:
        self.h, self.c, self.seq = h, c, 0

    def __call__(self, body: bytes = b"m") -> bool:
        self.seq += 1
        [conf] = confirms(self.h.run(pub(self.c, "q", body, seq=self.seq)))
        assert conf.seq == self.seq
        return conf.ack


def take(h: Harness, c: Any, n: int) -> None:
    for _ in range(n):
        [g] = gets(h.run(get(c, "q")))
        h.run(ack(c, g.delivery_tag))


def test_the_publish_that_goes_over_is_kept_then_refused_until_80_percent() -> None:
    h, c = setup(**QQ, **{"x-max-length": 10})
    p = Publisher(h, c)
    assert [p() for _ in range(12)] == [True] * 11 + [False]
    assert h.state.queues["q"].ready_count() == 11 and h.state.queues["q"].rejecting
    take(h, c, 2)  # 9 ready: below the limit, not yet at 80% (8)
    assert p() is False
    take(h, c, 1)  # 8 ready
    assert p() is True and not h.state.queues["q"].rejecting
    assert [p() for _ in range(3)] == [True, True, False]  # 10, 11 (over again), refused


def test_bytes_limit_latches_alike() -> None:
    h, c = setup(**QQ, **{"x-max-length-bytes": 100})
    p = Publisher(h, c)
    assert [p(b"x" * 40) for _ in range(4)] == [True, True, True, False]  # 120 > 100
    take(h, c, 1)  # 80 bytes: at 80%
    assert p(b"x" * 40) is True


def test_the_latch_survives_a_snapshot() -> None:
    h, c = setup(**QQ, **{"x-max-length": 2})
    p = Publisher(h, c)
    assert [p(), p(), p()] == [True, True, True]
    h.state = snapshot_copy(h.state)
    assert h.state.queues["q"].rejecting
    assert p() is False


def test_a_raised_or_removed_limit_opens_the_latch_at_the_next_publish() -> None:
    h, c = setup(**QQ)
    h.run(PolicySet(False, "/", "len", "^q$", "queues", 0, {"max-length": 2}))
    p = Publisher(h, c)
    assert [p(), p(), p(), p()] == [True, True, True, False]
    h.run(PolicySet(False, "/", "len", "^q$", "queues", 0, {"max-length": 100}))
    assert p() is True
    h.run(PolicySet(False, "/", "len", "^q$", "queues", 0, {"max-length": 1}))
    assert p() is False  # over the new limit already: latched
    h.run(PolicySet(False, "/", "len", "^q$", "queues", 0, {"overflow": "reject-publish"}))
    assert p() is True and not h.state.queues["q"].rejecting  # no limit at all


def test_a_message_handed_straight_to_a_consumer_is_not_ready_and_does_not_count() -> None:
    h, c = setup(**QQ, **{"x-max-length": 1})
    h.run(consume(c, "q", "t", no_ack=True))
    p = Publisher(h, c)
    assert [p() for _ in range(5)] == [True] * 5
    assert h.state.queues["q"].ready_count() == 0


def test_reject_publish_dlx_on_a_quorum_queue_is_drop_head() -> None:
    h, c = setup(**{"x-queue-type": "quorum", "x-overflow": "reject-publish-dlx",
                    "x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    h.run(xdecl(c, "dlx", "fanout"), qdecl(c, "dead"), qbind(c, "dead", "dlx"))
    p = Publisher(h, c)
    assert [p(b"a"), p(b"b"), p(b"c")] == [True, True, True]
    assert [g.body for g in gets(h.run(get(c, "q"), get(c, "q")))] == [b"b", b"c"]
    [d] = gets(h.run(get(c, "dead")))
    assert d.body == b"a" and d.props["headers"]["x-death"][0]["reason"] == "maxlen"


def test_classic_queues_and_version_4_refuse_at_the_limit() -> None:
    h, c = setup(**{"x-overflow": "reject-publish", "x-max-length": 2})
    p = Publisher(h, c)
    assert [p(), p(), p()] == [True, True, False]
    take(h, c, 1)
    assert p() is True
    h, c = setup(QUORUM_OVERFLOW - 1, **QQ, **{"x-max-length": 2})
    p = Publisher(h, c)
    assert [p(), p(), p()] == [True, True, False]
