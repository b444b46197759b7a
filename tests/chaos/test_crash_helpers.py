"""The pure parts of chaosmirrorq.crash's overlapping faults (the faults themselves
run only in the chaos suite: crash-during-partition, crash-during-pause,
membership-lost-writes)."""
from __future__ import annotations

import pytest
from chaosmirrorq import crash, fault


def test_seeded_heal_order_alternates_so_two_seeds_cover_both_orders() -> None:
    assert [crash._heal_order("seeded", s) for s in (1, 2, 3, 4)] == ["crash", "fault", "crash", "fault"]
    assert crash._heal_order("seeded", None) == "fault"
    assert crash._heal_order("crash", 2) == "crash" and crash._heal_order("fault", 1) == "fault"


@pytest.mark.parametrize("kwargs", [{"fault": "kill"}, {"heal_first": "never"}])
def test_bad_arguments_fail_before_any_fault(kwargs: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # no cluster (an earlier test in this process may have left one): reaching
    # for it would raise RuntimeError, not ValueError
    monkeypatch.delitem(fault.STATE, "cluster", raising=False)
    with pytest.raises(ValueError):
        crash.crash_during(**kwargs)  # type: ignore[arg-type]
