"""/api/nodes: the Raft members as RabbitMQ nodes; this node's OS figures."""
from __future__ import annotations

import os
import time
from typing import Any

from node.http.auth import Principal, require_monitor
from node.http.context import Context
from node.http.errors import not_found
from node.http.format import EXCHANGE_TYPES
from node.http.server import Request, Response, json_response
from node.http.stats import STARTED, process_stats
from node.replication.status import NodeStatus


def node_json(ctx: Context, name: str, st: NodeStatus) -> dict[str, Any]:
    cluster = ctx.cluster(st)
    member = next((m for m in cluster["members"] if m["name"] == name), None)
    mine = name == ctx.b.node_id
    alarms = ctx.b.alarms() if mine else []
    out: dict[str, Any] = {
        "name": name, "type": "disc", "running": bool(member and member["reachable"]),
        "being_drained": bool(member and member["draining"]),
        "mem_alarm": "low on memory" in alarms, "disk_free_alarm": "low on disk" in alarms,
        "partitions": [], "rates_mode": "basic", "exchange_types": EXCHANGE_TYPES,
        "mirrorq": member or {},
    }
    if mine:
        out.update({"os_pid": str(os.getpid()), "processors": os.cpu_count() or 1,
                    "uptime": int((time.monotonic() - STARTED) * 1000),
                    **process_stats(),
                    # RabbitMQ's mem_used is the node's memory: this process's RSS
                    # (above), what the memory_high_watermark alarm compares;
                    # mem_limit is that watermark (0 = off). message_bytes are the
                    # queued bodies, connection_held_bytes the unfinished bodies
                    # and open transactions (each connection's max_connection_buffer)
                    "message_bytes": int(st.message_bytes or 0),
                    "connection_held_bytes": int(st.connection_held_bytes or 0),
                    "mem_limit": int(st.mem_limit or 0),
                    "queues": st.queues, "connections": st.connections,
                    "role": st.role, "term": st.term,
                    "commit_index": st.commit_index})
    return out


async def nodes(ctx: Context, _r: Request, _p: dict[str, str], p: Principal) -> Response:
    require_monitor(p)
    st = ctx.b.status()
    return json_response([node_json(ctx, n, st) for n in st.members or []])


async def node(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    require_monitor(p)
    st = ctx.b.status()
    if params["node"] not in (st.members or []):
        raise not_found()
    return json_response(node_json(ctx, params["node"], st))
