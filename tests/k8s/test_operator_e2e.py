"""Issue 13 end to end, against a real Kubernetes v1.20.2 control plane (etcd,
kube-apiserver, controller-manager, scheduler: k8s/control_plane.py) and the
node agent (k8s/node_agent.py: a Ready Node, hostPath PVs, each pod a process in
its own network namespace). Nothing here is mocked: `helm install` of the chart
installs the CRD, the operator's Deployment with its ServiceAccount and RBAC,
and one MirrorqCluster; the scheduler places the operator's pod, which runs
under its own ServiceAccount's token (in-cluster config), so the chart's RBAC is
what lets it work; the operator builds the StatefulSet, the real StatefulSet
controller makes the pods and PVCs, and AMQP clients reach each pod's address.

The tests run in order on one release (module fixtures): install -> a rolling restart from a config change under load (at most one pod
down at a time) -> the leader's pod deleted and recreated -> a pod whose volume is
lost comes back as a fresh member -> `helm uninstall` keeps the PVCs. (Scaling
3 -> 5 -> 3 under load runs under the real kubelet: tests/k8s/test_kubelet_e2e.py.)
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from harness.client import uniq_queue
from k8s.control_plane import bin_dir, missing_binaries, up
from k8s.node_agent import NodeAgent
from node.admin.client import call_status
from tests.support.k8s_env import (
    CHART,
    NAME,
    RELEASE,
    SELECTOR,
    Env,
    wait,
)
from tests.support.k8s_load import amqp_roundtrip, delete_leader_pod_and_wait_for_it, publish_while

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the node agent needs root "
                                "(network namespaces, mounts, iptables)")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, broker_image: Any) -> Iterator[Env]:
    missing = missing_binaries(bin_dir())
    assert not missing, f"run `make k8s-build` first (missing in {bin_dir()}: {missing})"
    work = tmp_path_factory.mktemp("k8s-e2e")
    cp = up(work / "k8s")
    agent: NodeAgent | None = None
    try:
        # broker and operator pods: runc containers of the image built from the
        # Dockerfile (the chart names it for both)
        agent = NodeAgent.for_control_plane(cp, work / "agent",
                                            {broker_image.ref: broker_image}).start()
        e = Env(cp, agent, work)
        e.values.write_text(
            "replicas: 3\n"
            f"image:\n  repository: {broker_image.ref.rsplit(':', 1)[0]}\n"
            f"  tag: {broker_image.ref.rsplit(':', 1)[1]}\n"
            "persistence:\n  size: 1Gi\n"
            "terminationGracePeriodSeconds: 30\n"
            "config:\n  memory_high_watermark: 1073741824\n"
            "operator:\n  extraEnv:\n"
            "    - {name: MIRRORQ_OPERATOR_RECONCILE_SECONDS, value: \"2\"}\n")
        yield e
        e.stop_watch()
    finally:
        if agent is not None:
            agent.stop()
        cp.down()


@pytest.fixture
def diag(env: Env, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(env.diagnostics())


def test_helm_install_runs_operator_under_its_service_account_and_three_ready_members(
        env: Env, diag: None) -> None:
    t0 = time.monotonic()
    env.helm("install", RELEASE, str(CHART), "--create-namespace", "-f", str(env.values))
    # the operator: scheduled on the agent's Node, running with its own ServiceAccount
    op = wait(lambda: [p for p in env.json("pods", "-l", "app.kubernetes.io/component=operator")
                       ["items"] if p.get("status", {}).get("phase") == "Running"],
              60, "the operator pod running", env.diagnostics)[0]
    assert op["spec"]["serviceAccountName"] == f"{NAME}-operator"
    token_vols = [v["secret"]["secretName"] for v in op["spec"]["volumes"] if "secret" in v]
    assert any(v.startswith(f"{NAME}-operator-token-") for v in token_vols), token_vols
    st = wait(lambda: env.converged(3), 180, "3 members in sync, 3 pods Ready",
              env.diagnostics)
    print(f"install -> 3 Ready members: {time.monotonic() - t0:.1f}s; status {st}")
    assert {c["type"]: c["status"] for c in st["conditions"]}["QuorumStatus"] == "True"
    # the brokers and the operator are containers of the image built from the
    # Dockerfile (runc; issue 30: one image, the chart's default for both): the image's
    # user (uid 10001, with the broker pods' fsGroup), a read-only root
    seen = []
    for w in list(env.agent.workers.values()):
        if w.name.startswith(f"{NAME}-"):
            assert w.image is not None, f"{w.name} runs as a process, not a container"
            ident = subprocess.run(["runc", "--root", str(env.agent.runc_root), "exec", w.cid,
                                    "sh", "-c", "id -u; id -G; touch /x 2>&1 || true; cat /proc/1/cmdline"],
                                   capture_output=True, text=True, timeout=30).stdout.split("\n")
            assert ident[0] == "10001", ident
            assert "10001" in ident[1].split(), ident  # fsGroup (the operator: its own group)
            assert "Read-only file system" in ident[2], ident
            seen.append((w.name, ident[3].replace("\0", " ")))
    ops = [cmd for name, cmd in seen if name.startswith(f"{NAME}-operator")]
    assert len(ops) == 1 and "kopf run -m mirrorq_operator.handlers" in ops[0], seen
    assert len(seen) == 4, seen
    # AMQP through each pod's own address, with the chart Secret's user
    eps = env.endpoints()
    assert len({e.host for e in eps}) == 3
    for e in eps:
        body = os.urandom(4096)
        assert amqp_roundtrip(e, uniq_queue("e2e"), body) == body
    # the wrong password is refused (only the Secret's user exists)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(
            host=eps[0].host, credentials=pika.PlainCredentials(eps[0].user, "wrong"),
            connection_attempts=1, socket_timeout=5))
    # the admin port is mutual TLS from the operator's CA (issue 26): the operator and
    # the readiness probes (3 Ready pods above) got through it; plaintext, as before, does
    # not, and TLS with the CA's client certificate still wants the token
    tls = env.admin_tls(eps[0].node_id)
    assert call_status(eps[0].host, 15682, 3.0, token=env.secret("admin-token"),
                       **tls)["node_id"] == eps[0].node_id
    with pytest.raises(Exception, match="UNAVAILABLE"):
        call_status(eps[0].host, 15682, 3.0, token=env.secret("admin-token"), tls_ca=b"")
    with pytest.raises(Exception, match="UNAUTHENTICATED|token"):
        call_status(eps[0].host, 15682, 3.0, token="", **tls)
    # the management HTTP API (15672) on every pod, with the Secret's user: each
    # names the same leader; no credentials is 401
    leaders = set()
    for e in eps:
        auth = base64.b64encode(f"{e.user}:{e.password}".encode()).decode()
        req = urllib.request.Request(f"http://{e.host}:15672/api/mirrorq/cluster",
                                     headers={"Authorization": f"Basic {auth}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            leaders.add(json.load(resp)["leader"])
    assert len(leaders) == 1 and None not in leaders, leaders
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"http://{eps[0].host}:15672/api/overview", timeout=10)
    assert denied.value.code == 401


@pytest.mark.timeout(900)
def test_config_change_rolls_pods_one_at_a_time_under_load(env: Env, diag: None) -> None:
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in env.pods()}
    most_down = [0]
    stop = threading.Event()

    def count_down() -> None:
        while not stop.is_set():
            with_uid = {p["metadata"]["name"] for p in env.pods()}
            down = 3 - len([n for n in env.ready_pods() if n in with_uid])
            most_down[0] = max(most_down[0], down)
            stop.wait(0.3)

    watcher = threading.Thread(target=count_down, daemon=True)

    def roll() -> None:
        t0 = time.monotonic()
        watcher.start()
        env.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "config.heartbeat=30")
        wait(lambda: env.converged(3) and all(
            p["metadata"]["uid"] != before[p["metadata"]["name"]] for p in env.pods()), 400,
             "every pod restarted with the new config", env.diagnostics)
        stop.set()
        print(f"rolling restart of 3 pods: {time.monotonic() - t0:.1f}s")

    try:
        publish_while(env, "roll", roll)
    finally:
        stop.set()
    assert most_down[0] <= 1, f"{most_down[0]} pods were down at once"
    cm = env.json("configmap", NAME)["data"]["mirrorq.toml"]
    assert "heartbeat = 30" in cm, cm


def test_deleted_leader_pod_is_recreated_and_rejoins(env: Env, diag: None) -> None:
    delete_leader_pod_and_wait_for_it(env)


@pytest.mark.timeout(900)
def test_pod_whose_volume_is_lost_comes_back_as_a_fresh_member(env: Env, diag: None) -> None:
    victim = f"{NAME}-2"
    pvc = env.json("pvc", f"data-{victim}")
    pv = pvc["spec"]["volumeName"]
    t0 = time.monotonic()
    # the volume goes: claim and volume deleted, then the pod (a node's disk lost)
    env.kubectl("delete", "pvc", f"data-{victim}", "--wait=false")
    env.cp.kubectl("delete", "pv", pv, "--wait=false")
    env.kubectl("delete", "pod", victim, "--wait=false")

    def fresh_claim() -> bool:
        new = env.json("pvc", f"data-{victim}")
        if new["metadata"]["uid"] == pvc["metadata"]["uid"]:
            return False
        return True

    def reschedule_if_stuck() -> bool:
        # a pod recreated while its old claim was still terminating waits for a
        # claim that will not come back (the StatefulSet controller makes claims
        # only with new pods): deleting that pod is part of the fault's routine
        if fresh_claim():
            return True
        pod = env.json("pods", "-l", SELECTOR)["items"]
        for p in pod:
            if p["metadata"]["name"] == victim and p.get("status", {}).get("phase") == "Pending" \
                    and not p["spec"].get("nodeName"):
                env.kubectl("delete", "pod", victim, "--wait=false", check=False)
        return False

    wait(reschedule_if_stuck, 120, "a new claim for the pod", env.diagnostics, interval=2)
    st = wait(lambda: env.converged(3), 240, "the fresh member in sync", env.diagnostics)
    new_uid = env.json("pvc", f"data-{victim}")["metadata"]["uid"]
    assert st["volumes"][victim] == new_uid, st
    print(f"volume of {victim} lost -> fresh member in sync: {time.monotonic() - t0:.1f}s")


def test_helm_uninstall_removes_the_release_and_keeps_the_pvcs(env: Env, diag: None) -> None:
    claims = sorted(c["metadata"]["name"] for c in env.json("pvc")["items"])
    assert claims == [f"data-{NAME}-{k}" for k in range(3)] or len(claims) >= 3, claims
    t0 = time.monotonic()
    env.helm("uninstall", RELEASE)
    wait(lambda: not env.json("pods")["items"], 180, "every pod gone", env.diagnostics)
    for kind in ("statefulset", "service", "configmap", "deployment", "mirrorqcluster"):
        items = env.json(kind)["items"]
        left = [i["metadata"]["name"] for i in items if i["metadata"]["name"] != "kube-root-ca.crt"]
        wait(lambda k=kind: not [i for i in env.json(k)["items"]
                                 if i["metadata"]["name"] != "kube-root-ca.crt"],
             60, f"{kind} removed (left: {left})", env.diagnostics)
    kept = sorted(c["metadata"]["name"] for c in env.json("pvc")["items"])
    assert kept == claims, (claims, kept)
    print(f"helm uninstall -> everything but the PVCs (and Secrets) gone: "
          f"{time.monotonic() - t0:.1f}s")
    print("\n".join(line for line in env.agent.history[-40:]
                    if "terminating" in line or "SIGKILL" in line or "deleted" in line))
