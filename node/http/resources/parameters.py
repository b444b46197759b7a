"""/api/parameters and /api/global-parameters. RabbitMQ keeps per-vhost
runtime parameters for its plugins' components (federation upstreams,
shovels, ...); mirrorq has none of those components, so every listing is
empty and every parameter unknown. Global parameters are replicated
(machine version 6: GlobalParameterSet/Clear) and set, replaced and cleared
here as RabbitMQ's rabbit_mgmt_wm_global_parameter does; the cluster name is
the global parameter "cluster_name" (PUT /api/cluster-name sets it). While
it is not set, the name derived from the members is listed in its place
(what mirrorq always answered), but there is nothing to DELETE."""
from __future__ import annotations

from typing import Any

from node.broker.parameter import CLUSTER_NAME
from node.http.auth import Principal
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.query import filter_sort_page
from node.http.server import HttpError, Request, Response, json_response


def _need_policymaker(p: Principal) -> None:
    # RabbitMQ's is_authorized_policies / is_authorized_global_parameters
    if not p.policymaker:
        raise HttpError(403, "not_authorised", "Not policymaker user")


async def parameters(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    _need_policymaker(p)
    if "vhost" in params:
        ctx.need_vhost_access(p, params["vhost"])
    return filter_sort_page(req, [])


async def parameter(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    _need_policymaker(p)
    ctx.need_vhost_access(p, params["vhost"])
    raise not_found()


def _globals(ctx: Context) -> list[dict[str, Any]]:
    """The set parameters in the order they were first set; the derived
    cluster name first while "cluster_name" is not set."""
    set_ = ctx.model().global_parameters
    rows = [{"name": n, "value": v} for n, v in set_.items()]
    if CLUSTER_NAME not in set_:
        rows.insert(0, {"name": CLUSTER_NAME, "value": ctx.cluster_name()})
    return rows


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


async def global_parameter_put(ctx: Context, req: Request, params: dict[str, str],
                               p: Principal) -> Response:
    """{"value": any JSON} (RabbitMQ's with_decode([value]): 400 without
    it); 201 when new, 204 when replaced."""
    _need_policymaker(p)
    body = json_object(req.json())
    if "value" not in body:
        raise bad_request("key_missing: value")
    try:
        new = await ctx.b.administrator.set_global_parameter(params["name"], body["value"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    except RuntimeError as exc:
        raise HttpError(503, "service_unavailable", str(exc)) from None
    return Response(201 if new else 204)


async def global_parameter_delete(ctx: Context, _r: Request, params: dict[str, str],
                                  p: Principal) -> Response:
    """404 for a parameter that is not set (RabbitMQ's resource_exists)."""
    _need_policymaker(p)
    try:
        await ctx.b.administrator.clear_global_parameter(params["name"])
    except KeyError:
        raise not_found() from None
    return Response(204)
