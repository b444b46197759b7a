"""/api/channels: list (all, a vhost's)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.http.auth import Principal
from node.http.context import Context
from node.http.format import channel_json
from node.http.query import filter_sort_page
from node.http.server import Request, Response

if TYPE_CHECKING:
    from node.replication.read_model import Management


def chan_rows(ctx: Context, rows: Management, p: Principal,
              vhost: str | None = None) -> list[dict[str, Any]]:
    locals_ = ctx.b.local_connections()
    vis = ctx.vhosts_for(p)
    out = []
    for ch in rows.channels:
        if ch.vhost not in vis or (vhost is not None and ch.vhost != vhost):
            continue
        local = locals_.get((ch.node, ch.conn))
        if not p.monitor and local is not None and local.user != p.name:
            continue
        out.append(channel_json(ch, local))
    return out


async def channels(ctx: Context, req: Request, _p: dict[str, str], p: Principal) -> Response:
    return filter_sort_page(req, chan_rows(ctx, await ctx.rows(), p))


async def vhost_channels(ctx: Context, req: Request, params: dict[str, str],
                         p: Principal) -> Response:
    ctx.need_vhost(p, params["vhost"])
    return filter_sort_page(req, chan_rows(ctx, await ctx.rows(), p, params["vhost"]))
