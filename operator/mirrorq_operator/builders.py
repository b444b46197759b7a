"""Pure builders of the Kubernetes manifests for one MirrorqCluster (plain dicts)."""
from __future__ import annotations

from typing import Any

from .model import (
    ADMIN_PORT,
    AMQP_PORT,
    METRICS_PORT,
    RAFT_PORT,
    Spec,
    headless_name,
    pod_name,
)

DATA_DIR = "/var/lib/mirrorq"
CONFIG_DIR = "/etc/mirrorq"

# Peers come from the operator-maintained `members` key; an empty data dir after
# the cluster has formed starts with --join (never bootstraps a second cluster).
START_SCRIPT = """#!/bin/sh
set -eu
SELF="$POD_NAME.$HEADLESS.$POD_NAMESPACE.svc"
PEERS=""
for m in $(cat /etc/mirrorq/members); do
  [ "$m" = "$POD_NAME" ] || PEERS="$PEERS${PEERS:+,}$m=$m.$HEADLESS.$POD_NAMESPACE.svc:25672"
done
JOIN=""
if [ ! -e /var/lib/mirrorq/raft.journal ] && [ "$(cat /etc/mirrorq/formed)" = "true" ]; then
  JOIN="--join"
fi
exec mirrorq serve --node-id "$POD_NAME" --host "$SELF" --data-dir /var/lib/mirrorq \\
  --amqp-port 5672 --raft-port 25672 --admin-port 15672 --metrics-port 15692 \\
  --peers "$PEERS" --config /etc/mirrorq/mirrorq.toml $JOIN
"""

READY_PROBE = ("import os,sys; from node.admin.server import call_status as c; "
               "s=c(os.environ['POD_NAME']+'.'+os.environ['HEADLESS']+'.'"
               "+os.environ['POD_NAMESPACE']+'.svc',15672,2.0); "
               "sys.exit(0 if os.environ['POD_NAME'] in s.get('in_sync',[]) "
               "and not s.get('blocked') else 1)")


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "mirrorq", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/managed-by": "mirrorq-operator"}


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels(name)}


def _toml(config: dict[str, Any]) -> str:
    lines = []
    for key in sorted(config):
        value = config[key]
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = str(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + ("\n" if lines else "")


def build_configmap(spec: Spec, name: str, namespace: str, members: list[str] | None = None,
                    formed: bool = False) -> dict[str, Any]:
    initial = members if members is not None else [pod_name(name, k) for k in range(spec.replicas)]
    return {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, namespace),
        "data": {"mirrorq.toml": _toml(dict(spec.config)), "start.sh": START_SCRIPT,
                 "members": "\n".join(initial) + "\n", "formed": "true" if formed else "false"},
    }


def _ports() -> list[dict[str, Any]]:
    return [{"name": "amqp", "containerPort": AMQP_PORT},
            {"name": "raft", "containerPort": RAFT_PORT},
            {"name": "admin", "containerPort": ADMIN_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT}]


def build_statefulset(spec: Spec, name: str, namespace: str,
                      replicas: int | None = None) -> dict[str, Any]:
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "HEADLESS", "value": headless_name(name)}]
    mounts: list[dict[str, Any]] = [{"name": "data", "mountPath": DATA_DIR},
                                    {"name": "config", "mountPath": CONFIG_DIR}]
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": name}}]
    if spec.tls_secret:
        mounts.append({"name": "tls", "mountPath": "/etc/mirrorq-tls", "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": spec.tls_secret}})
    container = {
        "name": "mirrorq", "image": spec.image, "command": ["/bin/sh", f"{CONFIG_DIR}/start.sh"],
        "ports": _ports(), "env": env, "volumeMounts": mounts,
        "resources": dict(spec.resources),
        "readinessProbe": {"exec": {"command": ["python", "-c", READY_PROBE]},
                           "periodSeconds": 5, "timeoutSeconds": 4},
        "livenessProbe": {"tcpSocket": {"port": ADMIN_PORT}, "initialDelaySeconds": 30,
                          "periodSeconds": 10, "failureThreshold": 6},
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True},
    }
    pvc_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": spec.storage_size}}}
    if spec.storage_class:
        pvc_spec["storageClassName"] = spec.storage_class
    selector = labels(name)
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(name, namespace),
        "spec": {
            "serviceName": headless_name(name),
            "replicas": spec.replicas if replicas is None else replicas,
            # Parallel: a full restart must not wait for pod 0 to be ready (needs a quorum)
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "terminationGracePeriodSeconds": 120,
                    "securityContext": {"runAsNonRoot": True, "fsGroup": 1000},
                    "affinity": {"podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{
                            "weight": 100,
                            "podAffinityTerm": {"labelSelector": {"matchLabels": selector},
                                                "topologyKey": "kubernetes.io/hostname"}}]}},
                    "containers": [container],
                    "volumes": volumes,
                },
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": pvc_spec}],
        },
    }


def build_headless_service(spec: Spec, name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(headless_name(name), namespace),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": labels(name),
                 "ports": [{"name": "raft", "port": RAFT_PORT, "targetPort": RAFT_PORT},
                           {"name": "admin", "port": ADMIN_PORT, "targetPort": ADMIN_PORT}]},
    }


def build_client_service(spec: Spec, name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(name, namespace),
        "spec": {"type": spec.service_type, "selector": labels(name),
                 "ports": [{"name": "amqp", "port": AMQP_PORT, "targetPort": AMQP_PORT},
                           {"name": "metrics", "port": METRICS_PORT,
                            "targetPort": METRICS_PORT}]},
    }


def build_pdb(spec: Spec, name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(name, namespace),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(name)}},
    }


def build_network_policy(spec: Spec, name: str, namespace: str) -> dict[str, Any]:
    members = {"podSelector": {"matchLabels": labels(name)}}
    operator = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mirrorq-operator"}}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(name, namespace),
        "spec": {
            "podSelector": {"matchLabels": labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [members], "ports": [{"port": RAFT_PORT, "protocol": "TCP"}]},
                {"from": [members, operator], "ports": [{"port": ADMIN_PORT, "protocol": "TCP"}]},
                {"ports": [{"port": AMQP_PORT, "protocol": "TCP"},
                           {"port": METRICS_PORT, "protocol": "TCP"}]},
            ],
        },
    }


def build_all(spec: Spec, name: str, namespace: str) -> list[dict[str, Any]]:
    return [build_configmap(spec, name, namespace), build_headless_service(spec, name, namespace),
            build_client_service(spec, name, namespace), build_pdb(spec, name, namespace),
            build_network_policy(spec, name, namespace), build_statefulset(spec, name, namespace)]
