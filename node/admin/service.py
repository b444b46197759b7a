"""Admin API over gRPC (grpcio and protobuf are used in node/admin only).

The service is typed: node/admin/admin.proto, with the generated
admin_pb2*.py checked in (`make proto`); the client is node/admin/client.py.
Changes are handed to a Membership, the node's one Administrator, which
serializes them. Security: a bearer token (checked by a server interceptor;
node/app refuses to start an admin port without one unless --insecure-dev)
and optional TLS (mutual when a client CA is given).
"""
from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, cast

import grpc

from node.admin import admin_pb2 as pb
from node.admin import admin_pb2_grpc as pb_grpc
from node.admin.convert import status_to_pb
from node.admin.metric import QueuesFn, StatusFn, _rows

SERVICE = "mirrorq.Admin"


class AccessModel(Protocol):
    """What the admin reads of node.replication.read_model.ReadModel (immutable)."""

    @property
    def users(self) -> Mapping[str, tuple[str, tuple[str, ...]]]: ...
    @property
    def vhosts(self) -> Mapping[str, None]: ...
    @property
    def permissions(self) -> Mapping[tuple[str, str], tuple[str, str, str]]: ...
    @property
    def policies(self) -> Mapping[tuple[str, str], Any]: ...
    @property
    def operator_policies(self) -> Mapping[tuple[str, str], Any]: ...


class Membership(Protocol):
    """The changes the service offers (node.app.administrator.Administrator,
    which carries them out one at a time)."""

    async def add_member(self, node_id: str, address: str) -> None: ...
    async def remove_member(self, node_id: str) -> None: ...
    async def transfer_leadership(self, node_id: str | None = None) -> str: ...
    async def set_draining(self, node_id: str | None = None, draining: bool = True) -> None: ...
    async def put_user(self, name: str, password: str, tags: tuple[str, ...] = ()) -> None: ...
    async def delete_user(self, name: str) -> None: ...
    async def put_vhost(self, name: str) -> None: ...
    async def delete_vhost(self, name: str) -> None: ...
    async def set_permissions(self, user: str, vhost: str, configure: str, write: str,
                              read: str) -> None: ...
    async def clear_permissions(self, user: str, vhost: str) -> None: ...
    async def set_policy(self, vhost: str, name: str, pattern: Any, definition: Any,
                         priority: Any = 0, apply_to: Any = "all",
                         operator: bool = False) -> bool: ...
    async def clear_policy(self, vhost: str, name: str, operator: bool = False) -> None: ...
    async def set_limit(self, scope: str, owner: str, name: str, value: Any) -> None: ...
    async def clear_limit(self, scope: str, owner: str, name: str = "") -> None: ...
    def read_model(self) -> AccessModel:
        """UserList, VhostList and PermissionList read users, vhosts and
        permissions from it (the node's replicated state as of its last tick)."""
        ...


class _Invalid(Exception):
    """A malformed request: INVALID_ARGUMENT."""


def _need(value: str, what: str) -> str:
    if not value:
        raise _Invalid(f"{what} must be a non-empty string")
    return value


class _TokenInterceptor(grpc.aio.ServerInterceptor):
    """Every RPC needs `authorization: Bearer <token>` (constant-time compare)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong admin token")
        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else bytes(value)
                if hmac.compare_digest(given, self._expected):
                    return await continuation(details)
        return self._deny


class _Servicer(pb_grpc.AdminServicer):
    def __init__(self, owner: AdminServer) -> None:
        self._o = owner

    async def Status(self, request: pb.StatusRequest,  # noqa: N802 - gRPC method names
                     context: grpc.aio.ServicerContext) -> pb.NodeStatus:
        return status_to_pb(self._o.status())

    async def ListQueues(self, request: pb.ListQueuesRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> pb.ListQueuesResponse:
        if self._o.queues is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "queue listing not available")
        try:
            rows = await _rows(self._o.queues)  # type: ignore[arg-type]
        except TimeoutError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"queue listing: {exc}")
        if request.HasField("vhost"):
            rows = [r for r in rows if r["vhost"] == request.vhost]
        return pb.ListQueuesResponse(queues=[pb.QueueInfo(**r) for r in rows])

    async def AddMember(self, request: pb.AddMemberRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        def op(m: Membership) -> Awaitable[Any]:
            host, _, port = request.address.rpartition(":")
            if not host or not port.isdigit():
                raise _Invalid("AddMember needs node_id and address host:port")
            return m.add_member(_need(request.node_id, "node_id"), request.address)
        return await self._o.change(context, op)

    async def RemoveMember(self, request: pb.RemoveMemberRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        return await self._o.change(
            context, lambda m: m.remove_member(_need(request.node_id, "node_id")))

    async def TransferLeadership(self, request: pb.TransferLeadershipRequest,  # noqa: N802
                                 context: grpc.aio.ServicerContext
                                 ) -> pb.TransferLeadershipResponse:
        target = request.node_id or None  # "" = any: the most caught-up follower
        out: list[str] = []

        async def op(m: Membership) -> None:
            out.append(await m.transfer_leadership(target))
        res = await self._o.change(context, op)
        return pb.TransferLeadershipResponse(ok=res.ok, status=res.status, new_leader=out[0])

    async def Drain(self, request: pb.DrainRequest,  # noqa: N802
                    context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        return await self._o.change(context, lambda m: m.set_draining(request.node_id or None, True))

    async def Revive(self, request: pb.ReviveRequest,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        return await self._o.change(context,
                                    lambda m: m.set_draining(request.node_id or None, False))

    async def UserPut(self, request: pb.UserPutRequest,  # noqa: N802
                      context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        def op(m: Membership) -> Awaitable[Any]:
            if any(not t for t in request.tags):
                raise _Invalid("tags must be non-empty strings")
            return m.put_user(_need(request.name, "name"), request.password, tuple(request.tags))
        return await self._o.change(context, op)

    async def UserDelete(self, request: pb.UserDeleteRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        return await self._o.change(context, lambda m: m.delete_user(_need(request.name, "name")))

    async def UserList(self, request: pb.UserListRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> pb.UserListResponse:
        users = (await self._o.model(context)).users
        return pb.UserListResponse(users=[pb.User(name=n, tags=list(tags))
                                          for n, (_h, tags) in sorted(users.items())])

    async def VhostPut(self, request: pb.VhostPutRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        return await self._o.change(context, lambda m: m.put_vhost(_need(request.name, "name")),
                                    "put_vhost")

    async def VhostDelete(self, request: pb.VhostDeleteRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        return await self._o.change(context,
                                    lambda m: m.delete_vhost(_need(request.name, "name")),
                                    "delete_vhost")

    async def VhostList(self, request: pb.VhostListRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> pb.VhostListResponse:
        vhosts = (await self._o.model(context)).vhosts
        return pb.VhostListResponse(vhosts=[pb.Vhost(name=n) for n in sorted(vhosts)])

    async def PermissionSet(self, request: pb.PermissionSetRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        r = request
        return await self._o.change(context, lambda m: m.set_permissions(
            _need(r.user, "user"), _need(r.vhost, "vhost"), r.configure, r.write, r.read),
            "set_permissions")

    async def PermissionClear(self, request: pb.PermissionClearRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        return await self._o.change(context, lambda m: m.clear_permissions(
            _need(request.user, "user"), _need(request.vhost, "vhost")), "clear_permissions")

    async def PermissionList(self, request: pb.PermissionListRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> pb.PermissionListResponse:
        perms = (await self._o.model(context)).permissions
        rows = [pb.Permission(user=u, vhost=v, configure=c, write=w, read=r)
                for (u, v), (c, w, r) in sorted(perms.items())
                if (not request.HasField("vhost") or v == request.vhost)
                and (not request.HasField("user") or u == request.user)]
        return pb.PermissionListResponse(permissions=rows)


    async def PolicySet(self, request: pb.PolicySetRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        r = request
        try:
            definition = json.loads(r.definition_json or "null")
        except ValueError:
            definition = r.definition_json  # refused by set_policy with RabbitMQ's text
        return await self._o.change(context, lambda m: m.set_policy(
            _need(r.vhost, "vhost"), _need(r.name, "name"), r.pattern, definition,
            r.priority, r.apply_to or "all", r.operator), "set_policy")

    async def PolicyClear(self, request: pb.PolicyClearRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        r = request
        return await self._o.change(context, lambda m: m.clear_policy(
            _need(r.vhost, "vhost"), _need(r.name, "name"), r.operator), "clear_policy")

    async def PolicyList(self, request: pb.PolicyListRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> pb.PolicyListResponse:
        m = await self._o.model(context)
        table = getattr(m, "operator_policies" if request.operator else "policies", {})
        rows = [pb.Policy(vhost=p.vhost, name=p.name, pattern=p.pattern, apply_to=p.apply_to,
                          definition_json=json.dumps(p.definition, sort_keys=True),
                          priority=float(p.priority))
                for _key, p in sorted(table.items())
                if not request.HasField("vhost") or p.vhost == request.vhost]
        return pb.PolicyListResponse(policies=rows)


    async def LimitSet(self, request: pb.LimitSetRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        r = request
        return await self._o.change(context, lambda m: m.set_limit(
            _scope(r.scope), _need(r.owner, "owner"), _need(r.name, "name"), r.value),
            "set_limit")

    async def LimitClear(self, request: pb.LimitClearRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> pb.ChangeResponse:
        r = request
        return await self._o.change(context, lambda m: m.clear_limit(
            _scope(r.scope), _need(r.owner, "owner"), r.name), "clear_limit")

    async def LimitList(self, request: pb.LimitListRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> pb.LimitListResponse:
        m = await self._o.model(context)
        rows = [pb.Limit(scope=scope, owner=owner, name=name, value=value)
                for scope, table in (("vhost", getattr(m, "vhost_limits", {})),
                                     ("user", getattr(m, "user_limits", {})))
                if request.scope in ("", scope)
                for owner, limits in sorted(table.items())
                for name, value in sorted(limits.items())]
        return pb.LimitListResponse(limits=rows)


def _scope(scope: str) -> str:
    if scope not in ("vhost", "user"):
        raise _Invalid(f"scope must be vhost or user, not {scope!r}")
    return scope


class AdminServer:
    """`tls` = (certificate chain PEM, private key PEM, client CA PEM or None):
    TLS only on the admin port, client certificates required when a CA is given."""

    def __init__(self, status: StatusFn, membership: Membership | None = None, *,
                 queues: QueuesFn | None = None, token: str | None = None,
                 tls: tuple[bytes, bytes, bytes | None] | None = None) -> None:
        self.status = status
        self.queues = queues
        self._membership = membership
        self._token = token
        self._tls = tls
        self._server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        interceptors = [_TokenInterceptor(self._token)] if self._token else []
        self._server = grpc.aio.server(interceptors=interceptors)
        pb_grpc.add_AdminServicer_to_server(_Servicer(self), self._server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self._tls is not None:
            cert, key, client_ca = self._tls
            creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                                require_client_auth=client_ca is not None)
            bound = self._server.add_secure_port(address, creds)
        else:
            bound = self._server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"cannot bind admin port {port}")
        await self._server.start()

    async def model(self, context: grpc.aio.ServicerContext) -> AccessModel:
        """The node's read model (its replicated state as of its last Raft tick)."""
        fn = getattr(self._membership, "read_model", None)
        if fn is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "read_model not available")
        return cast(Callable[[], AccessModel], fn)()  # abort() raised if it was None

    async def change(self, context: grpc.aio.ServicerContext,
                     op: Callable[[Membership], Awaitable[Any]],
                     requires: str | None = None) -> pb.ChangeResponse:
        if self._membership is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "membership changes not available")
        if requires is not None and not hasattr(self._membership, requires):
            # a node built before this feature existed
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{requires} not available")
        # no lock here: the Membership (the node's one Administrator) serializes
        # changes, the management HTTP API's as well as these
        try:
            await op(self._membership)  # type: ignore[arg-type]
        except _Invalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{type(exc).__name__}: {exc}")
        except (TimeoutError, KeyError, RuntimeError) as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{type(exc).__name__}: {exc}")
        return pb.ChangeResponse(ok=True, status=status_to_pb(self.status()))

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.5)
