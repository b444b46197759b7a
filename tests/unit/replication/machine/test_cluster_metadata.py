"""Global parameters (the cluster name among them) and vhost deletion
protection folded through the state machine (machine version 6, issue 28):
set, replace and clear; nothing changes below version 6; a protected vhost
survives VhostDelete until the protection is lifted; the read model and the
snapshot's cluster section carry both; the pure checks of
node/broker/parameter.py."""
from __future__ import annotations

import pytest

from node.broker.parameter import (
    CLUSTER_NAME,
    MAX_DEPTH,
    cluster_name,
    exported,
    global_parameter_error,
)
from node.broker.vhost import deletion_refused, protection_of_missing
from node.replication import codec
from node.replication.command import (
    Batch,
    GlobalParameterClear,
    GlobalParameterSet,
    SetMachineVersion,
    VhostDelete,
    VhostProtection,
    VhostPut,
)
from node.replication.machine import apply_batch, default_state
from node.replication.machine.version import CLUSTER_METADATA, MACHINE_VERSION
from node.replication.raft.snapshot import encode_snapshot
from node.replication.read_model import build
from tests.support.machine import Harness
from tests.support.snapshot import META, assert_same_state, snapshot_copy


def harness(version: int = CLUSTER_METADATA) -> Harness:
    h = Harness()
    h.run(VhostPut("v"), SetMachineVersion(version))
    return h


def test_machine_version_6_carries_cluster_metadata() -> None:
    assert CLUSTER_METADATA == 6 <= MACHINE_VERSION


def test_global_parameters_are_set_replaced_and_cleared_in_log_order() -> None:
    h = harness()
    before = h.state.config_version
    h.run(GlobalParameterSet(CLUSTER_NAME, "prod"), GlobalParameterSet("p", {"a": [1, None]}))
    assert h.state.global_parameters == {CLUSTER_NAME: "prod", "p": {"a": [1, None]}}
    assert h.state.config_version > before  # the read model rebuilds
    h.run(GlobalParameterSet(CLUSTER_NAME, "staging"), GlobalParameterClear("p"),
          GlobalParameterClear("never-set"))
    assert h.state.global_parameters == {CLUSTER_NAME: "staging"}
    assert list(build(h.state).global_parameters.items()) == [(CLUSTER_NAME, "staging")]


def test_below_machine_version_6_the_new_commands_change_nothing() -> None:
    h = harness(version=5)
    cv = h.state.config_version
    h.run(GlobalParameterSet(CLUSTER_NAME, "x"), VhostProtection("v", True))
    assert h.state.global_parameters == {} and h.state.protected_vhosts == {}
    assert h.state.config_version == cv
    h.run(VhostDelete("v"))
    assert "v" not in h.state.vhosts


def test_a_protected_vhost_survives_delete_until_the_protection_is_lifted() -> None:
    h = harness()
    h.run(VhostProtection("v", True))
    assert list(h.state.protected_vhosts) == ["v"]
    assert list(build(h.state).protected_vhosts) == ["v"]
    h.run(VhostDelete("v"))
    assert "v" in h.state.vhosts and h.state.exchanges  # nothing of it went
    h.run(VhostProtection("v", False))
    assert h.state.protected_vhosts == {}
    h.run(VhostDelete("v"))
    assert "v" not in h.state.vhosts


def test_protection_of_an_unknown_vhost_is_ignored() -> None:
    h = harness()
    cv = h.state.config_version
    h.run(VhostProtection("nope", True), VhostProtection("v", False))
    assert h.state.protected_vhosts == {} and h.state.config_version == cv


def test_members_applying_the_same_log_reach_the_same_state() -> None:
    entries = [codec.encode_batch(Batch("n1", 1, i, 100.0 + i, cmds)) for i, cmds in enumerate([
        [VhostPut("v"), GlobalParameterSet(CLUSTER_NAME, "early")],  # before version 6: ignored
        [SetMachineVersion(CLUSTER_METADATA)],
        [GlobalParameterSet(CLUSTER_NAME, "late"), VhostProtection("v", True), VhostDelete("v")],
    ], 1)]
    members = [default_state(), default_state()]
    for index, entry in enumerate(entries, 1):
        for s in members:
            apply_batch(s, codec.decode_batch(entry), index)
    a, b = (encode_snapshot(s, META) for s in members)
    assert a == b
    assert members[0].global_parameters == {CLUSTER_NAME: "late"}
    assert "v" in members[0].vhosts


def test_the_read_model_shows_a_replaced_value_that_compares_equal() -> None:
    h = harness()
    h.run(GlobalParameterSet("p", 1))
    m1 = build(h.state)
    h.run(GlobalParameterSet("p", True))  # 1 == True, but another JSON value
    m2 = build(h.state, m1)
    assert m2.global_parameters["p"] is True
    h.run(VhostPut("w"))
    assert build(h.state, m2).global_parameters is m2.global_parameters  # unchanged: kept


def test_the_cluster_section_round_trips_from_machine_version_6() -> None:
    h = harness()
    h.run(GlobalParameterSet(CLUSTER_NAME, "prod"),
          GlobalParameterSet("p", {"nested": {"list": [1, 2.5, "x", False, None]}}),
          VhostPut("w"), VhostProtection("w", True), VhostProtection("v", True))
    copy = snapshot_copy(h.state)
    assert copy.global_parameters == h.state.global_parameters
    assert list(copy.protected_vhosts) == ["w", "v"]
    assert_same_state(copy, h.state)


def test_before_machine_version_6_the_snapshot_has_no_cluster_section() -> None:
    h = harness(version=5)
    five = encode_snapshot(h.state, META)
    h.state.machine_version = CLUSTER_METADATA
    six = encode_snapshot(h.state, META)
    assert len(six) - len(five) == len(codec.encode(("cluster", 1, {}, [])))
    assert snapshot_copy(h.state).global_parameters == {}


@pytest.mark.parametrize(("name", "value", "why"), [
    ("", 1, "needs a name"),
    (7, 1, "needs a name"),
    ("x" * 256, 1, "at most 255 bytes"),
    ("p", b"raw", "not a JSON value"),
    ("p", (1, 2), "not a JSON value"),
    ("p", {1: "a"}, "key that is not a string"),
    ("p", 2 ** 600, "integer too large"),
    ("p", "x" * 70000, "longer than"),
])
def test_a_global_parameter_the_log_cannot_carry_is_refused(name: object, value: object,
                                                             why: str) -> None:
    refusal = global_parameter_error(name, value)
    assert refusal is not None and why in refusal


def test_nesting_is_bounded_below_the_codecs_depth() -> None:
    deep: object = 1
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert global_parameter_error("p", deep) is None
    codec.decode(codec.encode(GlobalParameterSet("p", deep)))  # the log reads it back
    refusal = global_parameter_error("p", [deep])
    assert refusal is not None and "nested" in refusal


def test_the_cluster_name_is_the_parameter_else_derived_from_the_first_member() -> None:
    assert cluster_name({}, ["n1", "n2"]) == "mirrorq@n1"
    assert cluster_name({}, []) == "mirrorq"
    assert cluster_name({CLUSTER_NAME: "prod"}, ["n1"]) == "prod"
    assert cluster_name({CLUSTER_NAME: {"a": 1}}, ["n1"]) == '{"a": 1}'


def test_the_export_leaves_out_internal_parameters() -> None:
    assert exported({CLUSTER_NAME: "c", "internal_cluster_id": "x", "p": [1]}) == [
        {"name": CLUSTER_NAME, "value": "c"}, {"name": "p", "value": [1]}]


def test_rabbitmq_texts_for_protection() -> None:
    assert deletion_refused("v") == ("Refusing to delete virtual host 'v' because it is "
                                     "protected from deletion")
    assert protection_of_missing("v", True) == ("Cannot enable deletion protection of virtual "
                                                "host 'v' because it does not exist")
    assert protection_of_missing("v", False).startswith("Cannot disable deletion protection")
