"""/api/overview, /api/cluster-name, /api/extensions, /api/whoami, /api/version."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.http.auth import Principal, require_admin
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request
from node.http.format import EXCHANGE_TYPES, RABBIT_VERSION, message_stats, rate
from node.http.server import HttpError, Request, Response, json_response

if TYPE_CHECKING:
    from node.replication.read_model import Management


def _totals(ctx: Context, rows: Management, vis: frozenset[str]) -> tuple[Any, ...]:
    """The sums over the visible objects: O(objects), so built once per
    snapshot of the rows (ctx.memo), whatever the number of requests."""
    queues = [q for q in rows.queues if q.vhost in vis]
    counted = [ctx.sampler.counted((q.vhost, q.name), q.stats) for q in queues]
    return (sum(q.ready for q in queues), sum(q.unacked for q in queues),
            [sum(c[i] for c in counted) for i in range(4)], ctx.sampler.totals(vis),
            {"channels": sum(1 for c in rows.channels if c.vhost in vis),
             "connections": sum(1 for c in rows.connections if c.vhost in vis),
             "consumers": sum(1 for c in rows.consumers if c.vhost in vis),
             "exchanges": sum(1 for x in rows.exchanges if x.vhost in vis),
             "queues": len(queues)})


async def overview(ctx: Context, req: Request, _p: dict[str, str], p: Principal) -> Response:
    rows = await ctx.rows()
    vis = frozenset(ctx.vhosts_for(p))
    ready, unacked, totals, rates, object_totals = ctx.memo(
        rows, ("overview", vis), lambda: _totals(ctx, rows, vis))
    st = ctx.b.status()
    # publish, deliver_get, redeliver, ack: cluster-wide, as RabbitMQ's overview
    # (the replicated per-queue counters summed over the visible queues; a message
    # routed to k queues counts k publishes, an unroutable one none)
    stats = message_stats(totals, rates)
    # confirm: this node's (confirms are not replicated: one leaves the node
    # its publisher is connected to; sum the nodes' overviews for the cluster)
    hist_count = int((st.confirm_latency or {}).get("count") or 0)
    stats["confirm"] = ctx.sampler.confirmed(int(st.confirmed or hist_count))
    stats["confirm_details"] = rate(ctx.sampler.confirm_rate())
    out = {
        "management_version": RABBIT_VERSION, "rabbitmq_version": RABBIT_VERSION,
        "product_name": "mirrorq", "product_version": ctx.b.product_version,
        "rates_mode": "basic", "erlang_version": "none (Python)",
        "erlang_full_version": "none (Python)",
        "cluster_name": ctx.cluster_name(), "node": ctx.b.node_id,
        "disable_stats": False, "enable_queue_totals": True,
        "sample_retention_policies": {"global": [600], "basic": [600], "detailed": [600]},
        "exchange_types": EXCHANGE_TYPES,
        "object_totals": dict(object_totals),
        "queue_totals": {"messages": ready + unacked, "messages_details": rate(0),
                         "messages_ready": ready, "messages_ready_details": rate(0),
                         "messages_unacknowledged": unacked,
                         "messages_unacknowledged_details": rate(0)},
        "message_stats": stats,
        "listeners": ctx.b.listeners(),
        "contexts": [{"node": ctx.b.node_id, "description": "RabbitMQ Management",
                      "path": "/", "port": str(req.headers.get("host", "").rpartition(":")[2])}],
        "statistics_db_event_queue": 0,
        "churn_rates": {},
    }
    if p.monitor:  # the members' addresses, leader, commit index: monitoring (issue 42)
        out["mirrorq"] = ctx.cluster(st)
    else:  # RabbitMQ's overview gives listeners and contexts to monitors only
        del out["listeners"], out["contexts"]
    return json_response(out)


async def cluster_name(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    return json_response({"name": ctx.cluster_name()})


async def cluster_name_put(ctx: Context, req: Request, _p: dict[str, str],
                           p: Principal) -> Response:
    """RabbitMQ's rabbit_mgmt_wm_cluster_name PUT: administrators,
    {"name": "..."} (400 without it), the global parameter "cluster_name"
    (replicated), 204."""
    require_admin(p)
    body = json_object(req.json())
    if "name" not in body or body["name"] is None:
        raise bad_request("key_missing: name")
    if not isinstance(body["name"], str):
        raise bad_request("name must be a string")
    try:
        await ctx.b.administrator.set_cluster_name(body["name"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    except RuntimeError as exc:
        raise HttpError(503, "service_unavailable", str(exc)) from None
    return Response(204)


async def extensions(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    return json_response([])


async def whoami(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    return json_response({"name": p.name, "tags": list(p.tags)})


async def version(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    """RabbitMQ answers its product version as a JSON string; mirrorq answers
    the RabbitMQ version it is compatible with (as the overview's
    rabbitmq_version), which is what clients gate features on."""
    return json_response(RABBIT_VERSION)
