"""node.replication.codec: what the log holds and the Raft port carries, without pickle.

Round trips for every command kind (with the field-table values pamqp decodes:
datetimes, decimals, nested tables, bytes), the BasicPublish fast path with
random bodies, and refusal (CodecError, never another exception, never an
object of an unregistered type) for truncated, garbled and hostile inputs."""
from __future__ import annotations

import datetime
import decimal
import os
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.broker.ids import ChanId, ConnId
from node.replication import command as cmd
from node.replication.codec import RECORDS, CodecError, decode, decode_batch, encode, encode_batch

CH = ChanId("n1", 1_700_000_000_000_000_000, 3)

TABLE = {"s": "text", "i": -(2**40), "big": 2**80, "f": 1.5, "b": True, "n": None, "raw": b"\x00\xff",
         "t": datetime.datetime(2024, 5, 1, 12, 30, 15), "d": decimal.Decimal("3.14"),
         "nested": {"l": [1, "two", [3.0]], "tuple": (1, 2)}}


def _all_commands() -> list[object]:
    pub = cmd.BasicPublish(CH, 7, "amq.topic", "a.b", True, {"delivery_mode": 2, "headers": TABLE},
                           os.urandom(4096))
    return [
        cmd.ChannelOpen(CH, "/"), cmd.ChannelClose(CH, True), cmd.ChannelFlow(CH, False),
        cmd.ConnectionClose(ConnId("n1", 5)),
        cmd.ExchangeDeclare(CH, "x", "topic", False, True, False, False, TABLE, False),
        cmd.ExchangeDelete(CH, "x", True, False), cmd.ExchangeBind(CH, "d", "s", "k", {}, False),
        cmd.ExchangeUnbind(CH, "d", "s", "k", {}, True),
        cmd.QueueDeclare(*((CH,) + tuple(_defaults(cmd.QueueDeclare)))),
        cmd.QueueBind(CH, "q", "x", "k", TABLE, False), cmd.QueueUnbind(CH, "q", "x", "k", {}),
        cmd.QueuePurge(CH, "q", False), cmd.QueueDelete(CH, "q", False, True, False),
        cmd.BasicQos(*((CH,) + tuple(_defaults(cmd.BasicQos)))),
        cmd.BasicConsume(*((CH,) + tuple(_defaults(cmd.BasicConsume)))),
        cmd.BasicCancel(*((CH,) + tuple(_defaults(cmd.BasicCancel)))),
        cmd.BasicCredit(*((CH,) + tuple(_defaults(cmd.BasicCredit)))),
        cmd.BasicGet(CH, "q", False), pub, cmd.BasicAck(CH, 5, True),
        cmd.BasicNack(CH, 6, False, True, True), cmd.BasicRecover(CH),
        cmd.TxCommit(CH, (pub, cmd.BasicAck(CH, 1, False))), cmd.Echo(CH, "Confirm.SelectOk", {}),
        cmd.Tick(), cmd.NodeUp("n2", 123), cmd.NodeDown("n2"), cmd.MarkOutOfSync("n3"),
        cmd.MarkInSync("n3"), cmd.SetMember("n4", "10.0.0.4:25672", False), cmd.SetDraining("n2", True),
        cmd.UserPut("u", "hash", ("administrator",)), cmd.UserDelete("u"), cmd.VhostPut("v"),
        cmd.VhostDelete("v"), cmd.PermissionSet("u", "v", ".*", ".*", ".*"), cmd.PermissionClear("u", "v"),
        cmd.DropMember("n4"),
        cmd.PolicySet(False, "v", "p", "^q", "queues", 1, {"max-length": 5, "overflow": "reject-publish"}),
        cmd.PolicySet(True, "/", "op", ".*", "all", 2.5, {"message-ttl": 1000}),
        cmd.PolicyClear(True, "/", "op"),
        cmd.SetMachineVersion(2),
        cmd.ConnectionOpen(ConnId("n1", 7), "v", "u"),
        cmd.LimitSet("vhost", "/", "max-connections", -1),
        cmd.LimitClear("user", "u", ""),
        cmd.TopicPermissionSet("u", "/", "amq.topic", "^a\\.", ""),
        cmd.TopicPermissionClear("u", "/", ""),
        cmd.GlobalParameterSet("cluster_name", "prod"),
        cmd.GlobalParameterSet("p", {"a": [1, 2.5, None, True, "x"], "b": {"c": 2 ** 70}}),
        cmd.GlobalParameterClear("p"),
        cmd.VhostProtection("v", True),
    ]


def _defaults(kind: type) -> list[object]:
    """Plausible values for a command's fields after `chan`, by annotation."""
    out: list[object] = []
    for name in kind._fields[1:]:  # type: ignore[attr-defined]
        ann = str(kind.__annotations__[name])
        out.append(True if ann == "bool" else 3 if ann == "int" else {} if "Table" in ann or "dict" in ann
                   else f"{name}-value")
    return out


def test_every_registered_command_round_trips_in_a_batch() -> None:
    cmds = _all_commands()
    kinds = {type(c) for c in cmds}
    assert kinds >= set(RECORDS) - {ChanId, ConnId, cmd.Batch}, "a command kind has no round-trip case"
    batch = cmd.Batch("n1", 99, 12, 1_700_000_000.25, cmds)
    assert decode_batch(encode_batch(batch)) == batch


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=70_000), seq=st.integers(0, 2**63 - 1),
       exchange=st.text(max_size=40), rk=st.text(max_size=255),
       headers=st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=20),
                                                              st.binary(max_size=20), st.booleans(),
                                                              st.none()), max_size=5))
def test_publish_fast_path_round_trips(body: bytes, seq: int, exchange: str, rk: str,
                                       headers: dict[str, object]) -> None:
    pub = cmd.BasicPublish(CH, seq, exchange, rk, bool(seq % 2), {"headers": headers} if headers else {}, body)
    out = decode(encode(pub))
    assert out == pub and type(out) is cmd.BasicPublish and type(out.chan) is ChanId


def test_bodies_travel_as_raw_bytes_not_reencoded() -> None:
    body = os.urandom(256 * 1024)
    data = encode(cmd.BasicPublish(CH, 1, "", "q", False, {}, body))
    assert body in data and len(data) < len(body) + 128


def test_truncated_encodings_raise_codec_error_only() -> None:
    data = encode_batch(cmd.Batch("n1", 1, 1, 0.0, _all_commands()))
    for cut in range(0, len(data), max(1, len(data) // 400)):
        with pytest.raises(CodecError):
            decode(data[:cut])


def test_random_garbage_raises_codec_error_only() -> None:
    rng = random.Random(11)
    data = encode_batch(cmd.Batch("n1", 1, 1, 0.0, _all_commands()))
    for _ in range(3000):
        if rng.random() < 0.5:
            blob = rng.randbytes(rng.randrange(1, 300))
        else:  # flip a few bytes of a valid encoding
            b = bytearray(data)
            for _ in range(rng.randrange(1, 6)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            blob = bytes(b)
        try:
            value = decode(blob)
        except CodecError:
            continue
        _only_known_types(value)


def _only_known_types(v: object) -> None:
    known = (type(None), bool, int, float, str, bytes, list, tuple, dict, datetime.datetime,
             decimal.Decimal) + RECORDS
    assert type(v) in known, type(v)
    if isinstance(v, dict):
        for k, item in v.items():
            _only_known_types(k)
            _only_known_types(item)
    elif isinstance(v, list | tuple):
        for item in v:
            _only_known_types(item)


def test_hostile_lengths_and_nesting_are_refused() -> None:
    with pytest.raises(CodecError):
        decode(b"l" + (2**32 - 1).to_bytes(4, "little"))  # a list claiming 4 billion items
    with pytest.raises(CodecError):
        decode(b"b" + (2**31).to_bytes(4, "little") + b"x")
    with pytest.raises(CodecError):
        decode(b"l\x01\x00\x00\x00" * 200 + b"N")  # nested far too deep
    with pytest.raises(CodecError):
        decode(b"R\xff")  # no such record
    with pytest.raises(CodecError):
        decode(pickle.dumps(cmd.Tick()))  # a pickle is not an encoding
    with pytest.raises(CodecError):
        decode_batch(encode(["not", "a", "batch"]))
    with pytest.raises(CodecError):
        decode_batch(encode(cmd.Batch("n1", 1, 1, 0.0, ["a string, not a command"])))  # type: ignore[list-item]


def test_unregistered_types_cannot_be_encoded() -> None:
    with pytest.raises(CodecError):
        encode({"x": object()})
    with pytest.raises(CodecError):
        encode({1, 2})
