"""What a Kubernetes cluster would do with the operator's StatefulSet, for the
operator's end-to-end test against kmock (tests/operator/kmock_api.py), with
real mirrorq processes standing in for the pods.

FakeKubelet plays the StatefulSet controller and the kubelet for one cluster:
- pods NAME-0..replicas-1 run as `mirrorq serve` processes (node id = pod
  name) on 127.0.0.1, at the ports of the operator's local addressing
  (model.Addressing, MIRRORQ_OPERATOR_LOCAL_BASE_PORT);
- a pod starts only once the ConfigMap exists, the way the operator's start
  script (builders.START_SCRIPT) would start it: with the ConfigMap's rendered
  `mirrorq.toml`, the container's Secret-backed environment (the Raft password:
  a missing Secret keeps the pod from starting, CreateContainerConfigError),
  peers = the ConfigMap's `members` but itself; --join when its volume holds no
  Raft journal and the ConfigMap says the cluster has `formed`;
- each pod has a PersistentVolumeClaim `data-NAME-k` (uid from the API
  server) and a data directory that outlives the pod (scale down keeps both,
  like a StatefulSet's volumeClaimTemplates);
- the Pod object's Ready condition mirrors the chart's readiness rule
  (helm/mirrorq/templates/configmap.yaml, ready.py): the node answers its admin
  Status, is in the in-sync set, has a quorum, is not blocked, and is not
  draining;
- a process that exits while its pod should run is restarted with the
  kubelet's back-off (10 s, doubling, capped at 5 min: CrashLoopBackOff);
- pods beyond spec.replicas are stopped (SIGTERM, SIGKILL after the grace
  period) and their Pod objects deleted, highest ordinal first;
- the StatefulSet's status (replicas, readyReplicas, ...) follows the pods.

It also records what each reachable node and the leader report as members
over time (admin Status), for the test's one-change-at-a-time assertions.
"""
from __future__ import annotations

import base64
import json
import os
import random
import socket
import threading
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirrorq_operator.model import Addressing

from node.admin.server import call_status
from tests.cluster_proc import ClusterNode

CRASH_BACKOFF = 10.0
CRASH_BACKOFF_MAX = 300.0
IMAGE = "mirrorq (a local process)"
GRACE_SECONDS = 10.0  # shorter than the chart's 120 s: a node stops in well under a second


class KubeError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> {status}: {body[:300]}")
        self.status = status


class KubeHTTP:
    """A minimal JSON client of the (kmock) API server: no models, no validation."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None,
             content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": content_type,
                                              "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as rsp:
                raw = rsp.read()
        except urllib.error.HTTPError as exc:
            raise KubeError(method, path, exc.code,
                            exc.read().decode(errors="replace")) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        """The object, or None when it does not exist (404)."""
        try:
            return self.call("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.call("POST", path, obj)

    def patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.call("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str) -> Any:
        try:
            return self.call("DELETE", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise


def write_kubeconfig(path: Path, server: str, namespace: str) -> Path:
    """A kubeconfig for the kubernetes client and kopf (JSON is valid YAML)."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": "kmock", "user": {"token": "kmock-accepts-anything"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock",
                                                    "namespace": namespace}}],
        "current-context": "kmock",
    }, indent=1))
    return path


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(size: int, attempts: int = 200) -> int:
    """A base port P with P..P+size-1 all free on 127.0.0.1 (for the local addressing),
    below the ephemeral range: the pods listen on these ports for the whole test and
    restart on them, so no outgoing connection (nor another test's free_port()) may
    take one meanwhile."""
    low = _ephemeral_low()
    top = low - size if low > 12000 + size else 65535 - size
    for _ in range(attempts):
        base = random.randrange(10000, top)
        socks: list[socket.socket] = []
        try:
            for p in range(base, base + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {size} free ports")


def readiness(node_id: str, st: dict[str, Any] | None) -> bool:
    """The chart's readiness rule (ready.py), plus: a draining node is not ready."""
    return (st is not None and node_id in (st.get("in_sync") or ())
            and bool(st.get("has_quorum")) and not st.get("blocked")
            and node_id not in (st.get("draining") or ()))


@dataclass
class Pod:
    ordinal: int
    node: ClusterNode
    ready: bool = False
    restarts: int = 0
    restart_at: float | None = None  # crash back-off: when to start it again
    backoff: float = CRASH_BACKOFF
    published: dict[str, Any] = field(default_factory=dict)  # last status written to the API


class FakeKubelet(threading.Thread):
    def __init__(self, api: KubeHTTP, namespace: str, name: str, addressing: Addressing,
                 base_dir: Path, period: float = 0.4) -> None:
        super().__init__(name=f"kubelet-{name}", daemon=True)
        assert addressing.local, "the fake kubelet runs pods at the local addressing"
        self.api = api
        self.ns = namespace
        self.cluster = name
        self.addressing = addressing
        self.base_dir = base_dir
        self.period = period
        self.config_path = base_dir / "mirrorq.toml"
        self.pods: dict[int, Pod] = {}
        self.stopped: list[ClusterNode] = []  # every node that ran, for the log tails
        self.pvc_uids: dict[int, str] = {}
        self.events: list[str] = []
        self.starts: list[tuple[str, bool]] = []  # (pod, started with --join), in order
        self.errors: list[str] = []
        # admin Status views over time: (monotonic time, reporter, sorted members)
        self.leader_views: list[tuple[float, str, tuple[str, ...]]] = []
        self.node_views: dict[str, list[tuple[float, tuple[str, ...]]]] = {}
        self.statuses: dict[str, dict[str, Any] | None] = {}
        self._lock = threading.Lock()
        self._stop_ev = threading.Event()
        self._sts_status: dict[str, Any] = {}
        base_dir.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- paths
    def _core(self, plural: str, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.ns}/{plural}" + (f"/{name}" if name else "")

    @property
    def _sts_path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/{self.cluster}"

    def pod_name(self, k: int) -> str:
        return f"{self.cluster}-{k}"

    # ---------------------------------------------------------------- public
    def stop(self, timeout: float = 15.0) -> None:
        self._stop_ev.set()
        self.join(timeout)

    def kill_all(self) -> None:
        """SIGKILL every node process this kubelet started (by pid)."""
        with self._lock:
            nodes = [p.node for p in self.pods.values()] + self.stopped
        for n in nodes:
            n.kill9()

    def serving(self) -> list[ClusterNode]:
        """The ready pods' nodes, lowest ordinal first (AMQP candidates)."""
        with self._lock:
            return [p.node for k, p in sorted(self.pods.items()) if p.ready]

    def node(self, k: int) -> ClusterNode:
        with self._lock:
            return self.pods[k].node

    def log_tails(self, n: int = 25) -> str:
        with self._lock:
            nodes = {id(x): x for x in [p.node for p in self.pods.values()] + self.stopped}
        return "\n".join(f"---- {x.node_id} (pid {x.pid}) ----\n{x.tail_log(n)}"
                         for x in nodes.values())

    def _event(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    # ---------------------------------------------------------------- loop
    def run(self) -> None:
        while not self._stop_ev.is_set():
            try:
                self.sync()
            except Exception:  # noqa: BLE001 - keep reconciling, the test reports these
                self.errors.append(traceback.format_exc())
                del self.errors[:-20]
            self._stop_ev.wait(self.period)

    def sync(self) -> None:
        sts = self.api.get(self._sts_path)
        if sts is None:
            return
        replicas = int(sts["spec"].get("replicas") or 0)
        for k in sorted(self.pods, reverse=True):
            if k >= replicas:
                self._terminate(k)
        cm = self.api.get(self._core("configmaps", self.cluster))
        for k in range(replicas):
            self._ensure(k, cm)
        self._probe()
        status = {"replicas": len(self.pods), "readyReplicas": sum(p.ready for p in self.pods.values()),
                  "currentReplicas": len(self.pods), "updatedReplicas": len(self.pods),
                  "availableReplicas": sum(p.ready for p in self.pods.values()),
                  "observedGeneration": sts["metadata"].get("generation", 1)}
        if status != self._sts_status:
            self.api.patch(self._sts_path + "/status", {"status": status})
            self._sts_status = status

    # ---------------------------------------------------------------- pods
    def _ensure(self, k: int, cm: dict[str, Any] | None) -> None:
        pod = self.pods.get(k)
        if pod is None:
            if cm is None:
                return  # the config volume is not there yet: ContainerCreating
            self._ensure_pvc(k)
            node = ClusterNode(self.pod_name(k), self.base_dir / f"data-{self.pod_name(k)}",
                               config_path=self.config_path)
            node.log_path = self.base_dir / f"{self.pod_name(k)}.log"
            node.amqp_port = self.addressing.port(k, "amqp")
            node.raft_port = self.addressing.port(k, "raft")
            node.admin_port = self.addressing.port(k, "admin")
            node.metrics_port = self.addressing.port(k, "metrics")
            pod = Pod(ordinal=k, node=node)
            self._start(pod, cm)
            with self._lock:
                self.pods[k] = pod
            self.api.delete(self._core("pods", node.node_id))  # a leftover of an earlier run
            self.api.create(self._core("pods"), self._pod_manifest(k))
            self._publish(pod)
            return
        if not pod.node.alive():
            now = time.monotonic()
            if pod.restart_at is None:
                rc = pod.node.proc.returncode if pod.node.proc else None
                pod.restart_at = now + pod.backoff
                self._event(f"{pod.node.node_id} exited rc={rc}; restart in {pod.backoff:.0f}s")
                pod.ready = False
                self._publish(pod)
            elif now >= pod.restart_at and cm is not None:
                pod.backoff = min(pod.backoff * 2, CRASH_BACKOFF_MAX)
                pod.restart_at = None
                pod.restarts += 1
                self._start(pod, cm)
                self._publish(pod)

    def _ensure_pvc(self, k: int) -> None:
        if k in self.pvc_uids:
            return
        name = f"data-{self.pod_name(k)}"
        pvc = self.api.get(self._core("persistentvolumeclaims", name))
        if pvc is None:
            pvc = self.api.create(self._core("persistentvolumeclaims"), {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": self.ns,
                             "labels": {"app.kubernetes.io/instance": self.cluster}},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}})
        self.pvc_uids[k] = pvc["metadata"]["uid"]

    def _secret_env(self) -> dict[str, str]:
        """The container's env entries taken from Secrets (secretKeyRef), as the kubelet
        injects them; a missing Secret or key fails the start like CreateContainerConfigError."""
        sts = self.api.get(self._sts_path) or {}
        containers = sts.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
        env: dict[str, str] = {}
        for entry in (containers[0].get("env") or []) if containers else []:
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                continue
            secret = self.api.get(self._core("secrets", ref["name"])) or {}
            value = (secret.get("data") or {}).get(ref["key"])
            if value is None:
                raise RuntimeError(f"CreateContainerConfigError: secret {ref['name']} has no "
                                   f"key {ref['key']}")
            env[entry["name"]] = base64.b64decode(value).decode()
        return env

    def _start(self, pod: Pod, cm: dict[str, Any]) -> None:
        """What START_SCRIPT does: the rendered config and the Secret-backed env, peers
        from the ConfigMap, --join on an empty volume once the cluster has formed."""
        node = pod.node
        data = cm.get("data") or {}
        node.env = self._secret_env()
        self.config_path.write_text(data.get("mirrorq.toml") or "")
        members = (data.get("members") or "").split()
        node.peers = {m: self.addressing.raft_address(self.cluster, self.ns, int(m.rsplit("-", 1)[1]))
                      for m in members if m != node.node_id}
        join = not (node.data_dir / "raft.journal").exists() and data.get("formed") == "true"
        self._event(f"start {node.node_id} join={join} peers={sorted(node.peers)}")
        self.starts.append((node.node_id, join))
        node.start(join=join, wait=False)

    def _terminate(self, k: int) -> None:
        with self._lock:
            pod = self.pods.pop(k)
            self.stopped.append(pod.node)
        self._event(f"terminate {pod.node.node_id} (pid {pod.node.pid})")
        pod.node.stop(timeout=GRACE_SECONDS)  # SIGTERM, then SIGKILL
        self.api.delete(self._core("pods", pod.node.node_id))
        self.statuses.pop(pod.node.node_id, None)

    def _pod_manifest(self, k: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.pod_name(k), "namespace": self.ns,
                         "labels": {"app.kubernetes.io/name": "mirrorq",
                                    "app.kubernetes.io/instance": self.cluster,
                                    "statefulset.kubernetes.io/pod-name": self.pod_name(k)},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                              "name": self.cluster, "uid": "-",
                                              "controller": True}]},
            "spec": {"hostname": self.pod_name(k), "subdomain": f"{self.cluster}-headless",
                     "containers": [{"name": "mirrorq", "image": IMAGE}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {
                         "claimName": f"data-{self.pod_name(k)}"}}]},
        }

    def _publish(self, pod: Pod) -> None:
        """The Pod's status through the status subresource, when it changed."""
        running = pod.node.alive()
        status = {
            "phase": "Running", "podIP": self.addressing.host(self.cluster, self.ns, pod.ordinal),
            "conditions": [{"type": "Ready", "status": "True" if pod.ready else "False"},
                           {"type": "ContainersReady", "status": "True" if pod.ready else "False"}],
            "containerStatuses": [{"name": "mirrorq", "image": IMAGE, "imageID": IMAGE,
                                   "ready": pod.ready,
                                   "restartCount": pod.restarts, "started": running,
                                   "state": {"running": {}} if running else
                                   {"waiting": {"reason": "CrashLoopBackOff"}}}],
        }
        if status != pod.published:
            self.api.patch(self._core("pods", pod.node.node_id) + "/status", {"status": status})
            pod.published = status

    def _probe(self) -> None:
        now = time.monotonic()
        with self._lock:
            pods = list(self.pods.values())
        views: dict[str, dict[str, Any] | None] = {}
        for pod in pods:
            st: dict[str, Any] | None = None
            if pod.node.alive():
                try:
                    st = call_status(pod.node.host, pod.node.admin_port, 1.0)
                except Exception:  # noqa: BLE001 - not answering: not ready
                    st = None
            views[pod.node.node_id] = st
            pod.ready = readiness(pod.node.node_id, st)
            self._publish(pod)
            if st is not None:
                members = tuple(sorted(st.get("members") or ()))
                seen = self.node_views.setdefault(pod.node.node_id, [])
                if not seen or seen[-1][1] != members:
                    seen.append((now, members))
        self.statuses = views
        leaders = sorted(n for n, st in views.items()
                         if st and st.get("role") == "leader" and st.get("has_quorum"))
        if leaders:
            members = tuple(sorted(views[leaders[0]].get("members") or ()))  # type: ignore[union-attr]
            if not self.leader_views or self.leader_views[-1][2] != members:
                self.leader_views.append((now, leaders[0], members))


def env_for_operator(kubeconfig: Path, addressing: Addressing, interval: float) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"KUBECONFIG": str(kubeconfig),
                "MIRRORQ_OPERATOR_LOCAL_BASE_PORT": str(addressing.local_base_port),
                "MIRRORQ_OPERATOR_RECONCILE_SECONDS": str(interval)})
    return env
