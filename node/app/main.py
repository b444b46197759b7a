"""`mirrorq` command line: serve one node (local-cluster comes with clustering).

Every user error (bad flag, bad config, port in use, unwritable data dir)
is one line on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import socket
import sys
import time
from typing import NoReturn

from node.amqp.config import default_listen
from node.app.config import (
    ConfigError,
    NodeConfig,
    admin_authenticated,
    apply_env,
    check_admin,
    check_cluster_password,
    check_data_dir,
    check_http_tls,
    check_tls,
    parse_peers,
    raft_authenticated,
    raft_bind_host,
    read_admin_token_file,
)
from node.app.config_file import apply_file, check_listen, validate
from node.app.memory import fix_mmap_threshold
from node.broker.loopback import is_loopback
from node.replication.config import SHORT_RAFT_PASSWORD
from node.replication.machine.version import MACHINE_VERSION
from node.replication.raft.log import LogDamaged

EXIT_USAGE = 2
EXIT_DATA = 3  # the data dir holds what this build will not load (a damaged log or snapshot)
# 4: the cluster's machine version is newer than this build's (raft/shim.py exits)
log = logging.getLogger("mirrorq")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"mirrorq: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


# TEST HOOK: run as a build of an older machine version would (report it, write
# what it writes, refuse a newer cluster's log), to test rolling upgrades
# without an old image (tests/cluster/test_machine_version.py). Not for production.
MACHINE_VERSION_ENV = "MIRRORQ_MACHINE_VERSION"


def machine_version_override(value: str | None) -> int:
    if not value:
        return MACHINE_VERSION
    if not value.isdigit() or not 1 <= int(value) <= MACHINE_VERSION:
        raise ConfigError(f"{MACHINE_VERSION_ENV}={value!r}: expected 1..{MACHINE_VERSION} "
                          "(a test hook: this build's machine version or an older one)")
    return int(value)


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mirrorq", description="AMQP 0-9-1 broker with Raft-mirrored queues")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser("serve", help="run one broker node")
    serve.add_argument("--node-id", required=True)
    serve.add_argument("--amqp-port", type=_port,
                       help="plain AMQP; required unless [tls] only = true (then ignored)")
    serve.add_argument("--amqps-port", type=_port,
                       help="AMQP over TLS (overrides [tls] port; needs [tls] cert and key)")
    serve.add_argument("--data-dir", required=True)
    serve.add_argument("--host", default="127.0.0.1",
                       help="this node's address: its Raft address as peers dial it, where the "
                            "metrics and HTTP ports listen (default 127.0.0.1)")
    serve.add_argument("--listen", action="append", metavar="ADDR",
                       help="address the AMQP and amqps listeners bind (repeatable or comma-"
                            "separated; overrides [amqp] listen; default: every address, IPv4 "
                            "and IPv6, as RabbitMQ)")
    serve.add_argument("--raft-listen", metavar="ADDR",
                       help="address the Raft port binds (default: every address; peers dial "
                            "--host)")
    serve.add_argument("--raft-port", type=_port,
                       help="default: AMQP port + 20000 (TLS-only without --amqp-port: amqps port)")
    serve.add_argument("--peers", default="", help="ID=HOST:RAFTPORT,... of the other members")
    serve.add_argument("--join", action="store_true",
                       help="joining an existing cluster: never campaign before hearing a leader")
    serve.add_argument("--insecure-dev", action="store_true",
                       help="allow a cluster without [raft] password or TLS, and an admin port "
                            "without a token (throwaway development only: anyone who reaches the "
                            "Raft port can join the log, any local user can administer the node)")
    serve.add_argument("--raft-tls-cert", help="PEM certificate of this member (mutual TLS between members)")
    serve.add_argument("--raft-tls-key", help="PEM private key for --raft-tls-cert")
    serve.add_argument("--raft-tls-ca", help="PEM CA that signed every member's certificate")
    serve.add_argument("--admin-port", type=_port,
                       help="gRPC admin API (local-cluster: 15682); needs a token (--admin-token-"
                            "file, [admin] token_file, MIRRORQ_ADMIN_TOKEN) unless --insecure-dev")
    serve.add_argument("--admin-listen", metavar="ADDR",
                       help="address the admin port binds (overrides [admin] listen; default "
                            "127.0.0.1: loopback only)")
    serve.add_argument("--admin-token-file", metavar="FILE",
                       help="file holding the admin API's bearer token (overrides [admin] token "
                            "and MIRRORQ_ADMIN_TOKEN); the token itself is never an option: "
                            "ps would show it")
    serve.add_argument("--http-port", type=_port,
                       help="management HTTP API, RabbitMQ's (overrides [http] port; 15672 is "
                            "RabbitMQ's)")
    serve.add_argument("--https-port", type=_port,
                       help="management API over HTTPS (overrides [http] tls_port; [http] "
                            "tls_cert/tls_key, else [tls] cert/key; 15671 is RabbitMQ's)")
    serve.add_argument("--http-member-url", action="append", default=[], metavar="NODE=URL",
                       help="another member's management URL (repeatable), so that "
                            "/api/mirrorq/cluster and the console link to it "
                            "(adds to [http] member_urls)")
    serve.add_argument("--metrics-port", type=_port)
    serve.add_argument("--config", help="TOML file (users, frame_max, heartbeat, memory_high_watermark, raft...)")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    from node.app import admin_cli, local_cluster
    admin_cli.add_parsers(sub, _Parser, _port)
    local_cluster.add_parser(sub, _Parser)
    return parser


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    cfg = NodeConfig(node_id=args.node_id, data_dir=args.data_dir, amqp_host=args.host,
                     amqp_port=args.amqp_port, admin_port=args.admin_port, metrics_port=args.metrics_port)
    if args.config:
        apply_file(cfg, args.config)
    apply_env(cfg, os.environ)
    if args.admin_token_file:
        cfg.admin.token = read_admin_token_file(args.admin_token_file, "--admin-token-file")
    if args.admin_listen:
        cfg.admin.listen = args.admin_listen.strip().removeprefix("[").removesuffix("]")
    if args.listen:
        cfg.amqp_listen = check_listen([a for arg in args.listen for a in arg.split(",")],
                                       "--listen")
    if getattr(args, "http_port", None) is not None:
        cfg.http.port = args.http_port
    if getattr(args, "https_port", None) is not None:
        cfg.http.tls_port = args.https_port
    for item in getattr(args, "http_member_url", None) or []:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ConfigError(f"--http-member-url {item!r}: expected NODE=http(s)://HOST:PORT/")
        cfg.http.member_urls[name] = url
    if args.amqps_port is not None:
        cfg.tls.port = args.amqps_port
    if cfg.tls.only:
        cfg.amqp_port = None  # TLS-only: no plain listener, --amqp-port is ignored
    elif args.amqp_port is None:
        raise ConfigError("the following arguments are required: --amqp-port "
                          "(unless [tls] only = true)")
    cfg.raft.host = args.host
    cfg.raft.bind_host = args.raft_listen
    base = args.amqp_port or cfg.tls.port or 0
    raft_port = args.raft_port or base + 20000
    if raft_port > 65535:
        raise ConfigError("default raft port (AMQP port + 20000) is out of range: pass --raft-port")
    cfg.raft.port = raft_port
    cfg.raft.peers = parse_peers(args.peers)
    cfg.raft.peers.pop(cfg.node_id, None)
    cfg.raft.join = bool(args.join)
    for key in ("tls_cert", "tls_key", "tls_ca"):
        value = getattr(args, f"raft_{key}")
        if value:
            setattr(cfg.raft, key, value)
    cfg.insecure_dev = bool(args.insecure_dev)
    if os.environ.get("MIRRORQ_UNSAFE_EARLY_CONFIRM") == "1":
        cfg.raft.unsafe_early_confirm = True
    if os.environ.get("MIRRORQ_UNSAFE_NO_FSYNC") == "1":
        cfg.raft.unsafe_no_fsync = True
    cfg.raft.machine_version = machine_version_override(os.environ.get(MACHINE_VERSION_ENV))
    validate(cfg)
    check_cluster_password(cfg)
    check_admin(cfg)
    cfg.raft.bind_host = raft_bind_host(cfg.raft.host, cfg.raft.bind_host, raft_authenticated(cfg))
    check_tls(cfg)
    check_http_tls(cfg)
    amqp_ports = [p for p in (cfg.amqp_port, cfg.tls.port) if p]
    ports = amqp_ports + [p for p in (cfg.raft.port, cfg.admin_port, cfg.metrics_port,
                                      cfg.http.plain_port(), cfg.http.https_port()) if p]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"ports must differ, got {ports}")
    for port in ports:
        if port in amqp_ports:
            hosts = cfg.amqp_listen or default_listen()
        elif port == cfg.raft.port and cfg.raft.bind_host:
            hosts = [cfg.raft.bind_host]
        elif port == cfg.admin_port:
            hosts = [cfg.admin.listen]
        else:
            hosts = [cfg.amqp_host]
        for host in hosts:
            _check_port_free(host, port)
    check_data_dir(cfg.data_dir)
    return cfg


def _warn_admin(cfg: NodeConfig) -> None:
    if not cfg.admin_port:
        return
    if not admin_authenticated(cfg):  # only --insecure-dev gets here (check_admin)
        log.warning("INSECURE (--insecure-dev): the gRPC admin API on %s:%d has no token: any "
                    "local user%s can create administrators and change membership. Throwaway "
                    "development nodes only.", cfg.admin.listen, cfg.admin_port,
                    "" if is_loopback(cfg.admin.listen, peer=False) else " and anyone who reaches it")
    elif cfg.admin.tls() is None and not is_loopback(cfg.admin.listen, peer=False):
        log.warning("the gRPC admin API listens on %s:%d without TLS: its token crosses the "
                    "network in clear ([admin] tls_cert/tls_key)", cfg.admin.listen,
                    cfg.admin_port)


RESOLVE_WAIT = 30.0  # seconds a name to listen on may take to appear in DNS


def _check_port_free(host: str, port: int) -> None:
    """Every address `host` names can be bound at `port` (as the listener will:
    IPv6 sockets IPv6-only)."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    deadline = time.monotonic() + RESOLVE_WAIT
    while True:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
            break
        except socket.gaierror as exc:
            # a new pod's own name (a headless Service's record) appears in the
            # cluster DNS a moment after the pod starts: wait for it, bounded
            if exc.errno not in (socket.EAI_AGAIN, socket.EAI_NONAME) \
                    or time.monotonic() >= deadline:
                raise ConfigError(f"cannot listen on {shown}: {exc.strerror}") from exc
            log.warning("waiting up to %.0f s for %s to resolve (%s)",
                        deadline - time.monotonic(), host, exc.strerror)
            time.sleep(1.0)
    for family, kind, proto, _name, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                raise ConfigError(f"cannot listen on {shown}: {exc.strerror}") from exc


async def serve(cfg: NodeConfig) -> None:
    _si = os.environ.get("MIRRORQ_SWITCH_INTERVAL")
    if _si:
        sys.setswitchinterval(float(_si))
    # Imported here so that `mirrorq --help` and argument errors stay fast.
    from node.app.node import serve as serve_node
    await serve_node(cfg)


def tune_gc() -> None:
    """At tens of thousands of messages a second every publish allocates a few
    containers, and CPython's default gen0 threshold (700) runs a collection
    every few hundred of them, some of which walk the whole heap: confirm-latency
    tails. Measured (bench S1w100, 3-node, random 1 KiB): p99 median 16.3 ->
    14.3 ms, S1 27.2k -> 31.5k msg/s. The start-up objects are frozen out of
    every collection."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "local-cluster":
        from node.app import local_cluster
        return local_cluster.run(args)
    from node.app import admin_cli
    if args.command in admin_cli.COMMANDS:
        return admin_cli.run(args)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        sys.stderr.write(f"mirrorq: error: {exc}\n")
        return EXIT_USAGE
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
    for text in cfg.deprecations:
        log.warning("DEPRECATED: %s", text)
    if cfg.insecure_dev and (cfg.raft.peers or cfg.raft.join) and not cfg.raft.password \
            and not cfg.raft.tls_ca:
        log.warning("INSECURE (--insecure-dev): cluster without [raft] password or TLS; anyone who "
                    "reaches the Raft port %s:%d can take part in the log. Throwaway development "
                    "clusters only.",
                    cfg.raft.host, cfg.raft.port)
    if not raft_authenticated(cfg) and cfg.raft.bind_host and not is_loopback(cfg.raft.bind_host, peer=False):
        log.warning("INSECURE: the Raft port listens on %s (--raft-listen) with neither a [raft] "
                    "password nor TLS: anyone who reaches %s:%d can take part in the log",
                    cfg.raft.bind_host, cfg.raft.bind_host, cfg.raft.port)
    if cfg.raft.password and len(cfg.raft.password) < SHORT_RAFT_PASSWORD and not cfg.raft.tls_ca:
        # a warning, not a refusal: a running cluster must not fail to restart on
        # upgrade; local-cluster and the operator generate 32+ random characters
        log.warning("WEAK: the [raft] password has %d characters (fewer than %d) and the Raft links "
                    "have no TLS: anyone who sees one handshake on the network can test guesses "
                    "offline. Use a long random password (e.g. `openssl rand -hex 16`) or Raft TLS.",
                    len(cfg.raft.password), SHORT_RAFT_PASSWORD)
    _warn_admin(cfg)
    if cfg.raft.unsafe_early_confirm:
        log.critical("MIRRORQ_UNSAFE_EARLY_CONFIRM=1: confirming publishes BEFORE replication; "
                     "confirmed messages WILL be lost on failures (chaos-suite self-test only)")
    if cfg.raft.unsafe_no_fsync:
        log.critical("MIRRORQ_UNSAFE_NO_FSYNC=1: the Raft log is NOT fdatasync'd before entries count as on "
                     "disk; confirmed messages WILL be lost on a power loss (chaos-suite self-test only)")
    from node.replication.raft.snapshot import SnapshotFormatError
    try:
        tune_gc()
        fix_mmap_threshold()
        asyncio.run(serve(cfg))
    except LogDamaged as exc:  # damage this node cannot repair: refuse, one line
        sys.stderr.write(f"mirrorq: error: raft log damaged: {exc}\n")
        return EXIT_DATA
    except OSError as exc:  # a port taken between the check and the bind
        sys.stderr.write(f"mirrorq: error: {exc.strerror or exc}\n")
        return EXIT_USAGE
    except SnapshotFormatError:  # logged (critical) with what to do: no traceback on top
        return EXIT_DATA
    return 0
