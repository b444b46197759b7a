"""The rows of the admin ListQueues call, read from the replicated state.

The Raft thread mutates the state while the admin runs on the event loop:
copy each dict in one C-level call (atomic under the GIL) and start over if
one changed size anyway, rather than iterate live objects.
"""
from __future__ import annotations

from typing import Any

from node.broker.vhost import split_key as split_queue_key


def queue_rows(state: Any, attempts: int = 20) -> list[dict[str, Any]]:
    """name, vhost, ready, unacked, consumers, durable for every queue, by vhost and name."""
    for _ in range(attempts):
        try:
            return _rows(state)
        except RuntimeError:  # "dictionary changed size during iteration": take it again
            continue
    return _rows(state)


def _rows(state: Any) -> list[dict[str, Any]]:
    queues = list(state.queues.items())
    # unacked deliveries live on the channels: (queue, message, consumer) by tag
    unacked: dict[int, int] = {}
    for ch in list(state.channels.values()):
        for entry in list(ch.unacked.values()):
            unacked[id(entry[0])] = unacked.get(id(entry[0]), 0) + 1
    rows = []
    for key, q in queues:
        vhost, name = split_queue_key(key)
        rows.append({"name": name, "vhost": vhost, "ready": q.ready_count(),
                     "unacked": unacked.get(id(q), 0), "consumers": len(q.consumers),
                     "durable": bool(q.durable)})
    rows.sort(key=lambda r: (r["vhost"], r["name"]))
    return rows
