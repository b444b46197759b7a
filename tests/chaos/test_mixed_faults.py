"""The mixed fault (chaosmirrorq.mixed.mixed_faults): packet loss, a SIGSTOPped
follower, a leader SIGKILL and a one-way partition, overlapping in time. The test
shows each of them happened, that their windows overlap, and that when the action
returns nothing is left: every node runs (none stopped), no iptables rule remains in
any namespace, the cluster is healthy. Root + `ip netns` needed (skipped otherwise)."""
from __future__ import annotations

import json
from pathlib import Path

from chaosmirrorq import actions, mixed

from tests.support.chaos_lab import netns_lab as _lab
from tests.support.chaos_lab import start_netns_cluster as _start


def _rules(idx: int) -> list[str]:
    out = _lab().run_in(idx, "iptables", "-w", "-S", check=False, timeout=20).stdout
    return [line for line in out.splitlines() if not line.startswith("-P ")]


def test_mixed_faults_overlap_take_effect_and_leave_nothing_behind(state: None, tmp_path: Path) -> None:  # noqa: F811
    _start(tmp_path)
    c = actions._cluster()
    pids_before = {n.node_id: n.pid for n in c.nodes}
    res = mixed.mixed_faults(seconds=6, loss_percent=20, seed=3)
    r = res["results"]
    assert r["loss"]["mechanism"] in ("netem", "iptables")
    assert r["pause"]["paused"] == res["b"]
    assert r["kill"][0]["killed"] == res["leader_at_start"]
    killed = res["leader_at_start"]
    assert c.node(killed).pid != pids_before[killed]  # SIGKILLed and restarted
    assert r["one-way"]["healthy_after"] is True and res["healthy_after"] is True
    faults = [json.loads(x) for x in (actions._run_dir() / "faults.jsonl").read_text().splitlines()]
    assert len(faults) == 4
    win = {f["name"].split()[0].split("-")[0]: (f["start_ts"], f["end_ts"]) for f in faults}
    assert set(win) == {"loss", "pause", "kill", "partition"}
    # the loss window overlaps each of the others; pause and kill overlap each other
    for other in ("pause", "kill", "partition"):
        assert win["loss"][0] < win[other][1] and win[other][0] < win["loss"][1], (other, win)
    assert win["pause"][0] < win["kill"][1] and win["kill"][0] < win["pause"][1]
    for i, n in enumerate(c.nodes):
        assert n.alive() and Path(f"/proc/{n.pid}/stat").read_text().split(") ")[1][0] != "T", n
        assert _rules(actions._lab_index(n)) == [], (n, i)
