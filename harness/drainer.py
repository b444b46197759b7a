"""A fast consumer for large backlogs that checks every body.

pika tops out near 7k msg/s here; draining millions of messages through it
takes minutes. This one speaks the few frames it needs over a RawClient and
parses deliveries by hand (method, header, body frames), so a drain runs at
the broker's pace: every body is checked against its own checksum
(harness.body), its id is recorded, acks go out with multiple=true.
"""
from __future__ import annotations

import select
import struct
import time
from dataclasses import dataclass, field

from pamqp import commands as spec

from harness.amqp import Closed, Endpoint, RawClient
from harness.body import body_id, body_ok

_U64 = struct.Struct(">Q")


@dataclass
class Drained:
    """What a drain received: ids per publisher tag, bodies that failed their
    check, redelivered count, bytes."""

    ids: dict[str, list[int]] = field(default_factory=dict)
    damaged: int = 0
    redelivered: int = 0
    count: int = 0
    body_bytes: int = 0
    seconds: float = 0.0


def drain_checked(broker: Endpoint, queue: str, expect: int, prefetch: int = 2000,
                  ack_every: int = 500, idle: float = 15.0, timeout: float = 900.0) -> Drained:
    """Consume `queue` until `expect` messages arrived (or nothing for `idle`
    seconds, or `timeout`), acking as it goes; every body checked."""
    c = _consumer(broker, queue, prefetch)
    out = Drained()
    t0 = time.monotonic()
    last_data = t0
    buf = bytearray(c.buf)
    pos = 0
    tag = 0
    acked = 0
    want = 0  # body bytes still to come for the current delivery
    parts: list[bytes] = []
    redelivered = False
    sock = c.sock
    try:
        while out.count < expect:
            now = time.monotonic()
            if now - t0 > timeout or now - last_data > idle:
                break
            r, _, _ = select.select([sock], [], [], 1.0)
            if r:
                data = sock.recv(4 << 20)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                last_data = now
                if pos:
                    del buf[:pos]
                    pos = 0
                buf += data
            n = len(buf)
            while n - pos >= 8:
                ftype = buf[pos]
                size = struct.unpack_from(">I", buf, pos + 3)[0]
                end = pos + 8 + size
                if end > n:
                    break
                start = pos + 7
                if ftype == 1:  # method
                    cls, meth = struct.unpack_from(">HH", buf, start)
                    if (cls, meth) == (60, 60):  # basic.deliver
                        k = start + 4
                        k += 1 + buf[k]  # consumer tag
                        tag = _U64.unpack_from(buf, k)[0]
                        redelivered = bool(buf[k + 8] & 1)
                    elif (cls, meth) in ((20, 40), (10, 50)):  # channel.close, connection.close
                        raise ConnectionError(f"closed by the broker: {bytes(buf[start:end - 1])!r}")
                elif ftype == 2:  # content header: class, weight, body size
                    want = _U64.unpack_from(buf, start + 4)[0]
                    parts = []
                    if want == 0:
                        _done(out, b"", redelivered)
                elif ftype == 3:  # body
                    parts.append(bytes(buf[start:end - 1]))
                    want -= size
                    if want <= 0:
                        _done(out, b"".join(parts), redelivered)
                        parts = []
                pos = end
            if out.count - acked >= ack_every or (out.count >= expect and tag and out.count > acked):
                c.send_frame(spec.Basic.Ack(delivery_tag=tag, multiple=True), 1)
                acked = out.count
    finally:
        out.seconds = time.monotonic() - t0
        try:
            if tag and out.count > acked:
                c.send_frame(spec.Basic.Ack(delivery_tag=tag, multiple=True), 1)
            c.close()
        except Exception:  # noqa: BLE001 - a drain's result stands; closing is best effort
            c.abort()
    return out


def _consumer(broker: Endpoint, queue: str, prefetch: int, setup: float = 60.0) -> RawClient:
    """A consuming connection; a node that has just restarted may still drop
    a new connection while it catches up: try again until `setup` runs out."""
    deadline = time.monotonic() + setup
    while True:
        c: RawClient | None = None
        try:
            c = RawClient(broker, rcvbuf=4 << 20)
            c.handshake()
            c.open_channel()
            c.call(spec.Basic.Qos(prefetch_count=prefetch), spec.Basic.QosOk)
            c.call(spec.Basic.Consume(queue=queue, consumer_tag="drain"), spec.Basic.ConsumeOk)
            return c
        except (OSError, Closed) as exc:
            if c is not None:
                c.abort()
            if time.monotonic() > deadline:
                raise
            print(f"drain: connection setup failed ({exc!r}), again")
            time.sleep(0.5)


def _done(out: Drained, body: bytes, redelivered: bool) -> None:
    out.count += 1
    out.body_bytes += len(body)
    if redelivered:
        out.redelivered += 1
    if not body_ok(body):
        out.damaged += 1
        return
    tag, msg_id = body_id(body)
    out.ids.setdefault(tag, []).append(msg_id)
