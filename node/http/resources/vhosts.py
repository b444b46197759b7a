"""/api/vhosts: list, show, create, delete (through the Administrator)."""
from __future__ import annotations

from node.http.auth import Principal, require_admin
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.format import vhost_json
from node.http.query import filter_sort_page
from node.http.server import Request, Response, json_response


async def vhosts(ctx: Context, req: Request, _p: dict[str, str], p: Principal) -> Response:
    rows = await ctx.rows()
    vis = ctx.vhosts_for(p)
    nodes = ctx.nodes()
    return filter_sort_page(req, [vhost_json(v, rows.queues, nodes)
                                  for v in ctx.model().vhosts if v in vis])


async def vhost(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    ctx.need_vhost(p, params["vhost"])
    rows = await ctx.rows()
    return json_response(vhost_json(params["vhost"], rows.queues, ctx.nodes()))


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
    return Response(204)
