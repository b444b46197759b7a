"""The sans-IO AMQP Connection driven in-process: a fake Proposer (commands are
recorded, effects fed back by hand), a settable clock and a client that speaks
pamqp-built frames (tests/unit/amqp)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import commands as pc
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from node.amqp import frame
from node.amqp.config import WireConfig
from node.amqp.connection import Connection
from node.amqp.endpoint import RUNNING
from node.broker.ids import ConnId
from node.replication.read_model import ReadModel


class FakeProposer:
    def __init__(self) -> None:
        self.cmds: list[Any] = []
        self.congested = False
        self.model = ReadModel(vhosts={"/": None})

    def propose(self, cmd: Any, size: int = 0) -> None:
        self.cmds.append(cmd)

    def is_congested(self) -> bool:
        return self.congested

    def add_drain_listener(self, cb: Callable[[], None]) -> None:
        pass

    def read_model(self) -> ReadModel:
        return self.model

    def add_model_listener(self, cb: Callable[[ReadModel], None]) -> None:
        pass

    async def queue_rows(self) -> list[dict[str, Any]]:
        return []

    def blocked_reason(self) -> str | None:
        return None

    def of(self, kind: type) -> list[Any]:
        return [c for c in self.cmds if isinstance(c, kind)]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Client:
    def __init__(self, config: WireConfig | None = None, caps: dict[str, Any] | None = None,
                 peer: str | None = "127.0.0.1") -> None:
        self.p = FakeProposer()
        self.clock = Clock()
        self.conn = Connection(self.p, ConnId("n1", 1), config or WireConfig(), self.clock, peer_host=peer)
        self.caps = caps if caps is not None else {
            "authentication_failure_close": True, "consumer_cancel_notify": True,
            "connection.blocked": True}

    def raw(self, data: bytes) -> None:
        self.conn.data_received(data)

    def send(self, chan: int, *objs: Any) -> None:
        self.raw(b"".join(pframe.marshal(o, chan) for o in objs))

    def recv(self) -> list[tuple[int, Any]]:
        data = self.conn.take_output()
        out = []
        while data:
            if data.startswith(b"AMQP"):
                out.append((0, data[:8]))
                data = data[8:]
                continue
            n, ch, f = pframe.unmarshal(data)
            out.append((ch, f))
            data = data[n:]
        return out

    def names(self) -> list[str]:
        return [f.name if hasattr(f, "name") else repr(f) for _, f in self.recv()]

    def start(self) -> Any:
        self.raw(frame.PROTOCOL_HEADER)
        [(_, start)] = self.recv()
        return start

    def login(self, mech: str = "PLAIN", user: str = "guest", pw: str = "guest") -> None:
        if mech == "PLAIN":
            resp: Any = f"\0{user}\0{pw}"
        else:
            # pamqp marshals longstr from str only; this table is pure ASCII
            resp = frame.encode_table({"LOGIN": user, "PASSWORD": pw})[4:].decode("latin-1")
        self.send(0, pc.Connection.StartOk(client_properties={"capabilities": self.caps},
                                           mechanism=mech, response=resp))

    def handshake(self, heartbeat: int = 0, frame_max: int = 131072) -> None:
        self.start()
        self.login()
        [(_, tune)] = self.recv()
        assert isinstance(tune, pc.Connection.Tune)
        self.send(0, pc.Connection.TuneOk(channel_max=2047, frame_max=frame_max, heartbeat=heartbeat),
                  pc.Connection.Open("/"))
        assert self.names() == ["Connection.OpenOk"]
        assert self.conn.phase == RUNNING

    def open(self, n: int = 1) -> Any:
        self.send(n, pc.Channel.Open())
        assert self.names() == ["Channel.OpenOk"]
        return self.conn.channels[n].id

    def publish(self, n: int, body: bytes, rk: str = "q", props: pc.Basic.Properties | None = None,
                **kw: Any) -> None:
        self.send(n, pc.Basic.Publish(exchange="", routing_key=rk, **kw),
                  pheader.ContentHeader(0, len(body), props or pc.Basic.Properties()))
        if body:
            self.send(n, ContentBody(body))

    def effects(self, *effects: Any) -> None:
        for e in effects:
            self.conn.apply_effect(e)
        self.conn.end_dispatch()

    def close_frame(self) -> Any:
        got = self.recv()
        closes = [f for _, f in got if isinstance(f, (pc.Connection.Close, pc.Channel.Close))]
        assert closes, got
        return closes[0]
