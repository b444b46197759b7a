"""mirrorq's own: /api/mirrorq/cluster (the Raft members as this node sees
them) and /api/mirrorq/members/{name} (add, remove; through the
Administrator); and RabbitMQ's /api/rebalance/queues, a no-op here."""
from __future__ import annotations

from node.http.auth import Principal, require_admin, require_monitor
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.server import HttpError, Request, Response, json_response


async def mirrorq_cluster(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    """Member addresses, the leader, the commit index: monitoring or
    administrator, as RabbitMQ's /api/nodes (issue 42; 403 otherwise)."""
    require_monitor(p)
    return json_response(ctx.cluster(ctx.b.status()))


async def member_add(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    body = json_object(req.json())
    address = body.get("address")
    if not isinstance(address, str) or ":" not in address:
        raise bad_request("address (HOST:RAFTPORT) is required")
    try:
        await ctx.b.administrator.add_member(params["name"], address)
    except (RuntimeError, ValueError) as exc:
        raise HttpError(409, "conflict", str(exc)) from None
    except TimeoutError as exc:
        raise HttpError(503, "service_unavailable", str(exc) or "timed out") from None
    return Response(201)


async def member_remove(ctx: Context, _r: Request, params: dict[str, str],
                        p: Principal) -> Response:
    require_admin(p)
    try:
        await ctx.b.administrator.remove_member(params["name"])
    except KeyError:
        raise not_found() from None
    except (RuntimeError, ValueError) as exc:
        raise HttpError(409, "conflict", str(exc)) from None
    except TimeoutError as exc:
        raise HttpError(503, "service_unavailable", str(exc) or "timed out") from None
    return Response(204)


async def rebalance_queues(ctx: Context, _r: Request, _p: dict[str, str],
                           p: Principal) -> Response:
    """POST /api/rebalance/queues: RabbitMQ moves queue leaders across the
    nodes (started in the background, 204). Every mirrorq queue lives in the
    one Raft group, led by its one leader: there is nothing to move, so this
    is accepted and does nothing (administrators only, as RabbitMQ)."""
    require_admin(p)
    return Response(204)
