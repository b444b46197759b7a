"""The wire's side of limits (issue 28): connection.open and channel.open
count this node's connections exactly and the other nodes' from the read
model, and a connection enters the replicated connection table
(ConnectionOpen) only once the cluster's machine version has it."""
from __future__ import annotations

from dataclasses import replace

from pamqp import commands as pc

from node.replication import command as C
from node.replication.machine.version import LIMITS
from tests.support.wire_client import Client


def limited(c: Client, **kw: object) -> None:
    c.p.model = replace(c.p.model, machine_version=LIMITS, **kw)  # type: ignore[arg-type]


def open_vhost(c: Client) -> list[tuple[int, object]]:
    c.start()
    c.login()
    c.recv()
    c.send(0, pc.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
           pc.Connection.Open("/"))
    return c.recv()


def test_connection_open_is_proposed_only_from_machine_version_4_on() -> None:
    old = Client()
    old.handshake()
    assert old.p.of(C.ConnectionOpen) == []
    limited(old)
    old.conn.record_open()  # what the server does when the version switches
    old.conn.record_open()
    assert old.p.of(C.ConnectionOpen) == [C.ConnectionOpen(old.conn.id, "/", "guest")]
    old.conn.connection_lost()
    assert old.p.of(C.ConnectionClose) == [C.ConnectionClose(old.conn.id)]
    new = Client()
    limited(new)
    new.handshake()
    assert new.p.of(C.ConnectionOpen) == [C.ConnectionOpen(new.conn.id, "/", "guest")]


def test_other_nodes_connections_count_against_the_vhost_limit() -> None:
    c = Client()
    limited(c, vhost_limits={"/": {"max-connections": 2}},
            counts={("vhost", "/", "n2"): 2, ("vhost", "/", "n1"): 5})  # n1 is counted locally
    [(_, close)] = open_vhost(c)
    assert isinstance(close, pc.Connection.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection limit (2) "
             "is reached", 10, 40)
    ok = Client()
    limited(ok, vhost_limits={"/": {"max-connections": 2}}, counts={("vhost", "/", "n2"): 1})
    assert isinstance(open_vhost(ok)[0][1], pc.Connection.OpenOk)


def test_other_nodes_channels_count_against_the_users_channel_limit() -> None:
    c = Client()
    limited(c, user_limits={"guest": {"max-channels": 3}}, counts={("chan", "guest", "n2"): 1})
    c.handshake()
    c.open(1)
    c.open(2)
    c.send(3, pc.Channel.Open())
    [(ch, close)] = c.recv()
    assert ch == 0 and isinstance(close, pc.Connection.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - number of channels opened for user 'guest' has reached the "
             "maximum allowed user limit of 3", 0, 0)
