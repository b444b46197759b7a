"""The typed admin API in-process, against a fake Membership: the call_*
helpers give back the same dicts (and Python types) the node built, and
errors map to the right gRPC status codes."""
from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from node.admin import admin_pb2 as pb
from node.admin import client as admin
from node.admin.convert import pb_to_status, status_to_pb
from node.admin.metric import MetricsServer, QueuesFn
from node.admin.service import AdminServer
from node.broker.vhost import split_key as split_queue_key
from node.replication.read_model import ReadModel, queue_rows
from tests.broker_proc import free_port

STATUS: dict[str, Any] = {
    "node_id": "n1", "role": "leader", "leader": None, "term": 3, "commit_index": 42,
    "last_applied": 42, "log_len": 7, "members": ["n1", "n2"], "in_sync": ["n1"], "draining": [],
    "has_quorum": True, "mirrored_index": 41, "blocked": False, "pending_batches": 0,
    "resends": 0, "nacked_publishes": 0, "journal_flushes": 9, "snapshots": 0,
    "last_snapshot_seconds": 0.0, "last_snapshot_bytes": 0, "applied_batches": 5,
    "message_bytes": 0, "connections": 2, "amqp_port": 5672, "queues": 1, "amqps_port": None,
    "machine_version": 2, "runs_machine_version": 2,
    # keys the schema does not name travel as JSON, types intact
    "failed_batches": {"n2": 1}, "future_ratio": 0.5, "future_count": 3,
}


class FakeMembership:
    def __init__(self) -> None:
        self.users_: dict[str, tuple[str, tuple[str, ...]]] = {"guest": ("h", ())}
        self.vhosts_: dict[str, None] = {"/": None}
        self.perms: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.calls: list[tuple[Any, ...]] = []

    async def add_member(self, node_id: str, address: str) -> None:
        self.calls.append(("add", node_id, address))

    async def remove_member(self, node_id: str) -> None:
        raise KeyError(f"no member {node_id!r}")

    async def transfer_leadership(self, node_id: str | None = None) -> str:
        self.calls.append(("transfer", node_id))
        return node_id or "n2"

    async def set_draining(self, node_id: str | None = None, draining: bool = True) -> None:
        self.calls.append(("drain", node_id, draining))

    async def put_user(self, name: str, password: str, tags: tuple[str, ...] = ()) -> None:
        self.users_[name] = ("h", tags)

    async def delete_user(self, name: str) -> None:
        del self.users_[name]

    async def put_vhost(self, name: str) -> None:
        if "\x00" in name:
            raise ValueError("a vhost name cannot contain NUL")
        self.vhosts_[name] = None

    async def delete_vhost(self, name: str) -> None:
        del self.vhosts_[name]

    async def set_permissions(self, user: str, vhost: str, configure: str, write: str,
                              read: str) -> None:
        for p in (configure, write, read):
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"bad pattern {p!r}: {exc}") from exc
        if user not in self.users_ or vhost not in self.vhosts_:
            raise KeyError(f"no user {user!r} or vhost {vhost!r}")
        self.perms[(user, vhost)] = (configure, write, read)

    async def clear_permissions(self, user: str, vhost: str) -> None:
        del self.perms[(user, vhost)]

    def read_model(self) -> ReadModel:
        return ReadModel(users=self.users_, vhosts=self.vhosts_, permissions=self.perms)


ROWS = [{"name": "a", "vhost": "/", "ready": 3, "unacked": 1, "consumers": 1, "durable": True},
        {"name": "b", "vhost": "v1", "ready": 0, "unacked": 0, "consumers": 0, "durable": False}]


async def _rows() -> list[dict[str, Any]]:  # as the node's: built on its raft thread
    return [dict(r) for r in ROWS]


class Served:
    def __init__(self, membership: Any, token: str | None = None,
                 queues: QueuesFn = _rows) -> None:
        self.port = free_port()
        self.membership = membership
        self.loop = asyncio.new_event_loop()
        self.server = AdminServer(lambda: dict(STATUS), membership, queues=queues,
                                        token=token)
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start("127.0.0.1", self.port))
            started.set()
            self.loop.run_forever()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.delenv(admin.TOKEN_ENV, raising=False)
    monkeypatch.delenv(admin.CA_ENV, raising=False)
    s = Served(FakeMembership())
    try:
        yield s
    finally:
        s.close()


def code_of(fn: Any, *args: Any, **kw: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kw)
    return err.value.code()  # type: ignore[no-any-return,attr-defined,unused-ignore]


def test_status_round_trip_keeps_shapes_and_types(served: Served) -> None:
    st = admin.call_status("127.0.0.1", served.port)
    assert st == STATUS
    for key, value in STATUS.items():
        assert type(st[key]) is type(value), key


def test_status_mapping_without_a_server() -> None:
    msg = status_to_pb({"term": True, "role": 5, "members": ["a", 1], "leader": "n2"})
    # a value of an unexpected type is not coerced: it travels as JSON
    assert not msg.HasField("term") and set(msg.extra) == {"term", "role", "members"}
    back = pb_to_status(pb.NodeStatus.FromString(msg.SerializeToString()))
    assert back["term"] is True and back["role"] == 5 and back["members"] == ["a", 1]
    assert back["leader"] == "n2" and back["commit_index"] is None and back["in_sync"] == []


def test_changes_return_ok_and_status(served: Served) -> None:
    reply = admin.call_add_member("127.0.0.1", served.port, "n3", "127.0.0.1:25999")
    assert reply == {"ok": True, "status": STATUS}
    assert admin.call_transfer_leadership("127.0.0.1", served.port)["ok"] is True
    admin.call_transfer_leadership("127.0.0.1", served.port, "n2")
    admin.call_drain("127.0.0.1", served.port)
    admin.call_revive("127.0.0.1", served.port, node_id="n2")
    assert served.membership.calls == [("add", "n3", "127.0.0.1:25999"), ("transfer", None),
                                       ("transfer", "n2"), ("drain", None, True),
                                       ("drain", "n2", False)]
    assert code_of(admin.call_remove_member, "127.0.0.1", served.port, "ghost") \
        == grpc.StatusCode.FAILED_PRECONDITION
    assert code_of(admin.call_add_member, "127.0.0.1", served.port, "n4", "no-port") \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(admin.call_add_member, "127.0.0.1", served.port, "", "h:1") \
        == grpc.StatusCode.INVALID_ARGUMENT


def test_users_vhosts_permissions(served: Served) -> None:
    port = served.port
    admin.call_user_put("127.0.0.1", port, "alice", "pw", ["administrator"])
    assert admin.call_user_list("127.0.0.1", port) == {
        "users": [{"name": "alice", "tags": ["administrator"]}, {"name": "guest", "tags": []}]}
    assert admin.call_vhost_put("127.0.0.1", port, "v1")["ok"] is True
    assert admin.call_vhost_list("127.0.0.1", port) == {"vhosts": [{"name": "/"}, {"name": "v1"}]}
    assert code_of(admin.call_vhost_put, "127.0.0.1", port, "bad\x00name") \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(admin.call_vhost_put, "127.0.0.1", port, "") == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(admin.call_vhost_delete, "127.0.0.1", port, "nope") \
        == grpc.StatusCode.FAILED_PRECONDITION
    admin.call_permission_set("127.0.0.1", port, "alice", "v1", ".*", "^amq\\.", "")
    admin.call_permission_set("127.0.0.1", port, "guest", "/", ".*", ".*", ".*")
    assert code_of(admin.call_permission_set, "127.0.0.1", port, "alice", "v1", "(", "", "") \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(admin.call_permission_set, "127.0.0.1", port, "bob", "v1", "", "", "") \
        == grpc.StatusCode.FAILED_PRECONDITION
    every = admin.call_permission_list("127.0.0.1", port)["permissions"]
    assert every == [
        {"user": "alice", "vhost": "v1", "configure": ".*", "write": "^amq\\.", "read": ""},
        {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]
    assert admin.call_permission_list("127.0.0.1", port, vhost="/")["permissions"] == every[1:]
    assert admin.call_permission_list("127.0.0.1", port, user="alice")["permissions"] == every[:1]
    admin.call_permission_clear("127.0.0.1", port, "alice", "v1")
    assert code_of(admin.call_permission_clear, "127.0.0.1", port, "alice", "v1") \
        == grpc.StatusCode.FAILED_PRECONDITION
    admin.call_vhost_delete("127.0.0.1", port, "v1")
    assert admin.call_vhost_list("127.0.0.1", port) == {"vhosts": [{"name": "/"}]}


def test_list_queues(served: Served) -> None:
    assert admin.call_list_queues("127.0.0.1", served.port) == {"queues": ROWS}
    assert admin.call_list_queues("127.0.0.1", served.port, vhost="v1") == {"queues": ROWS[1:]}


def test_list_queues_takes_a_plain_function_and_a_timeout_is_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(admin.TOKEN_ENV, raising=False)
    s = Served(FakeMembership(), queues=lambda: ROWS)
    try:
        assert admin.call_list_queues("127.0.0.1", s.port) == {"queues": ROWS}
    finally:
        s.close()

    async def silent() -> list[dict[str, Any]]:  # the raft thread does not answer
        raise TimeoutError("queue rows: the raft thread did not answer")
    s = Served(FakeMembership(), queues=silent)
    try:
        assert code_of(admin.call_list_queues, "127.0.0.1", s.port) \
            == grpc.StatusCode.UNAVAILABLE
    finally:
        s.close()


def test_metrics_render_async_queue_rows_and_survive_a_timeout() -> None:
    async def silent() -> list[dict[str, Any]]:
        raise TimeoutError("queue rows: the raft thread did not answer")

    body = asyncio.run(_scrape(MetricsServer(lambda: dict(STATUS), _rows, per_object=True)))
    assert body.startswith("HTTP/1.1 200")
    assert 'mirrorq_queue_messages_ready{node="n1",vhost="/",queue="a"} 3' in body
    body = asyncio.run(_scrape(MetricsServer(lambda: dict(STATUS), silent, per_object=True)))
    assert body.startswith("HTTP/1.1 200") and "mirrorq_queue_messages_ready{" not in body
    assert "mirrorq_message_bytes" in body


async def _scrape(server: MetricsServer, path: str = "/metrics", header: str = "") -> str:
    port = free_port()
    await server.start("127.0.0.1", port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{header}\r\n".encode())
        body = (await reader.read()).decode()
        writer.close()
        return body
    finally:
        await server.stop()


def test_metrics_are_aggregated_by_default_per_object_only_when_configured() -> None:
    """Issue 42: /metrics sums the queues (no vhost or queue names, RabbitMQ's
    aggregated default); per-object series on /metrics with
    return_per_object_metrics, on /metrics/per-object with per_object_endpoint."""
    total = sum(int(r["ready"]) for r in ROWS)
    body = asyncio.run(_scrape(MetricsServer(lambda: dict(STATUS), _rows)))
    assert body.startswith("HTTP/1.1 200")
    assert f'mirrorq_queue_messages_ready{{node="n1"}} {total}' in body
    assert "queue=" not in body and "vhost=" not in body
    assert asyncio.run(_scrape(MetricsServer(lambda: dict(STATUS), _rows),
                               "/metrics/per-object")).startswith("HTTP/1.1 404")
    body = asyncio.run(_scrape(MetricsServer(lambda: dict(STATUS), _rows,
                                             per_object_endpoint=True), "/metrics/per-object"))
    assert 'mirrorq_queue_messages_ready{node="n1",vhost="/",queue="a"} 3' in body


def test_metrics_token_is_required_when_set() -> None:
    def served() -> MetricsServer:
        return MetricsServer(lambda: dict(STATUS), _rows, token="s3cret")
    assert asyncio.run(_scrape(served())).startswith("HTTP/1.1 401")
    assert asyncio.run(_scrape(served(), header="Authorization: Bearer wrong\r\n")) \
        .startswith("HTTP/1.1 401")
    assert asyncio.run(_scrape(served(), header="Authorization: Basic s3cret\r\n")) \
        .startswith("HTTP/1.1 401")
    ok = asyncio.run(_scrape(served(), header="Authorization: Bearer s3cret\r\n"))
    assert ok.startswith("HTTP/1.1 200") and "mirrorq_term" in ok


def test_metrics_scrapes_in_flight_are_capped() -> None:
    """A scrape beyond max_scrapes waiting on the rows is answered 429 at once."""
    async def run() -> tuple[str, str]:
        gate = asyncio.Event()

        async def slow() -> list[dict[str, Any]]:
            await gate.wait()
            return [dict(r) for r in ROWS]
        server = MetricsServer(lambda: dict(STATUS), slow, max_scrapes=1)
        port = free_port()
        await server.start("127.0.0.1", port)
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(b"GET /metrics HTTP/1.1\r\n\r\n")
            await asyncio.sleep(0)
            for _ in range(200):  # the first scrape is in (waiting on the rows)
                if server._scraping:
                    break
                await asyncio.sleep(0.01)
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            w2.write(b"GET /metrics HTTP/1.1\r\n\r\n")
            second = (await r2.read()).decode()
            gate.set()
            first = (await r1.read()).decode()
            w1.close()
            w2.close()
            return first, second
        finally:
            await server.stop()
    first, second = asyncio.run(run())
    assert first.startswith("HTTP/1.1 200") and second.startswith("HTTP/1.1 429")


def test_a_node_without_vhosts_answers_unimplemented(monkeypatch: pytest.MonkeyPatch) -> None:
    class Old:
        async def put_user(self, name: str, password: str, tags: tuple[str, ...] = ()) -> None:
            pass
    monkeypatch.delenv(admin.TOKEN_ENV, raising=False)
    s = Served(Old())
    try:
        assert code_of(admin.call_vhost_put, "127.0.0.1", s.port, "v") \
            == grpc.StatusCode.UNIMPLEMENTED
        assert code_of(admin.call_vhost_list, "127.0.0.1", s.port) == grpc.StatusCode.UNIMPLEMENTED
    finally:
        s.close()


def test_token_interceptor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(admin.TOKEN_ENV, raising=False)
    s = Served(FakeMembership(), token="s3cret-token")
    try:
        assert code_of(admin.call_status, "127.0.0.1", s.port) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(admin.call_status, "127.0.0.1", s.port, token="wrong") \
            == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(admin.call_add_member, "127.0.0.1", s.port, "n9", "h:1", token="wrong") \
            == grpc.StatusCode.UNAUTHENTICATED
        assert s.membership.calls == []
        assert admin.call_status("127.0.0.1", s.port, token="s3cret-token")["node_id"] == "n1"
        monkeypatch.setenv(admin.TOKEN_ENV, "s3cret-token")  # what existing callers rely on
        assert admin.call_status("127.0.0.1", s.port)["node_id"] == "n1"
    finally:
        s.close()


def test_split_queue_key() -> None:
    assert split_queue_key("orders") == ("/", "orders")
    assert split_queue_key("v1\x00orders") == ("v1", "orders")
    assert split_queue_key("v1\x00a\x00b") == ("v1", "a\x00b")


def test_queue_rows_counts_unacked_per_queue() -> None:
    class Q:
        def __init__(self, ready: int, consumers: int, durable: bool) -> None:
            self.n, self.consumers, self.durable = ready, dict.fromkeys(range(consumers)), durable

        def ready_count(self) -> int:
            return self.n

    class Ch:
        def __init__(self, unacked: dict[int, tuple[Any, Any, Any]]) -> None:
            self.unacked = unacked

    class State:
        pass

    a, b = Q(2, 1, True), Q(0, 0, False)
    state = State()
    state.queues = {"a": a, "v\x00b": b}  # type: ignore[attr-defined]
    state.channels = {1: Ch({1: (a, None, None), 2: (b, None, None)}),  # type: ignore[attr-defined]
                      2: Ch({7: (a, None, None)})}
    assert [r._asdict() for r in queue_rows(state)] == [
        {"name": "a", "vhost": "/", "ready": 2, "unacked": 2, "consumers": 1, "durable": True},
        {"name": "b", "vhost": "v", "ready": 0, "unacked": 1, "consumers": 0, "durable": False}]
