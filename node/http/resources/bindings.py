"""/api/bindings: list, and one binding by source, destination (`q`: a queue,
`e`: an exchange) and properties key: show, create, delete."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from node.http.auth import Principal
from node.http.body import arguments, json_object, routing_key
from node.http.context import Context, Handler
from node.http.errors import not_found
from node.http.format import all_bindings, binding_json, properties_key
from node.http.server import HttpError, Request, Response, json_response

if TYPE_CHECKING:
    from node.replication.read_model import Management, MBinding


async def bindings(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    vhost = params.get("vhost")
    if vhost is not None:
        ctx.need_vhost(p, vhost)
    vis = frozenset(ctx.vhosts_for(p))
    rows = await ctx.rows()
    return ctx.listed(req, rows, "bindings", vis, lambda: [
        binding_json(b) for b in all_bindings(rows)
        if b.vhost in vis and (vhost is None or b.vhost == vhost)])


def matching(rows: Management, vhost: str, source: str, kind: str,
             dest: str) -> list[MBinding]:
    dtype = "queue" if kind == "q" else "exchange"
    return [b for b in all_bindings(rows) if b.vhost == vhost and b.source == source
            and b.destination_type == dtype and b.destination == dest]


async def binding_ends(ctx: Context, p: Principal, params: dict[str, str], kind: str) -> Management:
    vhost = params["vhost"]
    ctx.need_vhost(p, vhost)
    rows = await ctx.rows()
    src = "" if params["source"] == "amq.default" else params["source"]
    if not any(x.vhost == vhost and x.name == src for x in rows.exchanges):
        raise not_found()
    if kind == "q":
        found = any(q.vhost == vhost and q.name == params["dest"] for q in rows.queues)
    else:
        found = any(x.vhost == vhost and x.name == params["dest"] for x in rows.exchanges)
    if not found:
        raise not_found()
    return rows


def binding_list(kind: str) -> Handler:
    async def handler(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
        rows = await binding_ends(ctx, p, params, kind)
        return json_response([binding_json(b) for b in matching(
            rows, params["vhost"], params["source"], kind, params["dest"])])
    return handler


def binding_get(kind: str) -> Handler:
    async def handler(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
        rows = await binding_ends(ctx, p, params, kind)
        for b in matching(rows, params["vhost"], params["source"], kind,
                          params["dest"]):
            if properties_key(b.routing_key, b.arguments) == quote(params["props"], safe="~") \
                    or properties_key(b.routing_key, b.arguments) == params["props"]:
                return json_response(binding_json(b))
        raise not_found()
    return handler


def binding_post(kind: str) -> Handler:
    async def handler(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
        body = json_object(req.json())
        vhost, source, dest = params["vhost"], params["source"], params["dest"]
        if vhost not in ctx.model().vhosts:
            raise HttpError(404, "not_found", "vhost_not_found")
        ctx.need_vhost_access(p, vhost)
        rk = routing_key(body)
        args = arguments(body)

        async def bind(s: Any) -> Any:
            if kind == "q":
                return await s.call("Queue.Bind", {
                    "queue": dest, "exchange": source, "routing_key": rk, "nowait": False,
                    "arguments": args}, ("Queue.BindOk",))
            return await s.call("Exchange.Bind", {
                "destination": dest, "source": source, "routing_key": rk, "nowait": False,
                "arguments": args}, ("Exchange.BindOk",))
        await ctx.session_do(p, vhost, bind)
        resp = Response(201)
        resp.headers["Location"] = f"{quote(dest, safe='')}/{properties_key(rk, args)}"
        return resp
    return handler


def binding_delete(kind: str) -> Handler:
    async def handler(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
        rows = await binding_ends(ctx, p, params, kind)
        vhost, source, dest = params["vhost"], params["source"], params["dest"]
        found = None
        for b in matching(rows, vhost, source, kind, dest):
            key = properties_key(b.routing_key, b.arguments)
            if key in (params["props"], quote(params["props"], safe="~")):
                found = b
        if found is None or not found.source:
            raise not_found()
        b = found

        async def unbind(s: Any) -> Any:
            if kind == "q":
                return await s.call("Queue.Unbind", {
                    "queue": dest, "exchange": source, "routing_key": b.routing_key,
                    "arguments": dict(b.arguments)}, ("Queue.UnbindOk",))
            return await s.call("Exchange.Unbind", {
                "destination": dest, "source": source, "routing_key": b.routing_key,
                "nowait": False, "arguments": dict(b.arguments)}, ("Exchange.UnbindOk",))
        await ctx.session_do(p, vhost, unbind)
        return Response(204)
    return handler
