"""The chaos workload against a real 3-node cluster (127.0.0.1, no namespaces) with
every queue kind of its plan: classic, TTL dead-lettering into a DLX queue, max-length
with reject-publish, priority, and a single-active-consumer quorum queue; bodies of
1 KiB..256 KiB; one publisher without a window. After ~15 s, stop_workload_and_drain:
the history shows big bodies delivered intact, expired messages delivered from the DLX
queue, publishes nacked by reject-publish, the priority and SAC queues delivered, and
the fallback checker finds nothing lost or corrupted."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaosmirrorq import actions
from chaosmirrorq.probes import fallback_check

SECONDS = 15.0


@pytest.fixture
def cluster_base(tmp_path: Path) -> Iterator[Path]:
    try:
        yield tmp_path
    finally:
        actions.stop_workload()
        actions.stop_cluster()


def _events(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(run_dir.glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def test_workload_queue_kinds_end_to_end(cluster_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("CHAOS_QUEUE_KINDS", "CHAOS_WINDOWS", "CHAOS_TTL_MS", "CHAOS_MAX_LENGTH",
              "CHAOS_MIN_SIZE", "CHAOS_MAX_SIZE", "CHAOS_SEED"):
        monkeypatch.delenv(k, raising=False)
    t0 = time.monotonic()
    actions.start_cluster(nodes=3, netns=False, base_dir=str(cluster_base), experiment="workload-queues",
                          baseline=False)
    started = actions.start_workload(rate=80, warmup=0, windows="none,100,100", ttl_ms=2000,
                                     max_length=20)
    assert started["windows"] == [None, 100, 100]
    time.sleep(SECONDS)
    res = actions.stop_workload_and_drain(heal=False)
    elapsed = time.monotonic() - t0
    run_dir = cluster_base / "history"
    evs = _events(run_dir)
    pubs = [e for e in evs if e["type"] == "publish"]
    dlvs = [e for e in evs if e["type"] == "deliver"]
    intact = {e["msg_id"] for e in dlvs if not e.get("corrupted")}
    print(f"\n{elapsed:.0f}s, drained {res['drained']}, per queue {res['queues']}")

    # bodies of mixed sizes up to 256 KiB, the big ones (several body frames) intact
    sizes = {e["msg_id"]: e["size"] for e in pubs}
    assert min(sizes.values()) < 4096 and max(sizes.values()) > 131072
    big = [m for m, n in sizes.items() if n > 131072 and m in intact]
    assert len(big) >= 10, len(big)

    # the publishers' windows, recorded on each one's first publish event and in run.json
    first = {}
    for e in pubs:
        if "window" in e:
            assert e["publisher"] not in first
            first[e["publisher"]] = e["window"]
    assert first == {"p1": None, "p2": 100, "p3": 100}
    meta = json.loads((run_dir / "run.json").read_text())
    assert {p: v["window"] for p, v in meta["workload"]["publishers"].items()} == first
    assert meta["ended"] and meta["workload_counts"]["chaos-maxlen"]["nack"] > 0
    kinds = {q["name"]: q["kind"] for q in meta["workload"]["queues"]}
    assert sorted(kinds.values()) == ["classic", "classic", "dlx", "maxlen", "priority", "sac", "ttl"]

    by_q: dict[str, set[str]] = {}
    for e in dlvs:
        by_q.setdefault(e["queue"], set()).add(e["msg_id"])
    pub_q = {e["msg_id"]: e["queue"] for e in pubs}
    # expired TTL messages were dead-lettered and delivered from the DLX queue, same id
    dead = [e for e in dlvs if e["queue"] == "chaos-dlq"]
    assert dead and all(e.get("dead_lettered") == "expired" for e in dead)
    assert all(pub_q[e["msg_id"]] == "chaos-ttl" for e in dead)
    # reject-publish: nacked, only on the max-length queue, and not counted as lost
    nacked = [e for e in pubs if e["outcome"] == "nack"]
    assert nacked and {e["queue"] for e in nacked} == {"chaos-maxlen"}
    # every kind delivered (the priority and SAC queues too), consumers and drain
    for q in ("chaos-a", "chaos-b", "chaos-ttl", "chaos-maxlen", "chaos-prio", "chaos-sac", "chaos-dlq"):
        assert by_q.get(q), q
    assert len(by_q["chaos-prio"]) > 100 and len(by_q["chaos-sac"]) > 100
    assert {e["consumer"] for e in dlvs if e["queue"] == "chaos-sac" and e["phase"] == "workload"}
    assert sum(1 for e in evs if e["type"] == "settle" and e["action"] == "nack-requeue") > 0
    assert any(e["type"] == "drain_done" for e in evs)

    rep = fallback_check(run_dir)
    assert rep["drained"] and rep["lost"] == 0 and rep["corrupted"] == 0 and rep["unexpected"] == 0, rep
    assert rep["confirmed"] > 1000
    assert rep["published_ids"] - rep["confirmed"] >= len(nacked)
