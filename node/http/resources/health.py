"""/api/health/checks/* and /api/aliveness-test/{vhost} (the decisions of
the fine-grained checks: node/http/health_check.py)."""
from __future__ import annotations

import json
import time
from typing import Any

from node.broker.pattern import PatternError, compile_pattern
from node.http import health_check as hc
from node.http.auth import Principal
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.server import HttpError, Request, Response, json_response
from node.http.stats import quorum_critical


async def health_alarms(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    alarms = ctx.b.alarms()
    if alarms:
        return Response(503, json.dumps({
            "status": "failed", "reason": "resource alarm(s) in effect",
            "alarms": [{"node": ctx.b.node_id, "resource": a} for a in alarms]}).encode())
    return json_response({"status": "ok"})


async def health_quorum(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    st = ctx.b.status()
    why = quorum_critical(st)
    if why is not None:
        return Response(503, json.dumps({"status": "failed", "reason": why}).encode())
    if len(st.members or []) <= 1:
        return json_response({"status": "ok", "reason": "single node cluster"})
    return json_response({"status": "ok"})


async def healthchecks_node(ctx: Context, _r: Request, params: dict[str, str],
                            p: Principal) -> Response:
    """/api/healthchecks/node[/{node}] (still routed in RabbitMQ 4.x): this node
    answers, so it is up; another member is looked up in the cluster (404 if
    none has that name), its health is its own endpoint's business."""
    name = params.get("node")
    if name is not None and name != ctx.b.node_id and name not in (ctx.b.status().members or []):
        raise not_found()
    return json_response({"status": "ok"})


async def health_vhosts(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    return json_response({"status": "ok"})


async def aliveness(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    vhost = params["vhost"]
    ctx.need_vhost_access(p, vhost)  # it declares, publishes and gets there

    async def check(s: Any) -> None:
        await s.call("Queue.Declare", {"queue": "aliveness-test", "durable": False,
                                       "exclusive": False, "auto_delete": False,
                                       "passive": False, "nowait": False, "arguments": {}},
                     ("Queue.DeclareOk",))
        await s.publish("", "aliveness-test", {}, b"test_message")
        msg = await s.get("aliveness-test", True)
        if msg is None:
            raise HttpError(503, "failed", "aliveness-test: message not received")
    await ctx.session_do(Principal(p.name, p.tags, token=p.monitor), vhost, check)
    return json_response({"status": "ok"})


def _answer(check: hc.Check) -> Response:
    return json_response(check[1], check[0])


async def health_port_listener(ctx: Context, _r: Request, params: dict[str, str],
                               p: Principal) -> Response:
    try:
        port = int(params["port"])
    except ValueError:
        raise bad_request("Invalid port") from None
    return _answer(hc.port_listener(port, ctx.b.listeners()))


async def health_protocol_listener(ctx: Context, _r: Request, params: dict[str, str],
                                   p: Principal) -> Response:
    return _answer(hc.protocol_listener(params["protocols"], ctx.b.listeners()))


async def health_is_in_service(ctx: Context, _r: Request, _p: dict[str, str],
                               p: Principal) -> Response:
    st = ctx.b.status()
    return _answer(hc.is_in_service(st.has_quorum, st.leader))


async def health_target_cluster_size(ctx: Context, _r: Request, _p: dict[str, str],
                                     p: Principal) -> Response:
    """Online: this node and the members it has a Raft link to (as
    /api/nodes' `running`)."""
    st = ctx.b.status()
    members = set(st.members or [ctx.b.node_id])
    online = 1 + sum(1 for peer in st.peers
                     if peer.connected and peer.member in members and peer.member != st.node_id)
    return _answer(hc.reached_target_cluster_size(online, ctx.b.target_cluster_size()))


async def health_connection_limit(ctx: Context, _r: Request, _p: dict[str, str],
                                  p: Principal) -> Response:
    return _answer(hc.below_connection_limit(*ctx.b.connection_use()))


async def health_ready(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    st = ctx.b.status()
    opened, limit = ctx.b.connection_use()
    return _answer(hc.ready_to_serve_clients(st.has_quorum, st.leader, ctx.b.listeners(),
                                             opened, limit))


async def health_metadata_store(ctx: Context, _r: Request, _p: dict[str, str],
                                p: Principal) -> Response:
    return _answer(hc.metadata_store_initialized(ctx.b.status().last_applied))


async def health_metadata_store_data(ctx: Context, _r: Request, _p: dict[str, str],
                                     p: Principal) -> Response:
    return _answer(hc.metadata_store_with_data(ctx.b.status().last_applied,
                                               len(ctx.model().vhosts)))


async def health_quorum_leaders(ctx: Context, _r: Request, params: dict[str, str],
                                p: Principal) -> Response:
    """quorum-queues-without-elected-leaders/{all-vhosts | vhost/{vhost}}[/pattern/{pattern}]
    (RabbitMQ's default pattern: .*, matched anywhere in the name)."""
    vhost = params.get("vhost")
    if vhost is not None:
        ctx.need_vhost(p, vhost)  # 404 unknown; a failure names queues: visible vhosts only
    vis = ctx.vhosts_for(p)
    try:
        pattern = compile_pattern(params.get("pattern", ".*"))
    except PatternError as err:
        raise bad_request(f"invalid pattern: {err}") from None
    rows = await ctx.rows()
    queues = [(q.vhost, q.name) for q in rows.queues
              if (vhost is None or q.vhost == vhost) and q.vhost in vis
              and q.arguments.get("x-queue-type") == "quorum"
              and pattern.search(q.name)]
    st = ctx.b.status()
    return _answer(hc.quorum_queues_without_leader(hc.serving(st.has_quorum, st.leader), queues))


async def health_certificate_expiration(ctx: Context, _r: Request, params: dict[str, str],
                                        p: Principal) -> Response:
    """certificate-expiration/{within}/{unit}: 503 listing the TLS listeners
    (amqps, HTTPS, Raft TLS) whose certificate or CA file has an entry that
    expires within the period (or is not yet valid or no certificate)."""
    try:
        within = hc.period_seconds(params["within"], params["unit"])
    except ValueError as err:
        raise bad_request(str(err)) from None
    now = time.time()
    return _answer(hc.certificate_expiration(ctx.b.certificate_validity(now), now, within))
