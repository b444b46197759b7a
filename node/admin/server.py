"""Admin API over gRPC (grpcio owns this module) and Prometheus metrics.

The admin service has no generated stubs yet: methods take and return JSON
documents (UTF-8 bytes) through grpc's generic handlers, so any gRPC client
can call /mirrorq.Admin/Status with a JSON body.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Protocol

import grpc

StatusFn = Callable[[], dict[str, Any]]
SERVICE = "mirrorq.Admin"


class Membership(Protocol):
    async def add_member(self, node_id: str, address: str) -> None: ...
    async def remove_member(self, node_id: str) -> None: ...
    async def transfer_leadership(self, node_id: str | None = None) -> str: ...
    async def set_draining(self, node_id: str | None = None, draining: bool = True) -> None: ...
    async def put_user(self, name: str, password: str, tags: tuple[str, ...] = ()) -> None: ...
    async def delete_user(self, name: str) -> None: ...
    def users(self) -> Any: ...


def _json_in(data: bytes) -> Any:
    return json.loads(data or b"{}")


def _json_out(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


class AdminServer:
    def __init__(self, status: StatusFn, membership: Membership | None = None) -> None:
        self._status = status
        self._membership = membership
        # pysyncobj's one-change-at-a-time guard is dead code: serialize here
        self._change_lock = asyncio.Lock()
        self._server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        async def status(_request: Any, _context: grpc.aio.ServicerContext) -> dict[str, Any]:
            return self._status()

        async def add_member(request: Any, context: grpc.aio.ServicerContext) -> dict[str, Any]:
            node_id, address = request.get("node_id"), request.get("address")
            if not isinstance(node_id, str) or not isinstance(address, str) or ":" not in address:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    "AddMember needs node_id and address host:port")
            return await self._change(context, lambda m: m.add_member(node_id, address))

        async def remove_member(request: Any, context: grpc.aio.ServicerContext) -> dict[str, Any]:
            node_id = request.get("node_id")
            if not isinstance(node_id, str):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "RemoveMember needs node_id")
            return await self._change(context, lambda m: m.remove_member(node_id))

        async def transfer_leadership(request: Any,
                                      context: grpc.aio.ServicerContext) -> dict[str, Any]:
            target = request.get("node_id")
            if target is not None and not isinstance(target, str):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_id must be a string")
            return await self._change(context, lambda m: m.transfer_leadership(target))

        def maintenance(draining: bool) -> Any:
            async def handler(request: Any, context: grpc.aio.ServicerContext) -> dict[str, Any]:
                node_id = request.get("node_id")
                if node_id is not None and not isinstance(node_id, str):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_id must be a string")
                return await self._change(context, lambda m: m.set_draining(node_id, draining))
            return handler

        async def user_put(request: Any, context: grpc.aio.ServicerContext) -> dict[str, Any]:
            name, password, tags = request.get("name"), request.get("password"), request.get("tags") or []
            if not isinstance(name, str) or not name or not isinstance(password, str) \
                    or not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    "UserPut needs name, password (strings) and tags (list of strings)")
            return await self._change(context, lambda m: m.put_user(name, password, tuple(tags)))

        async def user_delete(request: Any, context: grpc.aio.ServicerContext) -> dict[str, Any]:
            name = request.get("name")
            if not isinstance(name, str):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "UserDelete needs name")
            return await self._change(context, lambda m: m.delete_user(name))

        async def user_list(_request: Any, context: grpc.aio.ServicerContext) -> dict[str, Any]:
            if self._membership is None:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, "users not available")
            users = self._membership.users()  # type: ignore[union-attr]
            return {"users": [{"name": n, "tags": list(tags)} for n, (_h, tags) in sorted(users.items())]}

        def unary(fn: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=_json_in, response_serializer=_json_out)

        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Status": unary(status),
            "AddMember": unary(add_member),
            "RemoveMember": unary(remove_member),
            "TransferLeadership": unary(transfer_leadership),
            "Drain": unary(maintenance(True)),
            "Revive": unary(maintenance(False)),
            "UserPut": unary(user_put),
            "UserDelete": unary(user_delete),
            "UserList": unary(user_list),
        })
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((handler,))
        if self._server.add_insecure_port(f"{host}:{port}") == 0:
            raise OSError(f"cannot bind admin port {port}")
        await self._server.start()

    async def _change(self, context: grpc.aio.ServicerContext, op: Any) -> dict[str, Any]:
        if self._membership is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "membership changes not available")
        async with self._change_lock:
            try:
                await op(self._membership)
            except (TimeoutError, KeyError, RuntimeError) as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"{type(exc).__name__}: {exc}")
        return {"ok": True, "status": self._status()}

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.5)


def _call(host: str, port: int, method: str, request: dict[str, Any],
          timeout: float) -> dict[str, Any]:
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        fn = channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=_json_out,
                                 response_deserializer=_json_in)
        result: dict[str, Any] = fn(request, timeout=timeout)
        return result


def call_status(host: str, port: int, timeout: float = 5.0) -> dict[str, Any]:
    return _call(host, port, "Status", {}, timeout)


def call_add_member(host: str, port: int, node_id: str, address: str,
                    timeout: float = 60.0) -> dict[str, Any]:
    return _call(host, port, "AddMember", {"node_id": node_id, "address": address}, timeout)


def call_remove_member(host: str, port: int, node_id: str, timeout: float = 60.0) -> dict[str, Any]:
    return _call(host, port, "RemoveMember", {"node_id": node_id}, timeout)


def call_transfer_leadership(host: str, port: int, node_id: str | None = None,
                             timeout: float = 30.0) -> dict[str, Any]:
    return _call(host, port, "TransferLeadership", {"node_id": node_id}, timeout)


def call_drain(host: str, port: int, timeout: float = 30.0,
               node_id: str | None = None) -> dict[str, Any]:
    """Maintenance mode for `node_id` (default: the node asked): its clients
    are closed with 320, it accepts no new ones and leaves the in-sync set."""
    return _call(host, port, "Drain", {"node_id": node_id}, timeout)


def call_revive(host: str, port: int, timeout: float = 30.0,
                node_id: str | None = None) -> dict[str, Any]:
    return _call(host, port, "Revive", {"node_id": node_id}, timeout)


def call_user_put(host: str, port: int, name: str, password: str, tags: list[str] | None = None,
                  timeout: float = 30.0) -> dict[str, Any]:
    return _call(host, port, "UserPut", {"name": name, "password": password, "tags": tags or []},
                 timeout)


def call_user_delete(host: str, port: int, name: str, timeout: float = 30.0) -> dict[str, Any]:
    return _call(host, port, "UserDelete", {"name": name}, timeout)


def call_user_list(host: str, port: int, timeout: float = 10.0) -> dict[str, Any]:
    return _call(host, port, "UserList", {}, timeout)


class MetricsServer:
    """Prometheus text exposition on GET /metrics (plain asyncio, no deps)."""

    def __init__(self, status: StatusFn) -> None:
        self._status = status
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
            if path != b"/metrics":
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            else:
                body = render_metrics(self._status()).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def render_metrics(status: dict[str, Any]) -> str:
    lines = []
    node = status.get("node_id", "")
    for key, value in sorted(status.items()):
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int | float):
            lines.append(f'mirrorq_{key}{{node="{node}"}} {value}')
    lines.append(f'mirrorq_is_leader{{node="{node}"}} {int(status.get("role") == "leader")}')
    return "\n".join(lines) + "\n"
