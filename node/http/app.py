"""The management HTTP API: RabbitMQ 3.10's paths and JSON shapes (issue 15).

`ManagementApi` is the HTTP app: it authenticates (auth.py), dispatches by
the route table (routes.py) to the handlers (resources/, one module per
resource family), serves the web console's files, and runs the rate and
latency sampler. The handlers read the read model and the rows and write
through the same paths a client takes: queues, exchanges, bindings, publish,
get and purge as AMQP methods on an in-process session (node/amqp/internal.py:
the channel code's permission checks and apply's validation and error
texts), users, vhosts, permissions and membership through the
Administrator, as the gRPC admin. JSON shapes: format.py; list queries:
query.py; rates, latency and cluster figures: stats.py.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from node.amqp.throttle import LoginGate
from node.http.auth import Principal, authenticate, claimed_user
from node.http.backend import Backend
from node.http.context import GET_MAX_BYTES, GET_MAX_COUNT, Context, Handler
from node.http.query import pick_columns
from node.http.request_limit import MAX_REQUESTS_PER_USER, RequestLimit
from node.http.resources.static import static_file
from node.http.routes import ROUTES
from node.http.server import (
    MAX_BODY,
    SMALL_BODY,
    HttpError,
    Request,
    Response,
    Router,
    json_response,
)
from node.http.stats import LATENCY_SAMPLE, SAMPLE_INTERVAL

STATIC_DIR = Path(__file__).with_name("static")
STATIC_METHODS = ("GET", "HEAD")  # all the console's files answer
REFUSAL_HOLD = 1.0  # seconds a request over max_requests_per_user waits for its 429


class ManagementApi:
    def __init__(self, backend: Backend, static_dir: Path | None = STATIC_DIR,
                 throttle: LoginGate | None = None,
                 max_requests_per_user: int = MAX_REQUESTS_PER_USER,
                 get_max_count: int = GET_MAX_COUNT, get_max_bytes: int = GET_MAX_BYTES) -> None:
        self.b = backend
        self.limit = RequestLimit(max_requests_per_user)
        self.throttle = throttle  # the node's login throttle, shared with AMQP logins
        self.static_dir = static_dir
        self.ctx = Context(backend, get_max_count, get_max_bytes)
        self.router = Router()
        self._sampling: asyncio.Task[None] | None = None
        for method, pattern, fn in ROUTES:
            self._on(method, pattern, fn)

    def start_sampling(self) -> None:
        self._sampling = asyncio.get_running_loop().create_task(self._sample_loop())

    async def stop(self) -> None:
        if self._sampling is not None:
            self._sampling.cancel()
            try:
                await self._sampling
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass

    async def _sample_loop(self) -> None:
        next_rates = time.monotonic()
        while True:
            now = time.monotonic()
            try:
                st = self.b.status()
                self.ctx.latency.add(now, st.confirm_latency or {})
                if now >= next_rates:
                    next_rates = now + SAMPLE_INTERVAL
                    rows = await self.b.management_rows()
                    self.ctx.sampler.add(time.monotonic(), rows, int(st.confirmed or 0))
            except Exception:  # noqa: BLE001 - no leader yet, raft busy: sample next time
                pass
            await asyncio.sleep(LATENCY_SAMPLE)

    def _on(self, method: str, pattern: str, fn: Handler, public: bool = False) -> None:
        ctx = self.ctx

        async def handler(req: Request, params: dict[str, str]) -> Response:
            if public:
                return await fn(ctx, req, params, Principal("", ()))
            p = req.principal if req.principal is not None else self._auth(req)
            if not self.limit.enter(p.name):
                # the answer is held (the loop is not): a client looping on its
                # keep-alive connection gets one refusal a second, not thousands
                await asyncio.sleep(REFUSAL_HOLD)
                raise HttpError(429, "too_many_requests",
                                f"{self.limit.limit} requests of user '{p.name}' in flight "
                                "already, retry later", {"Retry-After": "1"})
            try:
                return await fn(ctx, req, params, p)
            finally:
                self.limit.leave(p.name)
        self.router.add(method, pattern, handler)

    def _auth(self, req: Request) -> Principal:
        model = self.b.read_model()
        return authenticate(req.headers.get("authorization"), req.peer_host, model.users,
                            self.b.configured_users, self.b.loopback_users, self.b.token)

    def admit(self, req: Request) -> int:
        """Before the body is read (HttpServer's admit hook): the route (404,
        405), the credentials (401, 403: nothing unauthenticated is read),
        a cross-site Origin on a write (403); the largest body allowed."""
        path = req.path
        if not path.startswith("/api/") and path != "/api":
            # the console's files: GET/HEAD, never a body (405/413 unread, the
            # connection closed: an anonymous client gets no byte of it buffered)
            if req.method not in STATIC_METHODS:
                raise HttpError(405, "method_not_allowed", f"{req.method} is not allowed here",
                                {"Allow": ", ".join(STATIC_METHODS)})
            return 0
        self.router.resolve(req.method, path)
        req.principal = self._throttled_auth(req)
        if req.method not in ("GET", "HEAD") and not same_origin(
                req.headers.get("origin"), req.headers.get("host")):
            raise HttpError(403, "not_authorised", "cross-origin request refused")
        return MAX_BODY if is_definitions_import(req.method, path) else SMALL_BODY

    def _throttled_auth(self, req: Request) -> Principal:
        """Every request with credentials is a login: the shared throttle may hold
        its answer (req.hold), right or wrong, and a 401 counts as a failure. A
        keep-alive connection's requests repeating credentials that already
        passed on it are no new guess: not throttled (the console stays usable
        from an address a guesser shares)."""
        authorization = req.headers.get("authorization")
        gate = self.throttle
        if gate is None or not authorization or req.session.get("proven") == authorization:
            return self._auth(req)
        now = time.monotonic()
        user = claimed_user(authorization)
        wait = gate.wait(req.peer_host, now, user)
        if wait is None:
            raise HttpError(429, "too_many_requests",
                            f"too many login attempts from {req.peer_host}, retry later",
                            {"Retry-After": "10"})
        req.hold = wait
        try:
            principal = self._auth(req)
        except HttpError as err:
            gate.record(req.peer_host, err.status != 401, now, user)
            raise
        gate.record(req.peer_host, True, now, user)
        req.session["proven"] = authorization
        return principal

    async def __call__(self, req: Request) -> Response:
        path = req.path
        if not path.startswith("/api/") and path != "/api":
            return static_file(self.static_dir, path)
        handler, params = self.router.resolve(req.method, path)
        resp = await handler(req, params)
        cols = req.query.get("columns")
        if cols and req.method == "GET" and resp.status == 200 and resp.body[:1] == b"{":
            # one object (a queue, the overview...): RabbitMQ applies columns to it too;
            # lists went through query.filter_sort_page already
            value = json.loads(resp.body)
            if not ("items" in value and "page" in value):
                resp = json_response(pick_columns(value, cols))
        return resp


def same_origin(origin: str | None, host: str | None) -> bool:
    """A browser's Origin (scheme://host[:port]) names the Host it was sent to;
    no Origin (not a browser, or a same-origin GET) passes."""
    if origin is None:
        return True
    _, sep, authority = origin.partition("://")
    return bool(sep) and host is not None and authority.lower() == host.strip().lower()


def is_definitions_import(method: str, path: str) -> bool:
    """POST /api/definitions[/{vhost}]: the only bodies over SMALL_BODY."""
    parts = path.strip("/").split("/")
    return method == "POST" and parts[:2] == ["api", "definitions"] and len(parts) <= 3


def make_app(backend: Backend, static_dir: Path | None = STATIC_DIR,
             throttle: LoginGate | None = None,
             max_requests_per_user: int = MAX_REQUESTS_PER_USER) -> ManagementApi:
    return ManagementApi(backend, static_dir, throttle, max_requests_per_user)
