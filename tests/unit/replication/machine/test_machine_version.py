"""Machine versions (node/replication/machine/version.py): the behaviour that
differs between versions switches exactly at the index of SetMachineVersion,
identically on every member; a member whose build is older than the cluster's
machine version refuses to apply; the version never goes down; the snapshot
carries it (only from version 2 on, where every member reads its section)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from node.broker.vhost import resource_key
from node.replication import codec
from node.replication.command import Batch, ChannelOpen, QueueDeclare, SetMachineVersion
from node.replication.machine import BrokerState, apply_batch, default_state
from node.replication.machine.version import MACHINE_VERSION, MachineVersionError
from node.replication.raft.snapshot import RaftMeta, encode_snapshot, read_snapshot
from tests.support.machine import chan

CH = chan()
META = RaftMeta((b"", 5, 1), (b"", 4, 1), ("127.0.0.1:1",))


@pytest.fixture(autouse=True)
def _counted() -> Iterator[None]:
    before = codec.writes_counted()
    codec.write_counted(True)
    yield
    codec.write_counted(before)


def capped(name: str) -> QueueDeclare:
    """A declare as builds before issue 27 item 6 proposed it: their default cap of 2."""
    return QueueDeclare(CH, name, False, True, False, False, {}, False, 2)


def log() -> list[bytes]:
    """Raft entries 1..5, encoded as they travel."""
    cmds = [[ChannelOpen(CH)], [capped("before")], [SetMachineVersion(2)], [capped("after")],
            [SetMachineVersion(1)]]
    return [codec.encode_batch(Batch("n1", 1, i, 100.0 + i, c)) for i, c in enumerate(cmds, 1)]


def member(runs: int = MACHINE_VERSION) -> BrokerState:
    s = default_state()
    s.runs_version = runs
    return s


def test_behaviour_switches_at_the_index_of_set_machine_version_on_every_member() -> None:
    members = [member(), member()]
    seen: list[list[tuple[int, int | None, int | None]]] = [[], []]
    for index, entry in enumerate(log(), 1):
        for s, trace in zip(members, seen, strict=True):
            apply_batch(s, codec.decode_batch(entry), index)
            queues = [s.queues.get(resource_key("/", n)) for n in ("before", "after")]
            trace.append((s.machine_version, *(q.max_length if q else None for q in queues)))
        # identical states after every entry (the snapshot encodes all of it)
        a, b = (encode_snapshot(s, META) for s in members)
        assert a == b, index
    assert seen[0] == seen[1] == [
        (1, None, None),
        (1, 2, None),     # before the switch: the old build's cap applies
        (2, 2, None),     # index 3: SetMachineVersion(2)
        (2, 2, None),     # after it: the same declare no longer caps
        (2, 2, None),     # SetMachineVersion(1): never downgrades
    ]


def test_a_member_older_than_the_cluster_refuses_at_that_index() -> None:
    old, new = member(runs=1), member()
    entries = log()
    for index, entry in enumerate(entries[:2], 1):
        apply_batch(old, codec.decode_batch(entry), index)
        apply_batch(new, codec.decode_batch(entry), index)
    assert encode_snapshot(old, META) == encode_snapshot(new, META)  # identical up to there
    with pytest.raises(MachineVersionError, match="cluster runs machine version 2, this build runs 1"):
        apply_batch(old, codec.decode_batch(entries[2]), 3)  # the node exits on it (code 4)
    assert old.machine_version == 1  # nothing of the new version applied


def test_the_snapshot_carries_the_machine_version_from_version_2_on() -> None:
    s = member()
    v1 = encode_snapshot(s, META)
    assert read_snapshot(v1)[0].machine_version == 1
    s.machine_version = 2
    v2 = encode_snapshot(s, META)
    assert read_snapshot(v2)[0].machine_version == 2
    # version 1 writes the file builds before machine versions read: no section
    assert len(v2) - len(v1) == len(codec.encode(("machine", 1, 2)))
