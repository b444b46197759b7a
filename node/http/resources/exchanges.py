"""/api/exchanges: list, show, declare, delete, publish, an exchange's bindings
(as source and as destination)."""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from node.http.auth import Principal
from node.http.body import amqp_properties, arguments, boolean, json_object, routing_key
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.format import all_bindings, binding_json, exchange_json
from node.http.server import HttpError, Request, Response, json_response

if TYPE_CHECKING:
    from node.replication.read_model import Management, MExchange


async def exchanges(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    vhost = params.get("vhost")
    if vhost is not None:
        ctx.need_vhost(p, vhost)
    vis = frozenset(ctx.vhosts_for(p))
    rows = await ctx.rows()
    return ctx.listed(req, rows, "exchanges", vis, lambda: [
        exchange_json(x) for x in rows.exchanges
        if x.vhost in vis and (vhost is None or x.vhost == vhost)])


async def find_exchange(ctx: Context, p: Principal, vhost: str,
                        name: str) -> tuple[MExchange, Management]:
    ctx.need_vhost(p, vhost)
    rows = await ctx.rows()
    key = "" if name == "amq.default" else name
    for x in rows.exchanges:
        if x.vhost == vhost and x.name == key:
            return x, rows
    raise not_found()


async def exchange(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    x, rows = await find_exchange(ctx, p, params["vhost"], params["name"])
    out = exchange_json(x)
    out["incoming"] = []
    out["outgoing"] = []
    return json_response(out)


async def exchange_put(ctx: Context, req: Request, params: dict[str, str],
                       p: Principal) -> Response:
    vhost, name = params["vhost"], params["name"]
    body = json_object(req.json())
    if vhost not in ctx.model().vhosts:
        raise HttpError(404, "not_found", "vhost_not_found")
    ctx.need_vhost_access(p, vhost)
    xtype = body.get("type")
    if not isinstance(xtype, str) or not xtype:
        raise bad_request("exchange type is required")
    durable = boolean(body, "durable", True)
    auto_delete = boolean(body, "auto_delete", False)
    internal = boolean(body, "internal", False)
    args = arguments(body)
    rows = await ctx.rows()
    existed = any(x.vhost == vhost and x.name == name for x in rows.exchanges)

    async def declare(s: Any) -> Any:
        return await s.call("Exchange.Declare", {
            "exchange": name, "exchange_type": xtype, "durable": durable,
            "auto_delete": auto_delete, "internal": internal, "passive": False,
            "nowait": False, "arguments": args}, ("Exchange.DeclareOk",))
    await ctx.session_do(p, vhost, declare)
    return Response(204 if existed else 201)


async def exchange_delete(ctx: Context, req: Request, params: dict[str, str],
                          p: Principal) -> Response:
    vhost, name = params["vhost"], params["name"]
    await find_exchange(ctx, p, vhost, name)
    if_unused = req.query.get("if-unused") == "true"

    async def delete(s: Any) -> Any:
        return await s.call("Exchange.Delete", {"exchange": name, "if_unused": if_unused,
                                                "nowait": False}, ("Exchange.DeleteOk",))
    await ctx.session_do(p, vhost, delete)
    return Response(204)


async def publish(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    vhost, name = params["vhost"], params["name"]
    body = json_object(req.json())
    await find_exchange(ctx, p, vhost, name)
    for key in ("routing_key", "payload", "payload_encoding"):
        if key not in body:
            raise bad_request(f"{key} is missing")
    props = body.get("properties") or {}
    if not isinstance(props, dict):
        raise bad_request("properties must be an object")
    payload = body["payload"]
    if not isinstance(payload, str) or not isinstance(body["routing_key"], str):
        raise bad_request("payload and routing_key must be strings")
    if body["payload_encoding"] == "string":
        data = payload.encode("utf-8")
    elif body["payload_encoding"] == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except ValueError:
            raise bad_request("payload is not base64") from None
    else:
        raise bad_request("payload_encoding must be string or base64")
    amqp_props = amqp_properties(props)
    exchange = "" if name == "amq.default" else name
    rk = routing_key(body, None)

    async def pub(s: Any) -> bool:
        return bool(await s.publish(exchange, rk, amqp_props, data))
    routed = await ctx.session_do(p, vhost, pub)
    return json_response({"routed": routed})


async def exchange_source(ctx: Context, _r: Request, params: dict[str, str],
                          p: Principal) -> Response:
    x, rows = await find_exchange(ctx, p, params["vhost"], params["name"])
    return json_response([binding_json(b) for b in all_bindings(rows)
                          if b.vhost == x.vhost and b.source == x.name])


async def exchange_dest(ctx: Context, _r: Request, params: dict[str, str],
                        p: Principal) -> Response:
    x, rows = await find_exchange(ctx, p, params["vhost"], params["name"])
    return json_response([binding_json(b) for b in rows.bindings
                          if b.vhost == x.vhost and b.destination_type == "exchange"
                          and b.destination == x.name])
