"""GET /api/connections rows carry what a connection holds (issue 26 item 6)."""
from __future__ import annotations

from node.http.backend import LocalConnection
from node.http.format import connection_json
from node.replication.read_model import MConnection


def test_held_bytes_and_blocked_state() -> None:
    row = MConnection("n1", 7, 2, "/")
    out = connection_json(row, LocalConnection(held_bytes=12_000_000, blocked=True))
    assert out["held_bytes"] == 12_000_000 and out["state"] == "blocked"
    out = connection_json(row, LocalConnection())
    assert out["held_bytes"] == 0 and out["state"] == "running"
    assert connection_json(row, None)["state"] == "running"  # another node's connection
