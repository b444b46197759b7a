"""The PySpark history checker (chaos/analysis/check_history.py) on histories with
known answers, its exit codes and chart, and the synthetic generator."""
from __future__ import annotations

import json
import math
import runpy
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.history import (
    ANALYSIS,
    T,
    clean_events,
    dlv,
    drain,
    fault,
    pub,
    settle,
    write_run,
)
from tests.support.history import load_analysis as _load

pytest.importorskip("pyspark")
pytest.importorskip("matplotlib")
if shutil.which("java") is None:
    pytest.skip("Spark needs java on PATH", allow_module_level=True)

ch = _load("check_history")
gh = _load("generate_history")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics_events(run: str) -> tuple[list[dict], list[dict]]:
    """Two files (a publisher's and a consumer's) covering every definition."""
    p = [
        pub(run, "m1", T + 1),                                    # confirmed, delivered
        pub(run, "m2", T + 2),                                    # confirmed, never delivered: LOST
        pub(run, "m3", T + 3, "timeout", None, seq=3),            # uncertain ...
        pub(run, "m3", T + 4, "ack", seq=4),                      # ... republished: enqueued twice
        pub(run, "m4", T + 5, "nack"),                            # nacked but delivered: recovered
        pub(run, "m5", T + 6, "timeout", 5.0),                    # uncertain twice, delivered: recovered
        pub(run, "m5", T + 11, "connection-lost", None),
        pub(run, "m6", T + 7, "nack"),                            # nacked, not delivered: fine
        pub(run, "m7", T + 8),                                    # one redelivery
        pub(run, "m8", T + 9),                                    # two redeliveries
        pub(run, "m9", T + 10),                                   # only a redelivered delivery seen
    ]
    c = [
        dlv(run, "m1", T + 1.1), settle(run, "m1", T + 1.2),
        dlv(run, "m3", T + 3.5), settle(run, "m3", T + 3.6),
        dlv(run, "m3", T + 4.5), settle(run, "m3", T + 4.6),      # second redelivered=false: duplicate
        dlv(run, "m4", T + 5.5), settle(run, "m4", T + 5.6),
        dlv(run, "m5", T + 12, phase="drain"), settle(run, "m5", T + 12.1),
        dlv(run, "m7", T + 8.1), settle(run, "m7", T + 8.2, "nack-requeue"),
        dlv(run, "m7", T + 8.3, True), settle(run, "m7", T + 8.4),
        dlv(run, "m8", T + 9.1), settle(run, "m8", T + 9.2, "crash"),
        dlv(run, "m8", T + 9.5, True), settle(run, "m8", T + 9.6, "crash"),
        dlv(run, "m8", T + 9.9, True), settle(run, "m8", T + 9.95),
        dlv(run, "m9", T + 10.5, True), settle(run, "m9", T + 10.6),
        dlv(run, "ghost1", T + 6.5), settle(run, "ghost1", T + 6.6),  # never published: UNEXPECTED
        drain(run, T + 20),
    ]
    return p, c


def corrupted_events(run: str) -> list[dict]:
    """Bodies that failed the consumer's checksum (deliver `corrupted: true`)."""
    return [
        pub(run, "k1", T + 1), dlv(run, "k1", T + 1.1, corrupted=False),      # intact
        pub(run, "k2", T + 2), dlv(run, "k2", T + 2.1, corrupted=True),       # only a damaged copy: LOST + CORRUPTED
        settle(run, "k2", T + 2.2),
        pub(run, "k3", T + 3), dlv(run, "k3", T + 3.1, corrupted=True),       # damaged, then intact: CORRUPTED
        settle(run, "k3", T + 3.2, "nack-requeue"),
        dlv(run, "k3", T + 3.3, True, corrupted=False),
        pub(run, "k4", T + 4, "nack"), dlv(run, "k4", T + 4.1, corrupted=True),  # not confirmed, damaged: CORRUPTED
        pub(run, "k5", T + 5), dlv(run, "k5", T + 5.1),                       # no field: intact
        drain(run, T + 10),
    ]


def corruption_fault_events(run: str) -> list[dict]:
    """Two corruption windows (issue 29's names); a confirmed body delivered damaged
    only, inside the first."""
    evs: list[dict] = [fault(run, "corrupt-bitflip-segment-stopped n3", T + 10, T + 20),
                       fault(run, "corrupt-rollback-snapshot-running n2", T + 30, T + 40)]
    for i in range(45):
        evs += [pub(run, f"ok{i}", T + i), dlv(run, f"ok{i}", T + i + 0.5)]
    return evs + [pub(run, "bad", T + 12.2), dlv(run, "bad", T + 13, corrupted=True), drain(run, T + 60)]


def phase_events(run: str) -> list[dict]:
    """Faults [10, 20] (+ an overlapping [12, 15]) and [30, 40]; publishes span [0, 60]."""
    evs: list[dict] = [
        fault(run, "kill-leader n1", T + 10, T + 20),
        fault(run, "pause n2", T + 12, T + 15),
        fault(run, "partition n3", T + 30, T + 40),
    ]
    # before: 100 publishes in [0, 9.9), latencies 1..100 ms (in a scrambled order)
    for i in range(100):
        lat_ms = (i * 37) % 100 + 1
        evs.append(pub(run, f"b{i}", T + i * 0.099, lat=lat_ms / 1000))
    # during: 10 in the first window (from its start, inclusive), 10 acked + 1 nack in the second
    for i in range(10):
        evs.append(pub(run, f"d{i}", T + 10 + i, lat=1.0 + i / 1000))
    for i in range(10):
        evs.append(pub(run, f"e{i}", T + 30.5 + i * 0.5, lat=2.0))
    evs.append(pub(run, "dn", T + 40.0, "nack", 0.5))
    # between the windows: 5
    for i in range(5):
        evs.append(pub(run, f"g{i}", T + 25 + i * 0.1, lat=0.010))
    # after: 20 in (40, 60]
    for i in range(20):
        evs.append(pub(run, f"a{i}", T + 41 + i, lat=0.002))
    for e in list(evs):
        if e["type"] == "publish":
            evs.append(dlv(run, e["msg_id"], e["send_ts"] + 3))
    return evs + [drain(run, T + 70)]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    s = ch.make_spark()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("runs")
    p, c = metrics_events("metrics")
    dirs = {
        "clean": write_run(base, "clean", {"w1.jsonl": clean_events("clean")}),
        "metrics": write_run(base, "metrics", {"pub-1.jsonl": p, "cons-1.jsonl": c}),
        "phases": write_run(base, "phases", {"all.jsonl": phase_events("phases")}),
        "corrupted": write_run(base, "corrupted", {"w.jsonl": corrupted_events("corrupted")}),
        "corruptfaults": write_run(base, "corruptfaults", {"w.jsonl": corruption_fault_events("corruptfaults")}),
        "nofault": write_run(base, "nofault", {"w.jsonl": [pub("nofault", "x", T), pub("nofault", "y", T + 4, lat=0.003),
                                                          dlv("nofault", "x", T + 1), dlv("nofault", "y", T + 5)]},
                             meta=False),
        "missing": str(base / "does-not-exist"),
    }
    return dirs


@pytest.fixture(scope="module")
def parquet_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The `metrics` run, half as Parquet (written by Spark) and half as JSONL."""
    base = tmp_path_factory.mktemp("pq")
    p, c = metrics_events("pq")
    d = write_run(base, "pq", {"cons.jsonl": c})
    rows = [{f: e.get(f) for f in ch.SCHEMA.fieldNames()} for e in p]
    spark.createDataFrame(rows, ch.SCHEMA).coalesce(1).write.parquet(d + "/pubs.parquet")
    return d


@pytest.fixture(scope="module")
def report(spark: Any, runs_dir: dict[str, str], parquet_run: str) -> dict[str, Any]:
    """One Spark analysis of all the hand-written runs together (multi-run input)."""
    dirs = [runs_dir[k] for k in ("clean", "metrics", "phases", "nofault", "corrupted",
                                         "corruptfaults")] + [parquet_run]
    rep, chart = ch.analyze(spark, dirs)
    rep["_chart"] = chart
    return rep


# --------------------------------------------------------------------------- metrics


def test_clean_run(report: dict) -> None:
    r = report["runs"]["clean"]
    assert (r["confirmed"], r["lost"], r["duplicates"], r["unexpected"], r["recovered"], r["redeliveries"]) == (3, 0, 0, 0, 0, 0)
    assert r["ok"] and r["drained"] and r["lost_ids"] == [] and r["warnings"] == []
    assert r["corrupted"] == 0 and r["corrupted_deliveries"] == 0 and r["corrupted_ids"] == []
    assert r["experiment"] == "unit"


def test_every_definition(report: dict) -> None:
    r = report["runs"]["metrics"]
    assert r["confirmed"] == 6            # m1 m2 m3 m7 m8 m9
    assert r["lost"] == 1 and r["lost_ids"] == ["m2"]
    assert r["duplicates"] == 1           # m3 (m8's redeliveries are not duplicates)
    assert r["unexpected"] == 1 and r["unexpected_ids"] == ["ghost1"]
    assert r["recovered"] == 2            # m4 (nack), m5 (timeout + connection-lost)
    assert r["redeliveries"] == 4         # m7 once, m8 twice, m9 once
    assert r["published_ids"] == 9 and r["delivered_ids"] == 8
    assert r["publish_outcomes"] == {"ack": 6, "nack": 2, "timeout": 2, "connection-lost": 1}
    assert r["settle_actions"] == {"ack": 9, "nack-requeue": 1, "crash": 2}
    assert r["events"]["publish"] == 11 and r["events"]["deliver"] == 12
    assert r["corrupted"] == 0                # histories without the field: nothing corrupted
    assert not r["ok"] and not report["ok"]


def test_corrupted_bodies_fail_the_run(report: dict) -> None:
    r = report["runs"]["corrupted"]
    assert r["corrupted"] == 3 and r["corrupted_ids"] == ["k2", "k3", "k4"]
    assert r["corrupted_deliveries"] == 3
    # a damaged copy does not deliver a message: k2 (confirmed, only damaged) is lost too
    assert r["lost"] == 1 and r["lost_ids"] == ["k2"]
    assert r["confirmed"] == 4 and r["unexpected"] == 0 and r["duplicates"] == 0
    assert r["recovered"] == 1 and r["redeliveries"] == 1 and r["delivered_ids"] == 5
    assert not r["ok"]


def test_parquet_and_jsonl_in_one_run(report: dict) -> None:
    a, b = report["runs"]["pq"], report["runs"]["metrics"]
    for k in ("confirmed", "lost", "duplicates", "unexpected", "recovered", "redeliveries", "lost_ids", "events"):
        assert a[k] == b[k], k


def test_phases_windows_counts_and_rates(report: dict) -> None:
    r = report["runs"]["phases"]
    ph = r["phases"]
    assert [f["name"] for f in r["faults"]] == ["kill-leader n1", "pause n2", "partition n3"]
    assert {p: ph[p]["publishes"] for p in ph} == {"before": 100, "during": 21, "after": 20, "between": 5}
    assert {p: ph[p]["acks"] for p in ph} == {"before": 100, "during": 20, "after": 20, "between": 5}
    # publish span [T, T+60]; windows [10, 20] (the overlapping [12, 15] merged) and [30, 40]
    assert {p: ph[p]["seconds"] for p in ph} == {"before": 10.0, "during": 20.0, "after": 20.0, "between": 10.0}
    assert ph["before"]["publishes_per_s"] == 10.0 and ph["before"]["acks_per_s"] == 10.0
    assert ph["during"]["publishes_per_s"] == 1.05 and ph["during"]["acks_per_s"] == 1.0
    assert ph["after"]["acks_per_s"] == 1.0 and ph["between"]["acks_per_s"] == 0.5
    assert ph["before"]["from_ts"] == T and ph["before"]["to_ts"] == T + 10
    assert ph["after"]["from_ts"] == T + 40 and ph["after"]["to_ts"] == T + 60


def test_each_fault_on_its_own(report: dict) -> None:
    fs = report["runs"]["phases"]["faults"]
    assert [(f["publishes"], f["acks"], f["seconds"]) for f in fs] == [(10, 10, 10.0), (4, 4, 3.0), (11, 10, 10.0)]
    assert fs[1]["confirm_latency_ms"]["p50"] == pytest.approx(1003.0)  # sent at 12..15 s: 1002..1005 ms
    assert fs[2]["confirm_latency_ms"]["p99"] == pytest.approx(2000.0)
    assert fs[0]["publishes_per_s"] == 1.0


def test_latency_percentiles_per_phase(report: dict) -> None:
    ph = report["runs"]["phases"]["phases"]
    # nearest rank over 1..100 ms
    assert ph["before"]["confirm_latency_ms"] == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
    # 1000..1009 ms and ten of 2000 ms (the nack has no latency)
    assert ph["during"]["confirm_latency_ms"]["p50"] == pytest.approx(1009.0)
    assert ph["during"]["confirm_latency_ms"]["p99"] == pytest.approx(2000.0)
    assert ph["after"]["confirm_latency_ms"]["p50"] == pytest.approx(2.0)
    assert ph["between"]["confirm_latency_ms"]["p95"] == pytest.approx(10.0)


def test_no_faults_is_all_before(report: dict) -> None:
    r = report["runs"]["nofault"]
    ph = r["phases"]
    assert ph["before"]["publishes"] == 2 and ph["before"]["seconds"] == 4.0
    assert ph["during"]["publishes"] == 0 and ph["after"]["publishes"] == 0 and "between" not in ph
    assert ph["before"]["confirm_latency_ms"]["p50"] == pytest.approx(3.0)
    assert ph["before"]["confirm_latency_ms"]["p99"] == pytest.approx(5.0)
    # no run.json: the directory names the run; no drain_done: a warning
    assert any("run.json" in w for w in r["warnings"]) and any("drain_done" in w for w in r["warnings"])


def test_chart_buckets_computed(report: dict) -> None:
    cr = next(c for c in report["_chart"]["runs"] if c["run"] == "phases")
    assert cr["bucket_s"] == 1.0
    assert sum(v for _, v in cr["publish"]) == 146          # publishes per 1 s bucket, summed
    assert sum(v for _, v in cr["confirm"]) == 145          # acks, by outcome_ts
    assert [round(s) for s, _, _ in cr["faults"]] == [10, 12, 30]
    first = dict(cr["publish"])[0.0]
    assert first == 11                                      # send_ts in [T, T+1): i*0.099 for i=0..10


# --------------------------------------------------------------------------- pure helpers


def test_merge_windows_and_open_fault() -> None:
    assert ch.merge_windows([(5, 6), (1, 3), (2, 4)]) == [(1, 4), (5, 6)]
    m = ch.merge_windows([(10, 20), (15, None)])
    assert m == [(10, math.inf)]
    spans = ch.phase_spans(m, 0.0, 30.0)
    assert spans["before"]["seconds"] == 10 and spans["during"]["seconds"] == 20
    assert spans["after"]["seconds"] == 0 and spans["between"]["seconds"] == 0


# --------------------------------------------------------------------------- CLI (in-process)


def test_cli_clean_exit_0_with_report_and_chart(spark: Any, runs_dir: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out, png = tmp_path / "r.json", tmp_path / "c.png"
    rc = ch.main([runs_dir["clean"], runs_dir["phases"], "--out", str(out), "--chart", str(png)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["ok"] is True and set(rep["runs"]) == {"clean", "phases"}
    assert json.loads(capsys.readouterr().out) == rep
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


def test_cli_lost_exit_1(spark: Any, runs_dir: dict, tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "c.png"
    assert ch.main([runs_dir["clean"], runs_dir["metrics"], "--out", str(out), "--chart", str(png)]) == 1
    rep = json.loads(out.read_text())
    assert rep["ok"] is False and rep["runs"]["clean"]["ok"] and not rep["runs"]["metrics"]["ok"]
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_cli_unexpected_alone_exit_1(spark: Any, tmp_path: Path) -> None:
    d = write_run(tmp_path, "u", {"a.jsonl": clean_events("u") + [dlv("u", "stray", T + 1)]})
    assert ch.main([d, "--out", str(tmp_path / "r.json")]) == 1
    r = json.loads((tmp_path / "r.json").read_text())["runs"]["u"]
    assert (r["lost"], r["unexpected"], r["unexpected_ids"]) == (0, 1, ["stray"])


def test_cli_corrupted_alone_exit_1(spark: Any, tmp_path: Path) -> None:
    """A damaged body fails the check like a lost message, even when a later intact
    delivery means nothing is lost."""
    evs = clean_events("k") + [pub("k", "k9", T + 1), dlv("k", "k9", T + 1.1, corrupted=True),
                               dlv("k", "k9", T + 1.3, True, corrupted=False)]
    d = write_run(tmp_path, "k", {"a.jsonl": evs})
    assert ch.main([d, "--out", str(tmp_path / "r.json")]) == 1
    rep = json.loads((tmp_path / "r.json").read_text())
    r = rep["runs"]["k"]
    assert (r["lost"], r["unexpected"], r["corrupted"], r["corrupted_ids"]) == (0, 0, 1, ["k9"])
    assert rep["ok"] is False and r["ok"] is False


BAD_LINES = {
    "not-json": ["{not json"],
    "wrong-type": [json.dumps(pub("bad", "x", T) | {"send_ts": "yesterday"})],
    "bad-outcome": [json.dumps(pub("bad", "x", T, "maybe"))],
    "corrupted-not-bool": [json.dumps(dlv("bad", "c0", T + 1) | {"corrupted": "yes"})],
    "no-msg-id": [json.dumps({k: v for k, v in pub("bad", "x", T).items() if k != "msg_id"})],
    "unknown-type": [json.dumps({"type": "publsh", "run": "bad", "msg_id": "x"})],
    "fault-ends-before-start": [json.dumps(fault("bad", "f", T + 5, T + 1))],
    "other-run": [json.dumps(pub("other", "y", T))],
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_cli_bad_input_exit_2(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture, case: str) -> None:
    d = write_run(tmp_path, "bad", {"a.jsonl": clean_events("bad") + BAD_LINES[case]})
    assert ch.main([d, "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("check_history: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "r.json").exists()


def test_cli_no_input_exit_2(spark: Any, runs_dir: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert ch.main([runs_dir["missing"], "--out", str(tmp_path / "r.json")]) == 2
    assert "no *.jsonl or *.parquet" in capsys.readouterr().err
    empty = write_run(tmp_path, "empty", {"a.jsonl": [drain("empty", T)]})
    assert ch.main([empty, "--out", str(tmp_path / "r.json")]) == 2
    assert "no publish events" in capsys.readouterr().err


# --------------------------------------------------------------------------- generator


def test_generator_deterministic_and_worker_independent(tmp_path: Path) -> None:
    a = gh.generate(gh.Params(out=str(tmp_path / "a"), events=6000, seed=5, lost=3, unexpected=1, workers=1))
    b = gh.generate(gh.Params(out=str(tmp_path / "b"), events=6000, seed=5, lost=3, unexpected=1, workers=2))
    assert a == b | {"params": a["params"]}
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name
    c = gh.generate(gh.Params(out=str(tmp_path / "c"), events=6000, seed=6))
    assert c["confirmed"] != a["confirmed"] or c["duplicates"] != a["duplicates"]


@pytest.mark.slow
def test_generated_200k_injected_lost_found_exactly(spark: Any, tmp_path: Path) -> None:
    exp = gh.generate(gh.Params(out=str(tmp_path / "g"), events=200_000, seed=11, lost=13, unexpected=4, faults=4))
    assert exp["events"] >= 200_000
    rep, chart = ch.analyze(spark, [str(tmp_path / "g")])
    r = rep["runs"][exp["run"]]
    for k in ("confirmed", "lost", "duplicates", "unexpected", "recovered", "redeliveries"):
        assert r[k] == exp[k], k
    assert sorted(r["lost_ids"]) == exp["lost_ids"] and len(exp["lost_ids"]) == 13
    assert sorted(r["unexpected_ids"]) == sorted(exp["unexpected_ids"])
    assert sum(r["events"].values()) == exp["events"]
    assert r["duplicates"] > 0 and r["recovered"] > 0 and r["redeliveries"] > 0
    ph = r["phases"]
    assert sum(p["publishes"] for p in ph.values()) == exp["publishes"]
    assert ph["during"]["confirm_latency_ms"]["p99"] > 10 * ph["before"]["confirm_latency_ms"]["p99"]
    ch.render_chart(chart, str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC


def test_script_entry_point(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The file run as __main__ (sys.exit(main())): exit status 1 on a lost message,
    the report as JSON on stdout. In-process, on the shared session: a separate
    `python check_history.py` costs a JVM start (see chaos/analysis/README.md)."""
    p, c = metrics_events("sub")
    d = write_run(tmp_path, "sub", {"p.jsonl": p, "c.jsonl": c})
    argv = [str(ANALYSIS / "check_history.py"), d, "--out", str(tmp_path / "r.json"), "--chart", str(tmp_path / "c.png")]
    old = sys.argv
    sys.argv = argv
    try:
        with pytest.raises(SystemExit) as exc:
            runpy.run_path(argv[0], run_name="__main__")
    finally:
        sys.argv = old
    assert exc.value.code == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["runs"]["sub"]["lost_ids"] == ["m2"] and rep["ok"] is False
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC


# --------------------------------------------------------------------------- verdicts per window, datasets


def window_events(run: str) -> list[dict]:
    """Faults [10, 20] and [30, 40]; one verdict of each kind placed in a known phase."""
    evs: list[dict] = [fault(run, "kill-leader n1", T + 10, T + 20), fault(run, "partition n3", T + 30, T + 40)]
    for i in range(50):  # steady background, all delivered
        evs += [pub(run, f"ok{i}", T + i), dlv(run, f"ok{i}", T + i + 0.5)]
    evs += [
        pub(run, "lost1", T + 12.3),                                          # during window 1: lost
        dlv(run, "ghost", T + 15.05),                                         # window 1: unexpected
        pub(run, "dup1", T + 35.2), dlv(run, "dup1", T + 36), dlv(run, "dup1", T + 37),  # window 2: duplicate
        pub(run, "rec1", T + 5.4, "nack"), dlv(run, "rec1", T + 6),           # before: recovered
        pub(run, "bad1", T + 45.1), dlv(run, "bad1", T + 46, corrupted=True),  # after: corrupted ...
        dlv(run, "bad1", T + 47, True, corrupted=False),                      # ... then intact: not lost
        drain(run, T + 60),
    ]
    return evs


def test_verdicts_per_fault_window_and_per_phase(spark: Any, tmp_path: Path) -> None:
    d = write_run(tmp_path, "w", {"a.jsonl": window_events("w")})
    rep, _ = ch.analyze(spark, [d])
    r = rep["runs"]["w"]
    zero = dict.fromkeys(ch.VERDICTS, 0)
    assert (r["lost"], r["unexpected"], r["duplicates"], r["recovered"], r["corrupted"]) == (1, 1, 1, 1, 1)
    assert [f["verdicts"] for f in r["faults"]] == [zero | {"lost": 1, "unexpected": 1}, zero | {"duplicates": 1}]
    ph = r["phases"]
    assert ph["before"]["verdicts"] == zero | {"recovered": 1}
    assert ph["during"]["verdicts"] == zero | {"lost": 1, "unexpected": 1, "duplicates": 1}
    assert ph["after"]["verdicts"] == zero | {"corrupted": 1}
    assert ph["between"]["verdicts"] == zero
    e = rep["experiments"]["unit"]
    assert (e["runs"], e["lost"], e["corrupted"], e["ok"]) == (1, 1, 1, False)
    assert e["confirm_p99_ms_in_faults"] is not None and e["confirm_p99_ms_outside_faults"] is not None


def test_stall_seconds_counts_buckets_below_a_tenth_of_the_rate_before() -> None:
    acks = [(float(i), 100.0) for i in range(10)] + [(10.0, 5.0), (11.0, 0.0), (13.0, 50.0), (14.0, 100.0)]
    # 10, 11 and the missing 12 are below 10 acks/s: a 3 s stall; nothing before the start counts
    assert ch.stall_seconds(acks, 1.0, 100.0, 9.5, 12.0, 14.0) == 3.0
    assert ch.stall_seconds(acks, 1.0, 100.0, 0.0, 5.0, 9.0) == 0.0
    assert ch.stall_seconds(acks, 1.0, None, 0.0, 5.0, 9.0) is None


lr = _load("long_report")


def test_long_report_one_dataset_partitioned_by_experiment_and_run(spark: Any, tmp_path: Path) -> None:
    """RAW/<experiment>/<run>/ -> Parquet partitioned by experiment and run, a run split
    over several Parquet files, one check: per-run figures equal the JSONL check's,
    per-experiment sums, the Markdown table and one chart per experiment."""
    raw = tmp_path / "raw"
    p, c = metrics_events("m")
    write_run(raw / "alpha", "a1", {"w1.jsonl": clean_events("a1")[:3], "w2.jsonl": clean_events("a1")[3:]})
    write_run(raw / "alpha", "w", {"x.jsonl": window_events("w")[:60], "y.jsonl": window_events("w")[60:]})
    write_run(raw / "beta", "m", {"p.jsonl": p, "c.jsonl": c})
    conf = spark.sparkContext.getConf()
    old = {k: spark.conf.get(k) for k in ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")}
    spark.conf.set("spark.sql.files.maxPartitionBytes", "512")  # one input split per file at least
    spark.conf.set("spark.sql.files.openCostInBytes", "512")
    try:
        ds, out, md, charts = tmp_path / "ds", tmp_path / "r.json", tmp_path / "r.md", tmp_path / "charts"
        rc = lr.main([str(raw), "--dataset", str(ds), "--out", str(out), "--md", str(md), "--charts", str(charts)])
    finally:
        for k, v in old.items():
            spark.conf.set(k, v)
    assert conf is not None
    assert rc == 1  # beta/m lost one, alpha/w too
    parts = sorted(x.relative_to(ds).parts[:2] for x in ds.rglob("*.parquet"))
    assert set(parts) == {("experiment=alpha", "run=a1"), ("experiment=alpha", "run=w"), ("experiment=beta", "run=m")}
    assert parts.count(("experiment=alpha", "run=w")) > 1  # a run in several files
    rep = json.loads(out.read_text())
    ref, _ = ch.analyze(spark, [str(raw / "beta" / "m"), str(raw / "alpha" / "w")])
    for run in ("m", "w"):
        for k in ("confirmed", "lost", "duplicates", "unexpected", "recovered", "redeliveries", "corrupted",
                  "lost_ids", "events"):
            assert rep["runs"][run][k] == ref["runs"][run][k], (run, k)
    assert rep["runs"]["a1"]["ok"] and rep["runs"]["a1"]["experiment"] == "alpha"
    assert [f["verdicts"]["lost"] for f in rep["runs"]["w"]["faults"]] == [1, 0]
    a, b = rep["experiments"]["alpha"], rep["experiments"]["beta"]
    assert (a["runs"], a["confirmed"], a["lost"], a["corrupted"], a["ok"]) == (2, 3 + 53, 1, 1, False)
    assert (b["runs"], b["lost"], b["unexpected"], b["duplicates"]) == (1, 1, 1, 1)
    text = md.read_text()
    assert "| alpha | 2 | 56 | 1 |" in text and "| beta | 1 |" in text and "kill-leader" in text
    for exp in ("alpha", "beta"):
        assert (charts / f"{exp}.png").read_bytes()[:8] == PNG_MAGIC


def test_long_report_bad_line_is_exit_2(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    raw = tmp_path / "raw"
    write_run(raw / "alpha", "b", {"a.jsonl": clean_events("b") + ["{not json"]})
    rc = lr.main([str(raw), "--dataset", str(tmp_path / "ds"), "--out", str(tmp_path / "r.json")])
    assert rc == 2
    assert "malformed" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_dead_lettered_copy_is_not_a_duplicate_but_two_plain_first_deliveries_are(spark: Any, tmp_path: Path) -> None:
    """An expired message is delivered again from the DLX queue with the same msg_id
    (`dead_lettered: "expired"`): delivered, not duplicated. Two first deliveries from
    the same kind of queue still are."""
    run = "dl"
    evs = clean_events(run) + [
        pub(run, "t1", T + 1), dlv(run, "t1", T + 1.5), settle(run, "t1", T + 1.6, "nack-requeue"),
        dlv(run, "t1", T + 5, phase="drain") | {"dead_lettered": "expired", "queue": "chaos-dlq"},  # expired
        pub(run, "t2", T + 2), dlv(run, "t2", T + 6) | {"dead_lettered": "expired"},  # only the DLX copy
        pub(run, "d1", T + 3), dlv(run, "d1", T + 3.1), dlv(run, "d1", T + 3.2),      # a real duplicate
        pub(run, "d2", T + 4), dlv(run, "d2", T + 7) | {"dead_lettered": "expired"},
        dlv(run, "d2", T + 8) | {"dead_lettered": "expired"},                         # two DLX copies
    ]
    d = write_run(tmp_path, run, {"a.jsonl": evs})
    rep, _ = ch.analyze(spark, [d])
    r = rep["runs"][run]
    assert (r["lost"], r["duplicates"], r["unexpected"]) == (0, 2, 0)
    assert r["ok"]


def test_corruption_faults_get_verdicts_and_rows_of_their_own(report: dict) -> None:
    """Issue 29's kinds (chaosmirrorq.corruption names its windows `corrupt-<fault>-<file
    kind>-<mode> <node>`): a body damaged inside such a window is `corrupted` (and lost:
    no intact copy) in that window's verdicts, fails the run, and the per-kind table
    has a row for each kind."""
    r = report["runs"]["corruptfaults"]
    zero = dict.fromkeys(ch.VERDICTS, 0)
    assert [f["verdicts"] for f in r["faults"]] == [zero | {"corrupted": 1, "lost": 1}, zero]
    assert r["corrupted_ids"] == ["bad"] and not r["ok"] and not report["ok"]
    one = {"runs": {"corruptfaults": r}}
    lines = lr.fault_table(one).splitlines()
    head = [x.strip() for x in lines[0].strip("|").split("|")]
    rows = {cells[0]: dict(zip(head, cells, strict=True))
            for cells in ([x.strip() for x in ln.strip("|").split("|")] for ln in lines[2:])}
    assert set(rows) == {"corrupt-bitflip-segment-stopped", "corrupt-rollback-snapshot-running"}
    bitflip = rows["corrupt-bitflip-segment-stopped"]
    assert (bitflip["windows"], bitflip["corrupted"], bitflip["lost"]) == ("1", "1", "1")
    assert rows["corrupt-rollback-snapshot-running"]["corrupted"] == "0"
