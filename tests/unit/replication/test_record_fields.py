"""Records carry their field count (codec C and Q records): a record an older
build wrote (fewer fields) decodes with the missing fields' defaults, a field
without a default is refused, a record of a newer build (more fields) is
refused, never truncated. The count-less records of logs written before (R, P)
still decode, and are what a node writes while the cluster's machine version
is 1 (its members may run such a build)."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from node.broker.ids import ChanId
from node.replication import codec
from node.replication import command as cmd
from node.replication.codec import RECORDS, CodecError, decode, decode_batch, encode, encode_batch

CH = ChanId("n1", 5, 3)
PUB = cmd.BasicPublish(CH, 9, "amq.direct", "rk", False, {"delivery_mode": 2}, os.urandom(300))


@pytest.fixture(autouse=True)
def _counted() -> Iterator[None]:
    """The codec's mode is per process (a RaftNode of another test may have set it)."""
    before = codec.writes_counted()
    codec.write_counted(True)
    yield
    codec.write_counted(before)


def _rid(kind: type) -> bytes:
    return bytes((RECORDS.index(kind),))


def _counted_record(kind: type, *fields: object) -> bytes:
    return b"C" + _rid(kind) + bytes((len(fields),)) + b"".join(encode(f) for f in fields)


def test_records_are_written_with_their_field_count() -> None:
    data = encode(cmd.NodeDown("n2"))
    assert data[:3] == b"C" + _rid(cmd.NodeDown) + b"\x01"
    assert decode(data) == cmd.NodeDown("n2")
    assert encode(PUB)[:2] == b"Q\x07"


def test_count_less_records_of_older_logs_still_decode() -> None:
    # what builds before counted records wrote: R, class id, fields; P for publishes
    old = b"R" + _rid(cmd.NodeDown) + encode("n2")
    assert decode(old) == cmd.NodeDown("n2")
    queue_declare = (CH, "q", False, True, False, False, {}, False, 1000)
    old = b"R" + _rid(cmd.QueueDeclare) + b"".join(encode(f) for f in queue_declare)
    assert decode(old) == cmd.QueueDeclare(*queue_declare)
    counted = encode(PUB)
    assert decode(b"P" + counted[2:]) == PUB


def test_a_record_with_fewer_fields_takes_the_defaults() -> None:
    eight = (CH, "q", False, True, False, False, {}, False)  # QueueDeclare before default_max_length
    got = decode(_counted_record(cmd.QueueDeclare, *eight))
    assert got == cmd.QueueDeclare(*eight) and got.default_max_length == 0
    assert decode(_counted_record(cmd.UserPut, "u", "hash")) == cmd.UserPut("u", "hash", ())
    assert decode(_counted_record(cmd.ChannelOpen, CH)).vhost == "/"


def test_a_missing_field_without_a_default_is_refused_by_name() -> None:
    with pytest.raises(CodecError, match="SetMember record with 2 fields lacks 'in_sync'"):
        decode(_counted_record(cmd.SetMember, "n4", "h:1"))


def test_a_record_with_more_fields_than_this_build_knows_is_refused() -> None:
    with pytest.raises(CodecError, match="NodeDown record with 2 fields: this build knows 1 .*newer"):
        decode(_counted_record(cmd.NodeDown, "n2", 7))
    # inside a batch too: never decoded as a shorter record
    batch = encode_batch(cmd.Batch("n1", 1, 1, 1.0, [cmd.Tick()]))
    grown = batch.replace(b"C" + _rid(cmd.Tick) + b"\x00", b"C" + _rid(cmd.Tick) + b"\x01N")
    with pytest.raises(CodecError, match="Tick record with 1 fields"):
        decode_batch(grown)
    with pytest.raises(CodecError, match="unknown record 200"):
        decode(b"C\xc8\x00")


def test_a_publish_with_another_field_count_is_refused() -> None:
    data = encode(PUB)
    for count in (6, 8):
        with pytest.raises(CodecError, match=f"BasicPublish record with {count} fields"):
            decode(b"Q" + bytes((count,)) + data[2:])


def test_publish_spans_are_the_same_counted_or_not() -> None:
    batch = cmd.Batch("n1", 1, 1, 1.0, [PUB, cmd.TxCommit(CH, (PUB,))])
    spans: dict[int, tuple[int, int]] = {}
    data = encode_batch(batch)
    got = decode_batch(data, 0, spans)
    assert got == batch
    for c in (got.commands[0], got.commands[1].commands[0]):
        at, n = spans[id(c)]
        assert decode(data[at:at + n]) == PUB.props and data[at + n:at + n + len(PUB.body)] == PUB.body


def test_before_machine_version_2_records_are_written_as_older_builds_read_them() -> None:
    codec.write_counted(False)
    batch = cmd.Batch("n1", 1, 1, 1.0, [PUB, cmd.NodeUp("n1", 3)])
    data = encode_batch(batch)
    assert data[:2] == b"R" + _rid(cmd.Batch) and b"Q\x07" not in data and b"P" in data
    assert decode_batch(data) == batch
    # a record kind older builds do not know is always counted (they cannot read it anyway)
    assert encode(cmd.SetMachineVersion(2))[:3] == b"C" + _rid(cmd.SetMachineVersion) + b"\x01"


def test_a_field_added_later_is_left_out_of_count_less_records_only_at_its_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # as if QueueDeclare had gained default_max_length after records stopped being count-less
    legacy = list(codec._LEGACY_ARITY)
    legacy[RECORDS.index(cmd.QueueDeclare)] = 8
    monkeypatch.setattr(codec, "_LEGACY_ARITY", tuple(legacy))
    codec.write_counted(False)
    plain = cmd.QueueDeclare(CH, "q", False, True, False, False, {}, False)
    data = encode(plain)
    assert data[:1] == b"R" and decode(data) == plain  # read back with the default
    with pytest.raises(CodecError, match="default_max_length=5 cannot be written"):
        encode(plain._replace(default_max_length=5))
    codec.write_counted(True)
    assert decode(encode(plain._replace(default_max_length=5))).default_max_length == 5


def test_legacy_arities_are_frozen_for_every_record_kind_they_name() -> None:
    # a field added to one of these classes must come with a default (appended)
    for rid, n in enumerate(codec._LEGACY_ARITY):
        kind = RECORDS[rid]
        assert len(kind._fields) >= n, kind.__name__  # type: ignore[attr-defined]
        assert len(kind._fields) - len(kind._field_defaults) <= n, kind.__name__  # type: ignore[attr-defined]


def test_truncated_counted_records_are_codec_errors() -> None:
    data = encode_batch(cmd.Batch("n1", 1, 1, 1.0, [PUB, cmd.NodeDown("n2")]))
    for cut in range(len(data)):
        try:
            decode_batch(data[:cut])
        except CodecError:
            continue
        raise AssertionError(f"a batch cut at {cut} decoded")


def test_trailing_fields_at_their_default_are_left_out_so_older_builds_read_them() -> None:
    """A field appended since (BasicConsume.timeout) is written only when set: a
    build that does not know it reads the record as long as it is not."""
    plain = cmd.BasicConsume(CH, "q", "t", False, False, False, {}, False, 10)
    data = encode(plain)
    assert data[:3] == b"C" + _rid(cmd.BasicConsume) + b"\x09"  # the nine fields of before
    assert decode(data) == plain and decode(data).timeout == -1
    timed = plain._replace(timeout=60000)
    assert encode(timed)[:3] == b"C" + _rid(cmd.BasicConsume) + b"\x0a"
    assert decode(encode(timed)) == timed
    # a default that compares equal but is of another type is written
    assert decode(encode(cmd.ChannelOpen(CH, "/"))) == cmd.ChannelOpen(CH)
    assert encode(cmd.ChannelOpen(CH))[:3] == b"C" + _rid(cmd.ChannelOpen) + b"\x01"
