"""Pure builders of the Kubernetes manifests for one MirrorqCluster (plain dicts)."""
from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from node.app.config_file import NUMERIC_KEYS

from .model import (
    ADMIN_PORT,
    AMQP_PORT,
    AMQPS_PORT,
    HTTP_PORT,
    HTTPS_PORT,
    METRICS_PORT,
    RAFT_PORT,
    Spec,
    headless_name,
    pod_name,
)

DATA_DIR = "/var/lib/mirrorq"
# The broker image's user and group (Dockerfile: useradd --uid 10001 --gid 10001).
BROKER_UID = 10001
CONFIG_DIR = "/etc/mirrorq"
# The Raft port unpickles what it receives: every member gets the cluster's password
# from this Secret as MIRRORQ_RAFT_PASSWORD (the chart's key name; never in the
# ConfigMap, nor in argv). The operator creates it once with a random value.
RAFT_PASSWORD_KEY = "raft-password"
RAFT_PASSWORD_ENV = "MIRRORQ_RAFT_PASSWORD"
# spec.raftTls.secretName: mutual TLS on the Raft links from one cluster CA. The
# Secret (kubernetes.io/tls plus ca.crt: cert-manager's layout) is mounted here,
# beside the config (a mount inside the read-only ConfigMap volume could not be
# created), and mirrorq.toml's [raft] names the files, as the chart does. The
# password stays: it still authenticates the link.
RAFT_TLS_DIR = "/etc/mirrorq-raft-tls"
RAFT_TLS_VOLUME = "raft-tls"
RAFT_TLS_FILES = {"tls_cert": "tls.crt", "tls_key": "tls.key", "tls_ca": "ca.crt"}
# spec.tls.secretName: the amqps listener (port 5671) and the management API over
# HTTPS (15671; [http] tls_port serves [tls]'s certificate): the kubernetes.io/tls
# Secret is mounted here and mirrorq.toml's [tls] names its files. HTTPS only
# unless spec.tls.managementTlsOnly is false: the console's logins and the admin
# token never cross the network in clear.
TLS_DIR = "/etc/mirrorq-tls"
TLS_VOLUME = "tls"
# spec.adminTls (default on): the operator's per-cluster CA (pki.py) in the Secret
# NAME-admin-tls, created once and kept. Pods mount only the CA and their own
# certificate and key (not ca.key, not the operator's client key); [admin] serves
# TLS and asks for a client certificate from that CA (the token is still checked).
# MIRRORQ_ADMIN_CA/_CERT/_KEY point the readiness probe and `mirrorq` CLI calls in
# the pod at the same files (node.admin.client reads them).
ADMIN_TLS_DIR = "/etc/mirrorq-admin-tls"
ADMIN_TLS_VOLUME = "admin-tls"
ADMIN_TLS_KEYS = {"ca_cert": "ca.crt", "ca_key": "ca.key", "server_cert": "tls.crt",
                  "server_key": "tls.key", "client_cert": "client.crt",
                  "client_key": "client.key"}
ADMIN_TLS_POD_FILES = ("ca.crt", "tls.crt", "tls.key")
ADMIN_TLS_ENV = {"MIRRORQ_ADMIN_CA": "ca.crt", "MIRRORQ_ADMIN_CERT": "tls.crt",
                 "MIRRORQ_ADMIN_KEY": "tls.key"}
# The broker's credentials, like RabbitMQ's cluster operator: spec.auth.secretName,
# else NAME-default-user, which the operator creates once (username mirrorq, random
# password and admin token) and never replaces. Every pod gets them as environment
# variables (node.app.config.apply_env): the only AMQP user, and the admin token
# (an optional key for the kubelet, but a node refuses an admin port without a
# token unless spec.config gives [admin] tls_client_ca: its log says so).
AUTH_USERNAME_KEY = "username"
AUTH_PASSWORD_KEY = "password"
AUTH_TOKEN_KEY = "admin-token"
DEFAULT_USER_ENV = "MIRRORQ_DEFAULT_USER"
DEFAULT_PASS_ENV = "MIRRORQ_DEFAULT_PASS"
ADMIN_TOKEN_ENV = "MIRRORQ_ADMIN_TOKEN"
DEFAULT_USERNAME = "mirrorq"

# Peers come from the operator-maintained `members` key; an empty data dir after
# the cluster has formed starts with --join (never bootstraps a second cluster).
# A data dir holds a Raft log as `log/` (segments, issue 27) or, written by an
# older image, `raft.journal`: either is a member's own (no --join: a full
# restart must elect).
START_SCRIPT = """#!/bin/sh
set -eu
SELF="$POD_NAME.$HEADLESS.$POD_NAMESPACE.svc"
PEERS=""
for m in $(cat /etc/mirrorq/members); do
  [ "$m" = "$POD_NAME" ] || PEERS="$PEERS${PEERS:+,}$m=$m.$HEADLESS.$POD_NAMESPACE.svc:25672"
done
JOIN=""
if [ ! -e /var/lib/mirrorq/log ] && [ ! -e /var/lib/mirrorq/raft.journal ] \\
    && [ "$(cat /etc/mirrorq/formed)" = "true" ]; then
  JOIN="--join"
fi
# admin on the pod's own address (a node's default is loopback): the operator and the
# probes reach it there (every address for a pod from a template without POD_IP);
# its token comes from the environment, never argv
exec mirrorq serve --node-id "$POD_NAME" --host "$SELF" --data-dir /var/lib/mirrorq \\
  --amqp-port 5672 --raft-port 25672 --admin-port 15682 --admin-listen "${POD_IP:-0.0.0.0}" \\
  --metrics-port 15692 \\
  --http-port 15672 \\
  --peers "$PEERS" --config /etc/mirrorq/mirrorq.toml $JOIN
"""

# one `python -c` program; the admin token (if any) from the pod's environment
# node.admin.client since issue 25; an older broker image has call_status in
# node.admin.server, so that a new operator's probe still passes on an old image
READY_PROBE = ("import os,sys,importlib.util as u; "
               "c=__import__('node.admin.client' if u.find_spec('node.admin.client') "
               "else 'node.admin.server',fromlist=['call_status']).call_status; "
               "s=c(os.environ['POD_NAME']+'.'+os.environ['HEADLESS']+'.'"
               "+os.environ['POD_NAMESPACE']+'.svc',15682,2.0,"
               "token=os.environ.get('MIRRORQ_ADMIN_TOKEN') or None); "
               "sys.exit(0 if os.environ['POD_NAME'] in s.get('in_sync',[]) "
               "and not s.get('blocked') else 1)")


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "mirrorq", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/managed-by": "mirrorq-operator"}


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels(name)}


CONFIG_HASH = "mirrorq.io/config-hash"


def owned(manifests: list[dict[str, Any]], name: str, uid: str | None) -> list[dict[str, Any]]:
    """ownerReferences to the MirrorqCluster (uid), so that deleting it (`helm
    uninstall`) lets the garbage collector remove what the operator built. Secrets
    stay out: the Raft password and the default user belong to the volumes
    (PVCs, kept too) that a reinstall finds again."""
    if uid is None:
        return manifests
    ref = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "name": name,
           "uid": uid, "controller": True, "blockOwnerDeletion": True}
    out = []
    for m in manifests:
        if m["kind"] != "Secret":
            m = {**m, "metadata": {**m["metadata"], "ownerReferences": [ref]}}
        out.append(m)
    return out


def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _toml(config: dict[str, Any]) -> str:
    """spec.config as node.toml. The CRD types every value as a string
    (heartbeat "30"); a key the node reads as a number is written as one (a
    quoted "30" is refused by the node); anything else stays a string."""
    lines = []
    for key in sorted(config):
        value = config[key]
        if isinstance(value, str) and key in NUMERIC_KEYS and _number(value.strip()) is not None:
            value = _number(value.strip())
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = str(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + ("\n" if lines else "")


def raft_secret_name(name: str) -> str:
    return f"{name}-raft"


def build_raft_secret(name: str, namespace: str, password: str) -> dict[str, Any]:
    """The cluster's Raft password (generated by the caller: builders stay pure).
    Created once and never replaced: it belongs to the volumes' cluster."""
    meta = _meta(raft_secret_name(name), namespace)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "data": {RAFT_PASSWORD_KEY: base64.b64encode(password.encode()).decode()}}


def default_user_secret_name(name: str) -> str:
    return f"{name}-default-user"


def auth_secret_name(spec: Spec, name: str) -> str:
    """The Secret the pods' credentials come from: spec.auth.secretName, else
    the operator's NAME-default-user."""
    return spec.auth_secret or default_user_secret_name(name)


def build_default_user_secret(name: str, namespace: str, username: str, password: str,
                              token: str) -> dict[str, Any]:
    """NAME-default-user: the broker's user and admin token (generated by the
    caller: builders stay pure). Created once, never replaced."""
    meta = _meta(default_user_secret_name(name), namespace)
    data = {AUTH_USERNAME_KEY: username, AUTH_PASSWORD_KEY: password, AUTH_TOKEN_KEY: token}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def admin_tls_secret_name(name: str) -> str:
    return f"{name}-admin-tls"


def build_admin_tls_secret(name: str, namespace: str, pems: Mapping[str, bytes]) -> dict[str, Any]:
    """NAME-admin-tls from pki.AdminPki's fields (generated by the caller: builders
    stay pure). Created once, never replaced: the pods trust this CA."""
    meta = _meta(admin_tls_secret_name(name), namespace)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "data": {file: base64.b64encode(pems[field]).decode()
                     for field, file in ADMIN_TLS_KEYS.items()}}


def admin_tls_config() -> dict[str, str]:
    """The [admin] keys (dotted, for _toml): TLS from the mounted Secret, and client
    certificates from the same CA (the operator's and the probe's)."""
    return {"admin.tls_cert": f"{ADMIN_TLS_DIR}/tls.crt", "admin.tls_key": f"{ADMIN_TLS_DIR}/tls.key",
            "admin.tls_client_ca": f"{ADMIN_TLS_DIR}/ca.crt"}


def raft_tls_config() -> dict[str, str]:
    """The [raft] keys (dotted, for _toml) naming the mounted Secret's files."""
    return {f"raft.{key}": f"{RAFT_TLS_DIR}/{file}" for key, file in RAFT_TLS_FILES.items()}


def tls_config(spec: Spec) -> dict[str, Any]:
    """The [tls] keys (dotted, for _toml) of the amqps listener on the mounted
    Secret, and [http]'s HTTPS port on the same certificate."""
    return {"tls.port": AMQPS_PORT, "tls.cert": f"{TLS_DIR}/tls.crt",
            "tls.key": f"{TLS_DIR}/tls.key", "http.tls_port": HTTPS_PORT,
            "http.tls_only": spec.management_tls_only}


def _management_ports(spec: Spec) -> list[tuple[str, int]]:
    """(name, port) of the management API's listeners: plain HTTP unless spec.tls
    makes it HTTPS only, HTTPS with spec.tls."""
    https = [("management-tls", HTTPS_PORT)] if spec.tls_secret else []
    plain = [] if spec.tls_secret and spec.management_tls_only else [("management", HTTP_PORT)]
    return plain + https


def build_configmap(spec: Spec, name: str, namespace: str, members: list[str] | None = None,
                    formed: bool = False) -> dict[str, Any]:
    initial = members if members is not None else [pod_name(name, k) for k in range(spec.replicas)]
    config = dict(spec.config)
    if spec.raft_tls_secret:
        config.update(raft_tls_config())
    if spec.tls_secret:
        config.update(tls_config(spec))
    if spec.admin_tls:
        config.update(admin_tls_config())
    return {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, namespace),
        "data": {"mirrorq.toml": _toml(config), "start.sh": START_SCRIPT,
                 "members": "\n".join(initial) + "\n", "formed": "true" if formed else "false"},
    }


def _ports(spec: Spec) -> list[dict[str, Any]]:
    amqps = [{"name": "amqps", "containerPort": AMQPS_PORT}] if spec.tls_secret else []
    return [{"name": "amqp", "containerPort": AMQP_PORT}, *amqps,
            {"name": "raft", "containerPort": RAFT_PORT},
            {"name": "admin", "containerPort": ADMIN_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
            *({"name": n, "containerPort": p} for n, p in _management_ports(spec))]


def _secret_env(env: str, secret: str, key: str, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": env, "valueFrom": {"secretKeyRef": ref}}


def build_statefulset(spec: Spec, name: str, namespace: str,
                      replicas: int | None = None) -> dict[str, Any]:
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "HEADLESS", "value": headless_name(name)},
           _secret_env(RAFT_PASSWORD_ENV, raft_secret_name(name), RAFT_PASSWORD_KEY)]
    auth = auth_secret_name(spec, name)
    env += [_secret_env(DEFAULT_USER_ENV, auth, AUTH_USERNAME_KEY),
            _secret_env(DEFAULT_PASS_ENV, auth, AUTH_PASSWORD_KEY),
            _secret_env(ADMIN_TOKEN_ENV, auth, AUTH_TOKEN_KEY, optional=True)]
    if spec.admin_tls:
        env += [{"name": k, "value": f"{ADMIN_TLS_DIR}/{f}"} for k, f in ADMIN_TLS_ENV.items()]
    mounts: list[dict[str, Any]] = [{"name": "data", "mountPath": DATA_DIR},
                                    {"name": "config", "mountPath": CONFIG_DIR}]
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": name}}]
    if spec.tls_secret:
        mounts.append({"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": TLS_VOLUME, "secret": {"secretName": spec.tls_secret}})
    if spec.admin_tls:
        mounts.append({"name": ADMIN_TLS_VOLUME, "mountPath": ADMIN_TLS_DIR, "readOnly": True})
        volumes.append({"name": ADMIN_TLS_VOLUME, "secret": {
            "secretName": admin_tls_secret_name(name), "defaultMode": 0o440,
            "items": [{"key": f, "path": f} for f in ADMIN_TLS_POD_FILES]}})
    if spec.raft_tls_secret:
        mounts.append({"name": RAFT_TLS_VOLUME, "mountPath": RAFT_TLS_DIR, "readOnly": True})
        # only the three keys (a missing one is a mount error naming it); 0440 with
        # the pod's fsGroup: readable by the broker, not by other users
        volumes.append({"name": RAFT_TLS_VOLUME, "secret": {
            "secretName": spec.raft_tls_secret, "defaultMode": 0o440,
            "items": [{"key": f, "path": f} for f in RAFT_TLS_FILES.values()]}})
    container = {
        "name": "mirrorq", "image": spec.image, "command": ["/bin/sh", f"{CONFIG_DIR}/start.sh"],
        "ports": _ports(spec), "env": env, "volumeMounts": mounts,
        "resources": dict(spec.resources),
        "readinessProbe": {"exec": {"command": ["python", "-c", READY_PROBE]},
                           "periodSeconds": 5, "timeoutSeconds": 4},
        "livenessProbe": {"tcpSocket": {"port": ADMIN_PORT}, "initialDelaySeconds": 30,
                          "periodSeconds": 10, "failureThreshold": 6},
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    }
    if spec.image_pull_policy:  # (absent: the pod template of older operators, no roll)
        container["imagePullPolicy"] = spec.image_pull_policy
    pvc_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": spec.storage_size}}}
    if spec.storage_class:
        pvc_spec["storageClassName"] = spec.storage_class
    selector = labels(name)
    template: dict[str, Any] = {
        "metadata": {"labels": selector},
        "spec": {
            "terminationGracePeriodSeconds": spec.grace_seconds,
            # the image's uid; fsGroup: the volume is the broker's group's (the node keeps
            # its data dir's files 0600 itself); OnRootMismatch: no walk of the whole volume at
            # every start once its root is the group's (nor a re-loosening of those files)
            "securityContext": {"runAsNonRoot": True, "runAsUser": BROKER_UID,
                                "runAsGroup": BROKER_UID, "fsGroup": BROKER_UID,
                                "fsGroupChangePolicy": "OnRootMismatch",
                                "seccompProfile": {"type": "RuntimeDefault"}},
            # the broker never calls the API server (peers come from the ConfigMap, the
            # readiness probe asks the node's admin port): no token in the pod
            "automountServiceAccountToken": False,
            "affinity": {"podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 100,
                    "podAffinityTerm": {"labelSelector": {"matchLabels": selector},
                                        "topologyKey": "kubernetes.io/hostname"}}]}},
            "containers": [container],
            "volumes": volumes,
        },
    }
    if spec.image_pull_secrets:
        template["spec"]["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    # the pods' config (the ConfigMap's files are read at start) and template in
    # one hash: a spec change changes it, and the StatefulSet controller then
    # restarts the pods one at a time (RollingUpdate)
    digest = hashlib.sha256(json.dumps(
        [build_configmap(spec, name, namespace)["data"]["mirrorq.toml"], START_SCRIPT, template],
        sort_keys=True).encode()).hexdigest()[:16]
    template["metadata"]["annotations"] = {CONFIG_HASH: digest}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(name, namespace),
        "spec": {
            "serviceName": headless_name(name),
            "replicas": spec.replicas if replicas is None else replicas,
            # Parallel: a full restart must not wait for pod 0 to be ready (needs a quorum)
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": selector},
            "template": template,
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
    """What applications and people reach: AMQP(S) and the management API. Not
    metrics (NAME-metrics) nor admin and Raft (the headless Service)."""
    amqps = ([{"name": "amqps", "port": AMQPS_PORT, "targetPort": AMQPS_PORT}]
             if spec.tls_secret else [])
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(name, namespace),
        "spec": {"type": spec.service_type, "selector": labels(name),
                 "ports": [{"name": "amqp", "port": AMQP_PORT, "targetPort": AMQP_PORT}, *amqps,
                           *({"name": n, "port": p, "targetPort": p}
                             for n, p in _management_ports(spec))]},
    }


METRICS_COMPONENT = {"app.kubernetes.io/component": "metrics"}


def metrics_service_name(name: str) -> str:
    return f"{name}-metrics"


def build_metrics_service(spec: Spec, name: str, namespace: str) -> dict[str, Any]:
    """The scrape target (the chart's ServiceMonitor selects its extra label):
    headless, so that Prometheus scrapes every pod, and never a LoadBalancer
    whatever spec.service.type says."""
    # the cluster's labels (instance = the cluster, as the ServiceMonitor selects)
    meta = {**_meta(metrics_service_name(name), namespace),
            "labels": {**labels(name), **METRICS_COMPONENT}}
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {"clusterIP": "None", "selector": labels(name),
                 "ports": [{"name": "metrics", "port": METRICS_PORT,
                            "targetPort": METRICS_PORT}]},
    }


PDB_VERSIONS = ("policy/v1", "policy/v1beta1")  # preferred first; policy/v1 from Kubernetes 1.21


def pdb_api_version(served: Iterable[str]) -> str | None:
    """The PodDisruptionBudget API to use among the group versions the API
    server serves (discovery), or None when it serves neither (then the
    cluster goes without a PDB rather than without a StatefulSet)."""
    offered = set(served)
    return next((v for v in PDB_VERSIONS if v in offered), None)


def build_pdb(spec: Spec, name: str, namespace: str, api_version: str = "policy/v1") -> dict[str, Any]:
    return {
        "apiVersion": api_version, "kind": "PodDisruptionBudget", "metadata": _meta(name, namespace),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(name)}},
    }


def build_network_policy(spec: Spec, name: str, namespace: str) -> dict[str, Any]:
    """Who may reach which port (issue 26; enforced only where the CNI enforces
    NetworkPolicy): Raft from the members only; admin from the members (the
    readiness probe dials its own pod's admin port) and spec.networkPolicy.adminFrom
    (default: the operator's pods); metrics from metricsFrom (default: pods
    labelled app.kubernetes.io/name=prometheus, any namespace); AMQP(S) and the
    management API from clientFrom, default anywhere (both authenticate every
    client themselves)."""
    members: dict[str, Any] = {"podSelector": {"matchLabels": labels(name)}}
    amqps = [{"port": AMQPS_PORT, "protocol": "TCP"}] if spec.tls_secret else []
    client: dict[str, Any] = {"ports": [{"port": AMQP_PORT, "protocol": "TCP"}, *amqps,
                                        *({"port": p, "protocol": "TCP"}
                                          for _, p in _management_ports(spec))]}
    if spec.client_from is not None:
        client = {"from": [dict(p) for p in spec.client_from], **client}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(name, namespace),
        "spec": {
            "podSelector": {"matchLabels": labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [members], "ports": [{"port": RAFT_PORT, "protocol": "TCP"}]},
                {"from": [members, *(dict(p) for p in spec.admin_from)],
                 "ports": [{"port": ADMIN_PORT, "protocol": "TCP"}]},
                {"from": [dict(p) for p in spec.metrics_from],
                 "ports": [{"port": METRICS_PORT, "protocol": "TCP"}]},
                client,
            ],
        },
    }


def config_hash(statefulset: dict[str, Any]) -> str | None:
    """The config hash a StatefulSet's pod template carries (None: none)."""
    meta = (statefulset.get("spec") or {}).get("template", {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get(CONFIG_HASH)


def build_all(spec: Spec, name: str, namespace: str,
              pdb_version: str | None = "policy/v1",
              owner_uid: str | None = None) -> list[dict[str, Any]]:
    """Everything a cluster needs, the StatefulSet last; no PDB when the
    server offers no PDB API (pdb_version None), no NetworkPolicy when
    spec.networkPolicy.enabled is false; owned by the MirrorqCluster
    `owner_uid` when given."""
    pdb = [] if pdb_version is None else [build_pdb(spec, name, namespace, pdb_version)]
    np = [build_network_policy(spec, name, namespace)] if spec.network_policy else []
    return owned([build_configmap(spec, name, namespace),
                  build_headless_service(spec, name, namespace),
                  build_client_service(spec, name, namespace),
                  build_metrics_service(spec, name, namespace), *pdb, *np,
                  build_statefulset(spec, name, namespace)], name, owner_uid)
