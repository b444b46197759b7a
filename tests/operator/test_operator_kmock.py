"""End to end: the kopf operator (mirrorq_operator.handlers, run as `kopf run`)
drives real mirrorq node processes through an in-memory Kubernetes API.

There is no Kubernetes here. kmock (PyPI kmock, tests/operator/kmock_api.py)
is the only mock: an in-memory API server over HTTP on 127.0.0.1 that stores,
lists, watches and patches objects and runs no controller. The operator talks
to it through a kubeconfig exactly as it would to a cluster. What a cluster
would do with the operator's StatefulSet is played by FakeKubelet
(tests/operator/kubelet.py): for each ordinal it runs a real `mirrorq serve`
process as the pod, keeps the Pod, PersistentVolumeClaim and StatefulSet
status objects in kmock up to date, and reports readiness by the chart's rule.
The operator reaches the nodes through its local addressing mode
(MIRRORQ_OPERATOR_LOCAL_BASE_PORT: 127.0.0.1 and per-ordinal ports instead of
the headless Service's DNS names), and reconciles every second
(MIRRORQ_OPERATOR_RECONCILE_SECONDS) instead of every ten.

Named after SEMANTICS S25 (losing nodes loses no confirmed message): here the
nodes come and go through the operator, 3 -> 5 -> 3 members under streaming
confirms, one member added or removed at a time, drained before removal.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from mirrorq_operator.model import LOCAL_STRIDE, MAX_ORDINAL, Addressing

from tests.cluster_proc import (
    REPO,
    StreamPublisher,
    check_delivered,
    declare,
    drain,
    free_port,
    port_open,
    uniq_queue,
    wait_for,
)
from tests.operator.kubelet import (
    FakeKubelet,
    KubeHTTP,
    env_for_operator,
    free_port_block,
    write_kubeconfig,
)

T = TypeVar("T")

CONDITIONS = ("AllReplicasReady", "ClusterAvailable", "ReconcileSuccess", "QuorumStatus")
CRD = REPO / "helm" / "mirrorq" / "crds" / "mirrorqcluster.yaml"
RECONCILE_SECONDS = 1.0
CR_PLURAL = "/apis/mirrorq.io/v1alpha1/namespaces/{ns}/mirrorqclusters"


def _stop_pid(proc: subprocess.Popen[bytes] | None, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds, by pid."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "<no log>"


@dataclass
class OperatorEnv:
    api: KubeHTTP
    ns: str
    name: str
    addressing: Addressing
    kubelet: FakeKubelet
    kopf: subprocess.Popen[bytes]
    kopf_log: Path
    kmock_log: Path

    # ------------------------------------------------------------ objects
    @property
    def cr_path(self) -> str:
        return CR_PLURAL.format(ns=self.ns) + f"/{self.name}"

    def core(self, plural: str, name: str) -> str:
        return f"/api/v1/namespaces/{self.ns}/{plural}/{name}"

    @property
    def sts_path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/{self.name}"

    def create_cluster(self, replicas: int) -> dict[str, Any]:
        cr = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster",
              "metadata": {"name": self.name, "namespace": self.ns},
              "spec": {"replicas": replicas, "image": "mirrorq:e2e",
                       "persistence": {"size": "1Gi"}}}
        created: dict[str, Any] = self.api.create(CR_PLURAL.format(ns=self.ns), cr)
        return created

    def patch_spec(self, **spec: Any) -> int:
        """Merge-patch the CR's spec (like kubectl patch --type merge): its new generation."""
        out = self.api.patch(self.cr_path, {"spec": spec})
        return int(out["metadata"]["generation"])

    def cr(self) -> dict[str, Any]:
        cr: dict[str, Any] = self.api.get(self.cr_path) or {}
        return cr

    def status(self) -> dict[str, Any]:
        return dict(self.cr().get("status") or {})

    # ------------------------------------------------------------ waiting
    def diagnostics(self) -> str:
        try:
            st: Any = self.status()
        except Exception as exc:  # noqa: BLE001 - the API server itself may be the problem
            st = f"<unreadable: {exc!r}>"
        return (f"\n==== CR status: {st}\n==== admin views: {self.kubelet.statuses}"
                f"\n==== leader member views: {self.kubelet.leader_views}"
                f"\n==== kubelet events:\n" + "\n".join(self.kubelet.events[-30:])
                + "\n==== kubelet errors:\n" + "\n".join(self.kubelet.errors[-3:])
                + f"\n==== kopf log (pid {self.kopf.pid}, rc {self.kopf.poll()}):\n"
                + _tail(self.kopf_log, 40) + "\n==== kmock log:\n" + _tail(self.kmock_log, 15)
                + "\n" + self.kubelet.log_tails(12))

    def wait(self, cond: Callable[[], T | None], timeout: float, what: str) -> T:
        def probe() -> T | None:
            if self.kopf.poll() is not None:
                raise AssertionError(f"kopf exited with {self.kopf.returncode}")
            return cond()
        try:
            return wait_for(probe, timeout=timeout, interval=0.2, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{self.diagnostics()}") from None

    def members(self, n: int) -> list[str]:
        return [f"{self.name}-{k}" for k in range(n)]

    def converged(self, n: int, generation: int) -> dict[str, Any] | None:
        """The CR's status once it reports n members, all in sync, a leader, the
        generation observed, the four conditions True, nothing left to do."""
        st = self.status()
        want = self.members(n)
        conds = {c.get("type"): c for c in st.get("conditions") or ()}
        ok = (sorted(st.get("members") or ()) == want and sorted(st.get("inSync") or ()) == want
              and st.get("leader") in want and st.get("observedGeneration") == generation
              and all(conds.get(t, {}).get("status") == "True" for t in CONDITIONS)
              and conds["ReconcileSuccess"].get("reason") == "Converged"
              and not st.get("lastError"))
        return st if ok else None

    def wait_converged(self, n: int, generation: int, timeout: float) -> dict[str, Any]:
        return self.wait(lambda: self.converged(n, generation), timeout,
                         f"the CR status to converge on {n} members (generation {generation})")


@pytest.fixture
def operator_env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[OperatorEnv]:
    """kmock API server + kopf operator + fake kubelet, one namespace and cluster name
    per test; every process is stopped by pid at teardown, whatever happened."""
    ns = f"e2e-{uuid.uuid4().hex[:6]}"
    name = "mq"
    addressing = Addressing(local_base_port=free_port_block(LOCAL_STRIDE * (MAX_ORDINAL + 1)))
    kmock_log, kopf_log = tmp_path / "kmock.log", tmp_path / "kopf.log"
    api_port = free_port()
    kmock_proc: subprocess.Popen[bytes] | None = None
    kopf_proc: subprocess.Popen[bytes] | None = None
    kubelet: FakeKubelet | None = None
    env: OperatorEnv | None = None
    try:
        with open(kmock_log, "wb") as log:
            kmock_proc = subprocess.Popen(
                [sys.executable, "-m", "tests.operator.kmock_api", "--port", str(api_port)],
                cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(lambda: port_open(api_port) or kmock_proc.poll() is not None, timeout=30,
                 what="the kmock API server")
        assert kmock_proc.poll() is None, _tail(kmock_log, 30)
        api = KubeHTTP(f"http://127.0.0.1:{api_port}")
        # what an admin would do first: the namespace, the chart's CRD
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": ns}})
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                   yaml.safe_load(CRD.read_text()))

        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, f"http://127.0.0.1:{api_port}", ns)
        kubelet = FakeKubelet(api, ns, name, addressing, tmp_path / "pods")
        kubelet.start()

        kopf = Path(sys.executable).with_name("kopf")
        with open(kopf_log, "wb") as log:
            kopf_proc = subprocess.Popen(
                [str(kopf), "run", "--standalone", "--namespace", ns,
                 "-m", "mirrorq_operator.handlers"],
                cwd=str(tmp_path), env=env_for_operator(kubeconfig, addressing, RECONCILE_SECONDS),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        env = OperatorEnv(api=api, ns=ns, name=name, addressing=addressing, kubelet=kubelet,
                          kopf=kopf_proc, kopf_log=kopf_log, kmock_log=kmock_log)
        yield env
    finally:
        rep = getattr(request.node, "rep_call", None)
        if (env is not None and rep is not None and rep.failed
                and "==== CR status" not in str(rep.longrepr)):  # not already in the failure
            sys.stderr.write(env.diagnostics() + "\n")
        _stop_pid(kopf_proc)
        if kubelet is not None:
            kubelet.stop()
            kubelet.kill_all()
        _stop_pid(kmock_proc)


def not_one_change(views: list[tuple[str, ...]]) -> list[str]:
    """The transitions of a sequence of member sets that are not exactly one member
    added or removed."""
    return [f"{list(before)} -> {list(after)}"
            for before, after in zip(views, views[1:], strict=False)
            if len(set(before) ^ set(after)) != 1]


def test_s25_operator_creates_and_reports_status(operator_env: OperatorEnv) -> None:
    env = operator_env
    t0 = time.monotonic()
    created = env.create_cluster(replicas=3)
    assert created["metadata"]["generation"] == 1
    st = env.wait_converged(3, generation=1, timeout=90)
    took = time.monotonic() - t0

    # the resources the operator created, in the API server
    api, ns, name = env.api, env.ns, env.name
    cm = api.get(env.core("configmaps", name))
    assert cm is not None and cm["data"]["members"].split() == env.members(3)
    assert cm["data"]["formed"] == "true", cm["data"]
    assert api.get(env.core("services", f"{name}-headless"))["spec"]["clusterIP"] == "None"
    assert api.get(env.core("services", name)) is not None
    assert api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}") is not None
    assert api.get(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}") is not None
    sts = api.get(env.sts_path)
    assert sts["spec"]["replicas"] == 3 and sts["status"]["readyReplicas"] == 3
    for k in range(3):
        pod = api.get(env.core("pods", f"{name}-{k}"))
        assert {"type": "Ready", "status": "True"} in pod["status"]["conditions"], pod["status"]

    # the status: what the nodes say, and the volumes they were members with
    leader = env.kubelet.statuses[st["leader"]]
    assert leader is not None and leader["role"] == "leader", env.kubelet.statuses
    assert sorted(leader["members"]) == st["members"] and sorted(leader["in_sync"]) == st["inSync"]
    pvcs = {f"{name}-{k}": api.get(env.core("persistentvolumeclaims", f"data-{name}-{k}"))
            for k in range(3)}
    assert st["volumes"] == {pod: pvc["metadata"]["uid"] for pod, pvc in pvcs.items()}
    conds = {c["type"]: c for c in st["conditions"]}
    assert set(conds) == set(CONDITIONS)
    assert all(c["lastTransitionTime"] for c in conds.values())
    assert env.kubelet.errors == [], env.kubelet.errors[-1]
    print(f"\noperator: 3 members, leader {st['leader']}, converged {took:.1f}s after the CR")


@pytest.mark.timeout(480)  # about a minute; the waits' own deadlines report a stall first
def test_s25_operator_scales_3_5_3_under_confirmed_load(operator_env: OperatorEnv) -> None:
    env = operator_env
    kubelet = env.kubelet
    env.create_cluster(replicas=3)
    env.wait_converged(3, generation=1, timeout=90)
    q = uniq_queue("opscale")
    declare(kubelet.node(0), q)
    # "a" publishes from the start to the lowest ready ordinal; "b", started once
    # there are 5, to the highest: the pod drained first, so its client is closed
    # (320) and it moves to another member
    pub_a = StreamPublisher("a", q, kubelet.serving, total=None, window=20, deadline=200)
    pub_b = StreamPublisher("b", q, lambda: kubelet.serving()[::-1], total=None, window=20,
                            deadline=200)
    pubs = [pub_a]
    timings: dict[str, float] = {}
    pub_a.start()
    try:
        env.wait(lambda: len(pub_a.confirmed) >= 200 or pub_a.error, 60, "200 confirms on 3")
        assert pub_a.error is None, pub_a.summary()

        t = time.monotonic()
        assert env.patch_spec(replicas=5) == 2
        env.wait_converged(5, generation=2, timeout=150)
        timings["3->5"] = time.monotonic() - t
        assert env.api.get(env.sts_path)["spec"]["replicas"] == 5
        assert pub_a.progress_since(t) > 0 and pub_a.error is None, pub_a.summary()
        pub_b.start()
        pubs.append(pub_b)
        env.wait(lambda: len(pub_b.confirmed) >= 100 or pub_b.error, 60, "100 confirms from b")

        t = time.monotonic()
        assert env.patch_spec(replicas=3) == 3
        env.wait_converged(3, generation=3, timeout=150)
        timings["5->3"] = time.monotonic() - t
        assert env.api.get(env.sts_path)["spec"]["replicas"] == 3

        def shrunk() -> bool:  # the last pod may still be terminating
            sts = env.api.get(env.sts_path)
            return (sts["status"]["replicas"] == 3 and sorted(kubelet.pods) == [0, 1, 2]
                    and all(env.api.get(env.core("pods", f"{env.name}-{k}")) is None
                            for k in (3, 4)))
        env.wait(shrunk, 30, "pods mq-3 and mq-4 gone, the StatefulSet at 3")
        for k in (3, 4):  # their volumes stay (a StatefulSet's claims outlive its pods)
            assert env.api.get(env.core("persistentvolumeclaims", f"data-{env.name}-{k}"))
        t = time.monotonic()
        env.wait(lambda: all(p.progress_since(t) > 0 for p in pubs), 30,
                 "confirms after the membership changes")
    finally:
        for p in pubs:
            p.finish(60)
    for p in pubs:
        assert p.error is None, p.summary()
    # the operator drained mq-4 before removing it: b's client there was closed with 320
    assert pub_b.reconnects and pub_b.reconnects[0][1] == f"{env.name}-4", pub_b.summary()
    assert "320" in pub_b.reconnects[0][2] and "draining" in pub_b.reconnects[0][2], pub_b.summary()

    got = drain(kubelet.node(0), q)
    res = check_delivered({p.tag: p.confirmed for p in pubs}, got)
    print(f"\noperator scale {timings}; {res['delivered']} delivered, "
          f"{res['duplicates']} duplicates\n  " + "\n  ".join(p.summary() for p in pubs)
          + f"\n  leader member views: {[list(m) for _, _, m in kubelet.leader_views]}"
          + "".join(f"\n  {n}: {[len(m) for _, m in v]}" for n, v in kubelet.node_views.items()))
    assert res["lost_count"] == 0, f"lost {res['lost_count']}: {res['lost']}"

    # the first three bootstrapped together, the ones added by the operator joined
    assert kubelet.starts == [("mq-0", False), ("mq-1", False), ("mq-2", False),
                              ("mq-3", True), ("mq-4", True)], kubelet.starts
    # every member set seen (admin Status), by the leader and by each node: one change
    # at a time, never two at once
    leader_views = [m for _, _, m in kubelet.leader_views]
    assert not_one_change(leader_views) == [], f"leader views: {leader_views}"
    for node_id, seen in kubelet.node_views.items():
        views = [m for _, m in seen]
        assert not_one_change(views) == [], f"{node_id} views: {views}"
    assert [len(m) for m in leader_views] == [3, 4, 5, 4, 3], leader_views
    assert kubelet.errors == [], kubelet.errors[-1]
