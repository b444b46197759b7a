"""Prometheus metrics of a node: the text exposition on GET /metrics
(plain asyncio, no grpc), rendered from the node's status dict and queue rows."""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

# the node status as a dict (NodeStatus.to_dict()): every figure a gauge or a field
StatusFn = Callable[[], dict[str, Any]]
# rows of ListQueues: name, vhost, ready, unacked, consumers, durable; the node's
# is async (built on the raft thread at its next tick), a plain function also does
QueuesFn = Callable[[], Awaitable[list[dict[str, Any]]] | list[dict[str, Any]]]


async def _rows(queues: QueuesFn) -> list[dict[str, Any]]:
    rows = queues()
    if inspect.isawaitable(rows):
        return await rows
    return rows


class MetricsServer:
    """Prometheus text exposition on GET /metrics (plain asyncio, no deps)."""

    def __init__(self, status: StatusFn, queues: QueuesFn | None = None) -> None:
        self._status = status
        self._queues = queues
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
            if path != b"/metrics":
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            else:
                queues = None
                if self._queues is not None:
                    try:
                        queues = await _rows(self._queues)
                    except TimeoutError as exc:  # no per-queue series this time
                        log.warning("metrics: %s", exc)
                body = render_metrics(self._status(), queues).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()

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


def render_metrics(status: dict[str, Any], queues: list[dict[str, Any]] | None = None) -> str:
    """Prometheus text format, one family per metric: the monotonic status
    fields (COUNTERS) as `mirrorq_<key>_total` counters, every other numeric
    one as a `mirrorq_<key>` gauge, the confirm-latency histogram, and
    per-queue depths when `queues` (ListQueues rows) is given."""
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
            for row in queues:
                lines.append(f'{metric}{{node="{node}",vhost="{_label(row["vhost"])}",'
                             f'queue="{_label(row["name"])}"}} {row[field]}')
    return "\n".join(lines) + "\n"
