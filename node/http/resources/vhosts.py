"""/api/vhosts: list, show, create, delete (through the Administrator), and
RabbitMQ 4.x's deletion protection (/api/vhosts/{vhost}/deletion/protection,
rabbit_mgmt_wm_vhost_deletion_protection): a protected vhost refuses
DELETE with 412 and RabbitMQ's text until the protection is lifted."""
from __future__ import annotations

from node.broker.vhost import ProtectedFromDeletion, protection_of_missing
from node.http.auth import Principal, require_admin
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.format import vhost_json
from node.http.query import filter_sort_page
from node.http.server import HttpError, Request, Response, json_response


async def vhosts(ctx: Context, req: Request, _p: dict[str, str], p: Principal) -> Response:
    rows = await ctx.rows()
    vis = ctx.vhosts_for(p)
    nodes = ctx.nodes()
    m = ctx.model()
    return filter_sort_page(req, [vhost_json(v, rows.queues, nodes, v in m.protected_vhosts)
                                  for v in m.vhosts if v in vis])


async def vhost(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    ctx.need_vhost(p, params["vhost"])
    rows = await ctx.rows()
    name = params["vhost"]
    return json_response(vhost_json(name, rows.queues, ctx.nodes(),
                                    name in ctx.model().protected_vhosts))


async def vhost_put(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    json_object(req.json())
    name = params["vhost"]
    existed = name in ctx.model().vhosts
    try:
        await ctx.b.administrator.put_vhost(name, creator=None if p.token else p.name)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    return Response(204 if existed else 201)


async def vhost_delete(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    try:
        await ctx.b.administrator.delete_vhost(params["vhost"])
    except KeyError:
        raise not_found() from None
    except ProtectedFromDeletion as exc:
        # rabbit_mgmt_wm_vhost: rabbit_mgmt_util:precondition_failed
        raise HttpError(412, "precondition_failed", str(exc)) from None
    return Response(204)


async def protection_get(ctx: Context, _r: Request, params: dict[str, str],
                         p: Principal) -> Response:
    """RabbitMQ 4.3 routes GET but its handler has no representation (cowboy
    answers 406 or 500); mirrorq answers the vhost's state:
    {"name": ..., "protected_from_deletion": bool}. Administrators, as every
    method of this resource."""
    require_admin(p)
    name = params["vhost"]
    m = ctx.model()
    if name not in m.vhosts:
        raise not_found()
    return json_response({"name": name, "protected_from_deletion": name in m.protected_vhosts})


async def _protect(ctx: Context, name: str, protected: bool) -> Response:
    try:
        await ctx.b.administrator.set_vhost_protection(name, protected)
    except KeyError:
        raise HttpError(404, "not_found", protection_of_missing(name, protected)) from None
    except RuntimeError as exc:
        raise HttpError(503, "service_unavailable", str(exc)) from None
    return Response(204)


async def protection_post(ctx: Context, _r: Request, params: dict[str, str],
                          p: Principal) -> Response:
    """Enable the protection: 204; 404 with RabbitMQ's text for an unknown vhost."""
    require_admin(p)
    return await _protect(ctx, params["vhost"], True)


async def protection_delete(ctx: Context, _r: Request, params: dict[str, str],
                            p: Principal) -> Response:
    """Lift it: 204; 404 for an unknown vhost (RabbitMQ's resource_exists)."""
    require_admin(p)
    if params["vhost"] not in ctx.model().vhosts:
        raise not_found()
    return await _protect(ctx, params["vhost"], False)
