"""The "mixed" fault: several kinds of fault at once, overlapping (Jepsen's mixed
nemesis), as one chaostoolkit action so that the experiment's drain starts only
after every one of them has ended.

With F = `seconds`, from the action's start (the nodes are chosen at the start
from `seed`: follower A, follower B; the leader is whoever leads when its turn
comes):
    0.0 F .. 2.5 F   packet loss on A (`loss_percent` % of its packets; past
                     the partition's end: its start waits for a leader, late
                     under load, and the loss must overlap it)
    0.3 F .. 0.8 F   B SIGSTOPped
    0.6 F .. 1.0 F   the leader SIGKILLed (down 0.4 F, then restarted)
    1.0 F .. 1.5 F   a one-way partition: A stops hearing the leader of that moment
                     (from when a leader is known)
While B is stopped and the leader is down, the only live member is the lossy A:
no quorum, so confirms stop (nothing may be confirmed then) and resume after.
Each fault records its own window; every one is lifted in its own `finally`,
and the experiment's heal_all rollback clears whatever is left.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from chaosmirrorq import actions, fault


def _later(delay: float, fn: Callable[[], Any], results: dict[str, Any], name: str) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - reported by mixed_faults, which then fails
            results[name] = {"error": f"{type(e).__name__}: {e}"}

    t = threading.Thread(target=run, name=f"mixed-{name}", daemon=True)
    t.start()
    return t


def mixed_faults(seconds: float = 12.0, loss_percent: float = 10.0, seed: int | None = None) -> dict[str, Any]:
    f = fault.as_float(seconds)
    c = fault.cluster()
    leader = c.leader(timeout=30)
    followers = sorted(n.node_id for n in c.followers(timeout=30))
    if len(followers) < 2:
        raise RuntimeError(f"mixed faults need two followers, have {followers}")
    rng = random.Random(seed)
    rng.shuffle(followers)
    a, b = followers[0], followers[1]
    fault.faults()  # one history writer, created before the threads share it
    results: dict[str, Any] = {}

    def one_way() -> dict[str, Any]:  # A may lead by now: then the other follower
        now = c.leader(timeout=30).node_id
        return actions.partition_one_way(now, a if now != a else "follower", 0.5 * f)

    t0 = time.time()
    threads = [
        _later(0.0, lambda: actions.lose_packets(a, fault.as_float(loss_percent), 2.5 * f), results, "loss"),
        _later(0.3 * f, lambda: actions.pause_node(b, 0.5 * f), results, "pause"),
        _later(0.6 * f, lambda: actions.kill_node("leader", down_seconds=0.4 * f), results, "kill"),
        _later(1.0 * f, lambda: one_way(), results, "one-way"),
    ]
    for t in threads:
        t.join(timeout=10 * f + 300)
    healthy = fault.wait_healthy()
    errors = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    hung = [t.name for t in threads if t.is_alive()]
    if errors or hung:
        raise RuntimeError(f"mixed faults failed: {errors or ''} {'still running: ' + ', '.join(hung) if hung else ''}")
    return {"leader_at_start": leader.node_id, "a": a, "b": b, "seconds": f, "elapsed": round(time.time() - t0, 1),
            "healthy_after": healthy, "results": results}
