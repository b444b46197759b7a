"""`mirrorq` command line: serve one node (local-cluster comes with clustering).

Every user error (bad flag, bad config, port in use, unwritable data dir)
is one line on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import Any, NoReturn

from node.app.config import (
    ConfigError,
    NodeConfig,
    apply_file,
    check_data_dir,
    parse_peers,
    validate,
)

EXIT_USAGE = 2
log = logging.getLogger("mirrorq")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"mirrorq: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mirrorq", description="AMQP 0-9-1 broker with Raft-mirrored queues")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser("serve", help="run one broker node")
    serve.add_argument("--node-id", required=True)
    serve.add_argument("--amqp-port", type=_port, required=True)
    serve.add_argument("--data-dir", required=True)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (AMQP, Raft, admin)")
    serve.add_argument("--raft-port", type=_port, help="default: AMQP port + 20000")
    serve.add_argument("--peers", default="", help="ID=HOST:RAFTPORT,... of the other members")
    serve.add_argument("--join", action="store_true",
                       help="joining an existing cluster: never campaign before hearing a leader")
    serve.add_argument("--admin-port", type=_port)
    serve.add_argument("--metrics-port", type=_port)
    serve.add_argument("--config", help="TOML file (users, frame_max, heartbeat, memory_high_watermark, raft...)")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    status = sub.add_parser("status", help="print a node's status (admin API)")
    status.add_argument("--admin-port", type=_port, required=True)
    status.add_argument("--host", default="127.0.0.1")
    for name, what in (("drain", "maintenance mode: close clients, refuse new ones, leave the in-sync set"),
                       ("revive", "leave maintenance mode")):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("--admin-port", type=_port, required=True)
        cmd.add_argument("--host", default="127.0.0.1")
        cmd.add_argument("--node-id", help="the member to change (default: the node asked)")
    users = sub.add_parser("users", help="manage the replicated users (admin API)")
    users.add_argument("--admin-port", type=_port, required=True)
    users.add_argument("--host", default="127.0.0.1")
    users_sub = users.add_subparsers(dest="users_command", required=True, parser_class=_Parser)
    users_sub.add_parser("list", help="names and tags")
    add = users_sub.add_parser("add", help="create or update a user (salted SHA-256 hash)")
    add.add_argument("name")
    add.add_argument("password")
    add.add_argument("--tags", default="", help="comma-separated, e.g. administrator")
    delete = users_sub.add_parser("delete", help="delete a user")
    delete.add_argument("name")
    from node.app import local_cluster
    local_cluster.add_parser(sub, _Parser)
    return parser


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    cfg = NodeConfig(node_id=args.node_id, data_dir=args.data_dir, amqp_host=args.host,
                     amqp_port=args.amqp_port, admin_port=args.admin_port, metrics_port=args.metrics_port)
    if args.config:
        apply_file(cfg, args.config)
    cfg.raft.host = args.host
    raft_port = args.raft_port or args.amqp_port + 20000
    if raft_port > 65535:
        raise ConfigError("default raft port (AMQP port + 20000) is out of range: pass --raft-port")
    cfg.raft.port = raft_port
    cfg.raft.peers = parse_peers(args.peers)
    cfg.raft.peers.pop(cfg.node_id, None)
    cfg.raft.join = bool(args.join)
    if os.environ.get("MIRRORQ_UNSAFE_EARLY_CONFIRM") == "1":
        cfg.raft.unsafe_early_confirm = True
    validate(cfg)
    ports = [p for p in (cfg.amqp_port, cfg.raft.port, cfg.admin_port, cfg.metrics_port) if p]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"ports must differ, got {ports}")
    for port in ports:
        _check_port_free(cfg.amqp_host, port)
    check_data_dir(cfg.data_dir)
    return cfg


def _check_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


async def serve(cfg: NodeConfig) -> None:
    _si = os.environ.get("MIRRORQ_SWITCH_INTERVAL")
    if _si:
        sys.setswitchinterval(float(_si))
    # Imported here so that `mirrorq --help` and argument errors stay fast.
    from node.admin.server import AdminServer, MetricsServer
    from node.amqp.server import AmqpServer
    from node.broker.password import hash_password
    from node.replication.raft_node import RaftNode

    loop = asyncio.get_running_loop()
    holder: dict[str, Any] = {}

    def sink(effects: list[Any]) -> None:
        holder["amqp"].dispatch(effects)

    raft = RaftNode(cfg.node_id, cfg.data_dir, loop, sink, cfg.raft)
    raft.seed_users = {name: hash_password(pw) for name, pw in cfg.wire.users.items()}
    cfg.wire.data_dir = cfg.data_dir
    amqp = AmqpServer(raft, cfg.node_id, cfg.wire)
    holder["amqp"] = amqp
    raft.start()

    def status() -> dict[str, Any]:
        st = raft.status()
        st["connections"] = amqp.connection_count()
        st["amqp_port"] = cfg.amqp_port
        return st

    admin = AdminServer(status, raft) if cfg.admin_port else None
    metrics = MetricsServer(status) if cfg.metrics_port else None
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def removed(why: str) -> None:
        log.warning("node %s stops serving: %s", cfg.node_id, why)
        holder["why"] = why
        stop.set()

    raft.on_removed = removed
    try:
        await raft.wait_ready()
        if admin is not None and cfg.admin_port:
            await admin.start(cfg.amqp_host, cfg.admin_port)
        if metrics is not None and cfg.metrics_port:
            await metrics.start(cfg.amqp_host, cfg.metrics_port)
        await amqp.start(cfg.amqp_host, cfg.amqp_port)
        log.info("node %s ready: amqp://guest:guest@%s:%d/", cfg.node_id, cfg.amqp_host, cfg.amqp_port)
        await stop.wait()
        log.info("node %s shutting down", cfg.node_id)
    finally:
        await amqp.close(holder.get("why", "shutdown"))
        if admin is not None:
            await admin.stop()
        if metrics is not None:
            await metrics.stop()
        raft.stop()


def _admin_command(args: argparse.Namespace) -> int:
    import json

    import grpc

    from node.admin import server as admin
    try:
        if args.command == "status":
            out = admin.call_status(args.host, args.admin_port)
        elif args.command == "users":
            if args.users_command == "list":
                out = admin.call_user_list(args.host, args.admin_port)
            elif args.users_command == "add":
                tags = [t for t in args.tags.split(",") if t]
                out = admin.call_user_put(args.host, args.admin_port, args.name, args.password, tags)
                out = {"ok": out.get("ok"), "user": args.name, "tags": tags}
            else:
                out = admin.call_user_delete(args.host, args.admin_port, args.name)
                out = {"ok": out.get("ok"), "deleted": args.name}
        else:
            fn = admin.call_drain if args.command == "drain" else admin.call_revive
            out = fn(args.host, args.admin_port, node_id=args.node_id)
    except grpc.RpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            sys.stderr.write(f"mirrorq: error: cannot reach admin API on {args.host}:{args.admin_port}: "
                             f"{code.name}\n")
        else:
            sys.stderr.write(f"mirrorq: error: {args.command} refused: {exc.details()}\n")
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - one line for any transport error
        sys.stderr.write(f"mirrorq: error: cannot reach admin API on {args.host}:{args.admin_port}: "
                         f"{type(exc).__name__}\n")
        return EXIT_USAGE
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "local-cluster":
        from node.app import local_cluster
        return local_cluster.run(args)
    if args.command in ("status", "drain", "revive", "users"):
        return _admin_command(args)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        sys.stderr.write(f"mirrorq: error: {exc}\n")
        return EXIT_USAGE
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
    if cfg.raft.unsafe_early_confirm:
        log.critical("MIRRORQ_UNSAFE_EARLY_CONFIRM=1: confirming publishes BEFORE replication; "
                     "confirmed messages WILL be lost on failures (chaos-suite self-test only)")
    try:
        asyncio.run(serve(cfg))
    except OSError as exc:  # a port taken between the check and the bind
        sys.stderr.write(f"mirrorq: error: {exc.strerror or exc}\n")
        return EXIT_USAGE
    return 0
