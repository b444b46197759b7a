"""What every management API handler shares: the node (Backend), the rate
sampler and latency window, and the helpers all resource families use
(visibility, the rows, an in-process AMQP session)."""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from node.broker.parameter import cluster_name
from node.http.auth import (
    Principal,
    access_vhosts,
    require_vhost,
    require_vhost_access,
    visible_vhosts,
)
from node.http.errors import amqp_error
from node.http.server import HttpError, Request, Response
from node.http.stats import LatencyWindow, RateSampler, cluster_json

if TYPE_CHECKING:
    from node.http.backend import Backend
    from node.replication.read_model import Management
    from node.replication.status import NodeStatus


# a route's handler: (context, request, path parameters, authenticated principal)
Handler = Callable[["Context", Request, dict[str, str], Principal], Awaitable[Response]]


# POST /api/queues/{v}/{q}/get: at most this many messages and this many body
# bytes in one answer ([http] get_max_count, get_max_bytes; issue 42)
GET_MAX_COUNT = 10_000
GET_MAX_BYTES = 64 << 20


class Context:
    def __init__(self, backend: Backend, get_max_count: int = GET_MAX_COUNT,
                 get_max_bytes: int = GET_MAX_BYTES) -> None:
        self.b = backend
        self.get_max_count = get_max_count
        self.get_max_bytes = get_max_bytes
        self.sampler = RateSampler()
        self.latency = LatencyWindow()

    def model(self) -> Any:
        return self.b.read_model()

    async def rows(self) -> Management:
        try:
            return await self.b.management_rows()
        except TimeoutError:
            raise HttpError(503, "service_unavailable", "the replicated state did not answer "
                                                        "in time") from None

    def vhosts_for(self, p: Principal) -> set[str]:
        m = self.model()
        return set(visible_vhosts(p, m.vhosts, m.permissions))

    def need_vhost(self, p: Principal, vhost: str) -> None:
        """May `p` see `vhost`'s objects (monitoring sees every vhost)?"""
        m = self.model()
        require_vhost(p, vhost, m.vhosts, m.permissions)

    def need_vhost_access(self, p: Principal, vhost: str) -> None:
        """May `p` act in `vhost` (an administrator, or permissions on it)?"""
        m = self.model()
        require_vhost_access(p, vhost, m.vhosts, m.permissions)

    def access_vhosts_for(self, p: Principal) -> set[str]:
        m = self.model()
        return set(access_vhosts(p, m.vhosts, m.permissions))

    def nodes(self) -> list[str]:
        st = self.b.status()
        return list(st.members or [self.b.node_id])

    async def session_do(self, p: Principal, vhost: str,
                         fn: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run `fn(session)` on an in-process AMQP session as `p`; AMQP
        errors become RabbitMQ's HTTP answers."""
        from node.amqp.internal import AmqpReplyError
        # every write in a vhost (queues, exchanges, bindings, publish, get)
        # needs access to it, whatever the tags (RabbitMQ's is_authorized_vhost)
        self.need_vhost_access(p, vhost)
        try:
            async with self.b.session(p.name, vhost, p.token) as s:
                return await fn(s)
        except AmqpReplyError as err:
            raise amqp_error(err.code, err.text) from None
        except TimeoutError:
            raise HttpError(503, "service_unavailable",
                            "the cluster did not answer in time (no leader?)") from None

    def cluster(self, st: NodeStatus) -> dict[str, Any]:
        return cluster_json(st, self.latency, time.monotonic(), self.b.member_urls())

    def cluster_name(self) -> str:
        """The "cluster_name" global parameter, else the name derived from
        the members (node/broker/parameter.py)."""
        return cluster_name(self.model().global_parameters, self.nodes())
