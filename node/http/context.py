"""What every management API handler shares: the node (Backend), the rate
sampler and latency window, and the helpers all resource families use
(visibility, the rows, an in-process AMQP session)."""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from node.broker.parameter import cluster_name
from node.http.auth import (
    Principal,
    access_vhosts,
    require_vhost,
    require_vhost_access,
    visible_vhosts,
)
from node.http.errors import amqp_error
from node.http.query import filter_sort_page
from node.http.server import HttpError, Request, Response, encode_json
from node.http.stats import LatencyWindow, RateSampler, cluster_json

if TYPE_CHECKING:
    from node.http.backend import Backend
    from node.replication.read_model import Management
    from node.replication.status import NodeStatus


_T = TypeVar("_T")
_Row = TypeVar("_Row")

# the list query parameters query.filter_sort_page acts on
LIST_QUERY = ("name", "sort", "columns", "page")


class RowJson(NamedTuple):
    """One row of a list, its JSON (shared: never changed) and that JSON encoded."""

    row: Any
    json: dict[str, Any]
    encoded: bytes

# entries kept per snapshot: one per distinct (request, visible vhosts); more
# distinct requests than this within one snapshot start the memo over
MEMO_ENTRIES = 64

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
        # what the handlers derived from one snapshot of the rows (and one rate
        # sample): served again to every request asking the same (issue 42)
        self._memo_of: tuple[Any, int] | None = None
        self._memo: dict[Hashable, Any] = {}
        # kind -> row key -> (row, rate sample, its JSON): rows_json's previous snapshot
        self._rows_json: dict[str, dict[Hashable, tuple[Any, int, RowJson]]] = {}

    def model(self) -> Any:
        return self.b.read_model()

    async def rows(self) -> Management:
        try:
            return await self.b.management_rows()
        except TimeoutError:
            raise HttpError(503, "service_unavailable", "the replicated state did not answer "
                                                        "in time") from None

    def memo(self, rows: Management, key: Hashable, make: Callable[[], _T]) -> _T:
        """`make()` once per (rows snapshot, rate sample, key): many clients
        looping the same list cost one build of it per snapshot."""
        of = self._memo_of
        if of is None or of[0] is not rows or of[1] != self.sampler.generation:
            self._memo_of, self._memo = (rows, self.sampler.generation), {}
        if key in self._memo:
            return self._memo[key]  # type: ignore[no-any-return]
        if len(self._memo) >= MEMO_ENTRIES:
            self._memo = {}
        value = self._memo[key] = make()
        return value

    def listed(self, req: Request, rows: Management, kind: str, vis: frozenset[str],
               make: Callable[[], list[dict[str, Any]]]) -> Response:
        """A list answer (filtered, sorted, paged: query.filter_sort_page) built
        once per snapshot for each (list, visible vhosts, path, query)."""
        key = (kind, vis, req.path, tuple(sorted(req.query.items())))
        return self.memo(rows, key, lambda: filter_sort_page(req, make()))

    def rows_json(self, rows: Management, kind: str, items: Iterable[_Row],
                  key: Callable[[_Row], Hashable],
                  make: Callable[[_Row], dict[str, Any]]) -> list[RowJson]:
        """Every row's JSON and its encoding, once per snapshot; a row equal to
        its previous snapshot's (and the same rate sample) keeps its previous
        JSON: a busy node changes a few rows between snapshots, not thousands."""
        def build() -> list[RowJson]:
            old = self._rows_json.get(kind, {})
            gen = self.sampler.generation
            new: dict[Hashable, tuple[Any, int, RowJson]] = {}
            out = []
            for r in items:
                k = key(r)
                hit = old.get(k)
                if hit is not None and hit[1] == gen and hit[0] == r:
                    entry = hit
                else:
                    d = make(r)
                    entry = (r, gen, RowJson(r, d, encode_json(d)))
                new[k] = entry
                out.append(entry[2])
            self._rows_json[kind] = new
            return out
        return self.memo(rows, ("rows_json", kind), build)

    def listed_json(self, req: Request, rows: Management, kind: str, vis: frozenset[str],
                    entries: Callable[[], list[RowJson]],
                    keep: Callable[[Any], bool]) -> Response:
        """`listed` over rows_json entries: without a query that filters, sorts,
        picks columns or pages, the answer is the rows' encodings joined."""
        def make() -> Response:
            picked = [e for e in entries() if keep(e.row)]
            if not any(k in req.query for k in LIST_QUERY):
                return Response(200, b"[" + b",".join(e.encoded for e in picked) + b"]")
            return filter_sort_page(req, [e.json for e in picked])
        key = (kind, vis, req.path, tuple(sorted(req.query.items())))
        return self.memo(rows, key, make)

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
