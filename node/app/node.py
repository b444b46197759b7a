"""One node assembled from its config (the composition root): the raft node,
the AMQP server, the one Administrator, and the optional gRPC admin, metrics
and management HTTP servers; started in order, stopped in reverse.

There is exactly one Administrator per node: the gRPC admin API and the
management HTTP API both hand their changes to it, so that its one lock
serializes every change whichever way it came in.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from node.admin.metric import MetricsServer
from node.admin.service import AdminServer
from node.amqp.config import default_listen
from node.amqp.connection import FIRST_SERIAL
from node.amqp.server import MEMORY_ALARM, AmqpServer, throttle_from
from node.app.administrator import Administrator
from node.app.config import NodeConfig, raft_authenticated
from node.app.memory import ProcessMemory, resolve_watermark
from node.broker.binding_limit import BindingLimits
from node.broker.password import hash_password
from node.replication.raft_node import RaftNode
from node.replication.read_model import queue_dicts
from node.replication.status import NodeStatus

if TYPE_CHECKING:
    from node.http.app import ManagementApi
    from node.http.server import HttpServer

log = logging.getLogger("mirrorq")


def _bytes(n: int, fraction: float | None) -> str:
    if not n:
        return "off"
    text = f"{n} bytes ({n / 2**20:.0f} MiB)"
    return f"{text}, {fraction} of this node's memory" if fraction is not None else text


def _member_urls(cfg: NodeConfig) -> dict[str, str]:
    """The members' management URLs this node knows: its own, and the others'
    from [http] member_urls / --http-member-url."""
    urls = dict(cfg.http.member_urls)
    https, plain = cfg.http.https_port(), cfg.http.plain_port()
    if https or plain:
        host = f"[{cfg.amqp_host}]" if ":" in cfg.amqp_host else cfg.amqp_host
        scheme = "https" if https else "http"  # HTTPS when there is one
        urls[cfg.node_id] = f"{scheme}://{host}:{https or plain}/"
    return urls


class Node:
    """The parts of one node, built (not started) from `cfg`."""

    def __init__(self, cfg: NodeConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.stop = asyncio.Event()  # set: shut down (a signal, or this node was removed)
        self._why = "shutdown"
        cfg.raft.binding_limits = BindingLimits(cfg.wire.max_binding_key_words,
                                                cfg.wire.max_bindings_per_exchange,
                                                cfg.wire.max_bindings_per_vhost,
                                                cfg.wire.max_topic_wildcard_nodes)
        self.raft = RaftNode(cfg.node_id, cfg.data_dir, loop, self._dispatch, cfg.raft, FIRST_SERIAL)
        self.raft.seed_users = {name: hash_password(pw) for name, pw in cfg.wire.users.items()}
        cfg.wire.data_dir = cfg.data_dir
        cfg.wire.memory_high_watermark = resolve_watermark(cfg.memory_high_watermark_relative,
                                                           cfg.wire.memory_high_watermark)
        log.info("memory high-watermark: %s; per-connection buffer (unfinished messages, "
                 "open transactions): %s",
                 _bytes(cfg.wire.memory_high_watermark, cfg.memory_high_watermark_relative),
                 _bytes(cfg.wire.connection_buffer_limit(), None))
        # one login throttle per node: AMQP logins and HTTP basic auth share its budget
        self.throttle = throttle_from(cfg.wire)
        self.memory = ProcessMemory(cfg.wire.memory_high_watermark)
        self.amqp = AmqpServer(self.raft, cfg.node_id, cfg.wire, self.throttle, memory=self.memory)
        self.raft.on_removed = self._removed
        self.administrator = Administrator(self.raft, links_authenticated=raft_authenticated(cfg),
                                           limits=cfg.definitions)
        # queue rows are built on the raft thread at its next tick (read_model.ModelPublisher)
        self.admin = AdminServer(self.status_dict, self.administrator, queues=self.raft.queue_rows,
                                 token=cfg.admin.token, tls=cfg.admin.tls()) \
            if cfg.admin_port else None
        # the management rows' shared snapshot: how often it may be built again
        self.raft.row_cache.min_interval = cfg.http.rows_min_interval
        self.raft.row_cache.max_share = cfg.http.rows_max_share
        m = cfg.metrics
        self.metrics = MetricsServer(self.status_dict, self._metric_rows,
                                     per_object=m.return_per_object_metrics,
                                     per_object_endpoint=m.per_object_endpoint,
                                     token=m.token, max_scrapes=m.max_scrapes) \
            if cfg.metrics_port else None
        # the management API, and its listeners (port, server): plain HTTP, HTTPS or both
        self.http: tuple[list[tuple[int, HttpServer]], ManagementApi] | None = None
        http_ports = [(p, tls) for p, tls in ((cfg.http.plain_port(), None),
                                              (cfg.http.https_port(), cfg.https_context)) if p]
        if http_ports:
            from node.app.management import NodeBackend
            from node.http.app import ManagementApi
            from node.http.server import HttpServer
            listeners = [{"protocol": "amqp", "ip_address": a, "port": cfg.amqp_port}
                         for a in (cfg.amqp_listen or default_listen()) if cfg.amqp_port]
            listeners += [{"protocol": "amqp/ssl", "ip_address": a, "port": cfg.tls.port}
                          for a in (cfg.amqp_listen or default_listen()) if cfg.tls.port]
            listeners.append({"protocol": "clustering", "ip_address": cfg.raft.bind_host or "::",
                              "port": cfg.raft.port})
            listeners += [{"protocol": "https" if tls else "http", "ip_address": cfg.amqp_host,
                           "port": p} for p, tls in http_ports]
            # the certificates each TLS listener serves (certificate-expiration check)
            tls_files = [dict(x, certfile=cfg.tls.cert, cacertfile=cfg.tls.ca or None)
                         for x in listeners if x["protocol"] == "amqp/ssl"]
            if cfg.raft.tls_cert:
                tls_files += [dict(x, certfile=cfg.raft.tls_cert, cacertfile=cfg.raft.tls_ca)
                              for x in listeners if x["protocol"] == "clustering"]
            tls_files += [dict(x, certfile=cfg.http.tls_cert,
                               cacertfile=cfg.http.tls_client_ca or None)
                          for x in listeners if x["protocol"] == "https"]
            api = ManagementApi(NodeBackend(cfg.node_id, self.raft, self.amqp,
                                            self.administrator, self.status,
                                            cfg.wire.users, cfg.wire.loopback_users,
                                            cfg.admin.token, listeners,
                                            member_urls=_member_urls(cfg),
                                            tls_files=tls_files,
                                            target_cluster_size=cfg.http.target_cluster_size_hint),
                                throttle=self.throttle,
                                max_requests_per_user=cfg.http.max_requests_per_user,
                                get_max_count=cfg.http.get_max_count,
                                get_max_bytes=cfg.http.get_max_bytes)
            self.http = ([(p, HttpServer(api, tls, admit=api.admit,
                                         idle_timeout=cfg.http.idle_timeout,
                                         max_connections=cfg.http.max_connections,
                                         max_per_address=cfg.http.max_connections_per_address))
                          for p, tls in http_ports], api)

    def _dispatch(self, effects: list[Any]) -> None:
        self.amqp.dispatch(effects)

    def _removed(self, why: str) -> None:
        log.warning("node %s stops serving: %s", self.cfg.node_id, why)
        self._why = why
        self.stop.set()

    def status(self) -> NodeStatus:
        cfg = self.cfg
        return replace(self.raft.status(), connections=self.amqp.connection_count(),
                       amqp_port=cfg.amqp_port, amqps_port=cfg.tls.port,
                       connection_held_bytes=self.amqp.held_bytes(),
                       mem_used=self.memory.used, mem_limit=cfg.wire.memory_high_watermark,
                       mem_alarm=self.amqp.alarm == MEMORY_ALARM)

    async def _metric_rows(self) -> list[dict[str, Any]]:
        """The queues of the shared management rows (one build for every
        scraper and HTTP reader)."""
        return queue_dicts(await self.raft.management_rows())

    def status_dict(self) -> dict[str, Any]:
        """For the generic readers: gRPC Status and the Prometheus text."""
        return self.status().to_dict()

    async def run(self) -> None:
        """Start every part, serve until `stop` is set, then shut down."""
        cfg, raft, amqp, admin, metrics, http = (self.cfg, self.raft, self.amqp, self.admin,
                                                 self.metrics, self.http)
        raft.start()
        try:
            # admin first: the Status of a node that cannot find a leader (e.g. a wrong
            # Raft password) says so (role, term, leader None) instead of not answering
            if admin is not None and cfg.admin_port:
                await admin.start(cfg.admin.listen, cfg.admin_port)
            await raft.wait_ready()
            if metrics is not None and cfg.metrics_port:
                await metrics.start(cfg.amqp_host, cfg.metrics_port)
            if http is not None:
                for port, server in http[0]:
                    await server.start(cfg.amqp_host, port)
                http[1].start_sampling()
            listen = cfg.amqp_listen or default_listen()
            await amqp.start(listen, cfg.amqp_port, cfg.tls.port, cfg.amqps_context)
            urls = ([f"amqp://guest:guest@{cfg.amqp_host}:{cfg.amqp_port}/"]
                    if cfg.amqp_port else []) + \
                ([f"amqps://{cfg.amqp_host}:{cfg.tls.port}/ (verify {cfg.tls.verify})"]
                 if cfg.tls.port else [])
            log.info("node %s ready: %s (AMQP listening on %s%s)", cfg.node_id, ", ".join(urls),
                     ", ".join(listen), "" if cfg.amqp_listen or len(listen) > 1
                     else "; IPv6 is unavailable here")
            await self.stop.wait()
            log.info("node %s shutting down", cfg.node_id)
        finally:
            if http is not None:  # no new management writes while the wire closes
                for _, server in http[0]:
                    await server.stop()
            await amqp.close(self._why)
            if admin is not None:
                await admin.stop()
            if metrics is not None:
                await metrics.stop()
            if http is not None:
                await http[1].stop()
                for _, server in http[0]:
                    await server.stop()
            raft.stop()


async def serve(cfg: NodeConfig) -> None:
    """Run one node until SIGTERM or SIGINT, or until it is removed from the cluster."""
    loop = asyncio.get_running_loop()
    node = Node(cfg, loop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stop.set)
    await node.run()
