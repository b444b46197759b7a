"""The chaos workload's pure parts: queue plan and its declare arguments, publish
weights, publisher windows, x-death parsing, multi-frame bodies, and the fallback
history checker's verdicts for reject-publish nacks and dead-lettered deliveries."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from chaosmirrorq.probes import fallback_check
from chaosmirrorq.workload import (
    DEFAULT_MAX_SIZE,
    DLX_EXCHANGE,
    DLX_ROUTING_KEY,
    KINDS,
    QueueSpec,
    check_body,
    death_reason,
    parse_kinds,
    parse_windows,
    plan_summary,
    publish_cycle,
    queue_plan,
)
from pamqp import frame as pframe
from pamqp.body import ContentBody

from harness.body import RandomBodies, body_frames


def test_parse_kinds() -> None:
    assert parse_kinds(None) == list(KINDS)
    assert parse_kinds("") == list(KINDS)
    assert parse_kinds("classic") == [] and parse_kinds("none") == []
    assert parse_kinds("sac, TTL") == ["ttl", "sac"]  # KINDS order
    with pytest.raises(ValueError, match="unknown queue kind"):
        parse_kinds("ttl,stream")


def test_parse_windows() -> None:
    assert parse_windows(None, 3, 100) == [None, 100, 100]
    assert parse_windows("", 1, 50) == [None]
    assert parse_windows("none,100,100", 3) == [None, 100, 100]
    assert parse_windows("unbounded,0,inf,20", 4) == [None, None, None, 20]
    assert parse_windows("none,30", 5) == [None, 30, None, 30, None]  # repeats
    assert parse_windows([None, 7], 2) == [None, 7]
    with pytest.raises(ValueError):
        parse_windows("-1", 2)
    with pytest.raises(ValueError):
        parse_windows("lots", 2)


def test_queue_plan_arguments_and_consumers() -> None:
    plan = queue_plan(["chaos-a", "chaos-b"], kinds=KINDS, consumers=3, crash_every=150,
                      ttl_ms=2500, max_length=40, max_priority=9)
    by = {q.kind: q for q in plan}
    assert [q.name for q in plan] == ["chaos-a", "chaos-b", "chaos-ttl", "chaos-dlq", "chaos-maxlen",
                                      "chaos-prio", "chaos-sac"]
    assert by["ttl"].arguments == {"x-message-ttl": 2500, "x-dead-letter-exchange": DLX_EXCHANGE,
                                   "x-dead-letter-routing-key": DLX_ROUTING_KEY}
    assert by["dlx"].bind == (DLX_EXCHANGE, DLX_ROUTING_KEY) and by["dlx"].weight == 0
    assert by["dlx"].drain_after == ("chaos-ttl",)
    assert by["maxlen"].arguments == {"x-max-length": 40, "x-overflow": "reject-publish"}
    assert by["priority"].arguments == {"x-max-priority": 9} and by["priority"].priorities == 9
    assert by["sac"].arguments == {"x-queue-type": "quorum", "x-single-active-consumer": True,
                                  "x-delivery-limit": -1}
    # classic consumers: 3 over 2 queues, the last a crasher
    classic = [c for q in plan if q.kind == "classic" for c in q.consumers]
    assert len(classic) == 3 and [c.crash_every for c in classic].count(150) == 1
    assert [len(plan[0].consumers), len(plan[1].consumers)] == [2, 1]
    # the ttl consumer stalls longer than the TTL (messages expire), and crashes
    (ttl_c,) = by["ttl"].consumers
    assert ttl_c.stall_seconds > 2.5 and ttl_c.stall_every > ttl_c.stall_seconds and ttl_c.crash_every
    (ml_c,) = by["maxlen"].consumers
    assert ml_c.stall_seconds > 0
    for k in ("priority", "sac"):
        assert len(by[k].consumers) == 2 and sum(1 for c in by[k].consumers if c.crash_every) == 1
    assert len(by["dlx"].consumers) == 1
    json.dumps(plan_summary(plan))  # run.json material


def test_queue_plan_classic_only() -> None:
    plan = queue_plan(["q1"], kinds=(), consumers=1, crash_every=0)
    assert len(plan) == 1 and plan[0].kind == "classic" and plan[0].arguments == {}
    assert plan[0].consumers[0].crash_every == 0
    assert [q.kind for q in queue_plan(["a"], kinds=["maxlen"])] == ["classic", "maxlen"]


def test_publish_cycle_weights() -> None:
    plan = queue_plan(["chaos-a", "chaos-b"], kinds=KINDS)
    cyc = publish_cycle(plan)
    n = Counter(q.name for q in cyc)
    assert n == {"chaos-a": 3, "chaos-b": 3, "chaos-ttl": 1, "chaos-maxlen": 1, "chaos-prio": 1,
                 "chaos-sac": 1}  # 60 % classic, never the DLX queue
    assert all(a is not b for a, b in zip(cyc, cyc[1:], strict=False))  # spread out
    assert [q.name for q in publish_cycle([QueueSpec("x"), QueueSpec("y")])] == ["x", "y"] * 3


def test_declare_arguments_encode() -> None:
    """The plan's arguments go through pamqp's table encoding (declare_queues)."""
    from pamqp import commands as spec
    for q in queue_plan(["a"], kinds=KINDS):
        raw = pframe.marshal(spec.Queue.Declare(queue=q.name, durable=True,
                                                arguments=dict(q.arguments) or None), 1)
        _, _, m = pframe.unmarshal(raw)
        assert (m.arguments or {}) == q.arguments


def test_death_reason() -> None:
    assert death_reason(SimpleNamespace(headers=None)) is None
    assert death_reason(SimpleNamespace(headers={"x-other": 1})) is None
    deaths = [{"reason": "expired", "queue": "chaos-ttl", "count": 1}, {"reason": "rejected"}]
    assert death_reason(SimpleNamespace(headers={"x-death": deaths})) == "expired"
    assert death_reason(SimpleNamespace(headers={"x-death": [{"reason": b"maxlen"}]})) == "maxlen"


def test_big_body_goes_out_in_several_frames_and_checks() -> None:
    bodies = RandomBodies(DEFAULT_MAX_SIZE, DEFAULT_MAX_SIZE, seed=1, pool_seed=1)
    body = bodies.make("p1", 7)
    assert len(body) == 256 * 1024
    raw = body_frames(1, body, 131072)
    got = b""
    frames = 0
    while raw:
        n, _ch, v = pframe.unmarshal(raw)
        assert isinstance(v, ContentBody) and n <= 131072
        got += v.value
        raw = raw[n:]
        frames += 1
    assert frames == 3 and got == body
    assert check_body(got, len(body), "p1-7") == ("p1-7", False)
    bad = got[:-1] + bytes([got[-1] ^ 1])
    assert check_body(bad, len(body), "p1-7") == ("p1-7", True)


def _write(d: Path, events: list[dict[str, Any]]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.json").write_text(json.dumps({"run": "r", "experiment": "t"}))
    with open(d / "h.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps({"run": "r", **e}) + "\n")


def _pub(mid: str, outcome: str, queue: str, **kw: Any) -> dict[str, Any]:
    return {"type": "publish", "msg_id": mid, "publisher": "p1", "seq": 1, "node": "n1",
            "send_ts": 1.0, "outcome": outcome, "outcome_ts": 1.1, "queue": queue, **kw}


def _dlv(mid: str, queue: str, **kw: Any) -> dict[str, Any]:
    return {"type": "deliver", "msg_id": mid, "consumer": "c1", "node": "n1", "redelivered": False,
            "ts": 2.0, "phase": "workload", "queue": queue, "corrupted": False, **kw}


def test_fallback_checker_reject_publish_and_dead_letters(tmp_path: Path) -> None:
    events = [
        _pub("p1-1", "ack", "chaos-a", window=None, rate=100.0),  # optional first-event fields
        _dlv("p1-1", "chaos-a"),
        _pub("p1-2", "nack", "chaos-maxlen"),  # reject-publish: never delivered, not lost
        _pub("p1-3", "ack", "chaos-ttl"),  # expired, delivered from the DLX queue: delivered
        _dlv("p1-3", "chaos-dlq", dead_lettered="expired"),
        _pub("p1-4", "ack", "chaos-ttl"),  # consumed from the TTL queue by the drain
        _dlv("p1-4", "chaos-ttl", phase="drain"),
        {"type": "drain_done", "ts": 3.0},
    ]
    _write(tmp_path / "ok", events)
    rep = fallback_check(tmp_path / "ok")
    assert rep["lost"] == 0 and rep["corrupted"] == 0 and rep["unexpected"] == 0 and rep["drained"]
    assert rep["confirmed"] == 3 and rep["published_ids"] == 4 and rep["recovered"] == 0
    # a confirmed TTL message delivered nowhere is lost
    _write(tmp_path / "lost", [*events[:-1], _pub("p1-5", "ack", "chaos-ttl"), events[-1]])
    rep = fallback_check(tmp_path / "lost")
    assert rep["lost"] == 1 and rep["lost_ids"] == ["p1-5"]


def test_fallback_checker_dead_lettered_copy_is_not_a_duplicate(tmp_path: Path) -> None:
    """Delivered from the TTL queue, requeued, expired, delivered from the DLX queue: two
    fresh deliveries, but the second is a new (dead-lettered) message."""
    events = [
        _pub("p1-1", "ack", "chaos-ttl"),
        _dlv("p1-1", "chaos-ttl"),
        _dlv("p1-1", "chaos-dlq", dead_lettered="expired"),
        _pub("p1-2", "ack", "chaos-a"),
        _dlv("p1-2", "chaos-a"),
        _dlv("p1-2", "chaos-a"),  # enqueued twice: a duplicate
        {"type": "drain_done", "ts": 3.0},
    ]
    _write(tmp_path / "d", events)
    rep = fallback_check(tmp_path / "d")
    assert rep["duplicates"] == 1 and rep["lost"] == 0


def test_a_message_delivered_twice_as_new_fails_the_run(tmp_path: Path) -> None:
    """Our publishers never republish: two deliveries with redelivered=false are the
    broker's doing (S07) and fail the run, as the long run's stale-snapshot
    re-apply should have (issue 16); a redelivery (redelivered=true) does not."""
    from chaosmirrorq.probes import _normalize, report_passed
    twice = [_pub("p1-1", "ack", "chaos-a"), _dlv("p1-1", "chaos-a"), _dlv("p1-1", "chaos-a"),
             {"type": "drain_done", "ts": 3.0}]
    _write(tmp_path / "twice", twice)
    rep = _normalize(fallback_check(tmp_path / "twice"))
    assert rep["duplicates"] == 1 and rep["lost"] == 0 and not report_passed(rep)
    again = [_pub("p1-1", "ack", "chaos-a"), _dlv("p1-1", "chaos-a"),
             dict(_dlv("p1-1", "chaos-a"), redelivered=True), {"type": "drain_done", "ts": 3.0}]
    _write(tmp_path / "again", again)
    rep = _normalize(fallback_check(tmp_path / "again"))
    assert rep["duplicates"] == 0 and rep["redeliveries"] == 1 and report_passed(rep)
