"""The loop's immutable read model of the replicated state (issue 12):
build() reuses unchanged parts, the publisher hands models and on-demand
queue rows from the raft thread to the loop, and BrokerState's
config_version survives (or defaults in) snapshots."""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from node.replication.command import (
    ChannelOpen,
    MarkOutOfSync,
    PermissionSet,
    SetDraining,
    SetMember,
    UserDelete,
    UserPut,
    VhostDelete,
    VhostPut,
)
from node.replication.machine import BrokerState, default_state
from node.replication.read_model import (
    EMPTY,
    ModelPublisher,
    QueueRow,
    ReadModel,
    build,
    queue_rows,
)
from tests.support.machine import (
    Harness,
    ack,
    chan,
    consume,
    pub,
    qdecl,
)
from tests.support.snapshot import snapshot_copy

C1, C2 = chan(1), chan(2)


def _members(h: Harness, *nodes: str) -> None:
    h.run(*[SetMember(n, f"{n}:4321", True) for n in nodes])


def test_build_reuses_unchanged_parts() -> None:
    h = Harness()
    _members(h, "n1", "n2", "n3")
    h.run(UserPut("alice", "H", ("administrator",)), PermissionSet("alice", "/", ".*", ".*", ".*"))
    m1 = build(h.state)
    assert dict(m1.users) == {"alice": ("H", ("administrator",))}
    assert list(m1.vhosts) == ["/"]
    assert dict(m1.permissions) == {("alice", "/"): (".*", ".*", ".*")}
    assert dict(m1.members) == {"n1": "n1:4321", "n2": "n2:4321", "n3": "n3:4321"}
    assert m1.in_sync == ("n1", "n2", "n3") and m1.draining == ()
    assert m1.config_version == h.state.config_version and m1.version == 1
    assert build(h.state, m1) is m1  # nothing changed: the very same model

    h.open(C1)
    h.run(qdecl(C1, "q"), pub(C1, "q", b"abc"))  # bytes and queue count, no config change
    m2 = build(h.state, m1)
    assert m2 is not m1 and m2.version == 2
    assert (m2.message_bytes, m2.queue_count) == (3, 1)
    for part in ("users", "vhosts", "permissions", "members", "in_sync", "draining"):
        assert getattr(m2, part) is getattr(m1, part), part

    h.run(MarkOutOfSync("n3"))  # a config change that leaves users etc. alone
    m3 = build(h.state, m2)
    assert m3.in_sync == ("n1", "n2") and m3.in_sync is not m2.in_sync
    for part in ("users", "vhosts", "permissions", "members", "draining"):
        assert getattr(m3, part) is getattr(m2, part), part

    # a full rebuild (the state object was replaced) still keeps equal parts
    m4 = build(snapshot_copy(h.state), m3, full=True)
    for part in ("users", "vhosts", "permissions", "members", "in_sync", "draining"):
        assert getattr(m4, part) is getattr(m3, part), part


def test_a_user_change_yields_a_new_users_mapping_only() -> None:
    h = Harness()
    h.run(UserPut("alice", "H", ()), PermissionSet("alice", "/", ".*", ".*", ".*"))
    m1 = build(h.state)
    h.run(UserPut("bob", "H2", ("monitoring",)))
    m2 = build(h.state, m1)
    assert m2.users is not m1.users and "bob" in m2.users
    assert m2.vhosts is m1.vhosts and m2.permissions is m1.permissions
    assert "bob" not in m1.users  # the old model is untouched
    h.run(UserDelete("alice"))  # drops its permissions too
    m3 = build(h.state, m2)
    assert list(m3.users) == ["bob"] and dict(m3.permissions) == {}
    assert m3.vhosts is m2.vhosts
    h.run(VhostPut("v1"))
    m4 = build(h.state, m3)
    assert list(m4.vhosts) == ["/", "v1"] and m4.users is m3.users
    h.run(VhostDelete("v1"))
    assert list(build(h.state, m4).vhosts) == ["/"]


def test_the_model_cannot_be_mutated() -> None:
    h = Harness()
    h.run(UserPut("alice", "H", ()))
    m = build(h.state)
    with pytest.raises(TypeError):
        m.users["mallory"] = ("x", ())  # type: ignore[index]
    with pytest.raises(TypeError):
        del m.vhosts["/"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        m.permissions[("alice", "/")] = (".*", ".*", ".*")  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.users = {}  # type: ignore[misc]
    assert isinstance(m.in_sync, tuple) and isinstance(m.draining, tuple)
    # the state moves on in place; the model keeps what it saw
    h.run(UserPut("bob", "H", ()))
    assert list(m.users) == ["alice"]
    # plain dicts given to the constructor are copied, not wrapped
    users: dict[str, tuple[str, tuple[str, ...]]] = {"a": ("h", ())}
    made = ReadModel(users=users, in_sync=["n1"])  # type: ignore[arg-type]
    users["b"] = ("h", ())
    assert list(made.users) == ["a"] and made.in_sync == ("n1",)
    with pytest.raises(TypeError):
        made.users["c"] = ("h", ())  # type: ignore[index]


def test_queue_rows_count_ready_unacked_and_consumers() -> None:
    h = Harness()
    h.open(C1)
    h.open(C2)
    h.run(qdecl(C1, "work", durable=True), qdecl(C1, "idle"), VhostPut("v1"))
    h.run(*[pub(C1, "work", b"m%d" % i) for i in range(5)], pub(C1, "idle", b"x"))
    h.run(consume(C2, "work", "c1", credit=2))
    rows = queue_rows(h.state)
    assert rows == (QueueRow("idle", "/", 1, 0, 0, False), QueueRow("work", "/", 3, 2, 1, True))
    h.run(ack(C2, 1))  # one settled; the freed credit slot is not refilled without BasicCredit
    assert queue_rows(h.state)[1] == QueueRow("work", "/", 3, 1, 1, True)
    v1 = chan(3)
    h.run(ChannelOpen(v1, "v1"))
    h.run(qdecl(v1, "work"))
    assert [(r.vhost, r.name) for r in queue_rows(h.state)] == [
        ("/", "idle"), ("/", "work"), ("v1", "work")]


def test_a_state_from_a_snapshot_keeps_its_config_version_and_changes_on() -> None:
    h = Harness()
    h.run(UserPut("alice", "H", ()), SetMember("n1", "n1:1", True))
    assert h.state.config_version > 0
    st = snapshot_copy(h.state)
    assert st.config_version == h.state.config_version
    assert st.users == {"alice": ("H", ())} and list(st.members) == ["n1"]
    assert "/" in st.vhosts and st.exchanges.keys() == h.state.exchanges.keys()
    st.users["bob"] = ("H", ())  # the applier may mutate in place again
    assert list(build(st).users) == ["alice", "bob"]


# ---------------------------------------------------------------- publisher

def _run(coro_fn: Callable[[asyncio.AbstractEventLoop], Coroutine[Any, Any, None]]) -> None:
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coro_fn(loop))
    finally:
        loop.close()


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_publisher_hands_models_to_the_loop_and_calls_listeners_on_access_changes() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        h = Harness()
        pub_ = ModelPublisher(loop)
        assert pub_.current is EMPTY
        seen: list[ReadModel] = []
        pub_.add_listener(seen.append)
        pub_.tick(h.state)
        await _settle()
        first = pub_.current
        assert list(first.vhosts) == ["/"] and len(seen) == 1  # vhosts appeared
        pub_.tick(h.state)  # nothing changed: nothing handed over
        await _settle()
        assert pub_.current is first

        h.open(C1)
        h.run(qdecl(C1, "q"), pub(C1, "q", b"abcd"))
        pub_.tick(h.state)
        await _settle()
        assert pub_.current.message_bytes == 4 and len(seen) == 1  # no access change

        h.run(UserPut("alice", "H", ()))
        pub_.tick(h.state)
        await _settle()
        assert len(seen) == 2 and seen[-1] is pub_.current and "alice" in seen[-1].users
        assert seen[-1].vhosts is first.vhosts

        h.run(SetMember("n1", "n1:1", True), SetDraining("n1", True))
        pub_.tick(h.state)
        await _settle()
        assert pub_.current.draining == ("n1",) and len(seen) == 2  # not an access change
    _run(main)


def test_publisher_coalesces_ticks_and_follows_a_replaced_state() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        h = Harness()
        pub_ = ModelPublisher(loop, h.state)
        assert list(pub_.current.vhosts) == ["/"]
        handed: list[ReadModel] = []
        pub_.add_listener(handed.append)
        for name in ("a", "b", "c"):  # three ticks before the loop runs
            h.run(UserPut(name, "H", ()))
            pub_.tick(h.state)
        await _settle()
        assert list(pub_.current.users) == ["a", "b", "c"]
        assert len(handed) == 1  # one hand-over with the latest model

        # a snapshot installs another state object with the same config_version
        other = default_state()
        other.users["z"] = ("H", ())
        other.config_version = h.state.config_version
        pub_.tick(other)
        await _settle()
        assert list(pub_.current.users) == ["z"] and len(handed) == 2
    _run(main)


def test_publisher_follows_a_replaced_state_whose_config_version_is_behind() -> None:
    """A state loaded from a snapshot (a new object) whose config_version is
    behind the model's still shows its users: the publisher rebuilds a replaced state."""
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        h = Harness()
        h.run(UserPut("alice", "H", ()))
        pub_ = ModelPublisher(loop)
        pub_.tick(h.state)
        await _settle()
        loaded: BrokerState = snapshot_copy(h.state)
        loaded.config_version = 0
        loaded.users["bob"] = ("H", ())
        pub_.tick(loaded)
        await _settle()
        assert list(pub_.current.users) == ["alice", "bob"]
    _run(main)


def test_queue_rows_are_built_on_the_raft_thread_on_request() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        h = Harness()
        h.open(C1)
        h.run(qdecl(C1, "q"), pub(C1, "q"), pub(C1, "q"))
        pub_ = ModelPublisher(loop)
        stop = threading.Event()
        ticks = 0

        def raft_thread() -> None:  # ticks like the raft thread, state touched only here
            nonlocal ticks
            while not stop.is_set():
                pub_.tick(h.state)
                ticks += 1
                stop.wait(0.01)

        t = threading.Thread(target=raft_thread)
        t.start()
        try:
            rows = await pub_.queue_rows()
            assert rows == [{"name": "q", "vhost": "/", "ready": 2, "unacked": 0, "consumers": 0,
                             "durable": False}]
            rows[0]["ready"] = 99  # the caller's own copy
            both = await asyncio.gather(pub_.queue_rows(), pub_.queue_rows())
            assert both[0] == both[1] and both[0][0]["ready"] == 2
            assert both[0] is not both[1]
        finally:
            stop.set()
            t.join()
        assert ticks > 0
        with pytest.raises(TimeoutError):  # the raft thread does not tick any more
            await pub_.queue_rows(timeout=0.05)
        assert not pub_._row_waiters
        # a request answered at the next tick, not by rows built before it
        fut = asyncio.ensure_future(pub_.queue_rows(timeout=1.0))
        await _settle()
        h.run(qdecl(C1, "r"))
        pub_.tick(h.state)
        assert [r["name"] for r in await fut] == ["q", "r"]
    _run(main)


def test_a_failing_listener_does_not_starve_the_others() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        h = Harness()
        pub_ = ModelPublisher(loop)
        calls: list[str] = []

        def bad(_m: ReadModel) -> None:
            calls.append("bad")
            raise RuntimeError("boom")

        pub_.add_listener(bad)
        pub_.add_listener(lambda _m: calls.append("good"))
        pub_.tick(h.state)
        await _settle()
        assert calls == ["bad", "good"]
    _run(main)
