"""Histories for the checker's tests: event builders (publish, deliver, settle, fault,
drain) at a fixed epoch T, a run directory writer, and a loader for the scripts of
chaos/analysis (not a package: loaded by path)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = ROOT / "chaos" / "analysis"


def load_analysis(name: str) -> ModuleType:
    """chaos/analysis/NAME.py as module NAME, loaded once: a second load would
    replace sys.modules[NAME] and the first loader's functions could no longer
    be pickled to multiprocessing workers (generate_history's pool)."""
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(ANALYSIS / f"{name}.py"):
        return loaded
    spec = importlib.util.spec_from_file_location(name, ANALYSIS / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod



T = 1_700_000_000.0


def pub(run: str, mid: str, send: float, outcome: str = "ack", lat: float | None = 0.005, seq: int = 1) -> dict:
    return {
        "type": "publish", "run": run, "msg_id": mid, "publisher": "p0", "seq": seq, "node": "n1",
        "send_ts": send, "outcome": outcome, "outcome_ts": None if lat is None else send + lat,
    }


def dlv(run: str, mid: str, ts: float, redelivered: bool = False, phase: str = "workload",
        corrupted: bool | None = None) -> dict:
    e = {"type": "deliver", "run": run, "msg_id": mid, "consumer": "c0", "node": "n2",
         "redelivered": redelivered, "ts": ts, "phase": phase}
    if corrupted is not None:  # the workload writes it on every delivery; older histories lack it
        e["corrupted"] = corrupted
    return e


def settle(run: str, mid: str, ts: float, action: str = "ack") -> dict:
    return {"type": "settle", "run": run, "msg_id": mid, "consumer": "c0", "node": "n2", "ts": ts, "action": action}


def fault(run: str, name: str, start: float, end: float | None) -> dict:
    return {"type": "fault", "run": run, "name": name, "start_ts": start, "end_ts": end}


def drain(run: str, ts: float) -> dict:
    return {"type": "drain_done", "run": run, "ts": ts}


def write_run(base: Path, run: str, files: dict[str, list[Any]], meta: bool = True) -> str:
    """files: name -> events (dicts, or raw str lines)."""
    d = base / run
    d.mkdir(parents=True)
    if meta:
        (d / "run.json").write_text(json.dumps({"run": run, "experiment": "unit", "started": T, "ended": T + 100}))
    for name, events in files.items():
        with open(d / name, "w") as f:
            for e in events:
                f.write((e if isinstance(e, str) else json.dumps(e)) + "\n")
    return str(d)


def clean_events(run: str) -> list[dict]:
    evs: list[dict] = []
    for i in range(3):
        evs += [pub(run, f"c{i}", T + i), dlv(run, f"c{i}", T + i + 0.1), settle(run, f"c{i}", T + i + 0.2)]
    return evs + [drain(run, T + 10)]
