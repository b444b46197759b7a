"""Limits, topic permissions and the connection table folded through the
state machine (issue 28): ConnectionOpen counts per vhost, user and node,
every way a connection goes forgets it, max-queues refuses a declare with
RabbitMQ's 406 text, topic permissions refuse publishes and binds with its
403 texts, deletions take limits and topic permissions with them, and the
snapshot's access section carries them (counts rebuilt on load)."""
from __future__ import annotations

from node.broker.ids import ConnId
from node.replication.command import (
    ChannelClose,
    ChannelOpen,
    ConnectionClose,
    ConnectionOpen,
    ExchangeUnbind,
    LimitClear,
    LimitSet,
    NodeDown,
    NodeUp,
    QueueDelete,
    QueueUnbind,
    SetMachineVersion,
    TopicPermissionClear,
    TopicPermissionSet,
    TxCommit,
    UserDelete,
    UserPut,
    VhostDelete,
    VhostPut,
)
from node.replication.effect import ChannelError, ConnectionFailure
from node.replication.machine.version import LIMITS
from node.replication.read_model import build
from tests.support.machine import (
    Harness,
    chan,
    confirms,
    errors,
    pub,
    qbind,
    qdecl,
    replies,
    xbind,
    xdecl,
)
from tests.support.snapshot import assert_same_state, snapshot_copy


def harness() -> Harness:
    h = Harness()
    h.run(UserPut("u", "hash"), UserPut("w", "hash"), VhostPut("v"), SetMachineVersion(LIMITS))
    return h


def connect(h: Harness, conn: int, vhost: str = "/", user: str = "u", node: str = "n1",
            channels: int = 0) -> list:
    h.run(ConnectionOpen(ConnId(node, conn), vhost, user), node=node)
    chans = [chan(i, conn, node) for i in range(1, channels + 1)]
    for c in chans:
        h.run(ChannelOpen(c, vhost), node=node)
    return chans


def test_connections_are_counted_per_vhost_user_and_node_and_forgotten_every_way() -> None:
    h = harness()
    connect(h, 1, channels=2)
    connect(h, 2, vhost="v", channels=1)
    connect(h, 3, node="n2", channels=1)
    connect(h, 4, user="w")
    assert h.state.counts == {("vhost", "/", "n1"): 2, ("user", "u", "n1"): 2,
                              ("chan", "u", "n1"): 3, ("vhost", "v", "n1"): 1,
                              ("vhost", "/", "n2"): 1, ("user", "u", "n2"): 1,
                              ("chan", "u", "n2"): 1, ("user", "w", "n1"): 1}
    h.run(ChannelClose(chan(1, 1), True))
    assert h.state.counts[("chan", "u", "n1")] == 2
    h.run(ConnectionClose(ConnId("n1", 1)))  # its other channel goes with it
    assert h.state.counts[("chan", "u", "n1")] == 1
    assert ConnId("n1", 1) not in h.state.connections
    h.run(NodeDown("n2"))  # a channel-less connection is dropped (and told) too
    assert not any(k[2] == "n2" for k in h.state.counts)
    fx = h.run(VhostDelete("v"))
    assert [(e.conn, e.reply_code) for e in fx if isinstance(e, ConnectionFailure)] == \
        [(ConnId("n1", 2), 320)]
    h.run(NodeUp("n1", 2), node="n1", incarnation=2)  # a restart forgets the rest
    assert h.state.connections == {} and h.state.counts == {}


def test_node_down_tells_a_connection_without_channels() -> None:
    h = harness()
    connect(h, 5, node="n2")
    fx = h.run(NodeDown("n2"))
    assert [(e.conn, e.reply_code) for e in fx if isinstance(e, ConnectionFailure)] == \
        [(ConnId("n2", 5), 320)]


def test_max_queues_refuses_a_new_queue_with_rabbitmqs_406_but_not_a_redeclare() -> None:
    h = harness()
    c, = connect(h, 1, channels=1)
    h.run(LimitSet("vhost", "/", "max-queues", 2))
    h.run(qdecl(c, "q1"), qdecl(c, "q2"))
    assert not errors(h.run(qdecl(c, "q1")))  # an existing queue is no new one
    fx = h.run(qdecl(c, "q3"))
    assert [(e.reply_code, e.reply_text, e.class_id, e.method_id) for e in errors(fx)] == [
        (406, "PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost '/' (2) "
              "is reached", 50, 10)]
    c2 = chan(2, 1)
    h.run(ChannelOpen(c2), QueueDelete(c2, "q1", False, False, False))
    assert not errors(h.run(qdecl(c2, "q3")))
    h.run(LimitSet("vhost", "/", "max-queues", -1))  # negative: no limit
    assert not errors(h.run(qdecl(c2, "q4")))
    h.run(LimitSet("vhost", "/", "max-queues", 0), LimitClear("vhost", "/", "max-queues"))
    assert not errors(h.run(qdecl(c2, "q5")))
    assert h.state.vhost_limits == {}


def test_limits_of_unknown_owners_are_ignored_and_deletion_takes_them() -> None:
    h = harness()
    h.run(LimitSet("vhost", "nope", "max-queues", 1), LimitSet("user", "nobody", "max-channels", 1))
    assert h.state.vhost_limits == {} and h.state.user_limits == {}
    h.run(LimitSet("vhost", "v", "max-connections", 3), LimitSet("user", "w", "max-channels", 2),
          LimitSet("user", "w", "max-connections", 1),
          TopicPermissionSet("w", "/", "amq.topic", ".*", ".*"),
          TopicPermissionSet("u", "v", "amq.topic", ".*", ".*"))
    assert h.state.user_limits == {"w": {"max-channels": 2, "max-connections": 1}}
    h.run(UserDelete("w"), VhostDelete("v"))
    assert (h.state.vhost_limits, h.state.user_limits, h.state.topic_permissions) == ({}, {}, {})


def test_a_count_under_a_limit_moves_the_read_models_config() -> None:
    h = harness()
    before = build(h.state)
    connect(h, 1)  # no limit: the model has nothing to count
    assert build(h.state, before) is before or build(h.state, before).counts == {}
    h.run(LimitSet("user", "u", "max-connections", 5))
    m1 = build(h.state)
    assert dict(m1.counts) == {("user", "u", "n1"): 1} and dict(m1.user_limits["u"]) == {
        "max-connections": 5}
    connect(h, 2)
    m2 = build(h.state, m1)
    assert dict(m2.counts) == {("user", "u", "n1"): 2} and m2.users is m1.users
    assert m2.limits_on


def topic_setup(h: Harness) -> object:
    c, = connect(h, 1, channels=1)
    h.run(xdecl(c, "t", "topic"), xdecl(c, "d", "direct"), qdecl(c, "q"),
          TopicPermissionSet("u", "/", "t", "^{username}\\.", "^public\\."))
    return c


def test_topic_write_permission_refuses_a_publish_with_rabbitmqs_403() -> None:
    h = harness()
    c = topic_setup(h)
    assert confirms(h.run(pub(c, "u.orders", exchange="t", seq=1)))[0].ack
    fx = h.run(pub(c, "w.orders", exchange="t", seq=2))
    assert not confirms(fx)
    assert [(e.reply_code, e.reply_text, e.class_id, e.method_id) for e in errors(fx)] == [
        (403, "ACCESS_REFUSED - write access to topic 'w.orders' in exchange 't' in vhost '/' "
              "refused for user 'u'", 60, 40)]


def test_topic_permissions_leave_other_exchanges_users_and_types_alone() -> None:
    h = harness()
    c = topic_setup(h)
    assert not errors(h.run(pub(c, "anything", exchange="d", seq=1)))  # a direct exchange
    assert not errors(h.run(pub(c, "anything", exchange="amq.topic", seq=2)))  # none set there
    c2, = connect(h, 2, user="w", channels=1)
    assert not errors(h.run(pub(c2, "anything", exchange="t", seq=1)))  # none for this user

def test_a_channel_whose_user_is_unknown_is_refused_where_topic_permissions_exist() -> None:
    """Fails closed (issue 42): a channel whose connection is not in the
    table cannot be told apart from a restricted user; before, it published
    anything to `t`."""
    from node.replication.machine.version import TOPIC_FAIL_CLOSED

    old = harness()  # version 4-6: let through, as an older member would
    topic_setup(old)
    old.run(ChannelOpen(chan(1, 9)))
    assert not errors(old.run(pub(chan(1, 9), "w.orders", exchange="t", seq=1)))
    h = harness()
    h.run(SetMachineVersion(TOPIC_FAIL_CLOSED))
    topic_setup(h)
    c3 = chan(1, 9)
    h.run(ChannelOpen(c3))  # a connection the table does not know
    fx = h.run(pub(c3, "w.orders", exchange="t", seq=1))
    assert not confirms(fx)
    assert [(e.reply_code, e.reply_text) for e in errors(fx)] == [
        (403, "ACCESS_REFUSED - write access to topic 'w.orders' in exchange 't' in vhost '/' "
              "refused: the channel's user is unknown")]
    c4 = chan(2, 9)
    h.run(ChannelOpen(c4))
    assert not errors(h.run(pub(c4, "anything", exchange="amq.topic", seq=1)))  # none set there


def test_topic_read_permission_refuses_binds_and_unbinds_of_other_keys() -> None:
    h = harness()
    c = topic_setup(h)
    assert replies(h.run(qbind(c, "q", "t", "public.#")))
    cases = ((lambda c: qbind(c, "q", "t", "private.#"), (50, 20)),
             (lambda c: QueueUnbind(c, "q", "t", "private.#", {}), (50, 50)),
             (lambda c: xbind(c, "d", "t", "private.#"), (40, 30)),
             (lambda c: ExchangeUnbind(c, "d", "t", "private.#", {}, False), (40, 40)))
    for i, (make, ids) in enumerate(cases):
        c = chan(10 + i, 1)  # each refusal closes its channel
        h.run(ChannelOpen(c))
        fx = h.run(make(c))
        assert [(e.reply_code, e.reply_text, e.class_id, e.method_id) for e in errors(fx)] == [
            (403, "ACCESS_REFUSED - read access to topic 'private.#' in exchange 't' in vhost "
                  "'/' refused for user 'u'", *ids)], ids


def test_an_empty_topic_pattern_permits_nothing_and_vhost_expands_escaped() -> None:
    h = harness()
    c = topic_setup(h)
    h.run(TopicPermissionSet("u", "/", "t", "", "^{vhost}x$"))
    assert errors(h.run(pub(c, "u.x", exchange="t")))
    c = chan(2, 1)
    h.run(ChannelOpen(c))
    assert not errors(h.run(qbind(c, "q", "t", "/x")))
    fx = h.run(qbind(c, "q", "t", "ax"))  # "/" escaped: no regex surprise
    assert errors(fx)


def test_a_tx_commit_with_a_refused_topic_publish_applies_nothing() -> None:
    h = harness()
    c = topic_setup(h)
    fx = h.run(TxCommit(c, (pub(c, "q", exchange=""), pub(c, "w.x", exchange="t"))))
    assert [e.reply_code for e in errors(fx)] == [403]
    assert h.state.queues["q"].ready_count() == 0  # the first publish was not applied


def test_topic_permission_clear_one_exchange_or_all_of_a_vhost() -> None:
    h = harness()
    h.run(TopicPermissionSet("u", "/", "a", "x", "y"), TopicPermissionSet("u", "/", "b", "x", "y"),
          TopicPermissionSet("u", "v", "a", "x", "y"))
    h.run(TopicPermissionClear("u", "/", "a"))
    assert list(h.state.topic_permissions) == [("u", "/", "b"), ("u", "v", "a")]
    h.run(TopicPermissionClear("u", "/", ""))
    assert list(h.state.topic_permissions) == [("u", "v", "a")]


def test_the_access_section_round_trips_and_counts_are_rebuilt() -> None:
    h = harness()
    connect(h, 1, channels=2)
    connect(h, 2, vhost="v", node="n2", user="w", channels=1)
    h.run(LimitSet("vhost", "/", "max-connections", 4), LimitSet("user", "w", "max-channels", 9),
          TopicPermissionSet("u", "/", "amq.topic", "^a", ""))
    copy = snapshot_copy(h.state)
    assert copy.counts == h.state.counts and copy.counts  # derived: equal, order aside
    copy.counts = h.state.counts
    assert_same_state(copy, h.state)


def test_before_machine_version_4_the_snapshot_has_no_access_section() -> None:
    h = Harness()
    h.run(SetMachineVersion(2))
    copy = snapshot_copy(h.state)
    assert copy.machine_version == 2 and copy.connections == {} and copy.vhost_limits == {}


def test_channel_errors_are_channel_errors() -> None:  # the applier's own path
    h = harness()
    c = topic_setup(h)
    fx = h.run(pub(c, "w.x", exchange="t"))
    assert all(isinstance(e, ChannelError) for e in errors(fx))


def test_a_connection_recorded_after_its_channels_counts_them_once() -> None:
    h = harness()
    c1, c2 = chan(1, 3), chan(2, 3)
    h.run(ChannelOpen(c1), ChannelOpen(c2))  # opened before the switch to version 4
    h.run(ConnectionOpen(ConnId("n1", 3), "/", "u"))  # recorded at the switch
    assert h.state.counts[("chan", "u", "n1")] == 2
    h.run(ChannelClose(c1, True))
    assert h.state.counts[("chan", "u", "n1")] == 1
    h.run(ConnectionClose(ConnId("n1", 3)))
    assert h.state.counts == {}
