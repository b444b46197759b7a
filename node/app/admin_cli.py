"""The admin API's command line: `mirrorq status | queues | members | transfer-leader |
drain | revive | users | vhosts | permissions | policies | limits`.

Every command takes `--admin HOST:PORT` (or `--admin-port P [--host H]`),
`--json` (machine output; a table otherwise), `--token-file FILE` (default
$MIRRORQ_ADMIN_TOKEN; there is no --token: ps would show it to every local
user) and `--ca FILE` for a TLS admin port (default
$MIRRORQ_ADMIN_CA; `--cert`/`--key` for mutual TLS). The options may stand
before or after a sub-command (`users --admin-port P list --json`). Bad input
and every failed call is one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_USAGE = 2
COMMANDS = ("status", "queues", "members", "transfer-leader", "drain", "revive", "users",
            "vhosts", "permissions", "policies", "limits")


class UsageError(Exception):
    """One line for stderr, exit code 2."""


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _common(p: argparse.ArgumentParser, port_type: Callable[[str], int]) -> None:
    # SUPPRESS: a sub-command's copy must not reset what its parent parsed
    s = argparse.SUPPRESS
    p.add_argument("--admin", type=_host_port, default=s, metavar="HOST:PORT",
                   help="the node's admin API")
    p.add_argument("--admin-port", type=port_type, default=s, help="with --host (default 127.0.0.1)")
    p.add_argument("--host", default=s, help="host of --admin-port")
    p.add_argument("--json", action="store_true", default=s, help="machine-readable output")
    # --token is gone (issue 26: a token in argv shows in ps): still parsed, to say so
    p.add_argument("--token", nargs="?", const="", default=s, help=argparse.SUPPRESS)
    p.add_argument("--token-file", default=s, metavar="FILE",
                   help="file holding the admin token (default: $MIRRORQ_ADMIN_TOKEN)")
    p.add_argument("--ca", default=s, metavar="FILE",
                   help="CA of a TLS admin port, PEM (default: $MIRRORQ_ADMIN_CA)")
    p.add_argument("--cert", default=s, metavar="FILE", help="client certificate (mutual TLS)")
    p.add_argument("--key", default=s, metavar="FILE", help="client key (mutual TLS)")


def add_parsers(sub: Any, parser_class: type[argparse.ArgumentParser],
                port_type: Callable[[str], int]) -> None:
    def cmd(parent: Any, name: str, what: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=what, description=what)
        _common(p, port_type)
        return p

    def group(name: str, what: str, dest: str) -> Any:
        return cmd(sub, name, what).add_subparsers(dest=dest, required=True,
                                                  parser_class=parser_class)

    cmd(sub, "status", "a node's status: role, term, leader, indexes, members, counts")
    queues = cmd(sub, "queues", "every queue: ready, unacked, consumers (replicated state)")
    queues.add_argument("--vhost", help="only this vhost")

    members = group("members", "the Raft members (ask the leader to change them)", "sub")
    cmd(members, "list", "members, in-sync set, draining, leader")
    p = cmd(members, "add", "add a member (then start it with --join)")
    p.add_argument("node_id")
    p.add_argument("address", type=_host_port, metavar="HOST:RAFTPORT")
    cmd(members, "remove", "remove a member").add_argument("node_id")

    p = cmd(sub, "transfer-leader", "hand leadership over (ask the leader)")
    p.add_argument("--to", dest="target", metavar="NODE_ID",
                   help="the new leader (default: the most caught-up follower)")
    for name, what in (("drain", "maintenance mode: close clients, refuse new ones, "
                                 "leave the in-sync set"),
                       ("revive", "leave maintenance mode")):
        cmd(sub, name, what).add_argument(
            "--node-id", help="the member to change (default: the node asked)")

    users = group("users", "manage the replicated users", "users_command")
    cmd(users, "list", "names and tags")
    p = cmd(users, "add", "create or update a user (salted SHA-256 hash)")
    p.add_argument("name")
    p.add_argument("password", nargs="?", help="better: --password-stdin or --password-env")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    p.add_argument("--password-env", metavar="VAR", help="read the password from $VAR")
    p.add_argument("--tags", default="", help="comma-separated, e.g. administrator")
    cmd(users, "delete", "delete a user").add_argument("name")

    vhosts = group("vhosts", "manage the replicated virtual hosts", "sub")
    cmd(vhosts, "list", "every vhost")
    cmd(vhosts, "add", "create a vhost").add_argument("name")
    cmd(vhosts, "delete", "delete a vhost and what it holds").add_argument("name")

    perms = group("permissions", "per-vhost configure / write / read patterns of users", "sub")
    p = cmd(perms, "list", "every user's permissions")
    p.add_argument("--vhost", help="only this vhost")
    p.add_argument("--user", help="only this user")
    p = cmd(perms, "set", "set a user's permissions on a vhost (regular expressions)")
    for arg in ("user", "configure", "write", "read"):
        p.add_argument(arg)
    p.add_argument("--vhost", default="/", help="default /")
    p = cmd(perms, "clear", "remove a user's permissions on a vhost")
    p.add_argument("user")
    p.add_argument("--vhost", default="/", help="default /")

    pols = group("policies", "policies (and with --operator, operator policies) of vhosts",
                 "sub")
    p = cmd(pols, "list", "every policy, by vhost and name")
    p.add_argument("--vhost", help="only this vhost")
    p.add_argument("--operator", action="store_true", help="operator policies")
    p = cmd(pols, "set", "create or replace a policy (RabbitMQ's set_policy)")
    p.add_argument("name")
    p.add_argument("pattern", help="regular expression over queue / exchange names")
    p.add_argument("definition", help='JSON object, e.g. \'{"max-length": 1000}\'')
    p.add_argument("--vhost", default="/", help="default /")
    p.add_argument("--priority", type=int, default=0, help="default 0 (the highest applies)")
    p.add_argument("--apply-to", default="all",
                   help="all (default), queues, classic_queues, quorum_queues, exchanges")
    p.add_argument("--operator", action="store_true", help="an operator policy")
    p = cmd(pols, "clear", "remove a policy")
    p.add_argument("name")
    p.add_argument("--vhost", default="/", help="default /")
    p.add_argument("--operator", action="store_true", help="an operator policy")

    lims = group("limits", "vhost limits (max-connections, max-queues) and user limits "
                           "(max-connections, max-channels)", "sub")
    p = cmd(lims, "list", "every limit set")
    p.add_argument("--scope", choices=("vhost", "user"), help="only vhosts' or users'")

    def owner(p: argparse.ArgumentParser) -> None:
        who = p.add_mutually_exclusive_group(required=True)
        who.add_argument("--vhost", help="a vhost's limit")
        who.add_argument("--user", help="a user's limit")
    p = cmd(lims, "set", "set one limit (a negative value: no limit)")
    p.add_argument("name", help="max-connections, max-queues (vhost), max-channels (user)")
    p.add_argument("value", type=int)
    owner(p)
    p = cmd(lims, "clear", "remove one limit")
    p.add_argument("name")
    owner(p)


# ------------------------------------------------------------------ running

def _opt(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, None)


def _target(args: argparse.Namespace) -> tuple[str, int]:
    admin, port = _opt(args, "admin"), _opt(args, "admin_port")
    if admin is not None and port is not None:
        raise UsageError("use --admin HOST:PORT or --admin-port, not both")
    if admin is not None:
        return str(admin[0]), int(admin[1])
    if port is None:
        raise UsageError("the admin API is required: --admin HOST:PORT or --admin-port PORT")
    return _opt(args, "host") or "127.0.0.1", int(port)


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} {path}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from exc


def _security(args: argparse.Namespace) -> dict[str, Any]:
    if _opt(args, "token") is not None:
        raise UsageError("--token is not an option: a token on the command line shows in ps "
                         "to every local user; use --token-file FILE or $MIRRORQ_ADMIN_TOKEN")
    token = None
    if _opt(args, "token_file") is not None:
        token = _read_text(args.token_file, "token file").strip()
        if not token:
            raise UsageError(f"token file {args.token_file} is empty")
    cert, key = _opt(args, "cert"), _opt(args, "key")
    if (cert is None) != (key is None):
        raise UsageError("--cert and --key go together")
    for path in (p for p in (_opt(args, "ca"), cert, key) if p is not None):
        if not os.path.isfile(path):
            raise UsageError(f"no such file {path}")
    return {"token": token, "tls_ca": _opt(args, "ca"), "tls_cert": cert, "tls_key": key}


def _password(args: argparse.Namespace) -> str:
    given = [x for x in (args.password is not None, args.password_stdin,
                         args.password_env is not None) if x]
    if len(given) != 1:
        raise UsageError("give the password once: PASSWORD, --password-stdin or --password-env VAR")
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif args.password_env is not None:
        if args.password_env not in os.environ:
            raise UsageError(f"environment variable {args.password_env} is not set")
        password = os.environ[args.password_env]
    else:
        password = args.password
    if not password:
        raise UsageError("the password is empty")
    return str(password)


def _what(args: argparse.Namespace) -> str:
    sub = _opt(args, "sub") or _opt(args, "users_command")
    return f"{args.command} {sub}" if sub else str(args.command)


def run(args: argparse.Namespace) -> int:
    from node.admin import client as admin

    try:
        host, port = _target(args)
        sec = _security(args)
        doc, text = _dispatch(args, host, port, sec)
    except UsageError as exc:
        sys.stderr.write(f"mirrorq: error: {exc}\n")
        return EXIT_USAGE
    except admin.RpcError as exc:
        sys.stderr.write(f"mirrorq: error: {admin.rpc_error_line(exc, _what(args), f'{host}:{port}')}\n")
        return EXIT_USAGE
    except OSError as exc:  # e.g. an unreadable --ca/--cert/--key file
        sys.stderr.write(f"mirrorq: error: {' '.join(str(exc).split())}\n")
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - one line for any other transport error
        why = " ".join(str(exc).split())
        sys.stderr.write(f"mirrorq: error: cannot reach admin API on {host}:{port}: "
                         f"{type(exc).__name__}: {why}\n")
        return EXIT_USAGE
    if _opt(args, "json"):
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(text)
    return 0


def _dispatch(args: argparse.Namespace, host: str, port: int,
              sec: dict[str, Any]) -> tuple[Any, str]:
    """(JSON document, human text) of one command."""
    from node.admin import client as admin  # here: grpc loads slowly, `--help` stays fast
    c, sub = args.command, _opt(args, "sub")
    if c == "status":
        st = admin.call_status(host, port, **sec)
        return st, _status_text(st)
    if c == "queues":
        doc = admin.call_list_queues(host, port, vhost=args.vhost, **sec)
        rows = [[q["vhost"], q["name"], q["ready"], q["unacked"], q["consumers"],
                 "yes" if q["durable"] else "no"] for q in doc["queues"]]
        return doc, _table(["VHOST", "NAME", "READY", "UNACKED", "CONSUMERS", "DURABLE"], rows)
    if c == "members":
        if sub == "list":
            st = admin.call_status(host, port, **sec)
            doc = {k: st.get(k) for k in ("leader", "members", "in_sync", "draining")}
            return doc, _members_text(st)
        if sub == "add":
            address = f"{args.address[0]}:{args.address[1]}"
            doc = admin.call_add_member(host, port, args.node_id, address, **sec)
            return doc, f"added {args.node_id} ({address})\n" + _members_text(doc["status"])
        doc = admin.call_remove_member(host, port, args.node_id, **sec)
        return doc, f"removed {args.node_id}\n" + _members_text(doc["status"])
    if c == "transfer-leader":
        doc = admin.call_transfer_leadership(host, port, args.target, **sec)
        leader = doc["status"].get("leader")
        return {"ok": doc["ok"], "leader": leader, "status": doc["status"]}, f"leader: {leader}"
    if c in ("drain", "revive"):
        fn = admin.call_drain if c == "drain" else admin.call_revive
        doc = fn(host, port, node_id=args.node_id, **sec)
        return doc, _members_text(doc["status"])
    if c == "users":
        return _users(args, host, port, sec)
    if c == "vhosts":
        if sub == "list":
            doc = admin.call_vhost_list(host, port, **sec)
            return doc, _table(["NAME"], [[v["name"]] for v in doc["vhosts"]])
        if sub == "add":
            ok = admin.call_vhost_put(host, port, args.name, **sec)["ok"]
            return {"ok": ok, "vhost": args.name}, f"vhost {args.name} added"
        ok = admin.call_vhost_delete(host, port, args.name, **sec)["ok"]
        return {"ok": ok, "deleted": args.name}, f"vhost {args.name} deleted"
    if c == "policies":
        return _policies(args, host, port, sec)
    if c == "limits":
        return _limits(args, host, port, sec)
    # permissions
    if sub == "list":
        doc = admin.call_permission_list(host, port, vhost=args.vhost, user=args.user, **sec)
        rows = [[p["user"], p["vhost"], p["configure"], p["write"], p["read"]]
                for p in doc["permissions"]]
        return doc, _table(["USER", "VHOST", "CONFIGURE", "WRITE", "READ"], rows)
    if sub == "set":
        ok = admin.call_permission_set(host, port, args.user, args.vhost, args.configure,
                                       args.write, args.read, **sec)["ok"]
        doc = {"ok": ok, "user": args.user, "vhost": args.vhost, "configure": args.configure,
               "write": args.write, "read": args.read}
        return doc, (f"permissions of {args.user} on {args.vhost}: configure {args.configure!r} "
                     f"write {args.write!r} read {args.read!r}")
    ok = admin.call_permission_clear(host, port, args.user, args.vhost, **sec)["ok"]
    return ({"ok": ok, "user": args.user, "vhost": args.vhost},
            f"permissions of {args.user} on {args.vhost} cleared")


def _users(args: argparse.Namespace, host: str, port: int,
           sec: dict[str, Any]) -> tuple[Any, str]:
    from node.admin import client as admin
    if args.users_command == "list":
        doc = admin.call_user_list(host, port, **sec)
        return doc, _table(["NAME", "TAGS"], [[u["name"], ",".join(u["tags"])]
                                              for u in doc["users"]])
    if args.users_command == "add":
        tags = [t for t in args.tags.split(",") if t]
        ok = admin.call_user_put(host, port, args.name, _password(args), tags, **sec)["ok"]
        return ({"ok": ok, "user": args.name, "tags": tags},
                f"user {args.name} saved" + (f" (tags: {', '.join(tags)})" if tags else ""))
    ok = admin.call_user_delete(host, port, args.name, **sec)["ok"]
    return {"ok": ok, "deleted": args.name}, f"user {args.name} deleted"


def _policies(args: argparse.Namespace, host: str, port: int,
              sec: dict[str, Any]) -> tuple[Any, str]:
    from node.admin import client as admin
    kind = "operator policy" if args.operator else "policy"
    if args.sub == "list":
        doc = admin.call_policy_list(host, port, vhost=args.vhost, operator=args.operator, **sec)
        rows = [[p["vhost"], p["name"], p["pattern"], p["apply-to"], p["priority"],
                 json.dumps(p["definition"], sort_keys=True)] for p in doc["policies"]]
        return doc, _table(["VHOST", "NAME", "PATTERN", "APPLY_TO", "PRIORITY", "DEFINITION"],
                           rows)
    if args.sub == "set":
        try:
            definition = json.loads(args.definition)
        except ValueError as exc:
            raise UsageError(f"the definition is not JSON: {exc}") from None
        ok = admin.call_policy_set(host, port, args.vhost, args.name, args.pattern,
                                   json.dumps(definition), args.priority, args.apply_to,
                                   args.operator, **sec)["ok"]
        doc = {"ok": ok, "vhost": args.vhost, "name": args.name, "pattern": args.pattern,
               "apply-to": args.apply_to, "priority": args.priority, "definition": definition}
        return doc, f"{kind} {args.name} set on vhost {args.vhost}"
    ok = admin.call_policy_clear(host, port, args.vhost, args.name, args.operator, **sec)["ok"]
    return ({"ok": ok, "vhost": args.vhost, "cleared": args.name},
            f"{kind} {args.name} cleared on vhost {args.vhost}")


def _limits(args: argparse.Namespace, host: str, port: int,
            sec: dict[str, Any]) -> tuple[Any, str]:
    from node.admin import client as admin
    if args.sub == "list":
        doc = admin.call_limit_list(host, port, scope=args.scope or "", **sec)
        rows = [[x["scope"], x["owner"], x["name"], x["value"]] for x in doc["limits"]]
        return doc, _table(["SCOPE", "OWNER", "NAME", "VALUE"], rows)
    scope, owner = ("vhost", args.vhost) if args.vhost is not None else ("user", args.user)
    if args.sub == "set":
        ok = admin.call_limit_set(host, port, scope, owner, args.name, args.value, **sec)["ok"]
        return ({"ok": ok, "scope": scope, "owner": owner, "name": args.name,
                 "value": args.value}, f"{scope} {owner}: {args.name} = {args.value}")
    ok = admin.call_limit_clear(host, port, scope, owner, args.name, **sec)["ok"]
    return ({"ok": ok, "scope": scope, "owner": owner, "cleared": args.name},
            f"{scope} {owner}: {args.name} cleared")


# ------------------------------------------------------------------ text output

def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(headers)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


_STATUS_ORDER = ("node_id", "role", "leader", "term", "commit_index", "last_applied",
                 "mirrored_index", "members", "in_sync", "draining", "has_quorum", "blocked",
                 "queues", "connections", "amqp_port", "amqps_port")


def _status_text(st: dict[str, Any]) -> str:
    keys = [k for k in _STATUS_ORDER if k in st] + sorted(k for k in st if k not in _STATUS_ORDER)
    width = max(map(len, keys), default=0)
    return "\n".join(f"{k.ljust(width)}  {_cell(st[k])}" for k in keys)


def _members_text(st: dict[str, Any]) -> str:
    in_sync, draining = set(st.get("in_sync") or ()), set(st.get("draining") or ())
    rows = [[m, m == st.get("leader"), m in in_sync, m in draining]
            for m in st.get("members") or ()]
    return _table(["MEMBER", "LEADER", "IN_SYNC", "DRAINING"], rows)
