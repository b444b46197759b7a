"""node/app/node.py, the composition root: one Administrator serves both the
gRPC admin API and the management HTTP API, so a membership change asked
over one waits for a change asked over the other (one lock, not one per API)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from node.admin.client import TOKEN_ENV, call_add_member
from node.app import node as node_module
from node.app.administrator import Administrator
from node.app.config import NodeConfig
from node.replication.command import Command
from node.replication.read_model import ReadModel
from node.replication.status import NodeStatus
from tests.broker_proc import free_port
from tests.support.status import node_status

TOKEN = "t0ken"


class SlowRaft:
    """Stands in for RaftNode: records every change and holds each Raft
    configuration change until the test opens its gate."""

    def __init__(self, node_id: str, _data_dir: str, _loop: Any, _sink: Any, _cfg: Any,
                 _first_serial: int = 0) -> None:
        self.node_id = node_id
        self.seed_users: dict[str, str] = {}
        self.on_removed: Callable[[str], None] | None = None
        self.log: list[tuple[str, str]] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.changing: dict[str, asyncio.Event] = {}
        self.refusal: str | None = None  # what add_member_refusal answers
        self.row_cache = SimpleNamespace(min_interval=0.0, max_share=0.0)  # the Node sets these

    def add_drain_listener(self, _fn: Callable[[], None]) -> None:
        pass  # the AMQP server's; it is built but not started here

    def add_model_listener(self, _fn: Callable[[ReadModel], None]) -> None:
        pass

    def read_model(self) -> ReadModel:
        return ReadModel(members={self.node_id: "127.0.0.1:1"})

    def status(self) -> NodeStatus:
        return node_status(node_id=self.node_id, role="leader", leader=self.node_id)

    async def queue_rows(self) -> list[dict[str, Any]]:
        return []

    async def commit(self, cmds: list[Command], timeout: float = 30.0) -> None:
        self.log.append(("commit", getattr(cmds[0], "node", "")))

    def add_member_refusal(self) -> str | None:
        return self.refusal

    async def change_member(self, address: str, add: bool, timeout: float = 30.0) -> None:
        self.log.append(("change", address))
        self.changing.setdefault(address, asyncio.Event()).set()
        await self.gates.setdefault(address, asyncio.Event()).wait()
        self.log.append(("changed", address))


async def _http_put_member(port: int, name: str, address: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"address": address}).encode()
    writer.write(f"PUT /api/mirrorq/members/{name} HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    reply = await reader.read()
    writer.close()
    return reply.split(b"\r\n", 1)[0]


def test_http_and_grpc_membership_changes_on_one_node_are_serialized(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setattr(node_module, "RaftNode", SlowRaft)
    arrived: dict[str, asyncio.Event] = {}
    add_member = Administrator.add_member

    async def noted(self: Administrator, node_id: str, address: str,
                    timeout: float = 30.0) -> None:
        arrived.setdefault(node_id, asyncio.Event()).set()  # before it asks for the lock
        await add_member(self, node_id, address, timeout)
    monkeypatch.setattr(Administrator, "add_member", noted)

    async def run() -> None:
        admin_port, http_port = free_port(), free_port()
        cfg = NodeConfig(node_id="n1", data_dir=str(tmp_path), admin_port=admin_port)
        cfg.http.port = http_port
        cfg.admin.token = TOKEN
        cfg.raft.password = "unit"  # authenticated links: AddMember takes any address
        node = node_module.Node(cfg, asyncio.get_running_loop())
        assert node.admin is not None and node.http is not None
        raft = node.raft
        assert isinstance(raft, SlowRaft)
        await node.admin.start("127.0.0.1", admin_port)
        (_, http_server), = node.http[0]  # one plain listener: no [http] tls_port here
        await http_server.start("127.0.0.1", http_port)
        try:
            def reached(name: str) -> Awaitable[Any]:
                return asyncio.wait_for(arrived.setdefault(name, asyncio.Event()).wait(), 10)
            # gRPC first: it takes the lock and waits in its Raft configuration change
            grpc_call = asyncio.create_task(asyncio.to_thread(
                call_add_member, "127.0.0.1", admin_port, "n2", "h2:1", 10.0, token=TOKEN))
            await reached("n2")
            await asyncio.wait_for(raft.changing.setdefault("h2:1", asyncio.Event()).wait(), 10)
            # then HTTP: once in the Administrator it must wait for the gRPC change
            http_call = asyncio.create_task(_http_put_member(http_port, "n3", "h3:1"))
            await reached("n3")
            assert raft.log == [("commit", "n2"), ("change", "h2:1")], \
                "the HTTP change did not wait for the gRPC change"
            raft.gates["h2:1"].set()
            raft.gates.setdefault("h3:1", asyncio.Event()).set()
            assert (await http_call).startswith(b"HTTP/1.1 201")
            assert (await grpc_call)["ok"] is True
            assert raft.log == [("commit", "n2"), ("change", "h2:1"), ("changed", "h2:1"),
                                ("commit", "n3"), ("change", "h3:1"), ("changed", "h3:1")]
        finally:
            for address in ("h2:1", "h3:1"):  # a failed assertion leaves none waiting
                raft.gates.setdefault(address, asyncio.Event()).set()
            await node.admin.stop()
            await node.http[1].stop()
            await http_server.stop()

    asyncio.run(run())


def test_a_refused_add_member_records_no_member() -> None:
    """The quorum check (RaftShim.add_member_refusal; real processes: chaos
    experiment membership-lost-writes) comes before SetMember: a refused add
    leaves no out-of-sync member record that Raft never got."""
    raft = SlowRaft("n1", "", None, None, None)
    raft.refusal = "2 of the 3 members answer, below the quorum of 3 that 4 members need"
    admin = Administrator(raft)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="membership change refused: 2 of the 3"):
        asyncio.run(admin.add_member("n4", "127.0.0.1:4"))
    assert raft.log == []
