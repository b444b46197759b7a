"""Policies folded through the state machine: a change applies at once to
every matching queue and exchange (RabbitMQ's update_matched_objects), new
queues take theirs when declared, x-arguments win as RabbitMQ resolves each
key, and operator policies merge conservatively."""
from __future__ import annotations

import struct
import zlib
from typing import Any

from node.replication.codec import encode
from node.replication.command import (
    ExchangeDeclare,
    PolicyClear,
    PolicySet,
    QueueDelete,
    Tick,
    VhostDelete,
    VhostPut,
)
from node.replication.machine.policy import queue_policies
from node.replication.raft.snapshot import HEADER_SIZE, MAGIC, encode_snapshot, read_snapshot
from tests.support.machine import (
    Harness,
    bodies,
    chan,
    consume,
    get,
    pub,
    qbind,
    qdecl,
    reject,
    xdecl,
)
from tests.support.snapshot import META, assert_same_state, snapshot_copy


def policy(name: str, pattern: str, definition: dict[str, Any], priority: int = 0,
           apply_to: str = "all", vhost: str = "/") -> PolicySet:
    return PolicySet(False, vhost, name, pattern, apply_to, priority, definition)


def op_policy(name: str, pattern: str, definition: dict[str, Any], priority: int = 0,
              apply_to: str = "queues") -> PolicySet:
    return PolicySet(True, "/", name, pattern, apply_to, priority, definition)


def setup(h: Harness, *queues: str, args: dict[str, Any] | None = None) -> Any:
    c = h.open(chan())
    for q in queues:
        h.run(qdecl(c, q, durable=True, arguments=args))
    return c


def test_a_max_length_policy_caps_an_existing_queue_at_once_dead_lettering_the_heads() -> None:
    h = Harness()
    c = setup(h, "jobs", "dlq")
    for i in range(5):
        h.run(pub(c, "jobs", f"m{i}".encode()))
    h.run(policy("cap", "^jobs$", {"max-length": 2, "dead-letter-exchange": "",
                                   "dead-letter-routing-key": "dlq"}))
    q = h.state.queues["jobs"]
    assert q.ready_count() == 2 and q.max_length == 2
    assert bodies(h.run(get(c, "jobs", True), get(c, "jobs", True))) == [b"m3", b"m4"]
    dead = bodies(h.run(*(get(c, "dlq", True) for _ in range(3))))
    assert dead == [b"m0", b"m1", b"m2"]
    # a queue declared later takes the policy too; another name does not
    h.run(qdecl(c, "jobs2", durable=True), qdecl(c, "other", durable=True))
    assert h.state.queues["other"].max_length is None
    h.run(policy("cap", "^jobs", {"max-length": 1}))
    assert h.state.queues["jobs2"].max_length == 1


def test_a_message_ttl_policy_expires_messages_published_after_it() -> None:
    h = Harness()
    c = setup(h, "t")
    h.run(policy("ttl", ".*", {"message-ttl": 1000}, apply_to="queues"))
    h.run(pub(c, "t", b"old"))
    h.now += 2
    h.run(Tick())
    assert h.state.queues["t"].ready_count() == 0


def test_a_dead_letter_exchange_from_a_policy_receives_rejected_messages() -> None:
    h = Harness()
    c = setup(h, "work", "dead")
    h.run(ExchangeDeclare(c, "dlx", "fanout", False, True, False, False, {}, False))
    h.run(qbind(c, "dead", "dlx"))
    h.run(policy("dl", "^work$", {"dead-letter-exchange": "dlx"}))
    h.run(pub(c, "work", b"bad"), consume(c, "work", "ct"))
    h.run(reject(c, 1, requeue=False))
    assert bodies(h.run(get(c, "dead", True))) == [b"bad"]


def test_x_arguments_win_as_rabbitmq_resolves_each_key() -> None:
    h = Harness()
    c = setup(h, "classic", args={"x-max-length": 5, "x-overflow": "reject-publish",
                                  "x-dead-letter-exchange": "mine", "x-message-ttl": 100})
    h.run(qdecl(c, "quorum", durable=True,
                arguments={"x-queue-type": "quorum", "x-overflow": "reject-publish"}))
    h.run(policy("p", ".*", {"max-length": 10, "overflow": "drop-head",
                             "dead-letter-exchange": "theirs", "message-ttl": 50}))
    q = h.state.queues["classic"]
    # the smaller limit and TTL, the argument's DLX and (classic) overflow
    assert (q.max_length, q.message_ttl, q.dlx, q.overflow) == (5, 50, "mine", "reject-publish")
    # a quorum queue takes the policy's overflow (rabbit_quorum_queue: policy_has_precedence)
    assert h.state.queues["quorum"].overflow == "drop-head"


def test_an_operator_policy_merges_the_more_conservative_value() -> None:
    h = Harness()
    c = setup(h, "q", args={"x-queue-type": "quorum"})
    h.run(policy("p", ".*", {"max-length": 100, "message-ttl": 1000, "delivery-limit": -1,
                             "overflow": "drop-head"}))
    h.run(op_policy("op", ".*", {"max-length": 10, "message-ttl": 5000, "delivery-limit": 3,
                                 "overflow": "reject-publish"}))
    q = h.state.queues["q"]
    assert (q.max_length, q.message_ttl, q.delivery_limit, q.overflow) == \
        (10, 1000, 3, "reject-publish")
    p, op = queue_policies(h.state, q)
    assert p is not None and op is not None and (p.name, op.name) == ("p", "op")
    h.run(PolicyClear(True, "/", "op"))
    assert (q.max_length, q.delivery_limit, q.overflow) == (100, None, "drop-head")
    del c


def test_clearing_a_policy_returns_a_queue_to_its_arguments() -> None:
    h = Harness()
    setup(h, "q", args={"x-max-length": 7})
    h.run(policy("p", ".*", {"max-length": 3, "expires": 60000}))
    q = h.state.queues["q"]
    assert (q.max_length, q.expires) == (3, 60000) and "q" in h.state.expires_index
    h.run(PolicyClear(False, "/", "p"))
    assert (q.max_length, q.expires) == (7, None) and "q" not in h.state.expires_index


def test_the_highest_priority_policy_applies_alone() -> None:
    h = Harness()
    setup(h, "q")
    h.run(policy("low", ".*", {"max-length": 1}, priority=1),
          policy("high", "^q", {"message-ttl": 5}, priority=2))
    q = h.state.queues["q"]
    assert (q.max_length, q.message_ttl) == (None, 5)


def test_a_policy_with_a_key_a_classic_queue_lacks_does_not_apply_to_it() -> None:
    # rabbit_classic_queue's unsupported_policies: delivery-limit
    h = Harness()
    c = setup(h, "classic")
    h.run(qdecl(c, "quorum", durable=True, arguments={"x-queue-type": "quorum"}))
    h.run(policy("dl", ".*", {"delivery-limit": 2, "max-length": 4}))
    assert h.state.queues["classic"].max_length is None
    assert h.state.queues["quorum"].delivery_limit == 2
    h.run(policy("c", ".*", {"max-length": 4}, apply_to="classic_queues", priority=5))
    assert h.state.queues["classic"].max_length == 4
    assert h.state.queues["quorum"].max_length == 4  # still "dl"


def test_an_alternate_exchange_from_a_policy_takes_unroutable_messages() -> None:
    h = Harness()
    c = setup(h, "lost")
    h.run(ExchangeDeclare(c, "ae", "fanout", False, True, False, False, {}, False),
          ExchangeDeclare(c, "main", "direct", False, True, False, False, {}, False))
    h.run(qbind(c, "lost", "ae"))
    h.run(policy("ae", "^main$", {"alternate-exchange": "ae"}, apply_to="exchanges"))
    h.run(pub(c, "nowhere", b"x", exchange="main"))
    assert bodies(h.run(get(c, "lost", True))) == [b"x"]
    h.run(PolicyClear(False, "/", "ae"))
    h.run(pub(c, "nowhere", b"y", exchange="main"))
    assert h.state.queues["lost"].ready_count() == 0


def test_policies_survive_a_snapshot_and_a_deleted_vhost_takes_its_own() -> None:
    h = Harness()
    setup(h, "q")
    h.run(policy("p", ".*", {"max-length": 3}), op_policy("o", "^q$", {"expires": 1000}))
    h.run(policy("ae", ".*", {"alternate-exchange": "x"}, apply_to="exchanges", priority=9))
    copy = snapshot_copy(h.state)
    assert_same_state(h.state, copy)
    assert copy.policy_ae == h.state.policy_ae and copy.policy_ae
    h.run(VhostPut("v"), policy("pv", ".*", {"max-length": 1}, vhost="v"))
    assert ("v", "pv") in h.state.policies
    h.run(VhostDelete("v"))
    assert list(h.state.policies) == [("/", "p"), ("/", "ae")]


def test_a_policy_for_an_unknown_vhost_is_ignored() -> None:
    h = Harness()
    h.run(policy("p", ".*", {"max-length": 3}, vhost="nope"))
    assert h.state.policies == {}


def test_a_snapshot_written_before_policies_existed_still_loads() -> None:
    h = Harness()
    setup(h, "q", args={"x-max-length": 4})
    data = encode_snapshot(h.state, META)
    section = encode(("policies", 1, [], []))
    assert data.endswith(section)
    body = data[HEADER_SIZE:-len(section)]  # what a build before issue 28 wrote
    for version, old_body in ((3, body), (2, body[8:])):  # (version 2: no log-entries section)
        old = struct.pack("<8sHHQI", MAGIC, version, 0, len(old_body), zlib.crc32(old_body)) + old_body
        state, _ = read_snapshot(old)
        assert state.policies == {} and state.queues["q"].max_length == 4


def test_the_cached_winners_equal_a_full_match_after_any_sequence_of_writes() -> None:
    """The incremental re-evaluation (only the changed policy against each
    object of its vhost; a full match only where it was the winner) agrees
    with matching every policy, after random sets, replacements and clears
    of both families, and a snapshot load rebuilds the same caches."""
    import random

    from node.broker.policy import alternate_exchange, effective_definition, matching, queue_type
    from node.broker.vhost import split_key

    rnd = random.Random(7)
    h = Harness()
    names = [f"q{i}" for i in range(12)]
    c = setup(h, *names)
    h.run(qdecl(c, "qq1", durable=True, arguments={"x-queue-type": "quorum"}))
    h.run(xdecl(c, "xa"))
    h.run(xdecl(c, "xb", "topic"))
    patterns = ["^q1", "q", "^q\\d$", "1$", "^x", "^qq", "nothing", "a"]
    for step in range(300):
        operator = rnd.random() < 0.3
        name = f"p{rnd.randrange(8)}"
        roll = rnd.random()
        if roll < 0.03:  # a second vhost comes and goes, its default exchanges with it
            h.run(VhostDelete("v2") if "v2" in h.state.vhosts else VhostPut("v2"))
        elif roll < 0.08 and "v2" in h.state.vhosts:
            h.run(PolicySet(operator, "v2", name, rnd.choice(["amq", "direct$", "^$"]),
                            "exchanges", rnd.randrange(3), {"alternate-exchange": "ae"}))
        elif roll < 0.1 and "v2" in h.state.vhosts:
            h.run(PolicyClear(operator, "v2", name))
        elif roll < 0.15:  # objects come and go between policy writes
            h.run(QueueDelete(c, rnd.choice(names), False, False, False))
        elif roll < 0.2:
            h.run(qdecl(c, rnd.choice(names), durable=True))
        elif roll < 0.4:
            h.run(PolicyClear(operator, "/", name))
        else:
            definition = {"max-length": rnd.randrange(100)} if operator or rnd.random() < 0.5 \
                else {"alternate-exchange": "xa", "message-ttl": 5}
            if not operator and rnd.random() < 0.1:
                definition = {"delivery-limit": 3}  # not for classic queues
            h.run(PolicySet(operator, "/", name, rnd.choice(patterns),
                            rnd.choice(["all", "queues", "exchanges", "quorum_queues"]),
                            rnd.randrange(3), definition))
        s = h.state
        for key, q in s.queues.items():
            want = matching(s.policies, s.operator_policies, key, "queue", queue_type(q.arguments))
            assert queue_policies(s, q) == want, (step, key)
        for key in s.exchanges:
            want = matching(s.policies, s.operator_policies, key, "exchange")
            assert s.policy_index.winners("exchange", key) == want, (step, key)
        members = s.policy_index.plain()[2]
        want_members: dict[str, list[tuple[str, str]]] = {}
        for kind, table in (("queue", s.queues), ("exchange", s.exchanges)):
            for key in table:
                want_members.setdefault(split_key(key)[0], []).append((kind, key))
        assert members == {v: sorted(m) for v, m in sorted(want_members.items())}, step
        ae = {k: alternate_exchange({}, effective_definition(*matching(
            s.policies, s.operator_policies, k, "exchange"))) for k in s.exchanges}
        assert s.policy_ae == {k: v for k, v in ae.items() if v is not None}, step
    restored = snapshot_copy(h.state)
    assert restored.policy_index == h.state.policy_index
    assert restored.policy_ae == h.state.policy_ae


def test_the_apply_refuses_a_policy_past_the_ceiling_whatever_was_proposed() -> None:
    from node.broker.definition_limit import CEILING_NAME_BYTES
    from node.replication.command import SetMachineVersion
    from node.replication.machine.version import DEFINITION_CEILINGS

    too_long = policy("n" * (CEILING_NAME_BYTES + 1), "^jobs$", {"max-length": 1})
    too_big = policy("big", "^jobs$", {"dead-letter-routing-key": "k" * (300 * 1024)})
    old = Harness()  # below version 7 every member takes it (an older one would too)
    setup(old, "jobs")
    old.run(too_long)
    assert len(old.state.policies) == 1
    h = Harness()
    h.run(SetMachineVersion(DEFINITION_CEILINGS))
    setup(h, "jobs")
    h.run(too_long)
    h.run(too_big)
    assert h.state.policies == {}
    assert queue_policies(h.state, h.state.queues["jobs"]) == (None, None)
