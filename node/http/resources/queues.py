"""/api/queues: list, show, declare, delete, purge, get messages, a queue's
bindings."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.http.auth import Principal
from node.http.body import arguments, boolean, json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.format import all_bindings, binding_json, consumer_json, message_json, queue_json
from node.http.server import HttpError, Request, Response, json_response

if TYPE_CHECKING:
    from node.replication.read_model import Management, MQueue


def _queue_json(ctx: Context, q: MQueue) -> dict[str, Any]:
    key = (q.vhost, q.name)
    return queue_json(q, ctx.sampler.rates(key), ctx.sampler.counted(key, q.stats))


async def queues(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    vhost = params.get("vhost")
    if vhost is not None:
        ctx.need_vhost(p, vhost)
    vis = frozenset(ctx.vhosts_for(p))
    rows = await ctx.rows()
    return ctx.listed_json(
        req, rows, "queues", vis,
        lambda: ctx.rows_json(rows, "queues", rows.queues, lambda q: (q.vhost, q.name),
                              lambda q: _queue_json(ctx, q)),
        lambda q: q.vhost in vis and (vhost is None or q.vhost == vhost))


async def find_queue(ctx: Context, p: Principal, vhost: str,
                     name: str) -> tuple[MQueue, Management]:
    ctx.need_vhost(p, vhost)
    rows = await ctx.rows()
    for q in rows.queues:
        if q.vhost == vhost and q.name == name:
            return q, rows
    raise not_found()


async def queue(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    q, rows = await find_queue(ctx, p, params["vhost"], params["name"])
    out = _queue_json(ctx, q)
    locals_ = ctx.b.local_connections()
    numbers = {(c.node, c.conn, c.serial): c.number for c in rows.channels}
    out["consumer_details"] = [
        consumer_json(c, numbers.get((c.node, c.conn, c.chan_serial), 0),
                      locals_.get((c.node, c.conn)))
        for c in rows.consumers if c.vhost == q.vhost and c.queue == q.name]
    out["incoming"] = []
    out["deliveries"] = []
    return json_response(out)


async def queue_put(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    vhost, name = params["vhost"], params["name"]
    body = json_object(req.json())
    if vhost not in ctx.model().vhosts:
        raise HttpError(404, "not_found", "vhost_not_found")
    ctx.need_vhost_access(p, vhost)
    durable = boolean(body, "durable", True)
    auto_delete = boolean(body, "auto_delete", False)
    args = arguments(body)
    if "node" in body and not isinstance(body["node"], str):
        raise bad_request("node must be a string")
    rows = await ctx.rows()
    existed = any(q.vhost == vhost and q.name == name for q in rows.queues)
    if not name:
        raise bad_request("a queue needs a name")

    async def declare(s: Any) -> Any:
        return await s.call("Queue.Declare", {
            "queue": name, "durable": durable, "auto_delete": auto_delete,
            "exclusive": False, "passive": False, "nowait": False, "arguments": args},
            ("Queue.DeclareOk",))
    await ctx.session_do(p, vhost, declare)
    return Response(204 if existed else 201)


async def queue_delete(ctx: Context, req: Request, params: dict[str, str],
                       p: Principal) -> Response:
    vhost, name = params["vhost"], params["name"]
    await find_queue(ctx, p, vhost, name)
    if_unused = req.query.get("if-unused") == "true"
    if_empty = req.query.get("if-empty") == "true"

    async def delete(s: Any) -> Any:
        return await s.call("Queue.Delete", {"queue": name, "if_unused": if_unused,
                                             "if_empty": if_empty, "nowait": False},
                            ("Queue.DeleteOk",))
    await ctx.session_do(p, vhost, delete)
    return Response(204)


async def queue_purge(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    vhost, name = params["vhost"], params["name"]
    await find_queue(ctx, p, vhost, name)

    async def purge(s: Any) -> Any:
        return await s.call("Queue.Purge", {"queue": name, "nowait": False},
                            ("Queue.PurgeOk",))
    await ctx.session_do(p, vhost, purge)
    return Response(204)


async def queue_get(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    vhost, name = params["vhost"], params["name"]
    body = json_object(req.json())
    await find_queue(ctx, p, vhost, name)
    count = body.get("count", 1)
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise bad_request("count must be a positive integer")
    ackmode = body.get("ackmode") or ("ack_requeue_true" if body.get("requeue", True)
                                     else "ack_requeue_false")
    if ackmode not in ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
                       "reject_requeue_false"):
        raise bad_request(f"invalid ackmode {ackmode!r}")
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding must be auto or base64")
    truncate = body.get("truncate")
    if truncate is not None and (not isinstance(truncate, int) or truncate < 0):
        raise bad_request("truncate must be a non-negative integer")

    async def get(s: Any) -> list[dict[str, Any]]:
        out = []
        tags = []
        no_ack = ackmode == "ack_requeue_false"
        taken = 0
        for _ in range(min(count, ctx.get_max_count)):
            if not more_to_get(taken, ctx.get_max_bytes):
                break  # nothing is taken past the budget: what stays was never got
            msg = await s.get(name, no_ack)
            if msg is None:
                break
            taken += len(msg.body)
            out.append(message_json(msg, encoding, truncate))
            tag = msg.method.delivery_tag
            if ackmode == "reject_requeue_false":
                s.send(encode("Basic.Reject", {"delivery_tag": tag, "requeue": False}))
            tags.append(tag)
        if ackmode == "ack_requeue_true" and out:
            # requeued at their places (redelivered) before the session closes;
            # not a failed delivery (RabbitMQ sends basic.nack requeue=true, S27)
            await s.call("Basic.Recover", {"requeue": True}, ("Basic.RecoverOk",))
        elif ackmode.startswith("reject_") and out:
            if ackmode == "reject_requeue_true":  # after every get, as RabbitMQ: a
                for tag in tags:                  # failed delivery of a quorum queue (S27)
                    s.send(encode("Basic.Reject", {"delivery_tag": tag, "requeue": True}))
            await s.call("Basic.Qos", {"prefetch_count": 0}, ("Basic.QosOk",))  # a barrier
        return out
    return json_response(await ctx.session_do(p, vhost, get))


def more_to_get(taken_bytes: int, max_bytes: int) -> bool:
    """May a get answer take one more message, having taken `taken_bytes` of
    bodies? Until the byte budget is spent (so an answer holds at most
    max_bytes plus one message; RabbitMQ has no such bound: 10,000 gets of
    16 MiB built a 160 GiB answer)."""
    return taken_bytes < max_bytes


async def queue_bindings(ctx: Context, req: Request, params: dict[str, str],
                         p: Principal) -> Response:
    q, rows = await find_queue(ctx, p, params["vhost"], params["name"])
    out = [binding_json(b) for b in all_bindings(rows)
           if b.vhost == q.vhost and b.destination_type == "queue" and b.destination == q.name]
    return json_response(out)


def encode(path: str, fields: dict[str, Any]) -> bytes:
    from node.amqp import frame
    return frame.encode_method(1, path, fields)
