"""Client of the admin API (node/admin/admin.proto): the call_* helpers hide
protobuf, they take and return plain dicts (a status as the node built it,
see node/admin/convert.py). Security: the bearer token and TLS files default
to $MIRRORQ_ADMIN_TOKEN, $MIRRORQ_ADMIN_CA, $MIRRORQ_ADMIN_CERT and _KEY."""
from __future__ import annotations

import json
import os
from typing import Any, cast

import grpc

from node.admin import admin_pb2 as pb
from node.admin import admin_pb2_grpc as pb_grpc
from node.admin.convert import _change_to_dict, pb_to_status

RpcError = grpc.RpcError  # what every call_* raises (.code(), .details()), for callers without grpc
TOKEN_ENV, CA_ENV, CERT_ENV, KEY_ENV = ("MIRRORQ_ADMIN_TOKEN", "MIRRORQ_ADMIN_CA",
                                        "MIRRORQ_ADMIN_CERT", "MIRRORQ_ADMIN_KEY")


Pem = str | bytes  # a file path, or the PEM itself (the operator keeps its CA in memory)


def _read_pem(path: Pem, what: str) -> bytes:
    if isinstance(path, bytes):
        return path
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise OSError(f"cannot read {what} {path}: {exc.strerror}") from exc


def _env(value: Pem | None, name: str) -> Pem | None:
    # None: the environment's; "" (or b""): none at all, whatever the environment says
    return (value or None) if value is not None else (os.environ.get(name) or None)


def _call(host: str, port: int, method: str, request: Any, timeout: float,
          token: str | None, tls_ca: Pem | None, tls_cert: Pem | None,
          tls_key: Pem | None, tls_server_name: str | None = None) -> Any:
    """One unary call. The token defaults to $MIRRORQ_ADMIN_TOKEN; a CA file
    (default $MIRRORQ_ADMIN_CA) means TLS, with a client certificate when
    cert and key (default $MIRRORQ_ADMIN_CERT/_KEY) are given. Each TLS
    argument is a file path or the PEM bytes. tls_server_name: the name the
    server certificate must carry when `host` is an address it does not name
    (a pod's IP; the certificate names its DNS name)."""
    token, tls_ca = cast("str | None", _env(token, TOKEN_ENV)), _env(tls_ca, CA_ENV)
    tls_cert, tls_key = _env(tls_cert, CERT_ENV), _env(tls_key, KEY_ENV)
    target = f"{host}:{port}"
    if tls_ca is not None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read_pem(tls_ca, "CA file"),
            private_key=_read_pem(tls_key, "client key") if tls_key else None,
            certificate_chain=_read_pem(tls_cert, "client certificate") if tls_cert else None)
        options = ([("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name
                   else [])
        channel = grpc.secure_channel(target, creds, options=options)
    else:
        channel = grpc.insecure_channel(target)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with channel:
        return getattr(pb_grpc.AdminStub(channel), method)(request, timeout=timeout,
                                                            metadata=metadata)


def call_status(host: str, port: int, timeout: float = 5.0, *, token: str | None = None,
                tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                tls_key: Pem | None = None, tls_server_name: str | None = None) -> dict[str, Any]:
    return pb_to_status(_call(host, port, "Status", pb.StatusRequest(), timeout,
                              token, tls_ca, tls_cert, tls_key, tls_server_name))


def call_list_queues(host: str, port: int, vhost: str | None = None, timeout: float = 10.0, *,
                     token: str | None = None, tls_ca: Pem | None = None,
                     tls_cert: Pem | None = None, tls_key: Pem | None = None) -> dict[str, Any]:
    """{"queues": [{"name", "vhost", "ready", "unacked", "consumers", "durable"}, ...]}"""
    res = _call(host, port, "ListQueues", pb.ListQueuesRequest(vhost=vhost), timeout,
                token, tls_ca, tls_cert, tls_key)
    return {"queues": [{"name": q.name, "vhost": q.vhost, "ready": q.ready, "unacked": q.unacked,
                        "consumers": q.consumers, "durable": q.durable} for q in res.queues]}


def call_add_member(host: str, port: int, node_id: str, address: str,
                    timeout: float = 60.0, *, token: str | None = None,
                    tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                    tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "AddMember",
                                 pb.AddMemberRequest(node_id=node_id, address=address), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_remove_member(host: str, port: int, node_id: str, timeout: float = 60.0, *,
                       token: str | None = None, tls_ca: Pem | None = None,
                       tls_cert: Pem | None = None, tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "RemoveMember", pb.RemoveMemberRequest(node_id=node_id),
                                 timeout, token, tls_ca, tls_cert, tls_key))


def call_transfer_leadership(host: str, port: int, node_id: str | None = None,
                             timeout: float = 30.0, *, token: str | None = None,
                             tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                             tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "TransferLeadership",
                                 pb.TransferLeadershipRequest(node_id=node_id), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_drain(host: str, port: int, timeout: float = 30.0,
               node_id: str | None = None, *, token: str | None = None,
               tls_ca: Pem | None = None, tls_cert: Pem | None = None,
               tls_key: Pem | None = None) -> dict[str, Any]:
    """Maintenance mode for `node_id` (default: the node asked): its clients
    are closed with 320, it accepts no new ones and leaves the in-sync set."""
    return _change_to_dict(_call(host, port, "Drain", pb.DrainRequest(node_id=node_id), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_revive(host: str, port: int, timeout: float = 30.0,
                node_id: str | None = None, *, token: str | None = None,
                tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "Revive", pb.ReviveRequest(node_id=node_id), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_user_put(host: str, port: int, name: str, password: str, tags: list[str] | None = None,
                  timeout: float = 30.0, *, token: str | None = None,
                  tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                  tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "UserPut",
                                 pb.UserPutRequest(name=name, password=password, tags=tags or []),
                                 timeout, token, tls_ca, tls_cert, tls_key))


def call_user_delete(host: str, port: int, name: str, timeout: float = 30.0, *,
                     token: str | None = None, tls_ca: Pem | None = None,
                     tls_cert: Pem | None = None, tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "UserDelete", pb.UserDeleteRequest(name=name),
                                 timeout, token, tls_ca, tls_cert, tls_key))


def call_user_list(host: str, port: int, timeout: float = 10.0, *, token: str | None = None,
                   tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                   tls_key: Pem | None = None) -> dict[str, Any]:
    res = _call(host, port, "UserList", pb.UserListRequest(), timeout,
                token, tls_ca, tls_cert, tls_key)
    return {"users": [{"name": u.name, "tags": list(u.tags)} for u in res.users]}


def call_vhost_put(host: str, port: int, name: str, timeout: float = 30.0, *,
                   token: str | None = None, tls_ca: Pem | None = None,
                   tls_cert: Pem | None = None, tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "VhostPut", pb.VhostPutRequest(name=name), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_vhost_delete(host: str, port: int, name: str, timeout: float = 30.0, *,
                      token: str | None = None, tls_ca: Pem | None = None,
                      tls_cert: Pem | None = None, tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "VhostDelete", pb.VhostDeleteRequest(name=name),
                                 timeout, token, tls_ca, tls_cert, tls_key))


def call_vhost_list(host: str, port: int, timeout: float = 10.0, *, token: str | None = None,
                    tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                    tls_key: Pem | None = None) -> dict[str, Any]:
    """{"vhosts": [{"name": ...}, ...]}"""
    res = _call(host, port, "VhostList", pb.VhostListRequest(), timeout,
                token, tls_ca, tls_cert, tls_key)
    return {"vhosts": [{"name": v.name} for v in res.vhosts]}


def call_permission_set(host: str, port: int, user: str, vhost: str, configure: str, write: str,
                        read: str, timeout: float = 30.0, *, token: str | None = None,
                        tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                        tls_key: Pem | None = None) -> dict[str, Any]:
    req = pb.PermissionSetRequest(user=user, vhost=vhost, configure=configure, write=write,
                                  read=read)
    return _change_to_dict(_call(host, port, "PermissionSet", req, timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_permission_clear(host: str, port: int, user: str, vhost: str, timeout: float = 30.0, *,
                          token: str | None = None, tls_ca: Pem | None = None,
                          tls_cert: Pem | None = None,
                          tls_key: Pem | None = None) -> dict[str, Any]:
    return _change_to_dict(_call(host, port, "PermissionClear",
                                 pb.PermissionClearRequest(user=user, vhost=vhost), timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_permission_list(host: str, port: int, vhost: str | None = None, user: str | None = None,
                         timeout: float = 10.0, *, token: str | None = None,
                         tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                         tls_key: Pem | None = None) -> dict[str, Any]:
    """{"permissions": [{"user", "vhost", "configure", "write", "read"}, ...]}"""
    res = _call(host, port, "PermissionList", pb.PermissionListRequest(vhost=vhost, user=user),
                timeout, token, tls_ca, tls_cert, tls_key)
    return {"permissions": [{"user": p.user, "vhost": p.vhost, "configure": p.configure,
                             "write": p.write, "read": p.read} for p in res.permissions]}


def call_policy_set(host: str, port: int, vhost: str, name: str, pattern: str,
                    definition_json: str, priority: int = 0, apply_to: str = "all",
                    operator: bool = False, timeout: float = 30.0, *, token: str | None = None,
                    tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                    tls_key: Pem | None = None) -> dict[str, Any]:
    req = pb.PolicySetRequest(vhost=vhost, name=name, pattern=pattern,
                              definition_json=definition_json, priority=priority,
                              apply_to=apply_to, operator=operator)
    return _change_to_dict(_call(host, port, "PolicySet", req, timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_policy_clear(host: str, port: int, vhost: str, name: str, operator: bool = False,
                      timeout: float = 30.0, *, token: str | None = None,
                      tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                      tls_key: Pem | None = None) -> dict[str, Any]:
    req = pb.PolicyClearRequest(vhost=vhost, name=name, operator=operator)
    return _change_to_dict(_call(host, port, "PolicyClear", req, timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_policy_list(host: str, port: int, vhost: str | None = None, operator: bool = False,
                     timeout: float = 10.0, *, token: str | None = None,
                     tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                     tls_key: Pem | None = None) -> dict[str, Any]:
    """{"policies": [{"vhost", "name", "pattern", "apply-to", "definition", "priority"}]}"""
    res = _call(host, port, "PolicyList", pb.PolicyListRequest(vhost=vhost, operator=operator),
                timeout, token, tls_ca, tls_cert, tls_key)
    return {"policies": [{"vhost": p.vhost, "name": p.name, "pattern": p.pattern,
                          "apply-to": p.apply_to, "definition": json.loads(p.definition_json),
                          "priority": int(p.priority) if p.priority.is_integer() else p.priority}
                         for p in res.policies]}


def call_limit_set(host: str, port: int, scope: str, owner: str, name: str, value: int,
                   timeout: float = 30.0, *, token: str | None = None,
                   tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                   tls_key: Pem | None = None) -> dict[str, Any]:
    req = pb.LimitSetRequest(scope=scope, owner=owner, name=name, value=value)
    return _change_to_dict(_call(host, port, "LimitSet", req, timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_limit_clear(host: str, port: int, scope: str, owner: str, name: str = "",
                     timeout: float = 30.0, *, token: str | None = None,
                     tls_ca: Pem | None = None, tls_cert: Pem | None = None,
                     tls_key: Pem | None = None) -> dict[str, Any]:
    req = pb.LimitClearRequest(scope=scope, owner=owner, name=name)
    return _change_to_dict(_call(host, port, "LimitClear", req, timeout,
                                 token, tls_ca, tls_cert, tls_key))


def call_limit_list(host: str, port: int, scope: str = "", timeout: float = 10.0, *,
                    token: str | None = None, tls_ca: Pem | None = None,
                    tls_cert: Pem | None = None, tls_key: Pem | None = None) -> dict[str, Any]:
    """{"limits": [{"scope", "owner", "name", "value"}]}"""
    res = _call(host, port, "LimitList", pb.LimitListRequest(scope=scope), timeout,
                token, tls_ca, tls_cert, tls_key)
    return {"limits": [{"scope": x.scope, "owner": x.owner, "name": x.name, "value": x.value}
                       for x in res.limits]}


def rpc_error_line(exc: grpc.RpcError, what: str, target: str) -> str:
    """`<STATUS CODE>: <details>` on one line, for the CLI."""
    call = exc if isinstance(exc, grpc.Call) else None
    code = call.code() if call is not None else grpc.StatusCode.UNKNOWN
    details = " ".join(str((call.details() if call is not None else None) or "").split())
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"{code.name}: cannot reach admin API on {target}" + (f" ({details})" if details
                                                                      else "")
    return f"{code.name}: {what} refused: {details}"
