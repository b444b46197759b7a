"""/api/topic-permissions (all, a user's on a vhost, one exchange's), and a
user's or a vhost's: list, set, clear (through the Administrator), as
RabbitMQ's rabbit_mgmt_wm_topic_permission(s)(_user, _vhost): administrators
only."""
from __future__ import annotations

from typing import Any

from node.http.auth import Principal, require_admin
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.server import HttpError, Request, Response, json_response


def topic_permission_json(user: str, vhost: str, exchange: str,
                          perm: tuple[str, str]) -> dict[str, Any]:
    return {"user": user, "vhost": vhost, "exchange": exchange, "write": perm[0],
            "read": perm[1]}


def _rows(ctx: Context, user: str | None = None,
          vhost: str | None = None) -> list[dict[str, Any]]:
    rows = [topic_permission_json(u, v, x, perm)
            for (u, v, x), perm in ctx.model().topic_permissions.items()
            if (user is None or u == user) and (vhost is None or v == vhost)]
    return sorted(rows, key=lambda r: (r["vhost"], r["user"], r["exchange"]))


async def topic_permissions(ctx: Context, _r: Request, _p: dict[str, str],
                            p: Principal) -> Response:
    require_admin(p)
    return json_response(_rows(ctx))


async def user_topic_permissions(ctx: Context, _r: Request, params: dict[str, str],
                                 p: Principal) -> Response:
    require_admin(p)
    if params["user"] not in ctx.model().users:
        raise bad_request("vhost_or_user_not_found")
    return json_response(_rows(ctx, user=params["user"]))


async def vhost_topic_permissions(ctx: Context, _r: Request, params: dict[str, str],
                                  p: Principal) -> Response:
    require_admin(p)
    if params["vhost"] not in ctx.model().vhosts:
        raise bad_request("vhost_or_user_not_found")
    return json_response(_rows(ctx, vhost=params["vhost"]))


async def topic_permission(ctx: Context, _r: Request, params: dict[str, str],
                           p: Principal) -> Response:
    require_admin(p)
    m = ctx.model()
    if params["user"] not in m.users or params["vhost"] not in m.vhosts:
        raise not_found()
    rows = _rows(ctx, params["user"], params["vhost"])
    if "exchange" in params:
        rows = [r for r in rows if r["exchange"] == params["exchange"]]
    if not rows:
        raise not_found()
    return json_response(rows)


async def topic_permission_put(ctx: Context, req: Request, params: dict[str, str],
                               p: Principal) -> Response:
    require_admin(p)
    user, vhost = params["user"], params["vhost"]
    m = ctx.model()
    if user not in m.users or vhost not in m.vhosts:
        raise bad_request("vhost_or_user_not_found")
    body = json_object(req.json())
    for key in ("exchange", "write", "read"):
        if key not in body:
            raise bad_request(f"key_missing: {key}")
    exchange = body["exchange"]
    if not isinstance(exchange, str):
        raise bad_request("exchange should be a string")
    try:
        new = await ctx.b.administrator.set_topic_permissions(user, vhost, exchange,
                                                              body["write"], body["read"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    except KeyError:
        raise bad_request("vhost_or_user_not_found") from None
    except RuntimeError as exc:
        raise HttpError(503, "service_unavailable", str(exc)) from None
    return Response(201 if new else 204)


async def topic_permission_delete(ctx: Context, _r: Request, params: dict[str, str],
                                  p: Principal) -> Response:
    require_admin(p)
    try:
        await ctx.b.administrator.clear_topic_permissions(params["user"], params["vhost"],
                                                          params.get("exchange", ""))
    except KeyError:
        raise not_found() from None
    return Response(204)
