"""/api/parameters and /api/global-parameters, read-only. RabbitMQ keeps
per-vhost runtime parameters for its plugins' components (federation
upstreams, shovels, ...); mirrorq has none of those components, so every
listing is empty and every parameter unknown. Its one global parameter is
the cluster name (RabbitMQ's cluster_name), derived from the members, so it
cannot be set here."""
from __future__ import annotations

from typing import Any

from node.http.auth import Principal
from node.http.context import Context
from node.http.errors import not_found
from node.http.query import filter_sort_page
from node.http.server import HttpError, Request, Response, json_response


def _need_policymaker(p: Principal) -> None:
    # RabbitMQ's is_authorized_policies / is_authorized_global_parameters
    if not p.policymaker:
        raise HttpError(403, "not_authorised", "Not policymaker user")


async def parameters(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    _need_policymaker(p)
    if "vhost" in params:
        ctx.need_vhost(p, params["vhost"])
    return filter_sort_page(req, [])


async def parameter(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    _need_policymaker(p)
    ctx.need_vhost(p, params["vhost"])
    raise not_found()


def _globals(ctx: Context) -> list[dict[str, Any]]:
    return [{"name": "cluster_name", "value": ctx.cluster_name()}]


async def global_parameters(ctx: Context, req: Request, _p: dict[str, str],
                            p: Principal) -> Response:
    _need_policymaker(p)
    return filter_sort_page(req, _globals(ctx))


async def global_parameter(ctx: Context, _r: Request, params: dict[str, str],
                           p: Principal) -> Response:
    _need_policymaker(p)
    for row in _globals(ctx):
        if row["name"] == params["name"]:
            return json_response(row)
    raise not_found()
