"""/api/consumers: list (all, a vhost's)."""
from __future__ import annotations

from node.http.auth import Principal
from node.http.context import Context
from node.http.format import consumer_json
from node.http.query import filter_sort_page
from node.http.server import Request, Response


async def consumers(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    vhost = params.get("vhost")
    if vhost is not None:
        ctx.need_vhost(p, vhost)
    vis = ctx.vhosts_for(p)
    rows = await ctx.rows()
    locals_ = ctx.b.local_connections()
    numbers = {(c.node, c.conn, c.serial): c.number for c in rows.channels}
    out = [consumer_json(c, numbers.get((c.node, c.conn, c.chan_serial), 0),
                         locals_.get((c.node, c.conn)))
           for c in rows.consumers if c.vhost in vis and (vhost is None or c.vhost == vhost)]
    return filter_sort_page(req, out)
