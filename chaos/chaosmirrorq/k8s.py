"""chaostoolkit actions and probes for a mirrorq cluster on Kubernetes, through
the API (kubernetes client, the KUBECONFIG or in-cluster config): the operator's
MirrorqCluster status says who leads and who is in sync; pods are found by the
operator's labels and reached at their pod IPs (which change when a pod is
recreated: endpoints are looked up again at every (re)connect).

`amqp` arguments of chaosmirrorq.actions accept "k8s:NAMESPACE/CLUSTER" for
these endpoints, with the cluster's own user (its auth Secret).
"""
from __future__ import annotations

import base64
import time
from typing import Any

GROUP, VERSION, PLURAL = "mirrorq.io", "v1alpha1", "mirrorqclusters"
_loaded = False


def _client() -> Any:
    global _loaded
    from kubernetes import client, config
    if not _loaded:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        _loaded = True
    return client


def cluster(ns: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = _client().CustomObjectsApi().get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name)
    return body


def _pods(ns: str, name: str) -> list[Any]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/managed-by=mirrorq-operator"
    items: list[Any] = _client().CoreV1Api().list_namespaced_pod(
        ns, label_selector=selector).items
    return items


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True"
               for c in (pod.status.conditions or ()))


def credentials(ns: str, name: str) -> tuple[str, str]:
    """The cluster's AMQP user: its spec.auth Secret, else NAME-default-user."""
    secret_name = ((cluster(ns, name).get("spec") or {}).get("auth") or {}).get("secretName") \
        or f"{name}-default-user"
    data = _client().CoreV1Api().read_namespaced_secret(secret_name, ns).data or {}
    return (base64.b64decode(data["username"]).decode(),
            base64.b64decode(data["password"]).decode())


def endpoints(ns: str, name: str) -> list[Any]:
    """The cluster's pods with an IP, Ready ones first, as workload Endpoints."""
    from chaosmirrorq.workload import Endpoint
    user, password = credentials(ns, name)
    pods = [p for p in _pods(ns, name)
            if p.status.pod_ip and not p.metadata.deletion_timestamp]
    pods.sort(key=lambda p: (not _ready(p), p.metadata.name))
    return [Endpoint(p.metadata.name, p.status.pod_ip, 5672, user, password) for p in pods]


def kill_leader_pod(ns: str, cluster_name: str, grace_period: int = 0) -> dict[str, Any]:
    """Delete the pod of the member the operator reports as leader (grace 0 = SIGKILL
    right away); the StatefulSet controller recreates it."""
    leader = (cluster(ns, cluster_name).get("status") or {}).get("leader")
    if not leader:
        raise RuntimeError(f"{ns}/{cluster_name} reports no leader")
    client = _client()
    client.CoreV1Api().delete_namespaced_pod(
        leader, ns, body=client.V1DeleteOptions(grace_period_seconds=int(grace_period)))
    return {"killed": leader}


def scale_cluster(ns: str, cluster_name: str, replicas: int) -> dict[str, Any]:
    """Change spec.replicas of the MirrorqCluster (the operator adds or removes one
    member at a time)."""
    _client().CustomObjectsApi().patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, cluster_name, {"spec": {"replicas": int(replicas)}})
    return {"replicas": int(replicas)}


def cluster_converged(ns: str, cluster_name: str, replicas: int | None = None,
                      timeout: float = 180.0) -> bool:
    """Within `timeout`: the MirrorqCluster reports `replicas` (default: its spec)
    members, all in sync, a leader, ClusterAvailable, and as many pods are Ready."""
    deadline = time.monotonic() + float(timeout)
    while time.monotonic() < deadline:
        try:
            body = cluster(ns, cluster_name)
            n = int(replicas) if replicas not in (None, "") else int(body["spec"]["replicas"])
            st = body.get("status") or {}
            cond = {c.get("type"): c.get("status") for c in st.get("conditions") or ()}
            want = sorted(f"{cluster_name}-{k}" for k in range(n))
            ready = sorted(p.metadata.name for p in _pods(ns, cluster_name)
                           if _ready(p) and not p.metadata.deletion_timestamp)
            if (sorted(st.get("members") or ()) == want and sorted(st.get("inSync") or ()) == want
                    and st.get("leader") in want and cond.get("ClusterAvailable") == "True"
                    and ready == want):
                return True
        except Exception:  # noqa: BLE001 - API hiccup or a pod in transition: keep polling
            pass
        time.sleep(1.0)
    return False
