"""/api/permissions (and a vhost's, a user's): list, show, set, clear
(through the Administrator)."""
from __future__ import annotations

from node.http.auth import Principal, require_admin
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.format import permission_json
from node.http.server import HttpError, Request, Response, json_response


async def vhost_permissions(ctx: Context, _r: Request, params: dict[str, str],
                            p: Principal) -> Response:
    require_admin(p)
    m = ctx.model()
    if params["vhost"] not in m.vhosts:
        raise not_found()
    return json_response([permission_json(u, v, perm) for (u, v), perm
                          in m.permissions.items() if v == params["vhost"]])


async def user_permissions(ctx: Context, _r: Request, params: dict[str, str],
                           p: Principal) -> Response:
    require_admin(p)
    m = ctx.model()
    if params["user"] not in m.users:
        raise not_found()
    return json_response([permission_json(u, v, perm) for (u, v), perm
                          in m.permissions.items() if u == params["user"]])


async def permissions(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    return json_response([permission_json(u, v, perm) for (u, v), perm
                          in ctx.model().permissions.items()])


async def permission(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    perm = ctx.model().permissions.get((params["user"], params["vhost"]))
    if perm is None:
        raise not_found()
    return json_response(permission_json(params["user"], params["vhost"], perm))


async def permission_put(ctx: Context, req: Request, params: dict[str, str],
                         p: Principal) -> Response:
    require_admin(p)
    body = json_object(req.json())
    user, vhost = params["user"], params["vhost"]
    m = ctx.model()
    if vhost not in m.vhosts:
        raise HttpError(404, "not_found", "vhost_not_found")
    if user not in m.users:
        raise HttpError(404, "not_found", "user_not_found")
    pats = []
    for key in ("configure", "write", "read"):
        value = body.get(key)
        if not isinstance(value, str):
            raise bad_request(f"{key} is required (a regular expression)")
        pats.append(value)
    existed = (user, vhost) in m.permissions
    try:
        await ctx.b.administrator.set_permissions(user, vhost, *pats)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    except KeyError:
        raise not_found() from None
    return Response(204 if existed else 201)


async def permission_delete(ctx: Context, _r: Request, params: dict[str, str],
                            p: Principal) -> Response:
    require_admin(p)
    try:
        await ctx.b.administrator.clear_permissions(params["user"], params["vhost"])
    except KeyError:
        raise not_found() from None
    return Response(204)
