"""A delivery whose bytes are in the log is read by the shell (node/amqp/server.py,
read_stored) before its connection gets it, and only when the connection would
write it: the connection does no log I/O. A damaged record exits the node (code 3,
one critical line) at the delivery; an unreadable one fails the connection (541)."""
from __future__ import annotations

import logging
import os
from typing import Any

import pytest
from pamqp import commands as pc

from node.amqp import server
from node.amqp.config import WireConfig
from node.amqp.server import AmqpServer, _Protocol, read_stored
from node.replication.effect import Deliver, GetOk
from tests.support.wire_client import Client, FakeProposer


class Handle:
    """An entry whose payload is b"N" (no properties) and then the body."""

    def __init__(self, body: bytes, fail: Exception | None = None) -> None:
        self.idx = 7
        self.data = b"N" + body
        self.fail = fail
        self.reads = 0

    def payload(self) -> bytes:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.data


def _stored(h: Handle) -> tuple[Any, int, int, int]:
    return h, 0, 1, len(h.data) - 1


@pytest.fixture(autouse=True)
def _no_loop_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server.message_store.LOOP_CACHE, "_items", {})
    monkeypatch.setattr(server.message_store.LOOP_CACHE, "_bytes", 0)


def test_the_read_fills_props_and_body_and_the_delivery_count() -> None:
    h = Handle(b"body")
    d = Deliver(("c",), "ct", 1, True, "x", "rk", None, None, _stored(h), 2)  # type: ignore[arg-type]
    got = read_stored(d)
    assert got == d._replace(props={"headers": {"x-delivery-count": 2}}, body=b"body", stored=None)
    assert type(got) is Deliver
    g = GetOk(("c",), 3, False, "", "q", 5, None, None, _stored(h), -1, 4)  # type: ignore[arg-type]
    assert read_stored(g) == g._replace(props={"headers": {"x-acquired-count": 4}}, body=b"body",
                                        stored=None)
    plain = Deliver(("c",), "ct", 1, False, "", "q", None, None, _stored(h))  # type: ignore[arg-type]
    assert read_stored(plain) == plain._replace(props={}, body=b"body", stored=None)


def test_a_damaged_record_exits_the_node_with_code_3(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    def exit_(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.setattr(logging, "shutdown", lambda: None)
    h = Handle(b"body", fail=ValueError("record fails its checksum"))
    d = Deliver(("c",), "ct", 1, False, "", "q", None, None, _stored(h))  # type: ignore[arg-type]
    with caplog.at_level(logging.CRITICAL), pytest.raises(SystemExit) as exc:
        read_stored(d)
    assert exc.value.code == 3
    assert [r.getMessage() for r in caplog.records] == [
        "raft log damaged: message at index 7: record fails its checksum; exiting "
        "(the restart drops it and re-fetches)"]


def _served() -> tuple[AmqpServer, Client, Any]:
    srv = AmqpServer(FakeProposer(), "n1", WireConfig())
    c = Client()
    c.handshake()
    chan = c.open(1)
    proto = _Protocol(srv)
    proto.conn = c.conn
    srv.conns[c.conn.id.serial] = proto
    return srv, c, chan


def test_the_shell_reads_only_what_the_connection_writes() -> None:
    srv, c, chan = _served()
    h = Handle(b"payload")
    srv.dispatch([Deliver(chan, "ct", 1, False, "", "q", None, None, _stored(h))])
    frames = [f for _, f in c.recv()]
    assert isinstance(frames[0], pc.Basic.Deliver) and frames[-1].value == b"payload"
    assert h.reads == 1
    c.send(1, pc.Channel.Close(200, "bye", 0, 0))  # closing: deliveries are dropped
    gone = Handle(b"never read")
    srv.dispatch([Deliver(chan, "ct", 2, False, "", "q", None, None, _stored(gone))])
    assert gone.reads == 0


def test_an_unreadable_record_fails_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    srv, c, chan = _served()
    h = Handle(b"x", fail=OSError("closed"))  # (a closed fd: the node stopping)
    with caplog.at_level(logging.ERROR):
        srv.dispatch([GetOk(chan, 1, False, "", "q", 0, None, None, _stored(h))])
    close = c.close_frame()
    assert isinstance(close, pc.Connection.Close) and close.reply_code == 541
    assert "error applying GetOk" in caplog.text
