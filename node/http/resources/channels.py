"""/api/channels: list (all, a vhost's), show one (with its consumers)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from node.http.auth import Principal
from node.http.context import Context
from node.http.errors import not_found
from node.http.format import chan_name, channel_json, consumer_json
from node.http.query import filter_sort_page
from node.http.server import HttpError, Request, Response, json_response

if TYPE_CHECKING:
    from node.http.backend import LocalConnection
    from node.replication.read_model import Management, MChannel, MConsumer


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


def channel_detail(ch: MChannel, local: LocalConnection | None,
                   consumers: Sequence[MConsumer]) -> dict[str, Any]:
    """One channel as RabbitMQ's rabbit_mgmt_db:get_channel gives it: the list's
    row, its consumers (each as /api/consumers lists it) and the per-exchange
    and per-queue rate lists (empty: mirrorq keeps no fine-grained stats)."""
    row = channel_json(ch, local)
    row["consumer_details"] = [consumer_json(c, row["number"], local) for c in consumers
                               if (c.node, c.conn, c.chan_serial) == (ch.node, ch.conn, ch.serial)]
    row["publishes"] = []
    row["deliveries"] = []
    return row


async def channel(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    """RabbitMQ's is_authorized_user: a monitoring user or the channel's own
    user; another user gets 401 not_authorised (only this node knows the user
    of its own connections' channels: others' are shown as in the list)."""
    rows = await ctx.rows()
    locals_ = ctx.b.local_connections()
    vis = ctx.vhosts_for(p)
    for ch in rows.channels:
        local = locals_.get((ch.node, ch.conn))
        number = local.numbers.get(ch.serial, ch.number) if local is not None else ch.number
        if chan_name(ch.node, ch.conn, number) != params["name"]:
            continue
        if not p.monitor and local is not None and local.user != p.name:
            raise HttpError(401, "not_authorised", "User not authorised to access object")
        if ch.vhost not in vis:
            break
        return json_response(channel_detail(ch, local, rows.consumers))
    raise not_found()
