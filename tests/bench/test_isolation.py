"""bench/isolation.py: the figures and the verdict it derives, and the attack
modules it finds (no cluster, no network)."""
from __future__ import annotations

import pytest

from bench.isolation import discover, stats, table, verdict


def test_stats_quantiles_in_ms() -> None:
    s = stats([0.001 * i for i in range(1, 101)])
    assert s == {"n": 100, "p50_ms": 51.0, "p99_ms": 100.0, "max_ms": 100.0}
    assert stats([])["p99_ms"] is None


def test_verdict_is_the_issues_bar() -> None:
    quiet = {"p99_ms": 10.0}
    assert verdict(quiet, {"p99_ms": 20.0}, 0, None) == []
    assert verdict(quiet, {"p99_ms": 20.1}, 0, None) == ["p99 > 2x quiet"]
    assert verdict({"p99_ms": 600.0}, {"p99_ms": 1001.0}, 0, None) == ["p99 > 1 s"]
    assert verdict(quiet, {"p99_ms": 5.0}, 1, None) == ["election"]
    assert verdict(quiet, {"p99_ms": None}, None, "attack error") == [
        "p99 > 2x quiet", "p99 > 1 s", "election", "attack error"]


def test_discover_finds_the_attack_modules_but_the_interface() -> None:
    mods = discover(None)
    names = [m.NAME for m in mods]
    assert "topic-bindings" in names
    assert all(m.__name__ != "bench.attack_target" for m in mods)
    assert all(callable(m.setup) and callable(m.run) for m in mods)
    assert [m.NAME for m in discover(["topic"])] == ["topic-bindings"]
    assert [m.NAME for m in discover(["topic-bindings"])] == ["topic-bindings"]
    with pytest.raises(SystemExit):
        discover(["nope"])


def test_table_has_a_row_per_attack() -> None:
    q = {"p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 3.0}
    row = {"attack": "a", "victim": q, "p99_ratio": 1.0, "elections": 0,
           "figures": {"publishes": 5.0}, "failed": []}
    lines = table(q, [row, dict(row, attack="b", failed=["election"])]).splitlines()
    assert len(lines) == 4 and "| a |" in lines[2] and "holds" in lines[2]
    assert "election" in lines[3]
