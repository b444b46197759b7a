"""/api/users: list, without permissions, show, create or update (password or
hash), delete (through the Administrator); /api/auth/hash_password/{password}."""
from __future__ import annotations

from node.broker.password import hash_password as sha256_hash
from node.http.auth import Principal, parse_tags, require_admin
from node.http.body import json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.format import HASHING, user_json
from node.http.query import filter_sort_page
from node.http.server import Request, Response, json_response


async def users(ctx: Context, req: Request, _p: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    return filter_sort_page(req, [user_json(n, e) for n, e in ctx.model().users.items()])


async def users_without_permissions(ctx: Context, _r: Request, _p: dict[str, str],
                                    p: Principal) -> Response:
    require_admin(p)
    m = ctx.model()
    having = {u for (u, _v) in m.permissions}
    return json_response([user_json(n, e) for n, e in m.users.items() if n not in having])


async def user(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    entry = ctx.model().users.get(params["user"])
    if entry is None:
        raise not_found()
    return json_response(user_json(params["user"], entry))


async def user_put(ctx: Context, req: Request, params: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    body = json_object(req.json())
    name = params["user"]
    existed = name in ctx.model().users
    tags = parse_tags(body.get("tags", ""))
    admin = ctx.b.administrator
    if "password" in body:
        if not isinstance(body["password"], str):
            raise bad_request("password must be a string")
        await admin.put_user(name, body["password"], tags)
    elif "password_hash" in body:
        algo = body.get("hashing_algorithm", HASHING)
        if algo != HASHING:
            raise bad_request(f"unsupported hashing_algorithm {algo!r} (only {HASHING})")
        if not isinstance(body["password_hash"], str):
            raise bad_request("password_hash must be a string")
        try:
            await admin.put_user_hash(name, body["password_hash"], tags)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
    else:
        raise bad_request("password or password_hash is required")
    return Response(204 if existed else 201)


async def user_delete(ctx: Context, _r: Request, params: dict[str, str], p: Principal) -> Response:
    require_admin(p)
    try:
        await ctx.b.administrator.delete_user(params["user"])
    except KeyError:
        raise not_found() from None
    return Response(204)


async def users_bulk_delete(ctx: Context, req: Request, _p: dict[str, str], p: Principal) -> Response:
    """POST {"users": [...]}: delete each that exists (RabbitMQ's
    rabbit_mgmt_wm_users_bulk_delete: names it does not know are skipped)."""
    require_admin(p)
    names = json_object(req.json()).get("users")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad_request("users must be a list of user names")
    for name in names:
        try:
            await ctx.b.administrator.delete_user(name)
        except KeyError:
            continue
    return Response(204)


async def hash_password(ctx: Context, _r: Request, params: dict[str, str],
                        p: Principal) -> Response:
    """The hash a definitions file or PUT /api/users may carry as
    password_hash (rabbit_password_hashing_sha256, a fresh salt each call);
    administrators only, as RabbitMQ."""
    require_admin(p)
    return json_response({"ok": sha256_hash(params["password"])})
