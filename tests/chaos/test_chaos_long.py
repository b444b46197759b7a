"""chaosmirrorq.long's pure parts: seeds, fault lengths, arguments, history layout."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from chaosmirrorq import long, suite


def test_fault_seconds_deterministic_within_range_and_spread() -> None:
    draws = [long.fault_seconds(s, 5.0, 60.0) for s in range(1000, 1200)]
    assert draws == [long.fault_seconds(s, 5.0, 60.0) for s in range(1000, 1200)]
    assert all(5.0 <= d <= 60.0 for d in draws)
    # log-uniform: the geometric middle (~17 s) splits them about evenly, both ends occur
    below = sum(d < (5.0 * 60.0) ** 0.5 for d in draws)
    assert 70 < below < 130
    assert min(draws) < 6.5 and max(draws) > 50


def test_run_env_sets_seed_fault_and_fallback_checker() -> None:
    env = long.run_env({"PATH": "/bin", "CHAOS_RATE": "100"}, 1003, 5.0, 60.0, "packet-loss")
    secs = float(env["CHAOS_FAULT_SECONDS"])
    assert env["CHAOS_SEED"] == "1003" and secs == long.fault_seconds(1003, 5.0, 60.0, "packet-loss")
    # each experiment of a round draws its own length
    assert len({long.fault_seconds(1003, 5.0, 60.0, n) for n in suite.ORDER}) > len(suite.ORDER) // 2
    assert float(env["CHAOS_DOWN_SECONDS"]) == min(secs, 20.0)
    assert float(env["CHAOS_LONG_PAUSE_SECONDS"]) == float(env["CHAOS_DISK_FULL_SECONDS"]) == max(secs, 8.0)
    assert env["CHAOS_CHECKER"] == "fallback" and env["CHAOS_RATE"] == "100" and env["PATH"] == "/bin"


@pytest.mark.parametrize("bad", ["5", "a:b", "0:10", "10:5", "-1:3"])
def test_parse_range_rejects_bad_ranges(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        long.parse_range(bad)


def test_parse_range_accepts_min_max() -> None:
    assert long.parse_range("5:60") == (5.0, 60.0)


@pytest.mark.parametrize("argv, text", [(["--runs", "0"], "--runs"), (["--minutes", "-1"], "--minutes"),
                                        (["--only", "no-such-experiment"], "no such experiment"),
                                        (["--fault-seconds", "9:1"], "MIN <= MAX")])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], text: str, capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        long.main([*argv, "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert text in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_keep_history_moves_the_run_under_experiment_and_run_id(tmp_path: Path) -> None:
    base = tmp_path / "r00" / "follower-kill"
    (base / "history").mkdir(parents=True)
    (base / "history" / "run.json").write_text(json.dumps({"run": "follower-kill-20261125-010203"}))
    (base / "history" / "pub-p0.jsonl").write_text("{}\n")
    run = long.keep_history(base, tmp_path / "raw", "follower-kill")
    assert run == "follower-kill-20261125-010203"
    assert (tmp_path / "raw" / "follower-kill" / run / "pub-p0.jsonl").exists()
    assert not (base / "history").exists()
    assert long.keep_history(tmp_path / "nothing", tmp_path / "raw", "x") is None


def test_every_experiment_in_order_exists_and_skip_reasons_name_the_tag(tmp_path: Path) -> None:
    for name in suite.ORDER:
        assert (suite.EXPERIMENTS_DIR / f"{name}.json").exists(), name
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"tags": ["mirrorq"]}))
    assert suite.skip_reason(plain) is None
    assert suite.skip_reason(tmp_path / "missing.json") is None


def test_resume_runs_only_the_missing_rounds_and_keeps_the_earlier_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full run takes hours: --resume picks up where OUT/runs.json ends, and every
    sitting checks all the histories kept so far."""
    ran: list[tuple[str, str]] = []
    checked: list[int] = []

    def fake_run(name: str, round_dir: Path, env: dict[str, str], timeout: float) -> dict[str, object]:
        ran.append((name, env["CHAOS_SEED"]))
        hist = round_dir / name / "history"
        hist.mkdir(parents=True)
        (hist / "run.json").write_text(json.dumps({"run": f"{name}-{env['CHAOS_SEED']}"}))
        return {"experiment": name, "verdict": "PASS", "reasons": [], "seconds": 1.0}

    def fake_check(out: Path, spark: str, timeout: float) -> tuple[int, float]:
        checked.append(len(list((out / "raw").glob("*/*"))))
        return 0, 0.1

    monkeypatch.setattr(suite, "run_one", fake_run)
    monkeypatch.setattr(suite, "skip_reason", lambda path: None)
    monkeypatch.setattr(long, "spark_check", fake_check)
    out = tmp_path / "long"
    base = ["--only", "follower-kill,leader-kill-loop", "--out", str(out)]
    assert long.main([*base, "--runs", "1"]) == 0
    assert long.main([*base, "--runs", "2", "--resume"]) == 0
    assert ran == [("follower-kill", "1000"), ("leader-kill-loop", "1000"),
                   ("follower-kill", "1001"), ("leader-kill-loop", "1001")]
    rows = json.loads((out / "runs.json").read_text())
    assert [(r["round"], r["experiment"]) for r in rows] == [
        (0, "follower-kill"), (0, "leader-kill-loop"), (1, "follower-kill"), (1, "leader-kill-loop")]
    assert all(r["commit"] and r["wall_s"] >= 0 for r in rows)
    assert checked == [2, 4]  # the second sitting checks all four histories
    # without --resume OUT starts over
    assert long.main([*base, "--runs", "1"]) == 0
    assert len(json.loads((out / "runs.json").read_text())) == 1 * 2
