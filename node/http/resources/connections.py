"""/api/connections: list (all, a vhost's, a user's), show, close, a
connection's channels. Every node lists every connection; only its own ones have peer,
user and client details (LocalConnection), and only it can close them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.http.auth import Principal
from node.http.context import Context
from node.http.errors import not_found
from node.http.format import connection_json
from node.http.query import filter_sort_page
from node.http.resources.channels import chan_rows
from node.http.server import HttpError, Request, Response, json_response
from node.replication.read_model import MConnection

if TYPE_CHECKING:
    from node.replication.read_model import Management


def conn_rows(ctx: Context, rows: Management, p: Principal,
              vhost: str | None = None) -> list[dict[str, Any]]:
    locals_ = ctx.b.local_connections()
    vis = ctx.vhosts_for(p)
    out = []
    known = {(c.node, c.serial) for c in rows.connections}
    # the log learns of a connection with its first channel; RabbitMQ lists it
    # from connection.open on: this node adds its own opened ones the log lacks
    fresh = [MConnection(node, serial, 0, local.vhost) for (node, serial), local in locals_.items()
             if local.opened and (node, serial) not in known]
    for c in [*rows.connections, *fresh]:
        local = locals_.get((c.node, c.serial))
        row = connection_json(c, local)
        if row["vhost"] not in vis or (vhost is not None and row["vhost"] != vhost):
            continue
        if not p.monitor and local is not None and local.user != p.name:
            continue
        out.append(row)
    return out


async def connections(ctx: Context, req: Request, _p: dict[str, str], p: Principal) -> Response:
    return filter_sort_page(req, conn_rows(ctx, await ctx.rows(), p))


async def vhost_connections(ctx: Context, req: Request, params: dict[str, str],
                            p: Principal) -> Response:
    ctx.need_vhost(p, params["vhost"])
    return filter_sort_page(req, conn_rows(ctx, await ctx.rows(), p, params["vhost"]))


async def user_connections(ctx: Context, req: Request, params: dict[str, str],
                           p: Principal) -> Response:
    """/api/connections/username/{username}: RabbitMQ's is_authorized_user
    (the user itself or an administrator); this node lists every node's rows,
    but only its own carry the user, so it lists its own connections."""
    user = params["username"]
    if not p.administrator and p.name != user:
        raise HttpError(403, "not_authorised", "Not administrator user")
    return filter_sort_page(req, [r for r in conn_rows(ctx, await ctx.rows(), p)
                                  if r.get("user") == user])


async def user_connections_delete(ctx: Context, req: Request, params: dict[str, str],
                                  p: Principal) -> Response:
    """DELETE /api/connections/username/{username}: closes the user's
    connections that GET lists (this node's: only it knows their users),
    with the X-Reason header's text; 204 even when there are none, as
    RabbitMQ (its handler closes them wherever they are)."""
    user = params["username"]
    if not p.administrator and p.name != user:
        raise HttpError(403, "not_authorised", "Not administrator user")
    reason = req.headers.get("x-reason", "Closed via management plugin")
    for row in conn_rows(ctx, await ctx.rows(), p):
        if row.get("user") == user and row["node"] == ctx.b.node_id:
            await ctx.b.close_connection(int(row["name"].rpartition(".")[2]), reason)
    return Response(204)


async def connection(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    for row in conn_rows(ctx, await ctx.rows(), p):
        if row["name"] == params["name"]:
            return json_response(row)
    raise not_found()


async def connection_channels(ctx: Context, req: Request, params: dict[str, str],
                              p: Principal) -> Response:
    rows = await ctx.rows()
    if not any(r["name"] == params["name"] for r in conn_rows(ctx, rows, p)):
        raise not_found()
    return filter_sort_page(req, [c for c in chan_rows(ctx, rows, p)
                                  if c["connection_details"]["name"] == params["name"]])


async def connection_delete(ctx: Context, req: Request, params: dict[str, str],
                            p: Principal) -> Response:
    rows = await ctx.rows()
    row = next((r for r in conn_rows(ctx, rows, p) if r["name"] == params["name"]), None)
    if row is None:
        raise not_found()
    if not p.administrator and row.get("user") != p.name:
        raise HttpError(403, "not_authorised", "Not administrator user")
    node = row["node"]
    if node != ctx.b.node_id:
        raise HttpError(400, "bad_request", f"connection {params['name']} is on node "
                                            f"{node}: ask that node's management API")
    reason = req.headers.get("x-reason", "Closed via management plugin")
    serial = int(params["name"].rpartition(".")[2])
    if not await ctx.b.close_connection(serial, reason):
        raise not_found()
    return Response(204)
