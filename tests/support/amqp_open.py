"""connection.open as the node answers it, seen raw (issue 28's limits): a
RawClient taken through the handshake to connection.open on a vhost, and
what the node sent back (Connection.OpenOk or Connection.Close)."""
from __future__ import annotations

from typing import Any

from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from harness.amqp import Address, RawClient


def open_conn(host: str, port: int, vhost: str = "/", name: str = "guest",
              password: str = "guest") -> tuple[RawClient, Any]:
    """The client and the node's answer to its connection.open."""
    c = RawClient(Address(host, port, name, password))
    c.send(pframe.marshal(pheader.ProtocolHeader(), 0))
    c.expect(spec.Connection.Start)
    c.send_frame(spec.Connection.StartOk(client_properties={"product": "limits-test"},
                                         mechanism="PLAIN", response=f"\0{name}\0{password}",
                                         locale="en_US"))
    _, tune = c.expect(spec.Connection.Tune)
    c.send_frame(spec.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                        heartbeat=0))
    c.send_frame(spec.Connection.Open(virtual_host=vhost))
    _, answer = c.read_frame()
    return c, answer


def refusal(host: str, port: int, vhost: str = "/", name: str = "guest",
            password: str = "guest") -> tuple[int, str, int, int] | None:
    """(code, text, class, method) of the node's Connection.Close, or None
    when it opened (the connection is closed either way)."""
    c, answer = open_conn(host, port, vhost, name, password)
    c.close()
    if isinstance(answer, spec.Connection.Close):
        return answer.reply_code, answer.reply_text, answer.class_id, answer.method_id
    assert isinstance(answer, spec.Connection.OpenOk), answer
    return None
