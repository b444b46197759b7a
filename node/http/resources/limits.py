"""/api/vhost-limits and /api/user-limits: list, set one, clear one
(through the Administrator), as RabbitMQ's rabbit_mgmt_wm_limits / _limit
and _user_limits / _user_limit: a vhost's limits to whoever sees the vhost,
a user's to administrators and to that user; changes by administrators."""
from __future__ import annotations

from typing import Any

from node.broker.limit import USER, VHOST
from node.http.auth import Principal, require_admin
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.server import HttpError, Request, Response, json_response


def vhost_limits_json(vhost: str, limits: Any) -> dict[str, Any]:
    return {"vhost": vhost, "value": dict(limits)}


def user_limits_json(user: str, limits: Any) -> dict[str, Any]:
    return {"user": user, "value": dict(limits)}


async def vhost_limits(ctx: Context, _r: Request, params: dict[str, str],
                       p: Principal) -> Response:
    m = ctx.model()
    vhost = params.get("vhost")
    if vhost is not None:
        if vhost not in m.vhosts:
            raise not_found()
        ctx.need_vhost(p, vhost)
        limits = m.vhost_limits.get(vhost)
        return json_response([vhost_limits_json(vhost, limits)] if limits else [])
    vis = ctx.vhosts_for(p)
    return json_response([vhost_limits_json(v, lim) for v, lim in m.vhost_limits.items()
                          if v in vis])


async def user_limits(ctx: Context, _r: Request, params: dict[str, str],
                      p: Principal) -> Response:
    m = ctx.model()
    user = params.get("user")
    if user is None:
        require_admin(p)
        return json_response([user_limits_json(u, lim) for u, lim in m.user_limits.items()])
    if user != p.name:
        require_admin(p)
    if user not in m.users:
        raise not_found()
    limits = m.user_limits.get(user)
    return json_response([user_limits_json(user, limits)] if limits else [])


async def _put(ctx: Context, req: Request, scope: str, owner: str, name: str) -> Response:
    body = json_object(req.json())
    if "value" not in body:
        raise bad_request("key_missing: value")
    try:
        await ctx.b.administrator.set_limit(scope, owner, name, body["value"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    except KeyError:
        raise HttpError(404, "not_found", f"{scope}_not_found") from None
    except RuntimeError as exc:
        raise HttpError(503, "service_unavailable", str(exc)) from None
    return Response(204)


async def _delete(ctx: Context, scope: str, owner: str, name: str) -> Response:
    try:
        await ctx.b.administrator.clear_limit(scope, owner, name)
    except KeyError:
        raise HttpError(404, "not_found", f"{scope}_not_found") from None
    return Response(204)


async def vhost_limit_put(ctx: Context, req: Request, params: dict[str, str],
                          p: Principal) -> Response:
    require_admin(p)
    return await _put(ctx, req, VHOST, params["vhost"], params["name"])


async def vhost_limit_delete(ctx: Context, _r: Request, params: dict[str, str],
                             p: Principal) -> Response:
    require_admin(p)
    return await _delete(ctx, VHOST, params["vhost"], params["name"])


async def user_limit_put(ctx: Context, req: Request, params: dict[str, str],
                         p: Principal) -> Response:
    require_admin(p)
    return await _put(ctx, req, USER, params["user"], params["name"])


async def user_limit_delete(ctx: Context, _r: Request, params: dict[str, str],
                            p: Principal) -> Response:
    require_admin(p)
    return await _delete(ctx, USER, params["user"], params["name"])
