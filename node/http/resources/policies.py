"""/api/policies (all, a vhost's, one): list, show, set, clear (through the
Administrator), as RabbitMQ's rabbit_mgmt_wm_policies / _policy: the
policymaker or administrator tag, and a policymaker only in the vhosts it
has permissions on. operator_policies.py serves /api/operator-policies with
the same handlers (administrators only)."""
from __future__ import annotations

from typing import Any

from node.broker.policy import Policy
from node.http.auth import Principal, require_admin
from node.http.body import json_object
from node.http.context import Context, Handler
from node.http.errors import bad_request, not_found
from node.http.server import HttpError, Request, Response, json_response


def policy_json(p: Policy) -> dict[str, Any]:
    return {"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
            "definition": dict(p.definition), "priority": p.priority}


def _authorize(ctx: Context, p: Principal, operator: bool, vhost: str | None) -> None:
    if operator:
        require_admin(p)
    elif not p.policymaker:
        raise HttpError(403, "not_authorised", "Not policymaker user")
    if vhost is not None:
        ctx.need_vhost_access(p, vhost)  # is_authorized_policies: monitoring is not enough


def _table(ctx: Context, operator: bool) -> Any:
    m = ctx.model()
    return m.operator_policies if operator else m.policies


def _listing(ctx: Context, p: Principal, operator: bool, vhost: str | None) -> list[Policy]:
    vis = ctx.access_vhosts_for(p)
    pols = [pol for pol in _table(ctx, operator).values()
            if pol.vhost in vis and (vhost is None or pol.vhost == vhost)]
    return sorted(pols, key=lambda pol: pol.priority)  # RabbitMQ lists by priority, ascending


def handlers(operator: bool) -> dict[str, Handler]:
    """The list, show, put and delete handlers of one policy family."""

    async def listing(ctx: Context, _r: Request, params: dict[str, str],
                      p: Principal) -> Response:
        vhost = params.get("vhost")
        _authorize(ctx, p, operator, vhost)
        return json_response([policy_json(pol) for pol in _listing(ctx, p, operator, vhost)])

    async def show(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
        _authorize(ctx, p, operator, params["vhost"])
        pol = _table(ctx, operator).get((params["vhost"], params["name"]))
        if pol is None:
            raise not_found()
        return json_response(policy_json(pol))

    async def put(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
        vhost = params["vhost"]
        _authorize(ctx, p, operator, None)
        if vhost not in ctx.model().vhosts:
            raise HttpError(404, "not_found", "vhost_not_found")
        ctx.need_vhost_access(p, vhost)
        body = json_object(req.json())
        for key in ("pattern", "definition"):
            if key not in body:
                raise bad_request(f"key_missing: {key}")
        try:
            new = await ctx.b.administrator.set_policy(
                vhost, params["name"], body["pattern"], body["definition"],
                body.get("priority", 0), body.get("apply-to", "all"), operator)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        except KeyError:
            raise HttpError(404, "not_found", "vhost_not_found") from None
        return Response(201 if new else 204)

    async def delete(ctx: Context, _r: Request, params: dict[str, str],
                     p: Principal) -> Response:
        _authorize(ctx, p, operator, params["vhost"])
        try:
            await ctx.b.administrator.clear_policy(params["vhost"], params["name"], operator)
        except KeyError:
            raise not_found() from None
        return Response(204)

    return {"list": listing, "show": show, "put": put, "delete": delete}


_H = handlers(operator=False)
policies, policy, policy_put, policy_delete = _H["list"], _H["show"], _H["put"], _H["delete"]
