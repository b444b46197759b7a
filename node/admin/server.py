"""Admin API over gRPC (grpcio and protobuf are used in node/admin only) and
Prometheus metrics.

The service is typed: node/admin/admin.proto, with the generated
admin_pb2*.py checked in (`make proto`). The call_* helpers hide protobuf:
they take and return plain dicts, and a status is the same JSON-able dict
that the node builds and render_metrics takes (see status_to_pb/pb_to_status).
Security: an optional bearer token (checked by a server interceptor) and
optional TLS (mutual when a client CA is given).
"""
from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, cast

import grpc

from node.admin import admin_pb2 as pb
from node.admin import admin_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]
# rows of ListQueues: name, vhost, ready, unacked, consumers, durable; the node's
# is async (built on the raft thread at its next tick), a plain function also does
QueuesFn = Callable[[], Awaitable[list[dict[str, Any]]] | list[dict[str, Any]]]
SERVICE = "mirrorq.Admin"
RpcError = grpc.RpcError  # what every call_* raises (.code(), .details()), for callers without grpc
TOKEN_ENV, CA_ENV, CERT_ENV, KEY_ENV = ("MIRRORQ_ADMIN_TOKEN", "MIRRORQ_ADMIN_CA",
                                        "MIRRORQ_ADMIN_CERT", "MIRRORQ_ADMIN_KEY")


class AccessModel(Protocol):
    """What the admin reads of node.replication.read_model.ReadModel (immutable)."""

    @property
    def users(self) -> Mapping[str, tuple[str, tuple[str, ...]]]: ...
    @property
    def vhosts(self) -> Mapping[str, None]: ...
    @property
    def permissions(self) -> Mapping[tuple[str, str], tuple[str, str, str]]: ...


class Membership(Protocol):
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
    def read_model(self) -> AccessModel:
        """UserList, VhostList and PermissionList read users, vhosts and
        permissions from it (the node's replicated state as of its last tick)."""
        ...


async def _rows(queues: QueuesFn) -> list[dict[str, Any]]:
    rows = queues()
    if inspect.isawaitable(rows):
        return await rows
    return rows


# ------------------------------------------------------------ Status <-> dict

_REPEATED = ("members", "in_sync", "draining")
_SCALARS: dict[str, type] = {}
for _f in pb.NodeStatus.DESCRIPTOR.fields:
    if _f.name not in _REPEATED and _f.name != "extra":
        _SCALARS[_f.name] = {_f.TYPE_STRING: str, _f.TYPE_INT64: int, _f.TYPE_BOOL: bool,
                             _f.TYPE_DOUBLE: float}[_f.type]


def _fits(value: Any, kind: type) -> bool:
    # exact Python types only, so that a round trip never turns 0 into 0.0 or True into 1
    return type(value) is kind or (kind is int and isinstance(value, int)
                                   and not isinstance(value, bool))


def status_to_pb(status: Mapping[str, Any]) -> pb.NodeStatus:
    """Known keys go to typed fields; anything else (a key this schema does
    not name yet, or a value of an unexpected type) travels JSON-encoded in
    `extra`, so a newer node never loses information to an older schema."""
    msg = pb.NodeStatus()
    for key, value in status.items():
        kind = _SCALARS.get(key)
        if kind is not None and (value is None or _fits(value, kind)):
            if value is not None:
                setattr(msg, key, value)
        elif key in _REPEATED and isinstance(value, list | tuple) \
                and all(isinstance(v, str) for v in value):
            getattr(msg, key).extend(value)
        else:
            try:
                msg.extra[key] = json.dumps(value, sort_keys=True, default=str)
            except (TypeError, ValueError):  # e.g. non-string dict keys: never fail a Status
                msg.extra[key] = json.dumps(repr(value))
    return msg


def pb_to_status(msg: pb.NodeStatus) -> dict[str, Any]:
    """The dict the node built: every named key (None when unset), lists as lists."""
    out: dict[str, Any] = {}
    for key in _SCALARS:
        out[key] = getattr(msg, key) if msg.HasField(key) else None
    for key in _REPEATED:
        out[key] = list(getattr(msg, key))
    for key, text in msg.extra.items():
        out[key] = json.loads(text)
    return out


def _change_to_dict(msg: pb.ChangeResponse | pb.TransferLeadershipResponse) -> dict[str, Any]:
    return {"ok": msg.ok, "status": pb_to_status(msg.status)}


# ------------------------------------------------------------------ server

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
        # pysyncobj's one-change-at-a-time guard is dead code: serialize here
        self._change_lock = asyncio.Lock()
        self._server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        interceptors = [_TokenInterceptor(self._token)] if self._token else []
        self._server = grpc.aio.server(interceptors=interceptors)
        pb_grpc.add_AdminServicer_to_server(_Servicer(self), self._server)
        address = f"{host}:{port}"
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
        async with self._change_lock:
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


# ------------------------------------------------------------------ client

def _read_pem(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise OSError(f"cannot read {what} {path}: {exc.strerror}") from exc


def _env(value: str | None, name: str) -> str | None:
    return value if value is not None else (os.environ.get(name) or None)


def _call(host: str, port: int, method: str, request: Any, timeout: float,
          token: str | None, tls_ca: str | None, tls_cert: str | None,
          tls_key: str | None) -> Any:
    """One unary call. The token defaults to $MIRRORQ_ADMIN_TOKEN; a CA file
    (default $MIRRORQ_ADMIN_CA) means TLS, with a client certificate when
    cert and key (default $MIRRORQ_ADMIN_CERT/_KEY) are given."""
    token, tls_ca = _env(token, TOKEN_ENV), _env(tls_ca, CA_ENV)
    tls_cert, tls_key = _env(tls_cert, CERT_ENV), _env(tls_key, KEY_ENV)
    target = f"{host}:{port}"
    if tls_ca is not None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read_pem(tls_ca, "CA file"),
            private_key=_read_pem(tls_key, "client key") if tls_key else None,
            certificate_chain=_read_pem(tls_cert, "client certificate") if tls_cert else None)
        channel = grpc.secure_channel(target, creds)
    else:
        channel = grpc.insecure_channel(target)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with channel:
        return getattr(pb_grpc.AdminStub(channel), method)(request, timeout=timeout,
                                                            metadata=metadata)


def call_status(host: str, port: int, timeout: float = 5.0, *, token: str | None = None,
                tls_ca: str | None = None, tls_cert: str | None = None,
                tls_key: str | None = None) -> dict[str, Any]:
    return pb_to_status(_call(host, port, "Status", pb.StatusRequest(), timeout,
                              token, tls_ca, tls_cert, tls_key))


def call_list_queues(host: str, port: int, vhost: str | None = None, timeout: float = 10.0, *,
                     token: str | None = None, tls_ca: str | None = None,
                     tls_cert: str | None = None, tls_key: str | None = None) -> dict[str, Any]:
    """{"queues": [{"name", "vhost", "ready", "unacked", "consumers", "durable"}, ...]}"""
    res = _call(host, port, "ListQueues", pb.ListQueuesRequest(vhost=vhost), timeout,
                token, tls_ca, tls_cert, tls_key)
    return {"queues": [{"name": q.name, "vhost": q.vhost, "ready": q.ready, "unacked": q.unacked,
                        "consumers": q.consumers, "durable": q.durable} for q in res.queues]}


def call_add_member(host: str, port: int, node_id: str, address: str,
                    timeout: float = 60.0, *, token: str | None = None,
                    tls_ca: str | None = None, tls_cert: str | None = None,
                    tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "AddMember",
                                 pb.AddMemberRequest(node_id=node_id, address=address), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_remove_member(host: str, port: int, node_id: str, timeout: float = 60.0, *,
                       token: str | None = None, tls_ca: str | None = None,
                       tls_cert: str | None = None, tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "RemoveMember", pb.RemoveMemberRequest(node_id=node_id),
                                 timeout, token, tls_ca, tls_cert, tls_key))


def call_transfer_leadership(host: str, port: int, node_id: str | None = None,
                             timeout: float = 30.0, *, token: str | None = None,
                             tls_ca: str | None = None, tls_cert: str | None = None,
                             tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "TransferLeadership",
                                 pb.TransferLeadershipRequest(node_id=node_id), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_drain(host: str, port: int, timeout: float = 30.0,
               node_id: str | None = None, *, token: str | None = None,
               tls_ca: str | None = None, tls_cert: str | None = None,
               tls_key: str | None = None) -> dict[str, Any]:
    """Maintenance mode for `node_id` (default: the node asked): its clients
    are closed with 320, it accepts no new ones and leaves the in-sync set."""
    return _change_to_dict(_call(host, port, "Drain", pb.DrainRequest(node_id=node_id), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_revive(host: str, port: int, timeout: float = 30.0,
                node_id: str | None = None, *, token: str | None = None,
                tls_ca: str | None = None, tls_cert: str | None = None,
                tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "Revive", pb.ReviveRequest(node_id=node_id), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_user_put(host: str, port: int, name: str, password: str, tags: list[str] | None = None,
                  timeout: float = 30.0, *, token: str | None = None,
                  tls_ca: str | None = None, tls_cert: str | None = None,
                  tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "UserPut",
                                 pb.UserPutRequest(name=name, password=password, tags=tags or []),
                                 timeout, token, tls_ca, tls_cert, tls_key))


def call_user_delete(host: str, port: int, name: str, timeout: float = 30.0, *,
                     token: str | None = None, tls_ca: str | None = None,
                     tls_cert: str | None = None, tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "UserDelete", pb.UserDeleteRequest(name=name),
                                 timeout, token, tls_ca, tls_cert, tls_key))


def call_user_list(host: str, port: int, timeout: float = 10.0, *, token: str | None = None,
                   tls_ca: str | None = None, tls_cert: str | None = None,
                   tls_key: str | None = None) -> dict[str, Any]:
    res = _call(host, port, "UserList", pb.UserListRequest(), timeout,
                token, tls_ca, tls_cert, tls_key)
    return {"users": [{"name": u.name, "tags": list(u.tags)} for u in res.users]}


def call_vhost_put(host: str, port: int, name: str, timeout: float = 30.0, *,
                   token: str | None = None, tls_ca: str | None = None,
                   tls_cert: str | None = None, tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "VhostPut", pb.VhostPutRequest(name=name), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_vhost_delete(host: str, port: int, name: str, timeout: float = 30.0, *,
                      token: str | None = None, tls_ca: str | None = None,
                      tls_cert: str | None = None, tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "VhostDelete", pb.VhostDeleteRequest(name=name),
                                 timeout, token, tls_ca, tls_cert, tls_key))


def call_vhost_list(host: str, port: int, timeout: float = 10.0, *, token: str | None = None,
                    tls_ca: str | None = None, tls_cert: str | None = None,
                    tls_key: str | None = None) -> dict[str, Any]:
    """{"vhosts": [{"name": ...}, ...]}"""
    res = _call(host, port, "VhostList", pb.VhostListRequest(), timeout,
                token, tls_ca, tls_cert, tls_key)
    return {"vhosts": [{"name": v.name} for v in res.vhosts]}


def call_permission_set(host: str, port: int, user: str, vhost: str, configure: str, write: str,
                        read: str, timeout: float = 30.0, *, token: str | None = None,
                        tls_ca: str | None = None, tls_cert: str | None = None,
                        tls_key: str | None = None) -> dict[str, Any]:
    req = pb.PermissionSetRequest(user=user, vhost=vhost, configure=configure, write=write,
                                  read=read)
    return _change_to_dict(_call(host, port, "PermissionSet", req, timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_permission_clear(host: str, port: int, user: str, vhost: str, timeout: float = 30.0, *,
                          token: str | None = None, tls_ca: str | None = None,
                          tls_cert: str | None = None,
                          tls_key: str | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "PermissionClear",
                                 pb.PermissionClearRequest(user=user, vhost=vhost), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_permission_list(host: str, port: int, vhost: str | None = None, user: str | None = None,
                         timeout: float = 10.0, *, token: str | None = None,
                         tls_ca: str | None = None, tls_cert: str | None = None,
                         tls_key: str | None = None) -> dict[str, Any]:
    """{"permissions": [{"user", "vhost", "configure", "write", "read"}, ...]}"""
    res = _call(host, port, "PermissionList", pb.PermissionListRequest(vhost=vhost, user=user),
                timeout, token, tls_ca, tls_cert, tls_key)
    return {"permissions": [{"user": p.user, "vhost": p.vhost, "configure": p.configure,
                             "write": p.write, "read": p.read} for p in res.permissions]}


def rpc_error_line(exc: grpc.RpcError, what: str, target: str) -> str:
    """`<STATUS CODE>: <details>` on one line, for the CLI."""
    call = exc if isinstance(exc, grpc.Call) else None
    code = call.code() if call is not None else grpc.StatusCode.UNKNOWN
    details = " ".join(str((call.details() if call is not None else None) or "").split())
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"{code.name}: cannot reach admin API on {target}" + (f" ({details})" if details
                                                                      else "")
    return f"{code.name}: {what} refused: {details}"


class MetricsServer:
    """Prometheus text exposition on GET /metrics (plain asyncio, no deps)."""

    def __init__(self, status: StatusFn, queues: QueuesFn | None = None) -> None:
        self._status = status
        self._queues = queues
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
                queues = None
                if self._queues is not None:
                    try:
                        queues = await _rows(self._queues)
                    except TimeoutError as exc:  # no per-queue series this time
                        log.warning("metrics: %s", exc)
                body = render_metrics(self._status(), queues).encode()
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


# status keys that only grow: exposed as Prometheus counters, named `_total` and
# only so (a gauge of the same value without `_total` made every one a duplicate)
COUNTERS = ("published", "confirmed", "nacked", "delivered", "redelivered", "acked",
            "leader_changes", "resends", "journal_flushes", "snapshots", "applied_batches",
            "nacked_publishes", "deferred_elections", "prevote_rounds", "ignored_votes",
            "fast_elections", "peer_rejects", "encoded_appends", "forced_compactions")


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(status: dict[str, Any], queues: list[dict[str, Any]] | None = None) -> str:
    """Prometheus text format, one family per metric: the monotonic status
    fields (COUNTERS) as `mirrorq_<key>_total` counters, every other numeric
    one as a `mirrorq_<key>` gauge, the confirm-latency histogram, and
    per-queue depths when `queues` (ListQueues rows) is given."""
    lines = []
    node = _label(status.get("node_id", ""))
    gauges = dict(status, is_leader=status.get("role") == "leader")
    for key, value in sorted(gauges.items()):
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int | float):
            continue
        if key in COUNTERS:
            lines.append(f"# TYPE mirrorq_{key}_total counter")
            lines.append(f'mirrorq_{key}_total{{node="{node}"}} {value}')
        else:
            lines.append(f"# TYPE mirrorq_{key} gauge")
            lines.append(f'mirrorq_{key}{{node="{node}"}} {value}')
    hist = status.get("confirm_latency")
    if isinstance(hist, dict) and hist.get("le"):
        name = "mirrorq_confirm_latency_seconds"
        lines.append(f"# TYPE {name} histogram")
        for le, count in zip(hist["le"], hist["cumulative"], strict=True):
            lines.append(f'{name}_bucket{{node="{node}",le="{le}"}} {count}')
        lines.append(f'{name}_sum{{node="{node}"}} {hist["sum"]}')
        lines.append(f'{name}_count{{node="{node}"}} {hist["count"]}')
    if queues is not None:
        for field in ("ready", "unacked", "consumers"):
            metric = f"mirrorq_queue_{'messages_' if field != 'consumers' else ''}{field}"
            lines.append(f"# TYPE {metric} gauge")
            for row in queues:
                lines.append(f'{metric}{{node="{node}",vhost="{_label(row["vhost"])}",'
                             f'queue="{_label(row["name"])}"}} {row[field]}')
    return "\n".join(lines) + "\n"
