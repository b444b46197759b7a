"""/api/definitions: export (all, a vhost's) and import."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.broker.limit import USER, VHOST
from node.http.auth import Principal, parse_tags, require_admin
from node.http.body import arguments, json_object
from node.http.context import Context
from node.http.errors import bad_request, not_found
from node.http.format import HASHING, definitions
from node.http.server import HttpError, Request, Response, json_response


async def definitions_get(ctx: Context, _r: Request, params: dict[str, str],
                          p: Principal) -> Response:
    require_admin(p)
    m = ctx.model()
    rows = await ctx.rows()
    vhost = params.get("vhost")
    if vhost is not None:
        if vhost not in m.vhosts:
            raise not_found()
        rows = rows._replace(queues=tuple(q for q in rows.queues if q.vhost == vhost),
                             exchanges=tuple(x for x in rows.exchanges if x.vhost == vhost),
                             bindings=tuple(b for b in rows.bindings if b.vhost == vhost))
        d = definitions({}, [], {}, rows, ctx.b.product_version,
                        [pol for pol in m.policies.values() if pol.vhost == vhost])
        for key in ("users", "vhosts", "permissions", "topic_permissions",
                    "global_parameters"):
            d.pop(key, None)
        for section in ("queues", "exchanges", "bindings", "policies"):
            for item in d[section]:
                item.pop("vhost", None)
        return json_response(d)
    return json_response(definitions(m.users, list(m.vhosts), m.permissions, rows,
                                     ctx.b.product_version, m.policies.values(),
                                     m.vhost_limits, m.user_limits, m.topic_permissions,
                                     m.global_parameters, m.protected_vhosts))


async def definitions_post(ctx: Context, req: Request, _p: dict[str, str],
                           p: Principal) -> Response:
    require_admin(p)
    d = _json_body(req)
    await import_definitions(ctx, d, p)
    return Response(204)


async def definitions_vhost_post(ctx: Context, req: Request, params: dict[str, str],
                                 p: Principal) -> Response:
    """A vhost's definitions (as its export writes them: no vhost fields)."""
    require_admin(p)
    vhost = params["vhost"]
    if vhost not in ctx.model().vhosts:
        raise not_found()
    d = _json_body(req)
    for key in ("users", "vhosts", "permissions", "topic_permissions", "global_parameters"):
        d.pop(key, None)
    for section in ("queues", "exchanges", "bindings", "policies"):
        for item in d.get(section) or []:
            if isinstance(item, dict):
                item["vhost"] = vhost
    await import_definitions(ctx, d, p)
    return Response(204)


def _json_body(req: Request) -> dict[str, Any]:
    # RabbitMQ's handler accepts only declared types (cowboy: 415 otherwise); a
    # browser's cross-site form can send text/plain without a preflight, never JSON
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise HttpError(415, "bad_request", "send the definitions as application/json")
    return json_object(req.json())


async def import_definitions(ctx: Context, d: dict[str, Any], p: Principal) -> None:
    """RabbitMQ's import order: users, vhosts (their metadata's
    protected_from_deletion too), permissions, global parameters, policies,
    exchanges, queues, bindings. The first failure answers 400 with its reason."""
    admin = ctx.b.administrator

    def items(key: str) -> list[dict[str, Any]]:
        value = d.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise bad_request(f"{key} must be a list of objects")
        return value
    for u in items("users"):
        name = u.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request("a user needs a name")
        tags = parse_tags(u.get("tags", ""))
        algo = u.get("hashing_algorithm", HASHING)
        if "password_hash" in u:
            if algo != HASHING:
                raise bad_request(f"user {name}: unsupported hashing_algorithm {algo!r}")
            try:
                await admin.put_user_hash(name, str(u["password_hash"]), tags)
            except ValueError as exc:
                raise bad_request(f"user {name}: {exc}") from None
        elif "password" in u:
            await admin.put_user(name, str(u["password"]), tags)
        else:
            raise bad_request(f"user {name}: password_hash or password is required")
    for v in items("vhosts"):
        name = v.get("name")
        if not isinstance(name, str):
            raise bad_request("a vhost needs a name")
        try:
            await admin.put_vhost(name)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        metadata = v.get("metadata")
        protected = metadata.get("protected_from_deletion") if isinstance(metadata, dict) \
            else None
        if isinstance(protected, bool):  # RabbitMQ's add_vhost: update_metadata, known keys
            try:
                await admin.set_vhost_protection(name, protected)
            except RuntimeError as exc:
                raise bad_request(f"vhost {name}: {exc}") from None
    for scope, key in ((VHOST, "vhosts"), (USER, "users")):  # RabbitMQ's `limits` of each
        for owner in items(key):
            await _import_limits(admin, scope, str(owner["name"]), owner.get("limits"))
    for perm in items("permissions"):
        try:
            await admin.set_permissions(str(perm["user"]), str(perm["vhost"]),
                                        str(perm["configure"]), str(perm["write"]),
                                        str(perm["read"]))
        except (KeyError, ValueError) as exc:
            raise bad_request(f"permission {perm}: {exc}") from None
    for perm in items("topic_permissions"):
        try:
            await admin.set_topic_permissions(str(perm["user"]), str(perm["vhost"]),
                                              str(perm["exchange"]), perm["write"],
                                              perm["read"])
        except (KeyError, ValueError, RuntimeError) as exc:
            raise bad_request(f"topic permission {perm}: {exc}") from None
    for param in items("global_parameters"):  # RabbitMQ's add_global_parameter
        name = param.get("name")
        try:
            await admin.set_global_parameter(name, param.get("value"))
        except (ValueError, RuntimeError) as exc:
            raise bad_request(f"global parameter {name}: {exc}") from None
    for pol in items("policies"):  # before the queues, as RabbitMQ imports them
        name, vhost = pol.get("name"), pol.get("vhost", "/")
        if not isinstance(name, str) or not name:
            raise bad_request(f"policy in virtual host '{vhost}' has undefined name")
        try:
            await admin.set_policy(str(vhost), name, pol.get("pattern"), pol.get("definition"),
                                   pol.get("priority", 0), pol.get("apply-to", "all"))
        except ValueError as exc:
            raise bad_request(f'{exc} (vhost: "{vhost}" key: "{name}")') from None
        except KeyError:
            raise bad_request(f"policy {name}: vhost {vhost} does not exist") from None
    token_p = Principal(p.name, p.tags, token=True)  # an administrator imports everything
    by_vhost: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for kind in ("exchanges", "queues", "bindings"):
        for item in items(kind):
            vhost = item.get("vhost", "/")
            if vhost not in ctx.model().vhosts:
                raise bad_request(f"{kind[:-1]} {item.get('name', '')}: vhost {vhost} "
                                  "does not exist")
            by_vhost.setdefault(str(vhost), []).append((kind, item))
    for vhost, todo in by_vhost.items():
        async def run(s: Any, todo: list[tuple[str, dict[str, Any]]] = todo) -> None:
            for kind, item in todo:
                await declare_item(s, kind, item)
        await ctx.session_do(token_p, vhost, run)


async def _import_limits(admin: Any, scope: str, owner: str, limits: Any) -> None:
    """A vhost's or user's `limits` object of an export (none: nothing)."""
    if not limits:
        return
    if not isinstance(limits, dict):
        raise bad_request(f"{scope} {owner}: limits must be an object")
    for name, value in limits.items():
        try:
            await admin.set_limit(scope, owner, str(name), value)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise bad_request(f"{scope} {owner}: {exc}") from None


async def declare_item(s: Any, kind: str, item: Mapping[str, Any]) -> None:
    args = arguments(item)
    if kind == "exchanges":
        await s.call("Exchange.Declare", {
            "exchange": str(item["name"]), "exchange_type": str(item.get("type", "direct")),
            "durable": bool(item.get("durable", True)),
            "auto_delete": bool(item.get("auto_delete", False)),
            "internal": bool(item.get("internal", False)), "passive": False, "nowait": False,
            "arguments": args}, ("Exchange.DeclareOk",))
    elif kind == "queues":
        await s.call("Queue.Declare", {
            "queue": str(item["name"]), "durable": bool(item.get("durable", True)),
            "auto_delete": bool(item.get("auto_delete", False)), "exclusive": False,
            "passive": False, "nowait": False, "arguments": args}, ("Queue.DeclareOk",))
    else:
        rk = str(item.get("routing_key", ""))
        if item.get("destination_type", "queue") == "queue":
            await s.call("Queue.Bind", {"queue": str(item["destination"]),
                                        "exchange": str(item["source"]), "routing_key": rk,
                                        "nowait": False, "arguments": args}, ("Queue.BindOk",))
        else:
            await s.call("Exchange.Bind", {"destination": str(item["destination"]),
                                           "source": str(item["source"]), "routing_key": rk,
                                           "nowait": False, "arguments": args},
                         ("Exchange.BindOk",))
