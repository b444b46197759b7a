"""The Raft port takes only peers that know the cluster password (pysyncobj
unpickles what it receives; with a password every message is Fernet-checked
first, and a connection that fails the check is dropped before unpickling).

- An impostor at a dead member's own Raft address with a wrong password, and
  a newcomer with no password at all (--insecure-dev), both with the cluster's
  peers, campaign for ever: the cluster keeps its leader and term, keeps
  confirming publishes, never counts them as members in sync, and they never
  learn a leader or a single committed entry.
- `serve` with --peers / --join and no password: one line, exit 2; with
  --insecure-dev a throwaway cluster forms (and the log says how unsafe it is).
- The password from MIRRORQ_RAFT_PASSWORD and from raft.password_file is the
  same password (a cluster of one of each forms).
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pika

from harness.client import declare, pika_conn, uniq_queue
from harness.process import REPO, Cluster, ClusterNode, free_port, port_open, wait_for
from node.admin.client import call_transfer_leadership
from node.app.config import NO_CLUSTER_PASSWORD


def _serve(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "node.app", "serve", "--node-id", "n1",
            "--amqp-port", str(free_port()), "--raft-port", str(free_port()),
            "--data-dir", str(tmp_path / "d"), *extra]
    return subprocess.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})


def _publish_confirmed(node: ClusterNode, queue: str, n: int = 20) -> None:
    conn = pika_conn(node)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(n):  # returns once acked; a nack raises
            ch.basic_publish("", queue, f"{node.node_id}-{i}".encode(),
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        conn.close()


def _declare_and_publish(node: ClusterNode) -> None:
    queue = uniq_queue("rp")
    declare(node, queue)
    _publish_confirmed(node, queue)


def _intrude(cluster: Cluster, intruder: ClusterNode, queue: str, window: float) -> None:
    """Start `intruder`; once it answers its admin Status, watch it and the good members
    for `window` seconds (a "never" needs a window: the caller calibrates it on a
    node that did get in), checking at every poll that the members keep their leader,
    term and member set and that the intruder has no leader, nothing committed and
    no clients. Then the cluster still confirms publishes on every good member."""
    good = [n for n in cluster.nodes if n.alive()]
    leader = cluster.leader()
    before = {n.node_id: n.status() for n in good}
    term = before[leader.node_id]["term"]
    assert {st["term"] for st in before.values()} == {term}
    intruder.start(wait=False)
    wait_for(intruder.try_status, timeout=30, what=f"{intruder.node_id}'s admin API")
    deadline = time.monotonic() + window
    polls = 0
    while time.monotonic() < deadline:
        for n in good:
            st = n.status()
            assert st["term"] == term and cluster.node_for(st["leader"]) is leader, st
            assert sorted(st["members"]) == sorted(before[n.node_id]["members"]), st
        assert intruder.alive(), intruder.tail_log(20)
        st = intruder.status()
        assert st["leader"] is None and st["role"] != "leader" and st["in_sync"] == [], st
        # a fresh pysyncobj log holds one entry of its own; the cluster's are far beyond
        assert st["commit_index"] <= 1 and st["last_applied"] <= 1, st
        assert not port_open(intruder.amqp_port)  # never ready: it never heard a leader
        polls += 1
        time.sleep(0.2)  # poll period; the window is the caller's calibrated bound
    assert polls >= 5
    for n in good:
        _publish_confirmed(n, queue)
        st = n.status()
        assert st["term"] == term and cluster.node_for(st["leader"]) is leader, st
    assert "Traceback" not in "".join(n.tail_log(200) for n in good)


def _fresh_n3(cluster: Cluster, n3: ClusterNode, name: str, config: Path,
              extra_args: tuple[str, ...] = ()) -> ClusterNode:
    """A node with an empty data dir on n3's own ports and Raft address."""
    node = ClusterNode("n3", cluster.base_dir / name / "data", config_path=config,
                       extra_args=extra_args)
    for attr in ("amqp_port", "raft_port", "admin_port", "metrics_port"):
        setattr(node, attr, getattr(n3, attr))
    node.log_path = cluster.base_dir / f"{name}.log"
    node.peers = dict(n3.peers)
    cluster.removed.append(node)  # killed and log-dumped by the fixture
    return node


def test_intruders_without_the_password_cannot_join_or_disturb(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(3).start()
    n3 = c.node("n3")
    leader = c.leader()
    if leader is n3:  # n3 is the one replaced below: the leader must be another node
        call_transfer_leadership(n3.host, n3.admin_port, "n1", token=n3.admin_token)
        wait_for(lambda: c.leader() is c.node("n1"), timeout=30, what="n1 to lead")
        leader = c.node("n1")
    queue = "raft-password-q"
    conn = pika_conn(leader)
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    _publish_confirmed(leader, queue)
    n3.kill9()

    # control: with the password, an empty n3 on the same address gets the state;
    # how long that takes calibrates the window in which the intruders must not
    control = _fresh_n3(c, n3, "control", c.config_path)
    t0 = time.monotonic()
    control.start(join=True, wait=False)
    target = leader.status()["commit_index"]

    def caught_up() -> bool:
        st = control.try_status()
        return st is not None and st["commit_index"] >= target and \
            c.node_for(st["leader"]) is leader

    wait_for(caught_up, timeout=30, what="the control n3 to catch up")
    window = max(5.0, 3 * (time.monotonic() - t0))
    control.kill9()
    wait_for(lambda: "n3" not in c.leader().status()["in_sync"], timeout=30,
             what="n3 to leave the in-sync set")

    # 1. an impostor on n3's own ports and Raft address, with a wrong password
    wrong = c.base_dir / "wrong.toml"
    wrong.write_text('[raft]\npassword = "not-the-cluster-password"\n')
    impostor = _fresh_n3(c, n3, "impostor", wrong)
    _intrude(c, impostor, queue, window)
    impostor.kill9()

    # 2. a newcomer without any password (--insecure-dev), listing every member as a peer
    bare = c.base_dir / "bare.toml"
    bare.write_text("")
    newcomer = ClusterNode("n4", c.base_dir / "n4" / "data", config_path=bare,
                           extra_args=["--insecure-dev"])
    newcomer.peers = {n.node_id: n.raft_address for n in c.nodes}
    c.removed.append(newcomer)
    _intrude(c, newcomer, queue, window)
    assert "INSECURE (--insecure-dev)" in newcomer.tail_log(200)
    st = c.leader().status()
    assert sorted(st["members"]) == ["n1", "n2", "n3"] and "n4" not in st["in_sync"]


def test_serve_with_peers_and_no_password_exits_2(tmp_path: Path) -> None:
    for extra in (("--peers", "n2=127.0.0.1:1"), ("--join",)):
        res = _serve(tmp_path, *extra)
        assert res.returncode == 2, (res.returncode, res.stderr)
        assert res.stderr == f"mirrorq: error: {NO_CLUSTER_PASSWORD}\n"


def test_insecure_dev_cluster_starts(cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(2, extra_args=["--insecure-dev"])
    c.config_path.write_text('loopback_users = ["guest"]\n')  # no [raft] password
    c.start()
    for n in c.nodes:
        assert "INSECURE (--insecure-dev)" in n.tail_log(200)
    _declare_and_publish(c.leader())


def test_password_from_env_and_from_password_file_agree(
        cluster_factory: Callable[..., Cluster]) -> None:
    c = cluster_factory(2)
    c.config_path.write_text('loopback_users = ["guest"]\n')
    secret = c.base_dir / "raft.password"
    secret.write_text("env-and-file\n")
    secret.chmod(0o600)
    n1, n2 = c.nodes
    n1.env = {"MIRRORQ_RAFT_PASSWORD": "env-and-file"}
    n2.config_path = c.base_dir / "n2.toml"
    n2.config_path.write_text('[raft]\npassword_file = "raft.password"\n')
    c.start()
    _declare_and_publish(c.leader())
    for n in c.nodes:
        assert "INSECURE" not in n.tail_log(200)
