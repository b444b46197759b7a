"""Isolation attack 1 (issue 42): topic routing cost in the replicated apply.

An ordinary user with permissions on its own vhost binds one queue 3,000
times to a topic exchange with keys `#.*.*...*.bN` (30 stars: 32 words, the
default max_binding_key_words) and publishes with fresh 126-word routing keys
(253 bytes, never twice: the routing cache never helps), 4 in flight with
confirms. Before the topic trie each such publish cost ~0.5 s of apply on
every member; with it ~0.1 ms. Run by bench/isolation.py (interface:
bench/attack_target.py).
"""
from __future__ import annotations

import random
import secrets
import threading
import time
from typing import Any

import requests
from pamqp import commands as spec
from pamqp import frame as pframe

from bench.attack_target import Target
from harness.amqp import Address, RawClient

NAME = "topic-bindings"
VHOST = USER = "attack-topic"
BINDINGS = 3000
STARS = 30
WINDOW = 4
_PASSWORD = secrets.token_hex(8)


def _put(t: Target, path: str, body: dict[str, Any] | None = None) -> None:
    r = requests.put(f"{t.http[0]}/api/{path}", json=body, auth=(t.user, t.password), timeout=30)
    if r.status_code not in (201, 204):
        raise RuntimeError(f"PUT /api/{path}: {r.status_code} {r.text}")


def _connect(t: Target) -> RawClient:
    host, port = t.amqp[0]
    c = RawClient(Address(host, port, USER, _PASSWORD))
    c.handshake(vhost=VHOST)
    c.open_channel(1)
    return c


def setup(t: Target) -> None:
    _put(t, f"vhosts/{VHOST}")
    _put(t, f"users/{USER}", {"password": _PASSWORD, "tags": ""})
    _put(t, f"permissions/{VHOST}/{USER}", {"configure": ".*", "write": ".*", "read": ".*"})
    c = _connect(t)
    try:
        c.call(spec.Exchange.Declare(exchange="t", exchange_type="topic"), spec.Exchange.DeclareOk)
        c.call(spec.Queue.Declare(queue="q"), spec.Queue.DeclareOk)
        stars = ".".join(["*"] * STARS)
        c.send(b"".join(pframe.marshal(spec.Queue.Bind(queue="q", exchange="t",
                                                       routing_key=f"#.{stars}.b{i}", nowait=True), 1)
                        for i in range(BINDINGS - 1)))
        c.call(spec.Queue.Bind(queue="q", exchange="t", routing_key=f"#.{stars}.b{BINDINGS}"),
               spec.Queue.BindOk)  # answered after the pipelined ones: all bound
    finally:
        c.close()


def _fresh_key(rng: random.Random) -> str:
    return ".".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(125)) + ".zz"


def run(t: Target, stop: threading.Event) -> dict[str, float]:
    rng = random.Random()
    c = _connect(t)
    t0 = time.monotonic()
    sent = acked = 0
    worst = 0.0
    sent_at: dict[int, float] = {}
    try:
        c.call(spec.Confirm.Select(), spec.Confirm.SelectOk)
        while not stop.is_set() or acked < sent:
            if not stop.is_set() and sent - acked < WINDOW:
                c.publish("t", _fresh_key(rng), b"x")
                sent += 1
                sent_at[sent] = time.monotonic()
                continue
            _, v = c.read_frame(timeout=60)
            if isinstance(v, spec.Basic.Ack | spec.Basic.Nack):
                upto = v.delivery_tag if v.multiple else max(acked, v.delivery_tag)
                now = time.monotonic()
                for tag in range(acked + 1, upto + 1):
                    worst = max(worst, now - sent_at.pop(tag, now))
                acked = upto
    finally:
        c.close()
    elapsed = time.monotonic() - t0
    return {"publishes": float(sent), "publishes_per_s": round(sent / elapsed, 1),
            "confirm_max_ms": round(worst * 1000, 1), "bindings": float(BINDINGS),
            "key_words": float(STARS + 2)}
