"""/api/queues/quorum/{vhost}/{queue}/status: the Raft members of a quorum
queue (RabbitMQ's rabbit_quorum_queue:status/2). Every mirrorq queue lives in
the one Raft group, so each quorum queue answers the group's members as this
node sees them: its own figures in full, another member's as far as this
node knows them ("" where it does not, as RabbitMQ for a member it cannot
ask)."""
from __future__ import annotations

from typing import Any

from node.http.auth import Principal
from node.http.context import Context
from node.http.resources.queues import find_queue
from node.http.server import Request, Response, json_response
from node.replication.status import NodeStatus


def member_rows(st: NodeStatus, log_bounds: tuple[int, int]) -> list[dict[str, Any]]:
    """One row per member, sorted by name (RabbitMQ sorts the nodes). This
    node: its role, its log's last index (also as "Last Written": the status
    does not tell appended from flushed), last applied, commit index, snapshot
    index (the log's first index once it was compacted, else 0) and term. Another member: "leader" if this node follows it, else "follower"
    while linked and "noconnection" when not (RabbitMQ's erpc error);
    "Last Written" is its match index where this node leads."""
    first, last = log_bounds
    peers = {p.member: p for p in st.peers}
    leading = st.role == "leader"
    rows = []
    for name in sorted(st.members or [st.node_id]):
        if name == st.node_id:
            rows.append(_row(name, st.role, "voter", last, last, st.last_applied,
                             st.commit_index, first if first > 1 else 0, st.term,
                             st.machine_version))
            continue
        peer = peers.get(name)
        linked = peer is not None and peer.connected
        if not linked and name != st.leader:
            rows.append(_row(name, "noconnection", "", "", "", "", "", "", "", ""))
            continue
        state = "leader" if name == st.leader else "follower"
        written: int | str = peer.match_index if leading and peer is not None else ""
        version: int | str = peer.machine_version if peer is not None and peer.machine_version \
            else st.machine_version
        rows.append(_row(name, state, "voter", "", written, "", "", "", st.term, version))
    return rows


def _row(name: str, state: str, membership: str, last: Any, written: Any, applied: Any,
         commit: Any, snapshot: Any, term: Any, version: Any) -> dict[str, Any]:
    return {"Node Name": name, "Raft State": state, "Membership": membership,
            "Last Log Index": last, "Last Written": written, "Last Applied": applied,
            "Commit Index": commit, "Snapshot Index": snapshot, "Term": term,
            "Machine Version": version}


async def quorum_status(ctx: Context, _r: Request, params: dict[str, str],
                        p: Principal) -> Response:
    """RabbitMQ: is_authorized_vhost, 404 for a missing queue, 503
    {"status": "failed", "reason": "classic_queue_not_supported"} for a
    classic queue."""
    q, _rows = await find_queue(ctx, p, params["vhost"], params["name"])
    kind = q.arguments.get("x-queue-type", "classic")
    if kind != "quorum":
        reason = "classic_queue_not_supported" if kind == "classic" else "not_quorum_queue"
        return json_response({"status": "failed", "reason": reason}, 503)
    return json_response(member_rows(ctx.b.status(), ctx.b.log_bounds()))
