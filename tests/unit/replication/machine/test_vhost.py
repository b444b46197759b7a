"""Vhosts and permissions in the replicated state machine and the pure
permission rule (issue 7): names resolve in the channel's vhost, vhosts are
isolated, deleting one takes everything in it, permissions follow users and
vhosts."""
from __future__ import annotations

from node.broker.permission import CONFIGURE, READ, WRITE, check_patterns, permitted
from node.broker.vhost import resource_key, split_key, vhost_name_error
from node.replication.command import (
    ChannelOpen,
    PermissionClear,
    PermissionSet,
    UserDelete,
    UserPut,
    VhostDelete,
    VhostPut,
)
from node.replication.effect import ChannelError, ConnectionFailure, Reply
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


def _open(h: Harness, serial: int, vhost: str, conn: int = 1) -> object:
    c = chan(serial, conn=conn)
    fx = h.run(ChannelOpen(c, vhost))
    assert not [e for e in fx if isinstance(e, ConnectionFailure)], fx
    return c


def test_keys_of_the_default_vhost_are_plain_names() -> None:
    assert resource_key("/", "q") == "q"
    assert split_key("q") == ("/", "q")
    assert split_key(resource_key("v1", "q")) == ("v1", "q")
    assert resource_key("v1", "q") != resource_key("v2", "q")
    assert vhost_name_error("") and vhost_name_error("a\x00b") and vhost_name_error("x" * 256)
    assert vhost_name_error("prod") is None


def test_same_names_in_two_vhosts_are_different_queues() -> None:
    h = Harness()
    h.run(VhostPut("v1"))
    root, v1 = _open(h, 1, "/"), _open(h, 2, "v1")
    h.run(qdecl(root, "q"), qdecl(v1, "q"))
    h.run(pub(root, "q", b"root"), pub(v1, "q", b"v1"))  # default exchange of each vhost
    assert bodies(h.run(get(root, "q", no_ack=True))) == [b"root"]
    assert bodies(h.run(get(v1, "q", no_ack=True))) == [b"v1"]
    assert set(h.state.queues) == {"q", "v1\x00q"}


def test_a_vhost_has_its_own_amq_exchanges_and_cannot_see_others() -> None:
    h = Harness()
    h.run(VhostPut("v1"))
    root, v1 = _open(h, 1, "/"), _open(h, 2, "v1")
    h.run(xdecl(root, "only-in-root"))
    fx = h.run(qdecl(v1, "q"), qbind(v1, "q", "amq.topic", "a.#"), pub(v1, "a.b", b"t",
                                                                        exchange="amq.topic"))
    assert not [e for e in fx if isinstance(e, ChannelError)]
    assert bodies(h.run(get(v1, "q", no_ack=True))) == [b"t"]
    v1b = _open(h, 3, "v1")
    fx = h.run(qbind(v1b, "q", "only-in-root"))
    err = [e for e in fx if isinstance(e, ChannelError)]
    assert err and err[0].reply_code == 404 and "in vhost 'v1'" in err[0].reply_text


def test_dead_letters_stay_in_the_queue_vhost() -> None:
    h = Harness()
    h.run(VhostPut("v1"))
    root, v1 = _open(h, 1, "/"), _open(h, 2, "v1")
    h.run(xdecl(root, "dlx", "fanout"), qdecl(root, "dead"), qbind(root, "dead", "dlx"))
    h.run(xdecl(v1, "dlx", "fanout"), qdecl(v1, "dead"), qbind(v1, "dead", "dlx"),
          qdecl(v1, "work", arguments={"x-dead-letter-exchange": "dlx"}))
    h.run(pub(v1, "work", b"m"), consume(v1, "work", "c"))
    h.run(reject(v1, 1, requeue=False))
    assert bodies(h.run(get(v1, "dead", no_ack=True))) == [b"m"]
    assert h.state.queues["dead"].ready_count() == 0  # "/"'s dead letter queue untouched


def test_nul_in_a_name_is_refused() -> None:
    h = Harness()
    c = _open(h, 1, "/")
    fx = h.run(qdecl(c, "v1\x00q"))
    err = [e for e in fx if isinstance(e, ChannelError)]
    assert err and err[0].reply_code == 406


def test_channel_open_on_a_missing_vhost_closes_the_connection() -> None:
    h = Harness()
    fx = h.run(ChannelOpen(chan(1), "gone"))
    err = [e for e in fx if isinstance(e, ConnectionFailure)]
    assert err and err[0].reply_code == 530
    assert chan(1) not in h.state.channels


def test_vhost_delete_takes_queues_exchanges_permissions_and_connections() -> None:
    h = Harness()
    h.run(VhostPut("v1"), UserPut("u", "h", ()), PermissionSet("u", "v1", ".*", ".*", ".*"),
          PermissionSet("u", "/", ".*", "", ""))
    root, v1 = _open(h, 1, "/", conn=1), _open(h, 2, "v1", conn=2)
    h.run(qdecl(root, "q"), qdecl(v1, "q"), xdecl(v1, "x"))
    fx = h.run(VhostDelete("v1"))
    closed = [e for e in fx if isinstance(e, ConnectionFailure)]
    assert [(e.conn.serial, e.reply_code) for e in closed] == [(2, 320)]
    assert "v1" not in h.state.vhosts
    assert [k for k in h.state.queues] == ["q"]
    assert not [k for k in h.state.exchanges if split_key(k)[0] == "v1"]
    assert h.state.permissions == {("u", "/"): (".*", "", "")}
    assert root in h.state.channels and v1 not in h.state.channels


def test_permissions_need_an_existing_user_and_vhost_and_go_with_the_user() -> None:
    h = Harness()
    h.run(UserPut("u", "h", ()), PermissionSet("u", "nope", ".*", ".*", ".*"),
          PermissionSet("ghost", "/", ".*", ".*", ".*"))
    assert h.state.permissions == {}
    h.run(PermissionSet("u", "/", "^a", "^b", "^c"))
    assert h.state.permissions == {("u", "/"): ("^a", "^b", "^c")}
    before = h.state.config_version
    h.run(PermissionSet("u", "/", "^x", "^b", "^c"))
    assert h.state.config_version > before  # the read model (and the wire's caches) notice
    assert h.state.permissions == {("u", "/"): ("^x", "^b", "^c")}
    h.run(UserDelete("u"))
    assert h.state.permissions == {}
    h.run(UserPut("u", "h", ()), PermissionSet("u", "/", ".*", ".*", ".*"),
          PermissionClear("u", "/"))
    assert h.state.permissions == {}


def test_vhost_put_is_idempotent() -> None:
    h = Harness()
    h.run(VhostPut("v1"))
    c = _open(h, 1, "v1")
    h.run(qdecl(c, "q"))
    fx = h.run(VhostPut("v1"))
    assert not fx and resource_key("v1", "q") in h.state.queues
    assert [e for e in h.run(qdecl(c, "q")) if isinstance(e, Reply)]


def test_permission_patterns_are_unanchored_and_empty_means_nothing() -> None:
    p = ("^conf-", "pub", "")
    assert permitted(p, CONFIGURE, "conf-x") and not permitted(p, CONFIGURE, "x-conf-")
    assert permitted(p, WRITE, "my-pub-x")  # RabbitMQ searches: match anywhere
    assert not permitted(p, READ, "") and not permitted(p, READ, "anything")
    assert permitted((".*", ".*", ".*"), READ, "")
    assert check_patterns(".*", "(", ".*") is not None
    assert check_patterns("^a$", "", ".*") is None


def test_resource_locked_and_exclusive_texts_name_the_queues_own_vhost() -> None:
    # 405 for an exclusive queue of vhost v named vhost '/' (a bare name where the
    # vhost-qualified key was meant); texts now take a ResourceKey only
    h = Harness()
    h.run(VhostPut("v"))
    owner, other = _open(h, 1, "v", conn=1), _open(h, 2, "v", conn=2)
    h.run(qdecl(owner, "ex", exclusive=True))
    locked = "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'ex' in vhost 'v'"
    # the owner redeclaring it without exclusive, and another connection unbinding it
    for cmd, c in ((qdecl(owner, "ex"), owner), (qbind(other, "ex", "amq.direct", "k"), other)):
        errs = [e for e in h.run(cmd) if isinstance(e, ChannelError)]
        assert len(errs) == 1 and errs[0].reply_code == 405, errs
        assert errs[0].reply_text.startswith(locked), errs[0].reply_text
        _reopen = ChannelOpen(c, "v")  # the channel was closed by the error
        h.run(_reopen)
