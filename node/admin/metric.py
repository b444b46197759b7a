"""Prometheus metrics of a node: the text exposition on GET /metrics
(plain asyncio, no grpc), rendered from the node's status dict and queue rows.

Issue 42: queue and vhost names are not served to whoever reaches the port.
/metrics sums the queues per node (RabbitMQ's aggregated /metrics) unless
`per_object` (RabbitMQ's prometheus.return_per_object_metrics);
/metrics/per-object (RabbitMQ's path) has one series per queue, and answers
only when `per_object_endpoint` is set (404 otherwise). With a `token` every
path needs `Authorization: Bearer TOKEN` (401 without it). At most
`max_scrapes` are answered at once (429 beyond); the rows are the node's
shared snapshot (node/replication/row_cache.py), never built per scrape."""
from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

# the node status as a dict (NodeStatus.to_dict()): every figure a gauge or a field
StatusFn = Callable[[], dict[str, Any]]
# rows of ListQueues: name, vhost, ready, unacked, consumers, durable; the node's
# is async (the shared snapshot of the rows), a plain function also does
QueuesFn = Callable[[], Awaitable[list[dict[str, Any]]] | list[dict[str, Any]]]

MAX_SCRAPES = 4  # default of [metrics] max_scrapes
HEAD_TIMEOUT = 5.0  # seconds to send the request line and headers


async def _rows(queues: QueuesFn) -> list[dict[str, Any]]:
    rows = queues()
    if inspect.isawaitable(rows):
        return await rows
    return rows


def _status_line(code: int, reason: str, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n" % (code, reason.encode())
            + extra + b"\r\n")


def scrape_answer(path: bytes, authorization: str | None, token: str | None, per_object: bool,
                  per_object_endpoint: bool) -> tuple[int, bool]:
    """(HTTP status, per-object series?) of a scrape (pure): 401 without the
    token when one is set, 404 for any other path (and for /metrics/per-object
    unless it is enabled), else 200."""
    if token is not None:
        given = (authorization or "").strip()
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(),
                                                                 token.encode()):
            return 401, False
    target = path.partition(b"?")[0]
    if target == b"/metrics":
        return 200, per_object
    if target == b"/metrics/per-object" and per_object_endpoint:
        return 200, True
    return 404, False


def _authorization(head: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"authorization":
            return value.decode("latin-1").strip()
    return None


class MetricsServer:
    """Prometheus text exposition on GET /metrics (plain asyncio, no deps)."""

    def __init__(self, status: StatusFn, queues: QueuesFn | None = None,
                 per_object: bool = False, per_object_endpoint: bool = False,
                 token: str | None = None, max_scrapes: int = MAX_SCRAPES) -> None:
        self._status = status
        self._queues = queues
        self.per_object = per_object
        self.per_object_endpoint = per_object_endpoint
        self._token = token
        self.max_scrapes = max_scrapes
        self._scraping = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
            code, per_object = scrape_answer(path, _authorization(request), self._token,
                                             self.per_object, self.per_object_endpoint)
            if code == 401:
                writer.write(_status_line(401, "Unauthorized",
                                          b'WWW-Authenticate: Bearer realm="metrics"\r\n'))
            elif code == 404:
                writer.write(_status_line(404, "Not Found"))
            elif self._scraping >= self.max_scrapes:
                writer.write(_status_line(429, "Too Many Requests", b"Retry-After: 1\r\n"))
            else:
                self._scraping += 1
                try:
                    body = (await self._render(per_object)).encode()
                finally:
                    self._scraping -= 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()

    async def _render(self, per_object: bool) -> str:
        queues = None
        if self._queues is not None:
            try:
                queues = await _rows(self._queues)
            except TimeoutError as exc:  # no queue series this time
                log.warning("metrics: %s", exc)
        return render_metrics(self._status(), queues, per_object)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


# status keys that only grow: exposed as Prometheus counters, named `_total` and
# only so (a gauge of the same value without `_total` made every one a duplicate)
COUNTERS = ("published", "confirmed", "nacked", "delivered", "redelivered", "acked",
            "leader_changes", "resends", "journal_flushes", "snapshots", "applied_batches",
            "nacked_publishes", "deferred_elections", "prevote_rounds", "ignored_votes",
            "fast_elections", "peer_rejects", "peer_mac_failures", "encoded_appends", "forced_compactions")


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(status: dict[str, Any], queues: list[dict[str, Any]] | None = None,
                   per_object: bool = True) -> str:
    """Prometheus text format, one family per metric: the monotonic status
    fields (COUNTERS) as `mirrorq_<key>_total` counters, every other numeric
    one as a `mirrorq_<key>` gauge, the confirm-latency histogram, and
    when `queues` (ListQueues rows) is given the queues' depths and consumers:
    one series per queue (`per_object`) or their sums on the node."""
    lines = []
    node = _label(status.get("node_id", ""))
    gauges = dict(status, is_leader=status.get("role") == "leader")
    for key, value in sorted(gauges.items()):
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int | float):
            continue
        if key in COUNTERS:
            lines.append(f"# TYPE mirrorq_{key}_total counter")
            lines.append(f'mirrorq_{key}_total{{node="{node}"}} {value}')
        else:
            lines.append(f"# TYPE mirrorq_{key} gauge")
            lines.append(f'mirrorq_{key}{{node="{node}"}} {value}')
    hist = status.get("confirm_latency")
    if isinstance(hist, dict) and hist.get("le"):
        name = "mirrorq_confirm_latency_seconds"
        lines.append(f"# TYPE {name} histogram")
        for le, count in zip(hist["le"], hist["cumulative"], strict=True):
            lines.append(f'{name}_bucket{{node="{node}",le="{le}"}} {count}')
        lines.append(f'{name}_sum{{node="{node}"}} {hist["sum"]}')
        lines.append(f'{name}_count{{node="{node}"}} {hist["count"]}')
    if queues is not None:
        for field in ("ready", "unacked", "consumers"):
            metric = f"mirrorq_queue_{'messages_' if field != 'consumers' else ''}{field}"
            lines.append(f"# TYPE {metric} gauge")
            if not per_object:  # no names: the sum over the queues
                lines.append(f'{metric}{{node="{node}"}} {sum(int(r[field]) for r in queues)}')
                continue
            for row in queues:
                lines.append(f'{metric}{{node="{node}",vhost="{_label(row["vhost"])}",'
                             f'queue="{_label(row["name"])}"}} {row[field]}')
    return "\n".join(lines) + "\n"
