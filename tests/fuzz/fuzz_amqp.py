"""Seeded mutation fuzzer for the AMQP wire layer (docs/fuzzing.md).

Two targets:

* ``frame``: node.amqp.frame's FrameReader and decoders fed arbitrary bytes and
  mutated valid frame sequences in random chunkings. Only FrameError may leave
  the reader, only UnknownMethod/BadArguments the method decoder, only
  BadArguments the header decoder; no frame over frame_max is yielded or
  buffered; unmutated input splits back into exactly its frames.
* ``conn``: a Connection after a valid handshake, fed valid and mutated
  method/content frame sequences. The proposer applies every command through
  the real replicated state machine (apply_batch) and hands the effects back,
  so channel behaviour runs end to end. No exception may leave
  data_received/apply_effect/end_dispatch/apply_batch; every Close carries a
  reply code of the spec and never 541; output is well framed, bounded, and
  silent on a channel after its Channel.Close and on the connection after
  Connection.Close; after the connection is gone the state holds nothing of it.

Input ``i`` of seed ``s`` is generated from ``Random((s << 32) ^ i)`` alone, so a
finding is replayed with ``--replay I``. Every input has a CPU-time bound
(ITIMER_PROF, so a loaded machine does not cause false hangs).

    python -m tests.fuzz.fuzz_amqp --inputs 1000000 --seed 1 [--target frame|conn|all] [--jobs 2]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import random
import signal
import struct
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from types import FrameType
from typing import Any

from pamqp import commands as pc
from pamqp import frame as pframe
from pamqp import header as pheader

from node.amqp import frame
from node.amqp.channel import CLOSING_LOCAL
from node.amqp.config import WireConfig
from node.amqp.connection import Connection
from node.amqp.endpoint import CLOSING
from node.broker.ids import ConnId
from node.replication.command import Batch, Command
from node.replication.effect import Effect, effect_node
from node.replication.machine import BrokerState, apply_batch, default_state
from node.replication.read_model import ReadModel
from node.replication.read_model import build as build_model
from node.replication.read_model import queue_rows as model_queue_rows

# AMQP 0-9-1 reply codes (spec "constants"); 541 is in the spec but is what the
# server sends for an escaped exception, so the fuzzer reports it separately.
REPLY_CODES = frozenset(
    {200, 311, 312, 313, 320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505, 506, 530, 540, 541}
)
OUTPUT_BOUND = 4 * 1024 * 1024  # bytes a single input may make the connection write
SETTLE_ROUNDS = 1000  # propose -> apply -> effects rounds per chunk before calling it a livelock
NODE = "n1"

_HDR = struct.Struct(">BHI")
Frames = list[tuple[int, int, bytes]]  # (frame type, channel, payload)
OVERHEAD = 8  # frame header + end octet; our own copy, so a broken frame.py cannot hide it
# a frame read in may overrun frame_max by one overhead (a payload of frame_max
# bytes), as RabbitMQ's reader allows; frames we send may not
FUDGE = 8
_Q = struct.Struct(">Q")


class Violation(Exception):
    """An invariant of a target does not hold."""


class Hang(BaseException):
    """The per-input CPU-time bound ran out (BaseException: never swallowed)."""


# ====================================================================== values

# names at the shortstr limit (255 bytes, 127 two-byte characters), outside the
# spec's name regex (which pamqp checks when building, not when decoding)
LONG = ("n" * 255, "\u00e9" * 127, "\x7f0", "a b", "\u2603")
NAMES_X = (
    "",
    "amq.direct",
    "amq.fanout",
    "amq.topic",
    "amq.headers",
    "amq.match",
    "x0",
    "x1",
    "amq.x",
    *LONG,
)
NAMES_Q = ("", "q0", "q1", "q1", "amq.q", "q0", "q1", *LONG)
KEYS = ("", "q0", "q1", "a.b", "#", "*.b", "a.*.#", *LONG)
TAGS = ("", "c0", "c1", "amq.ctag-x", *LONG)
EX_TYPES = ("direct", "fanout", "topic", "headers", "x-bogus", "")
INTERESTING_INTS = (
    0,
    1,
    2,
    3,
    7,
    127,
    128,
    255,
    256,
    4095,
    4096,
    4097,
    65535,
    65536,
    131064,
    131071,
    131072,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**63 - 1,
    2**64 - 1,
)

ARGS: tuple[dict[str, Any], ...] = (
    {},
    {},
    {},
    {"x-message-ttl": 0},
    {"x-message-ttl": -5},
    {"x-message-ttl": "10"},
    {"x-message-ttl": 2**40},
    {"x-expires": 0},
    {"x-expires": 1},
    {"x-expires": 1.5},
    {"x-max-length": 0},
    {"x-max-length": 1},
    {"x-max-length-bytes": 3},
    {"x-overflow": "reject-publish"},
    {"x-overflow": "bogus"},
    {"x-overflow": 1},
    {"x-overflow": "reject-publish-dlx", "x-max-length": 1, "x-dead-letter-exchange": "x0"},
    {"x-dead-letter-exchange": "x0"},
    {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q1"},
    {"x-dead-letter-routing-key": "q1"},
    {"x-dead-letter-exchange": 5},
    {"x-dead-letter-exchange": b"x0"},
    {"x-match": "any", "a": 1},
    {"x-match": "all", "a": "b"},
    {"x-match": 7},
    {"x-match": "bogus"},
    {"x-match": None},
    {"a": [1, "x", {"n": None}]},
    {"x-max-priority": 10},
    {"x-single-active-consumer": True},
    {"x-queue-type": "quorum"},
    {"alternate-exchange": "x1"},
    {"d": Decimal("1.5")},
    {"f": 1.5},
    {"b": b"\xff\x00"},
    {"t": datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)},
    {"x-priority": 5},
    {"x-cancel-on-ha-failover": True},
    {"": ""},
    {"x-message-ttl": True},
    # dead-lettering with a routing key no shortstr can carry
    {
        "x-max-length": 1,
        "x-dead-letter-exchange": "amq.topic",
        "x-dead-letter-routing-key": "k" * 300,
    },
    {"x-dead-letter-exchange": "amq.topic", "x-dead-letter-routing-key": "\u00e9" * 200},
)

PROPS: tuple[dict[str, Any], ...] = (
    {},
    {},
    {},
    {"delivery_mode": 2},
    {"delivery_mode": 1, "content_type": "text/plain"},
    {"expiration": "0"},
    {"expiration": "100"},
    {"expiration": "-1"},
    {"expiration": "abc"},
    {"expiration": ""},
    {"priority": 9},
    {"headers": {"a": 1}},
    {"headers": {"a": "b", "x": None}},
    {"headers": {"x-match": "any"}},
    {"correlation_id": "c", "reply_to": "q1", "message_id": "m"},
    {"timestamp": datetime.datetime(2001, 2, 3, tzinfo=datetime.UTC)},
    {"user_id": "guest"},
    {"user_id": "mallory"},
    {"app_id": "a", "message_type": "t", "cluster_id": "c"},
    {"headers": {"n": {"deep": [1, 2, {"x": b"y"}]}, "d": Decimal("3.14")}},
)


def _pick_args(rng: random.Random) -> dict[str, Any]:
    args = dict(rng.choice(ARGS))
    if rng.random() < 0.2:
        args.update(rng.choice(ARGS))
    return args


# ------------------------------------------------------------------ raw tables

_FIELD_TYPES = b"tbBsuUIilLfdDSTFVxA"


def raw_value(rng: random.Random, depth: int = 0) -> bytes:
    """One field value (type octet + encoding), often malformed on purpose."""
    t = rng.choice(_FIELD_TYPES + b"?Z\x00")
    tb = bytes((t,))
    if t in b"tbB":
        return tb + bytes((rng.randrange(256),))
    if t in b"suU":
        return tb + struct.pack(">H", rng.randrange(65536))
    if t in b"Ii":
        return tb + struct.pack(">I", rng.randrange(2**32))
    if t in b"lL":
        return tb + _Q.pack(rng.choice(INTERESTING_INTS))
    if t == ord("T"):  # timestamps far beyond datetime's range included
        return tb + _Q.pack(
            rng.choice(
                (
                    0,
                    2**32 - 1,
                    2**33,
                    2**40,
                    2**53,
                    2**62,
                    2**63 - 1,
                    2**64 - 1,
                    rng.randrange(2**64),
                )
            )
        )
    if t == ord("f"):
        return tb + struct.pack(">I", rng.randrange(2**32))
    if t == ord("d"):
        return tb + _Q.pack(rng.randrange(2**64))
    if t == ord("D"):
        return tb + bytes((rng.randrange(256),)) + struct.pack(">I", rng.randrange(2**32))
    if t in b"Sx":
        body = rng.randbytes(rng.randrange(12))
        n = len(body) if rng.random() < 0.8 else rng.choice(INTERESTING_INTS) & 0xFFFFFFFF
        return tb + struct.pack(">I", n) + body
    if t == ord("F") and depth < 4:
        return tb + raw_table(rng, depth + 1)
    if t == ord("A") and depth < 4:
        items = b"".join(raw_value(rng, depth + 1) for _ in range(rng.randrange(4)))
        return tb + struct.pack(">I", len(items)) + items
    if t == ord("V"):
        return tb
    return tb + rng.randbytes(rng.randrange(6))


def raw_table(rng: random.Random, depth: int = 0) -> bytes:
    """A field table with its 4-byte length; length and key lengths sometimes lie."""
    parts = []
    for _ in range(rng.randrange(5)):
        key = rng.choice(
            (
                b"a",
                b"x-match",
                b"x-message-ttl",
                b"x-expires",
                b"x-overflow",
                b"x-dead-letter-exchange",
                b"\xff\xfe",
                b"k" * 40,
            )
        )
        parts.append(bytes((len(key),)) + key + raw_value(rng, depth))
    body = b"".join(parts)
    n = len(body) if rng.random() < 0.85 else rng.choice(INTERESTING_INTS) & 0xFFFFFFFF
    return struct.pack(">I", n) + body


def deep_table(rng: random.Random) -> bytes:
    """A table holding arrays/tables nested hundreds or thousands deep."""
    depth = rng.choice((64, 300, 600, 1200, 3000))
    value = b"V"
    for _ in range(depth):
        if rng.random() < 0.5:
            value = b"A" + struct.pack(">I", len(value)) + value
        else:
            entry = b"\x01k" + value
            value = b"F" + struct.pack(">I", len(entry)) + entry
    entry = b"\x01k" + value
    return struct.pack(">I", len(entry)) + entry


# ====================================================================== corpus


def method_payload(obj: Any) -> bytes:
    return struct.pack(">HH", int(obj.index) >> 16, obj.frame_id) + bytes(obj.marshal())


def _variants(make: Callable[[random.Random], Any], rng: random.Random, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        try:
            out.append(method_payload(make(rng)))
        except (ValueError, TypeError):  # pamqp refused the field mix: not a frame to send
            continue
    return out


def _b(rng: random.Random, p: float = 0.5) -> bool:
    return rng.random() < p


_UNCHECKED: dict[type, type] = {}


def unchecked_method(cls: type, **fields: Any) -> Any:
    """A pamqp method built like a client that does not check names would
    (pamqp validates on construction and on marshal)."""
    sub = _UNCHECKED.get(cls)
    if sub is None:
        sub = _UNCHECKED[cls] = type(cls.__name__, (cls,), {"validate": lambda self: None})
    obj = sub()
    for name, value in fields.items():
        setattr(obj, name, value)
    return obj


METHOD_MAKERS: dict[str, Callable[[random.Random], Any]] = {
    "Channel.Flow": lambda r: unchecked_method(pc.Channel.Flow, active=_b(r, 0.6)),
    "Channel.Close": lambda r: unchecked_method(
        pc.Channel.Close, reply_code=200, reply_text="bye", class_id=0, method_id=0
    ),
    "Channel.CloseOk": lambda r: unchecked_method(pc.Channel.CloseOk),
    "Channel.Open": lambda r: unchecked_method(pc.Channel.Open),
    "Exchange.Declare": lambda r: unchecked_method(
        pc.Exchange.Declare,
        exchange=r.choice(NAMES_X),
        exchange_type=r.choice(EX_TYPES),
        passive=_b(r, 0.15),
        durable=_b(r),
        auto_delete=_b(r, 0.3),
        internal=_b(r, 0.15),
        nowait=_b(r, 0.2),
        arguments=_pick_args(r),
    ),
    "Exchange.Delete": lambda r: unchecked_method(
        pc.Exchange.Delete, exchange=r.choice(NAMES_X), if_unused=_b(r, 0.3), nowait=_b(r, 0.2)
    ),
    "Exchange.Bind": lambda r: unchecked_method(
        pc.Exchange.Bind,
        destination=r.choice(NAMES_X),
        source=r.choice(NAMES_X),
        routing_key=r.choice(KEYS),
        nowait=_b(r, 0.2),
        arguments=_pick_args(r),
    ),
    "Exchange.Unbind": lambda r: unchecked_method(
        pc.Exchange.Unbind,
        destination=r.choice(NAMES_X),
        source=r.choice(NAMES_X),
        routing_key=r.choice(KEYS),
        nowait=_b(r, 0.2),
        arguments=_pick_args(r),
    ),
    "Queue.Declare": lambda r: unchecked_method(
        pc.Queue.Declare,
        queue=r.choice(NAMES_Q),
        passive=_b(r, 0.15),
        durable=_b(r, 0.3),
        exclusive=_b(r, 0.3),
        auto_delete=_b(r, 0.3),
        nowait=_b(r, 0.2),
        arguments=_pick_args(r),
    ),
    "Queue.Bind": lambda r: unchecked_method(
        pc.Queue.Bind,
        queue=r.choice(NAMES_Q),
        exchange=r.choice(NAMES_X),
        routing_key=r.choice(KEYS),
        nowait=_b(r, 0.2),
        arguments=_pick_args(r),
    ),
    "Queue.Unbind": lambda r: unchecked_method(
        pc.Queue.Unbind,
        queue=r.choice(NAMES_Q),
        exchange=r.choice(NAMES_X),
        routing_key=r.choice(KEYS),
        arguments=_pick_args(r),
    ),
    "Queue.Purge": lambda r: unchecked_method(
        pc.Queue.Purge, queue=r.choice(NAMES_Q), nowait=_b(r, 0.2)
    ),
    "Queue.Delete": lambda r: unchecked_method(
        pc.Queue.Delete,
        queue=r.choice(NAMES_Q),
        if_unused=_b(r, 0.3),
        if_empty=_b(r, 0.3),
        nowait=_b(r, 0.2),
    ),
    "Basic.Qos": lambda r: unchecked_method(
        pc.Basic.Qos,
        prefetch_size=0 if _b(r, 0.95) else r.randrange(1, 99),
        prefetch_count=r.choice((0, 1, 2, 5, 65535)),
        global_=_b(r, 0.3),
    ),
    "Basic.Consume": lambda r: unchecked_method(
        pc.Basic.Consume,
        queue=r.choice(NAMES_Q),
        consumer_tag=r.choice(TAGS),
        no_local=_b(r, 0.1),
        no_ack=_b(r, 0.4),
        exclusive=_b(r, 0.2),
        nowait=_b(r, 0.2),
        arguments=_pick_args(r),
    ),
    "Basic.Cancel": lambda r: unchecked_method(
        pc.Basic.Cancel, consumer_tag=r.choice(TAGS), nowait=_b(r, 0.2)
    ),
    "Basic.Get": lambda r: unchecked_method(
        pc.Basic.Get, queue=r.choice(NAMES_Q), no_ack=_b(r, 0.4)
    ),
    "Basic.Recover": lambda r: unchecked_method(pc.Basic.Recover, requeue=_b(r, 0.9)),
    "Basic.RecoverAsync": lambda r: unchecked_method(pc.Basic.RecoverAsync, requeue=_b(r, 0.9)),
    "Confirm.Select": lambda r: unchecked_method(pc.Confirm.Select, nowait=_b(r, 0.3)),
    "Tx.Select": lambda r: unchecked_method(pc.Tx.Select),
    "Tx.Commit": lambda r: unchecked_method(pc.Tx.Commit),
    "Tx.Rollback": lambda r: unchecked_method(pc.Tx.Rollback),
}
# methods whose last field is the arguments table (raw tables are spliced in there)
ARG_LAST = (
    "Exchange.Declare",
    "Exchange.Bind",
    "Exchange.Unbind",
    "Queue.Declare",
    "Queue.Bind",
    "Queue.Unbind",
    "Basic.Consume",
)


def _server_side_methods() -> list[bytes]:
    """Every other method pamqp knows, with default fields: what a client must not send."""
    out = []
    for cls in pc.INDEX_MAPPING.values():
        if getattr(cls, "name", "") in METHOD_MAKERS:
            continue
        try:
            out.append(method_payload(cls()))
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def _props_header(size: int, props: dict[str, Any]) -> bytes:
    return pheader.ContentHeader(0, size, pc.Basic.Properties(**props)).marshal()


def _raw_header(rng: random.Random, size: int) -> bytes:
    """Content header with hand-made property lists (tables, timestamps, bad flags)."""
    head = struct.pack(">HHQ", 60 if _b(rng, 0.9) else rng.randrange(65536), 0, size)
    pick = rng.random()
    if pick < 0.35:
        return head + b"\x20\x00" + (deep_table(rng) if _b(rng, 0.15) else raw_table(rng))
    if pick < 0.6:  # timestamp only
        return (
            head
            + b"\x00\x40"
            + _Q.pack(rng.choice((0, 2**33, 2**53, 2**62, 2**64 - 1, rng.randrange(2**64))))
        )
    if pick < 0.8:  # flags with the continuation bit or random flags, random list
        return head + struct.pack(">H", rng.randrange(65536)) + rng.randbytes(rng.randrange(24))
    return head[: rng.randrange(len(head))]


@dataclass
class Corpus:
    methods: dict[str, list[bytes]]
    raw_args: list[bytes]  # ARG_LAST methods with raw/deep tables (often invalid)
    server_side: list[bytes]
    headers: list[bytes]  # valid content headers (body size patched in per use)
    all_valid: list[tuple[int, bytes]] = field(default_factory=list)  # (ftype, payload)


def build_corpus(seed: int = 0x5EED) -> Corpus:
    rng = random.Random(seed)
    methods = {name: _variants(make, rng, 24) for name, make in METHOD_MAKERS.items()}
    methods["Basic.Publish"] = _variants(
        lambda r: unchecked_method(
            pc.Basic.Publish,
            exchange=r.choice(NAMES_X),
            routing_key=r.choice(KEYS),
            mandatory=_b(r, 0.3),
            immediate=_b(r, 0.03),
        ),
        rng,
        48,
    )
    methods["Basic.Ack"] = [
        method_payload(pc.Basic.Ack(t, m)) for t in (0, 1, 2, 3, 9) for m in (False, True)
    ]
    methods["Basic.Nack"] = [
        method_payload(pc.Basic.Nack(t, m, q))
        for t in (0, 1, 2, 5)
        for m in (False, True)
        for q in (False, True)
    ]
    methods["Basic.Reject"] = [
        method_payload(pc.Basic.Reject(t, q)) for t in (0, 1, 2, 4) for q in (False, True)
    ]
    raw_args = []
    for name in ARG_LAST:
        for _ in range(12):
            obj = METHOD_MAKERS[name](rng)
            obj.arguments = {}  # marshals as 4 zero bytes at the end: replaced below
            table = deep_table(rng) if _b(rng, 0.1) else raw_table(rng)
            raw_args.append(method_payload(obj)[:-4] + table)
    headers = []
    for props in PROPS:
        try:
            headers.append(_props_header(0, props))
        except (ValueError, TypeError):
            continue
    corpus = Corpus(methods, raw_args, _server_side_methods(), headers)
    corpus.all_valid = (
        [(frame.FRAME_METHOD, p) for ps in methods.values() for p in ps]
        + [(frame.FRAME_METHOD, p) for p in corpus.server_side]
        + [(frame.FRAME_HEADER, h) for h in headers]
    )
    return corpus


def with_size(header: bytes, size: int) -> bytes:
    return header[:4] + _Q.pack(size) + header[12:]


with warnings.catch_warnings():  # pamqp warns on building Basic.RecoverAsync (deprecated)
    warnings.simplefilter("ignore", DeprecationWarning)
    CORPUS = build_corpus()
VALID_PAYLOADS = frozenset(p for _, p in CORPUS.all_valid)


# ====================================================================== mutation


def encode_frames(frames: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(_HDR.pack(t, c, len(p)) + p + b"\xce" for t, c, p in frames)


def mutate_bytes(rng: random.Random, data: bytes, rounds: int) -> bytes:
    buf = bytearray(data)
    for _ in range(rounds):
        n = len(buf)
        op = rng.randrange(10)
        if op == 0 and n:  # bit flip
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # interesting byte
            buf[rng.randrange(n)] = rng.choice((0, 1, 0x7F, 0x80, 0xCE, 0xFF, 0x20, 0x3C))
        elif op == 2:  # insert random bytes
            i = rng.randrange(n + 1)
            buf[i:i] = rng.randbytes(rng.randrange(1, 9))
        elif op == 3 and n:  # delete a range
            i = rng.randrange(n)
            del buf[i : i + rng.randrange(1, 17)]
        elif op == 4 and n:  # truncate
            del buf[rng.randrange(n) :]
        elif op == 5 and n:  # duplicate a range
            i = rng.randrange(n)
            j = min(n, i + rng.randrange(1, 64))
            k = rng.randrange(n + 1)
            buf[k:k] = buf[i:j]
        elif op == 6 and n >= 4:  # 32-bit field (sizes, table lengths)
            i = rng.randrange(n - 3)
            buf[i : i + 4] = struct.pack(">I", rng.choice(INTERESTING_INTS) & 0xFFFFFFFF)
        elif op == 7 and n >= 2:  # 16-bit field (class/method ids, channels, flags)
            i = rng.randrange(n - 1)
            buf[i : i + 2] = struct.pack(">H", rng.choice(INTERESTING_INTS) & 0xFFFF)
        elif op == 8:  # splice a piece of some valid frame payload
            _, p = rng.choice(CORPUS.all_valid)
            i = rng.randrange(len(p))
            piece = p[i : i + rng.randrange(1, 40)]
            k = rng.randrange(n + 1)
            buf[k:k] = piece
        elif op == 9 and n >= 8:  # 64-bit field (delivery tags, body sizes)
            i = rng.randrange(n - 7)
            buf[i : i + 8] = _Q.pack(rng.choice(INTERESTING_INTS))
    return bytes(buf)


def mutate_frames(
    rng: random.Random, frames: list[tuple[int, int, bytes]], frame_max: int
) -> bytes:
    """Structure-aware damage: frame size fields, types, channels, end octets, order."""
    frames = list(frames)
    for _ in range(rng.randrange(1, 3)):
        if not frames:
            break
        k = rng.randrange(len(frames))
        t, c, p = frames[k]
        op = rng.randrange(6)
        if op == 0:
            frames[k] = (rng.choice((0, 1, 2, 3, 4, 8, 9, 0xCE, 255)), c, p)
        elif op == 1:
            frames[k] = (t, rng.choice((0, 1, 2, 3, 2047, 2048, 65535)), p)
        elif op == 2:
            frames.insert(rng.randrange(len(frames) + 1), frames[k])
        elif op == 3:
            del frames[k]
        elif op == 4 and len(frames) > 1:
            j = rng.randrange(len(frames))
            frames[k], frames[j] = frames[j], frames[k]
        else:
            frames[k] = (t, c, mutate_bytes(rng, p, rng.randrange(1, 3)))
    data = bytearray(encode_frames(frames))
    if rng.random() < 0.6 and data:
        # corrupt one size field in place (the payload stays): lies about the length
        starts = []
        pos = 0
        while pos + 7 <= len(data):
            starts.append(pos)
            (size,) = struct.unpack_from(">I", data, pos + 3)
            pos += 8 + size
        if starts:
            s = rng.choice(starts)
            size = rng.choice(
                (
                    0,
                    1,
                    frame_max - 9,
                    frame_max - 8,
                    frame_max - 7,
                    frame_max,
                    frame_max + 1,
                    2**31,
                    2**32 - 1,
                    rng.randrange(2**32),
                )
            )
            data[s + 3 : s + 7] = struct.pack(">I", size & 0xFFFFFFFF)
    if rng.random() < 0.3 and data:  # a wrong end octet somewhere
        data[rng.randrange(len(data))] = rng.choice((0, 0xCD, 0xCF))
    return bytes(data)


def chunked(rng: random.Random, data: bytes) -> list[bytes]:
    """How the bytes arrive: whole, byte by byte (rarely: it is the costly
    case) or cut at a few random places."""
    pick = rng.random()
    if pick < 0.5 or len(data) < 2:
        return [data]
    if pick < 0.55:  # byte by byte (long inputs: small pieces instead)
        step = 1 if len(data) <= 300 else 13
        return [data[i : i + step] for i in range(0, len(data), step)]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(1, 8))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


# ====================================================================== time bound


@contextmanager
def cpu_time_bound(seconds: float) -> Iterator[None]:
    """Raise Hang in the main thread once the process has used `seconds` of CPU.

    ITIMER_PROF leaves SIGALRM (pytest-timeout) alone. Off the main thread no
    signal can be set; the caller still measures wall time then."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def on_prof(signum: int, frm: FrameType | None) -> None:
        raise Hang(f"input exceeded {seconds} s of CPU time")

    old = signal.signal(signal.SIGPROF, on_prof)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def arm(seconds: float) -> None:
    if seconds > 0 and threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_PROF, seconds)


# ====================================================================== target: frame

FRAME_MAXES = (4096, 4096, 8192, 131072, 131072, 16, 64, 512)


def _decode(ftype: int, payload: bytes, valid: bool) -> None:
    """Run the decoders the connection would run; only documented errors may leave."""
    if ftype == frame.FRAME_METHOD:
        frame.method_ids(payload)
        try:
            m = frame.decode_method(payload)
        except (frame.UnknownMethod, frame.BadArguments) as err:
            if valid:
                raise Violation(f"valid method payload rejected: {err!r}") from err
            return
        if m.name == "Connection.StartOk":
            frame.decode_amqplain(m.response or "")
    elif ftype == frame.FRAME_HEADER:
        try:
            _, _, props = frame.decode_header(payload)
        except frame.BadArguments as err:
            if valid:
                raise Violation(f"valid content header rejected: {err!r}") from err
            return
        # what was accepted must go out again to consumers (deliver, get-ok, return)
        again = b"\x00\x3c\x00\x00" + _Q.pack(0) + frame.encode_properties(props)
        try:
            frame.decode_header(again)
        except frame.BadArguments as err:
            raise Violation(f"re-encoded properties do not decode: {props!r}") from err


def read_frames(chunks: list[bytes], frame_max: int, expected: Frames | None = None) -> None:
    """Feed `chunks` to a FrameReader and decode what it yields; raise
    Violation on a broken invariant. `expected`: the frames the bytes encode
    when they are unmutated."""
    reader = frame.FrameReader(frame_max)
    got: Frames = []
    failed: frame.FrameError | None = None
    for chunk in chunks:
        reader.feed(chunk)
        try:
            for ftype, chan, payload in reader.frames():
                if len(payload) + OVERHEAD > frame_max + FUDGE:
                    raise Violation(f"frame of {len(payload)} bytes yielded, frame_max {frame_max}")
                got.append((ftype, chan, payload))
                _decode(ftype, payload, expected is not None and payload in VALID_PAYLOADS)
        except frame.FrameError as err:
            failed = err
            break
        if len(reader.buf) >= max(frame_max + FUDGE, 7):
            raise Violation(
                f"{len(reader.buf)} bytes buffered for one frame, frame_max {frame_max}"
            )
    if expected is not None:
        fits = all(len(p) + OVERHEAD <= frame_max + FUDGE for _, _, p in expected)
        if fits and (failed is not None or got != expected or reader.buf):
            raise Violation(
                f"valid stream mis-split: error={failed!r}, {len(got)} of "
                f"{len(expected)} frames, {len(reader.buf)} bytes left"
            )
        if not fits and failed is None:
            raise Violation("oversized frame accepted")


def run_frame_input(rng: random.Random) -> int:
    """One input of the frame target; returns the number of bytes fed."""
    frame_max = rng.choice(FRAME_MAXES)
    pick = rng.random()
    expected: list[tuple[int, int, bytes]] | None = None
    if pick < 0.15:
        data = rng.randbytes(rng.randrange(rng.choice((16, 64, 512, 4096))))
        if rng.random() < 0.3:  # a plausible header on random bytes
            data = _HDR.pack(rng.choice((1, 2, 3, 8)), rng.randrange(4), len(data)) + data
    else:
        frames: list[tuple[int, int, bytes]] = []
        for _ in range(rng.randrange(1, 7)):
            r = rng.random()
            chan = rng.choice((0, 1, 1, 2, 65535))
            if r < 0.55:
                ftype, payload = rng.choice(CORPUS.all_valid)
            elif r < 0.7:
                ftype, payload = frame.FRAME_METHOD, rng.choice(CORPUS.raw_args)
            elif r < 0.8:
                ftype, payload = frame.FRAME_HEADER, _raw_header(rng, rng.randrange(100))
            elif r < 0.93:
                ftype, payload = frame.FRAME_BODY, rng.randbytes(rng.randrange(64))
            else:
                ftype, chan, payload = frame.FRAME_HEARTBEAT, 0, b""
            frames.append((ftype, chan, payload))
        if rng.random() < 0.35:
            expected = frames
            data = encode_frames(frames)
        else:
            data = mutate_frames(rng, frames, frame_max)
            if rng.random() < 0.5:
                data = mutate_bytes(rng, data, rng.randrange(1, 4))
    read_frames(chunked(rng, data), frame_max, expected)
    # AMQPLAIN responses are field tables without their length: feed it raw bytes too
    if pick < 0.15 or rng.random() < 0.05:
        frame.decode_amqplain(data[:2048])
    return len(data)


# ====================================================================== target: conn


class LoopbackProposer:
    """A Proposer backed by the real state machine: every flush is one Batch
    through apply_batch, as a single-node Raft group would apply it."""

    def __init__(self) -> None:
        self.state: BrokerState = default_state()
        self.model: ReadModel | None = None
        self.pending: list[Command] = []
        self.seq = 0
        self.now = 1_000_000.0

    def propose(self, cmd: Command, size: int = 0) -> None:
        self.pending.append(cmd)

    def flush(self) -> list[Effect]:
        cmds, self.pending = self.pending, []
        self.seq += 1
        self.now += 0.001
        return apply_batch(self.state, Batch(NODE, 1, self.seq, self.now, cmds))

    def is_congested(self) -> bool:
        return False

    def add_drain_listener(self, cb: Callable[[], None]) -> None:
        pass

    def blocked_reason(self) -> str | None:
        return None

    def read_model(self) -> ReadModel:
        # one thread here: build it from the state on demand (unchanged parts are reused)
        self.model = build_model(self.state, self.model)
        return self.model

    def add_model_listener(self, cb: Callable[[ReadModel], None]) -> None:
        pass

    async def queue_rows(self) -> list[dict[str, Any]]:
        return [r._asdict() for r in model_queue_rows(self.state)]


def settle(conn: Connection, prop: LoopbackProposer) -> None:
    """Apply proposals and carry out their effects until nothing is left (as
    raft_node + server.dispatch do, minus the network)."""
    rounds = 0
    while prop.pending:
        rounds += 1
        if rounds > SETTLE_ROUNDS:
            raise Violation("proposals never settle (livelock between wire and state machine)")
        for e in prop.flush():
            if effect_node(e) == NODE:
                conn.apply_effect(e)
        conn.end_dispatch()


class _Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


def _handshakes() -> list[bytes]:
    out = []
    caps_sets: list[dict[str, Any]] = [
        {
            "authentication_failure_close": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "publisher_confirms": True,
        },
        {},
    ]
    for caps in caps_sets:
        for mech in ("PLAIN", "AMQPLAIN"):
            resp: Any = (
                "\0guest\0guest"
                if mech == "PLAIN"
                else frame.encode_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:].decode(
                    "latin-1"
                )
            )
            for fmax, cmax in ((131072, 2047), (4096, 2047), (0, 0), (131072, 2)):
                out.append(
                    frame.PROTOCOL_HEADER
                    + b"".join(
                        pframe.marshal(o, 0)
                        for o in (
                            pc.Connection.StartOk(
                                client_properties={"capabilities": caps, "product": "fuzz"},
                                mechanism=mech,
                                response=resp,
                            ),
                            pc.Connection.TuneOk(channel_max=cmax, frame_max=fmax, heartbeat=0),
                            pc.Connection.Open("/"),
                        )
                    )
                )
    return out


HANDSHAKES = _handshakes()
_CONN_LEVEL = [
    method_payload(o)
    for o in (
        pc.Connection.Close(200, "bye", 0, 0),
        pc.Connection.CloseOk(),
        pc.Connection.Blocked("x"),
        pc.Connection.Unblocked(),
        pc.Connection.UpdateSecret("s", "r"),
        pc.Connection.Open("/"),
        pc.Connection.TuneOk(0, 131072, 0),
        pc.Connection.Close(320, "x", 60, 40),
    )
]
_NEW_CHANNELS = (1, 2, 3)
_ODD_CHANNELS = (0, 4, 2047, 2048, 65535)
_METHOD_NAMES = tuple(CORPUS.methods)
# the common methods more often than tx/recover/flow
_HOT = (
    "Queue.Declare",
    "Queue.Bind",
    "Basic.Consume",
    "Basic.Get",
    "Basic.Ack",
    "Basic.Nack",
    "Basic.Reject",
    "Confirm.Select",
    "Basic.Qos",
    "Exchange.Declare",
    "Basic.Cancel",
    "Basic.Publish",
)
# valid declares/consumes that give the rest of a session something to work on
_PRELUDE = [
    method_payload(o)
    for o in (
        pc.Queue.Declare(queue="q0"),
        pc.Queue.Declare(queue="q1", arguments={"x-max-length": 3}),
        pc.Queue.Declare(queue="q1", exclusive=True),
        # overflow dead-letters to amq.topic, where q0 listens on "#"
        pc.Queue.Declare(
            queue="q1", arguments={"x-max-length": 1, "x-dead-letter-exchange": "amq.topic"}
        ),
        unchecked_method(
            pc.Queue.Declare,
            queue="q1",
            arguments={
                "x-max-length": 1,
                "x-dead-letter-exchange": "amq.topic",
                "x-dead-letter-routing-key": "k" * 300,
            },
        ),
        pc.Basic.Consume(queue="q0", consumer_tag="c0"),
        pc.Basic.Consume(queue="q1", consumer_tag="c1", no_ack=True),
        pc.Queue.Bind(queue="q0", exchange="amq.topic", routing_key="#"),
        pc.Exchange.Declare(exchange="x0", exchange_type="fanout"),
        pc.Queue.Bind(queue="q1", exchange="x0"),
        pc.Confirm.Select(),
        pc.Tx.Select(),
        pc.Basic.Qos(prefetch_count=1),
    )
]
# publishes that reach the queues above (deliveries, gets, returns, confirms)
_ROUTED = [
    method_payload(pc.Basic.Publish(exchange=x, routing_key=k, mandatory=m))
    for x, k, m in (
        ("", "q0", False),
        ("", "q1", False),
        ("", "q0", True),
        ("amq.topic", "a.b", False),
        ("x0", "", True),
        ("", "nowhere", True),
        ("amq.direct", "q0", True),
    )
]
_OPEN = CORPUS.methods["Channel.Open"][0]
_CLOSE_OK = CORPUS.methods["Channel.CloseOk"][0]
# setup steps: (alternatives, probability), in an order in which each can succeed
_SETUP = [
    ([method_payload(pc.Queue.Declare(queue="q0"))], 0.9),
    (_PRELUDE[1:5], 0.8),  # q1: one of its variants
    ([method_payload(pc.Exchange.Declare(exchange="x0", exchange_type="fanout"))], 0.4),
    ([method_payload(pc.Queue.Bind(queue="q0", exchange="amq.topic", routing_key="#"))], 0.5),
    ([method_payload(pc.Queue.Bind(queue="q1", exchange="x0"))], 0.3),
    (
        [
            method_payload(pc.Basic.Qos(prefetch_count=1)),
            method_payload(pc.Basic.Qos(prefetch_count=2, global_=True)),
        ],
        0.3,
    ),
    (
        [
            method_payload(pc.Basic.Consume(queue="q0", consumer_tag="c0")),
            method_payload(pc.Basic.Consume(queue="q0", consumer_tag="", no_ack=True)),
        ],
        0.6,
    ),
    ([method_payload(pc.Basic.Consume(queue="q1", consumer_tag="c1"))], 0.3),
    ([method_payload(pc.Confirm.Select()), method_payload(pc.Tx.Select())], 0.4),
]


def _publish_frames(rng: random.Random, chan: int) -> list[tuple[int, int, bytes]]:
    body = rng.randbytes(rng.choice((0, 0, 1, 5, 40, 300)))
    declared = (
        len(body)
        if rng.random() < 0.95
        else rng.choice((0, 1, len(body) + 1, max(0, len(body) - 1), 2**63))
    )
    header = (
        with_size(rng.choice(CORPUS.headers), declared)
        if rng.random() < 0.97
        else _raw_header(rng, declared)
    )
    method = rng.choice(_ROUTED if rng.random() < 0.6 else CORPUS.methods["Basic.Publish"])
    out = [(frame.FRAME_METHOD, chan, method), (frame.FRAME_HEADER, chan, header)]
    if body:
        n = rng.choice((1, 1, 1, 2, 3))
        step = max(1, -(-len(body) // n))
        out += [(frame.FRAME_BODY, chan, body[i : i + step]) for i in range(0, len(body), step)]
    if rng.random() < 0.03:  # content frames in the wrong order, missing or repeated
        op = rng.randrange(3)
        k = rng.randrange(len(out))
        if op == 0:
            j = rng.randrange(len(out))
            out[k], out[j] = out[j], out[k]
        elif op == 1:
            del out[k]
        else:
            out.insert(k, out[k])
    return out


def gen_op(rng: random.Random, opened: set[int], closing: set[int], limit: int = 3) -> Frames:
    """The frames of one client action. `opened`: channels the client believes
    open; `closing`: channels the server closed (owed a Channel.CloseOk)."""
    if closing and rng.random() < 0.8:
        chan = rng.choice(sorted(closing))
        closing.discard(chan)
        opened.discard(chan)
        out: Frames = [(frame.FRAME_METHOD, chan, _CLOSE_OK)]
        if rng.random() < 0.7:
            out.append((frame.FRAME_METHOD, chan, _OPEN))
            opened.add(chan)
        return out
    fresh = [c for c in _NEW_CHANNELS if c not in opened and c not in closing and c <= limit]
    if fresh and (not opened or rng.random() < 0.06):
        chan = rng.choice(fresh)
        opened.add(chan)
        return [(frame.FRAME_METHOD, chan, _OPEN)]
    if opened and rng.random() < 0.99:
        chan = rng.choice(sorted(opened))
    else:
        chan = rng.choice(_ODD_CHANNELS + _NEW_CHANNELS)
    r = rng.random()
    if r < 0.1:
        return [(frame.FRAME_METHOD, chan, rng.choice(_PRELUDE))]
    if r < 0.55:
        name = rng.choice(_HOT) if rng.random() < 0.6 else rng.choice(_METHOD_NAMES)
        if name == "Basic.Publish":
            return _publish_frames(rng, chan)
        if name == "Channel.Close":
            opened.discard(chan)
        return [(frame.FRAME_METHOD, chan, rng.choice(CORPUS.methods[name]))]
    if r < 0.88:
        return _publish_frames(rng, chan)
    if r < 0.905:
        return [(frame.FRAME_METHOD, chan, rng.choice(CORPUS.raw_args))]
    if r < 0.915:
        return [(frame.FRAME_METHOD, chan, rng.choice(CORPUS.server_side))]
    if r < 0.925:  # unknown or garbage method ids
        return [
            (
                frame.FRAME_METHOD,
                chan,
                struct.pack(
                    ">HH", rng.choice((0, 10, 20, 60, 85, 90, 999, 65535)), rng.randrange(0, 200)
                )
                + rng.randbytes(rng.randrange(12)),
            )
        ]
    if r < 0.935:  # content frames out of the blue
        if rng.random() < 0.5:
            return [
                (frame.FRAME_HEADER, chan, with_size(rng.choice(CORPUS.headers), rng.randrange(9)))
            ]
        return [(frame.FRAME_BODY, chan, rng.randbytes(rng.randrange(9)))]
    if r < 0.955:
        return [(frame.FRAME_HEARTBEAT, 0 if rng.random() < 0.8 else chan, b"")]
    if r < 0.96:
        return [(rng.choice((0, 4, 5, 7, 9, 0xCE, 255)), chan, rng.randbytes(4))]
    if r < 0.97:
        return [(frame.FRAME_METHOD, 0 if rng.random() < 0.8 else chan, rng.choice(_CONN_LEVEL))]
    opened.discard(chan)
    return [(frame.FRAME_METHOD, chan, rng.choice(CORPUS.methods["Channel.Close"]))]


def gen_session(rng: random.Random) -> tuple[bytes, Frames]:
    """A valid handshake plus a sequence of (mostly) well formed frames, made
    without looking at the server's answers."""
    hs = rng.choice(HANDSHAKES)
    opened: set[int] = set()
    frames = setup(rng, opened)
    for _ in range(rng.randrange(1, 24)):
        frames += gen_op(rng, opened, set())
    return hs, frames


def setup(rng: random.Random, opened: set[int]) -> Frames:
    """Often a few valid declares, binds and consumes first (in that order, a
    random subset), so that what follows meets queues with limits,
    dead-lettering and consumers."""
    if rng.random() < 0.35:
        return []
    opened.add(1)
    picks = [rng.choice(group) for group, p in _SETUP if rng.random() < p]
    return [(frame.FRAME_METHOD, 1, _OPEN)] + [(frame.FRAME_METHOD, 1, m) for m in picks]


@dataclass
class _Watch:
    """What the client has seen so far, to judge the next output."""

    opened: set[int] = field(default_factory=set)  # channels with an Open-Ok and no Close since
    ever: set[int] = field(default_factory=set)  # channels that were opened at some point
    open_ok: bool = False  # Connection.OpenOk sent: the handshake completed
    closed: set[int] = field(default_factory=set)  # server sent Channel.Close, no CloseOk yet
    conn_closed: bool = False
    close_ok_sent: bool = False
    total: int = 0
    closes: list[int] = field(default_factory=list)


def check_output(data: bytes, w: _Watch, frame_max: int) -> None:
    w.total += len(data)
    if w.total > OUTPUT_BOUND:
        raise Violation(f"output over {OUTPUT_BOUND} bytes for one input")
    pos = 0
    if data.startswith(b"AMQP"):
        pos = 8
    n = len(data)
    while pos < n:
        if n - pos < 8:
            raise Violation("truncated frame in output")
        ftype, chan, size = _HDR.unpack_from(data, pos)
        end = pos + 7 + size
        if end >= n or data[end] != frame.FRAME_END:
            raise Violation(f"badly framed output at {pos}")
        if size + OVERHEAD > frame_max:
            raise Violation(f"output frame of {size} bytes over frame_max {frame_max}")
        payload = data[pos + 7 : end]
        pos = end + 1
        if w.close_ok_sent:
            raise Violation("output after Connection.CloseOk")
        cid = mid = 0
        if ftype == frame.FRAME_METHOD:
            cid, mid = struct.unpack_from(">HH", payload)
            if (cid << 16 | mid) not in pc.INDEX_MAPPING:
                raise Violation(f"server sent unknown method {cid}.{mid}")
            if (cid, mid) in ((10, 50), (20, 40)):
                (code,) = struct.unpack_from(">H", payload, 4)
                w.closes.append(code)
                if code not in REPLY_CODES:
                    raise Violation(f"close with reply code {code} outside the spec")
                if code == 541:
                    text = payload[7 : 7 + payload[6]].decode("utf-8", "replace")
                    raise Violation(f"541 INTERNAL_ERROR sent: {text}")
        if w.conn_closed and not (chan == 0 and (cid, mid) == (10, 51)):
            raise Violation(f"frame {ftype} {cid}.{mid} on {chan} after Connection.Close")
        if chan == 0:
            if (cid, mid) == (10, 50):
                w.conn_closed = True
            elif (cid, mid) == (10, 51):
                w.close_ok_sent = True
            elif (cid, mid) == (10, 41):
                w.open_ok = True
            elif ftype != frame.FRAME_HEARTBEAT and (cid, mid) not in (
                (10, 10),
                (10, 30),
                (10, 41),
                (10, 61),
                (10, 60),
                (10, 71),
            ):
                raise Violation(f"unexpected {ftype} {cid}.{mid} on channel 0")
            continue
        if (cid, mid) == (20, 11):
            w.opened.add(chan)
            w.ever.add(chan)
            w.closed.discard(chan)
            continue
        if (cid, mid) == (20, 41) and chan in w.ever:  # answers a client Close: always allowed
            w.opened.discard(chan)
            w.closed.discard(chan)
            continue
        if chan not in w.opened:
            raise Violation(f"frame {ftype} {cid}.{mid} on channel {chan}, never opened")
        if chan in w.closed:
            raise Violation(f"frame {ftype} {cid}.{mid} on channel {chan} after its Channel.Close")
        elif (cid, mid) == (20, 40):
            w.closed.add(chan)


def check_state_clean(state: BrokerState, conn_id: ConnId) -> None:
    """Once the connection is gone nothing of it may remain in the replicated state."""
    if conn_id in state.conns or conn_id in state.exclusive:
        raise Violation("connection still in the state after ConnectionClose")
    left = [c for c in state.channels if c.conn_id == conn_id]
    if left:
        raise Violation(f"{len(left)} channels left in the state after ConnectionClose")
    held = 0
    for q in state.queues.values():
        if q.consumers:
            raise Violation(f"queue {q.name!r} keeps consumers of a closed connection")
        if q.owner == conn_id:
            raise Violation(f"exclusive queue {q.name!r} outlived its connection")
        ready = sum(m.size for _, m in q.returned) + sum(m.size for m in q.ready)
        if ready != q.ready_bytes:
            raise Violation(f"queue {q.name!r} ready_bytes {q.ready_bytes} != {ready}")
        held += ready
    if held != state.message_bytes:
        raise Violation(f"state.message_bytes {state.message_bytes} != held {held}")


class Session:
    """One client connection to the real state machine, every output checked."""

    def __init__(self) -> None:
        self.prop = LoopbackProposer()
        self.conn = Connection(
            self.prop, ConnId(NODE, 1), WireConfig(), _Clock(), peer_host="127.0.0.1"
        )
        self.watch = _Watch()
        self.fed = 0

    def feed(self, chunks: list[bytes]) -> None:
        conn = self.conn
        for chunk in chunks:
            self.fed += len(chunk)
            conn.data_received(chunk)
            settle(conn, self.prop)
            check_output(conn.take_output(), self.watch, conn.frame_max)

    def finish(self) -> None:
        """Final checks, then the client goes away and the state must forget it."""
        conn, w = self.conn, self.watch
        if w.open_ok and conn.close_transport and not (w.conn_closed or w.close_ok_sent):
            raise Violation("connection closed without Connection.Close/CloseOk")
        if conn.phase == CLOSING and not w.conn_closed:
            raise Violation("closing without having sent Connection.Close")
        conn.connection_lost()
        settle(conn, self.prop)
        check_state_clean(self.prop.state, conn.id)


def run_conn_input(rng: random.Random) -> int:
    """One input of the conn target; returns the number of bytes fed.

    Half the inputs are one frame stream made up front (then mutated and
    chunked as a whole); the other half are interactive: each action is chosen
    knowing which channels the server has closed, so sessions get deep (consumes,
    deliveries, acks, tx, confirms) instead of dying at the first channel error."""
    hs = rng.choice(HANDSHAKES)
    if rng.random() < 0.03:  # the handshake itself broken
        hs = mutate_bytes(rng, hs, rng.randrange(1, 3))
    s = Session()
    conn = s.conn
    if rng.random() < 0.5:
        _, frames = gen_session(rng)
        data = encode_frames(frames)
        pick = rng.random()
        if pick < 0.25:
            data = mutate_bytes(rng, data, rng.randrange(1, 4))
        elif pick < 0.35:
            data = mutate_frames(rng, frames, 131072)
        if rng.random() < 0.2:
            s.feed(chunked(rng, hs + data))
        else:
            s.feed(chunked(rng, hs))
            s.feed(chunked(rng, data))
    else:
        s.feed(chunked(rng, hs))
        opened: set[int] = set()
        s.feed([encode_frames(setup(rng, opened))])
        for _ in range(rng.randrange(1, 40)):
            if conn.close_transport or conn.phase == CLOSING:
                break
            closing = {n for n, ch in conn.channels.items() if ch.state == CLOSING_LOCAL}
            data = encode_frames(gen_op(rng, opened, closing, conn.channel_max))
            if rng.random() < 0.015:
                data = mutate_bytes(rng, data, 1)
            s.feed(chunked(rng, data))
        if conn.phase == CLOSING and rng.random() < 0.5:
            s.feed([encode_frames([(frame.FRAME_METHOD, 0, _CONN_LEVEL[rng.randrange(2)])])])
    s.finish()
    return s.fed


# ====================================================================== engine

TARGETS: dict[str, Callable[[random.Random], int]] = {
    "frame": run_frame_input,
    "conn": run_conn_input,
}


def input_rng(seed: int, index: int) -> random.Random:
    return random.Random((seed << 32) ^ index)


@dataclass
class Finding:
    target: str
    seed: int
    index: int
    kind: str  # exception type or "Violation"/"Hang"
    where: str
    detail: str

    def key(self) -> tuple[str, str, str]:
        return self.target, self.kind, self.where


@dataclass
class Stats:
    target: str
    inputs: int = 0
    bytes: int = 0
    seconds: float = 0.0
    max_input_seconds: float = 0.0
    crashes: int = 0
    findings: dict[tuple[str, str, str], Finding] = field(default_factory=dict)

    def merge(self, other: Stats) -> None:
        self.inputs += other.inputs
        self.bytes += other.bytes
        self.seconds = max(self.seconds, other.seconds)
        self.max_input_seconds = max(self.max_input_seconds, other.max_input_seconds)
        self.crashes += other.crashes
        for k, f in other.findings.items():
            self.findings.setdefault(k, f)

    def line(self) -> str:
        rate = self.inputs / self.seconds if self.seconds else 0.0
        return (
            f"target={self.target} inputs={self.inputs} seconds={self.seconds:.1f} "
            f"inputs/s={rate:.0f} bytes={self.bytes} crashes={self.crashes} "
            f"distinct={len(self.findings)} max_input_ms={self.max_input_seconds * 1000:.1f}"
        )


def _where(err: BaseException) -> str:
    """Where the exception left project code (innermost node/ frame), plus the
    innermost frame when that is elsewhere (pamqp): the key findings are grouped by."""
    if isinstance(err, Violation):
        return str(err).split(":")[0][:60]
    tb = traceback.extract_tb(err.__traceback__)
    if not tb:
        return "?"

    def fmt(fs: traceback.FrameSummary) -> str:
        return f"{fs.filename.split('/')[-1]}:{fs.lineno} {fs.name}"

    ours = [fs for fs in tb if "/node/" in fs.filename]
    if ours and ours[-1] is not tb[-1]:
        return f"{fmt(ours[-1])} (in {tb[-1].filename.split('/')[-1]})"
    return fmt(ours[-1] if ours else tb[-1])


def fuzz(
    target: str,
    seed: int,
    start: int,
    stop: int,
    time_limit: float = 2.0,
    progress: float = 0.0,
    label: str = "",
) -> Stats:
    """Run inputs [start, stop) of `seed` against `target`."""
    run = TARGETS[target]
    st = Stats(target)
    t0 = last = time.perf_counter()
    with cpu_time_bound(time_limit):
        for i in range(start, stop):
            rng = input_rng(seed, i)
            t1 = time.perf_counter()
            arm(time_limit)
            try:
                st.bytes += run(rng)
            except (Exception, Hang) as err:
                signal_off()
                st.crashes += 1
                f = Finding(target, seed, i, type(err).__name__, _where(err), str(err)[:300])
                st.findings.setdefault(f.key(), f)
            else:
                signal_off()
            dt = time.perf_counter() - t1
            if dt > st.max_input_seconds:
                st.max_input_seconds = dt
            st.inputs += 1
            if progress and t1 - last >= progress:
                last = t1
                print(
                    f"{label}{target}: {st.inputs} inputs, {st.crashes} crashes, "
                    f"{st.inputs / (t1 - t0):.0f}/s",
                    file=sys.stderr,
                    flush=True,
                )
    st.seconds = time.perf_counter() - t0
    return st


def signal_off() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_PROF, 0)


def replay(target: str, seed: int, index: int) -> None:
    """Re-run one input with its full traceback."""
    TARGETS[target](input_rng(seed, index))
    print(f"{target} seed={seed} index={index}: no failure")


def _job(args: tuple[str, int, int, int, float, float, str]) -> Stats:
    return fuzz(*args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000, help="inputs per target")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target", choices=(*TARGETS, "all"), default="all")
    ap.add_argument("--jobs", type=int, default=1, help="processes (inputs are split)")
    ap.add_argument("--time-limit", type=float, default=2.0, help="CPU seconds per input")
    ap.add_argument("--progress", type=float, default=30.0, help="seconds between reports")
    ap.add_argument("--replay", type=int, metavar="INDEX", help="re-run one input of --target")
    a = ap.parse_args(argv)
    if a.replay is not None:
        replay(a.target if a.target != "all" else "conn", a.seed, a.replay)
        return 0
    targets = list(TARGETS) if a.target == "all" else [a.target]
    bad = 0
    for target in targets:
        n, jobs = a.inputs, max(1, a.jobs)
        bounds = [(n * k // jobs, n * (k + 1) // jobs) for k in range(jobs)]
        t0 = time.perf_counter()
        work = [
            (target, a.seed, lo, hi, a.time_limit, a.progress, f"[job {k}] ")
            for k, (lo, hi) in enumerate(bounds)
        ]
        if jobs == 1:
            parts = [_job(work[0])]
        else:
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                parts = pool.map(_job, work)
        total = Stats(target)
        for p in parts:
            total.merge(p)
        total.seconds = time.perf_counter() - t0  # wall time of the whole target
        print(total.line(), flush=True)
        for f in total.findings.values():
            print(
                f"  {f.kind} at {f.where}: {f.detail}\n    replay: python -m "
                f"tests.fuzz.fuzz_amqp --target {f.target} --seed {f.seed} --replay {f.index}"
            )
        bad += total.crashes
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
