"""The issue-16 faults of chaosmirrorq.actions that need a real cluster: a bridge
partition (partition_bridge), a follower SIGSTOPped beyond the in-sync bound
(pause_node(watch_in_sync=True)), a SIGKILL while a snapshot child runs
(kill_during_snapshot) and a membership change while the removed member is cut off
(membership_change_during_partition). Each test starts a 3-node cluster in network
namespaces through the actions module, shows the fault takes effect, that the action
undoes it, and that the experiments' rollback (heal_all) undoes it when an action
stopped half way. Root + `ip netns` needed (skipped otherwise)."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from chaosmirrorq import actions, probes

from harness.process import ClusterNode
from tests.support.chaos_lab import netns_lab as _lab
from tests.support.chaos_lab import start_netns_cluster as _start
from tests.support.thread import in_thread as _in_thread

SNAPSHOT_OFTEN = "compaction_min_entries = 200\ncompaction_min_time = 1.0\n"

CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except OSError:
    sys.exit(1)
"""


def _reach(src: ClusterNode, dst: ClusterNode, timeout: float = 1.0) -> bool:
    """A TCP connect from src's namespace to dst's Raft port succeeds."""
    res = _lab().run_in(actions._lab_index(src), sys.executable, "-c", CONNECT, dst.host,
                        str(dst.raft_port), str(timeout), check=False, timeout=20)
    return res.returncode == 0


def _small_workload(queue: str) -> None:
    actions.start_workload(publishers=1, consumers=1, rate=150, window=50, queues=queue,
                           warmup=1.0, crash_every=0, min_size=512, max_size=4096)


# ------------------------------------------------------------------ bridge

def test_partition_bridge_cuts_the_two_sides_only_and_is_undone(tmp_path: Path, state: None) -> None:
    _start(tmp_path, spare=0)
    c = actions._cluster()
    leader = c.leader()
    bridge, other = c.followers()
    assert _reach(leader, other) and _reach(other, leader)
    t, out = _in_thread(actions.partition_bridge, seconds=4, bridge=bridge.node_id)
    time.sleep(1.0)
    # A (the leader) and C cannot reach each other; both still reach B
    assert not _reach(leader, other) and not _reach(other, leader)
    assert _reach(leader, bridge) and _reach(other, bridge)
    assert _reach(bridge, leader) and _reach(bridge, other)
    t.join(120)
    assert "error" not in out, out
    res = out["result"]
    assert res["bridge"] == bridge.node_id
    assert res["side_a"] == [leader.node_id] and res["side_c"] == [other.node_id]
    assert res["healthy_after"] is True
    # the leader kept its quorum through the bridge: B still named it at the end
    assert res["views_during"][bridge.node_id]["leader"] == leader.node_id, res
    assert _reach(leader, other) and _reach(other, leader)
    # stopped half way: the rollback removes the rules
    _lab().partition_pair(actions._lab_index(leader), actions._lab_index(other))
    assert not _reach(leader, other)
    assert actions.heal_all()["healthy"] is True
    assert _reach(leader, other) and _reach(other, leader)


# ------------------------------------------------------------------ long pause

def test_long_pause_of_a_follower_leaves_and_rejoins_the_in_sync_set(tmp_path: Path, state: None) -> None:
    _start(tmp_path, spare=0)
    c = actions._cluster()
    _small_workload("t-long-pause")
    follower = c.followers()[0]
    # 12 s: confirms must be seen going on after it left (at 4-8.5 s, later under load);
    # with 9 s a late departure left under a second to see them (CI: 0 confirmed while out)
    t, out = _in_thread(actions.pause_node, target=follower.node_id, seconds=12, watch_in_sync=True)
    time.sleep(7.5)  # beyond the 5 s bound (out_of_sync_after)
    during = probes.cluster_status()
    assert follower.paused
    assert follower.node_id in during["members"] and follower.node_id not in during["in_sync"], during
    t.join(120)
    assert "error" not in out, out
    res = out["result"]
    assert res["paused"] == follower.node_id and res["healthy_after"] is True
    assert res["left_in_sync_after"] is not None and 4.0 <= res["left_in_sync_after"] <= 8.5, res
    assert res["confirmed_while_out"] > 0, res  # confirms go on without it
    after = probes.cluster_status()
    assert follower.node_id in after["in_sync"], after
    # stopped half way: the rollback sends SIGCONT
    follower.pause()
    assert follower.paused
    assert actions.heal_all()["healthy"] is True
    assert not follower.paused and follower.node_id in probes.cluster_status()["in_sync"]


# ------------------------------------------------------------------ kill during a snapshot

def test_kill_during_snapshot_catches_a_snapshot_child(tmp_path: Path, state: None) -> None:
    _start(tmp_path, spare=0, config=SNAPSHOT_OFTEN)
    c = actions._cluster()
    _small_workload("t-snapshot")
    res = actions.kill_during_snapshot(target="follower", timeout=40, down_seconds=1)
    # the node died while its snapshot child was writing raft.dump.part, before it could
    # install it
    assert res["part_left_behind"] and res["part_bytes"] is not None, res
    assert res["snapshot_child"] and res["attempts"] >= 1
    assert res["healthy_after"] is True
    killed = c.node(res["killed"])
    assert killed.alive() and killed.pid not in res["snapshot_child"]
    for pid in res["snapshot_child"]:
        assert actions._proc_state(pid) in (None, "Z")  # the child went with it
    assert killed.node_id in probes.cluster_status()["in_sync"]
    # stopped half way (node down): the rollback starts it again
    killed.kill9()
    assert not killed.alive()
    assert actions.heal_all()["healthy"] is True
    assert killed.alive() and killed.node_id in probes.cluster_status()["in_sync"]


def test_snapshot_child_dies_with_its_node(tmp_path: Path, state: None) -> None:
    """node/replication/raft/snapshot/child.py: the forked snapshot child has PR_SET_PDEATHSIG, so
    a SIGKILLed node leaves no orphan holding its (inherited) listening sockets, which
    made the restarted node fail with "Address already in use"."""
    _start(tmp_path, spare=0, config=SNAPSHOT_OFTEN)
    c = actions._cluster()
    _small_workload("t-orphan")
    node = c.followers()[0]
    assert node.pid is not None
    me = actions._cmdline(node.pid)
    child = None
    deadline = time.monotonic() + 30
    while child is None and time.monotonic() < deadline:
        for k in actions._children(node.pid):
            # past its set-up (prctl, nice): writing raft.dump.part
            if actions._cmdline(k) == me and actions._has_open(k, actions.SNAPSHOT_PART):
                os.kill(k, signal.SIGSTOP)  # it cannot finish its snapshot now
                if actions._proc_state(k) == "T":
                    child = k
                    break
        time.sleep(0.001)
    assert child is not None, "no snapshot child seen within 30 s"
    node.kill9()
    gone = time.monotonic() + 5
    while actions._proc_state(child) not in (None, "Z") and time.monotonic() < gone:
        time.sleep(0.02)
    assert actions._proc_state(child) in (None, "Z"), "the snapshot child outlived its node"
    node.start(wait=True, timeout=60)  # its ports are free
    c.wait_healthy(timeout=60)


def test_kill_during_snapshot_fails_clearly_without_snapshots(tmp_path: Path, state: None) -> None:
    _start(tmp_path, spare=0)  # default thresholds: no snapshot in a few seconds
    with pytest.raises(RuntimeError, match="no snapshot in progress on a follower within 2 s"):
        actions.kill_during_snapshot(target="follower", timeout=2)
    assert all(n.alive() for n in actions._cluster().nodes)


# ------------------------------------------------------------------ membership during a partition

def test_membership_change_during_partition(tmp_path: Path, state: None) -> None:
    _start(tmp_path, spare=1)
    c = actions._cluster()
    _small_workload("t-membership")
    victim = c.followers()[0]
    res = actions.membership_change_during_partition(seconds=4, target=victim.node_id, observe=4)
    assert res["removed"] == victim.node_id and res["added"] not in (None, victim.node_id)
    assert res["healthy_after"] is True and not res["violations"], res
    st = probes.cluster_status()
    assert victim.node_id not in st["members"] and res["added"] in st["members"], st
    assert sorted(st["in_sync"]) == sorted(st["members"]) and len(st["members"]) == 3
    assert not victim.alive() and victim in c.removed
    # stopped half way (a member cut off): the rollback removes the rules
    f = c.followers()[0]
    lab = _lab()
    lab.partition(actions._lab_index(f), [nd.index for nd in lab.nodes])
    assert not _reach(f, c.leader())
    assert actions.heal_all()["healthy"] is True
    assert _reach(f, c.leader())


def test_suite_registers_the_process_experiments() -> None:
    from chaosmirrorq import suite

    for name, netns in (("bridge-partition", True), ("follower-long-pause", False),
                        ("kill-during-snapshot", False), ("membership-during-partition", True)):
        path = suite.EXPERIMENTS_DIR / f"{name}.json"
        assert name in suite.ORDER and suite.needs_netns(path) == netns
        assert name not in suite.SUBSETS["ci"]
