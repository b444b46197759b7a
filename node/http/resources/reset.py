"""/api/reset and /api/reset/{node} (RabbitMQ's rabbit_mgmt_wm_reset):
administrators reset the management statistics, 204. mirrorq's statistics
are each node's rate sampler over the replicated counters
(node/http/stats.py RateSampler), so a reset makes the answering node's
rates start over and its message counters count from now; RabbitMQ's
/api/reset resets every node's, mirrorq's the answering node's (each member
keeps its own sampler: send it to each, as /api/reset/{node} to that node).
/api/reset/{node}: 404 for a node that is no member (RabbitMQ's
resource_exists), 400 naming the node when it is another member."""
from __future__ import annotations

from node.http.auth import Principal, require_admin
from node.http.context import Context
from node.http.errors import not_found
from node.http.server import HttpError, Request, Response


async def reset(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    node = params.get("node")
    if node is not None and node != ctx.b.node_id:
        if node not in ctx.nodes():
            raise not_found()
        raise HttpError(400, "bad_request", f"the statistics of node {node} are kept by that "
                                            "node: ask its management API")
    rows = await ctx.rows()
    st = ctx.b.status()
    hist_count = int((st.confirm_latency or {}).get("count") or 0)
    ctx.sampler.reset(rows, int(st.confirmed or hist_count))
    return Response(204)
