"""The only module doing I/O: the Kubernetes API (kubernetes client) and the admin API."""
from __future__ import annotations

import base64
import binascii
import logging
import os
import secrets
import string
import time
from collections.abc import Mapping
from typing import Any, TypedDict

import grpc
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException

from node.admin.client import (
    call_add_member,
    call_drain,
    call_remove_member,
    call_revive,
    call_status,
    call_transfer_leadership,
)

from . import pki
from .builders import (
    ADMIN_TLS_KEYS,
    AUTH_TOKEN_KEY,
    DEFAULT_USERNAME,
    admin_tls_secret_name,
    build_admin_tls_secret,
    build_all,
    build_client_service,
    build_configmap,
    build_default_user_secret,
    build_metrics_service,
    build_network_policy,
    build_raft_secret,
    build_statefulset,
    config_hash,
    owned,
    pdb_api_version,
)
from .model import (
    Action,
    AddMember,
    Addressing,
    CreateResources,
    DrainMember,
    MarkFormed,
    NodeStatus,
    Observed,
    PodObs,
    RemoveMember,
    ReviveMember,
    ScaleStatefulSet,
    Spec,
    TransferLeadership,
    UpdateStatus,
    UpdateTemplate,
    WaitFor,
    pod_name,
)

log = logging.getLogger(__name__)

# How pods are reached: in-cluster DNS names and fixed ports, unless
# MIRRORQ_OPERATOR_LOCAL_BASE_PORT selects the local mode (model.Addressing).
# Read once, when the operator starts.
ADDRESSING = Addressing.from_env(os.environ)
DRAIN_TIMEOUT = 30.0
PENDING_EXPIRY = 300.0  # well above the admin calls' 60 s timeouts
DEFINITE_REFUSALS = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
                     grpc.StatusCode.UNIMPLEMENTED)


def load() -> None:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


CR = ("mirrorq.io", "v1alpha1", "mirrorqclusters")


def get_cluster(namespace: str, name: str) -> dict[str, Any] | None:
    body: dict[str, Any] | None = _get(client.CustomObjectsApi().get_namespaced_custom_object,
                                       *CR[:2], namespace, CR[2], name)
    return body


def patch_cluster_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi().patch_namespaced_custom_object_status(
        *CR[:2], namespace, CR[2], name, {"status": status})


def _admin(name: str, namespace: str, ordinal: int) -> tuple[str, int]:
    return ADDRESSING.admin_endpoint(name, namespace, ordinal)


def _get(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def read_admin_token(namespace: str, secret_name: str) -> str | None:
    """The `admin-token` key of the cluster's auth Secret (what its pods get as
    MIRRORQ_ADMIN_TOKEN); None when the Secret or the key is missing, and then the
    nodes have no token either (also None for a value that is not text, which the
    nodes refuse at start)."""
    secret = _get(client.CoreV1Api().read_namespaced_secret, secret_name, namespace)
    raw = ((secret.data or {}).get(AUTH_TOKEN_KEY) if secret is not None else None)
    if not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True).decode() or None
    except (binascii.Error, UnicodeDecodeError):
        return None


def read_admin_tls(namespace: str, name: str) -> tuple[bytes, bytes, bytes] | None:
    """(CA, client certificate, client key) from NAME-admin-tls; None when the
    Secret or a key is missing (then the pods cannot start either: their volume
    needs it), and the calls fail rather than fall back to plaintext."""
    secret = _get(client.CoreV1Api().read_namespaced_secret, admin_tls_secret_name(name),
                  namespace)
    data = (secret.data or {}) if secret is not None else {}
    try:
        pems = [base64.b64decode(data[ADMIN_TLS_KEYS[k]], validate=True)
                for k in ("ca_cert", "client_cert", "client_key")]
    except (KeyError, TypeError, binascii.Error):
        return None
    return pems[0], pems[1], pems[2]


class _TlsArgs(TypedDict):
    tls_ca: bytes
    tls_cert: bytes
    tls_key: bytes


def _tls_kwargs(tls: tuple[bytes, bytes, bytes] | None) -> _TlsArgs:
    # b"" (not None) without TLS: the admin client would fall back to the
    # operator's own $MIRRORQ_ADMIN_CA on None
    ca, cert, key = tls or (b"", b"", b"")
    return {"tls_ca": ca, "tls_cert": cert, "tls_key": key}


def ensure_admin_tls(spec: Spec, name: str, ns: str) -> None:
    """With spec.adminTls: NAME-admin-tls, generated once; an existing one (409) is
    kept (the running pods trust its CA). Checked first: no key generation on
    every reconcile."""
    if not spec.admin_tls or read_admin_tls(ns, name) is not None:
        return
    made = pki.generate(name, ns)
    _create(build_admin_tls_secret(name, ns, {f: getattr(made, f) for f in ADMIN_TLS_KEYS}))


def _token(token: str | None) -> str:
    # "" (not None) when there is none: the admin client would fall back to the
    # operator's own $MIRRORQ_ADMIN_TOKEN on None
    return token or ""


def observe(name: str, namespace: str, generation: int, status: Mapping[str, Any], *,
            auth_secret: str, spec: Spec | None = None, uid: str | None = None) -> Observed:
    """`auth_secret`: the cluster's auth Secret (builders.auth_secret_name), whose
    admin token every admin call of this pass carries (read once, here)."""
    apps, core = client.AppsV1Api(), client.CoreV1Api()
    token = read_admin_token(namespace, auth_secret)
    wants_tls = spec is None or spec.admin_tls
    admin_tls = read_admin_tls(namespace, name) if wants_tls else None
    tls = _tls_kwargs(admin_tls)
    sts = _get(apps.read_namespaced_stateful_set, name, namespace)
    cm = _get(core.read_namespaced_config_map, name, namespace)
    pods: list[PodObs] = []
    replicas = ready = 0
    if sts is not None:
        # a StatefulSet its controller has not reported on yet has no status
        replicas = sts.spec.replicas or 0
        ready = (sts.status.ready_replicas if sts.status is not None else 0) or 0
        for k in range(max(replicas, len(status.get("members") or ()))):
            pod = _get(core.read_namespaced_pod, pod_name(name, k), namespace)
            pvc = _get(core.read_namespaced_persistent_volume_claim,
                       f"data-{pod_name(name, k)}", namespace)
            node = None
            # no Secret while TLS is wanted: no call at all (never the token in clear)
            if pod is not None and (admin_tls is not None or not wants_tls):
                try:
                    node = NodeStatus.from_admin(call_status(*_admin(name, namespace, k), 2.0,
                                                             token=_token(token), **tls))
                except Exception:  # unreachable node: observed as such
                    node = None
            is_ready = pod is not None and pod.status is not None and any(
                c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or ()))
            pods.append(PodObs(ordinal=k, ready=is_ready, node=node,
                               pvc_uid=pvc.metadata.uid if pvc is not None else None))
    pending = status.get("pendingChange")
    members = {m for p in pods if p.node for m in p.node.members}
    if pending and (_settled(pending, members) or _expired(pending, time.time())):
        pending = None
    return Observed(name=name, namespace=namespace, exists=sts is not None, sts_replicas=replicas,
                    sts_ready=ready, generation=generation, pods=tuple(pods),
                    volumes=dict(status.get("volumes") or {}), pending_change=pending,
                    formed=cm is not None and (cm.data or {}).get("formed") == "true",
                    admin_token=token, admin_tls=admin_tls, uid=uid,
                    template_stale=sts is not None and spec is not None and _stale(sts, spec,
                                                                                  name, namespace))


def _stale(sts: Any, spec: Spec, name: str, namespace: str) -> bool:
    annotations = (sts.spec.template.metadata.annotations or {}) if sts.spec.template.metadata \
        else {}
    have = annotations.get("mirrorq.io/config-hash")
    return have != config_hash(build_statefulset(spec, name, namespace))


def _roll_out(spec: Spec, name: str, ns: str, replicas: int, uid: str | None) -> None:
    """The spec's ConfigMap files (members and formed stay) and pod template."""
    core, apps = client.CoreV1Api(), client.AppsV1Api()
    data = build_configmap(spec, name, ns)["data"]
    core.patch_namespaced_config_map(name, ns, {"data": {
        "mirrorq.toml": data["mirrorq.toml"], "start.sh": data["start.sh"]}})
    apps.patch_namespaced_stateful_set(
        name, ns, owned([build_statefulset(spec, name, ns, replicas)], name, uid)[0])
    sync_exposure(spec, name, ns, uid)


MERGE_PATCH = "application/merge-patch+json"  # lists (ports, ingress) replaced whole


def sync_exposure(spec: Spec, name: str, ns: str, uid: str | None) -> None:
    """The client Service's ports and the NetworkPolicy follow the spec (spec.tls
    turns management to HTTPS: the old ports would stay open, the new one shut);
    NAME-metrics is created for a cluster an older operator made; the
    NetworkPolicy goes when spec.networkPolicy.enabled is false."""
    core, net = client.CoreV1Api(), client.NetworkingV1Api()
    _create(owned([build_metrics_service(spec, name, ns)], name, uid)[0])
    client_svc = build_client_service(spec, name, ns)
    core.patch_namespaced_service(name, ns, {"spec": {"ports": client_svc["spec"]["ports"]}},
                                  _content_type=MERGE_PATCH)
    if not spec.network_policy:
        try:
            net.delete_namespaced_network_policy(name, ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
        return
    policy = owned([build_network_policy(spec, name, ns)], name, uid)[0]
    try:
        net.patch_namespaced_network_policy(name, ns, {"spec": policy["spec"]},
                                            _content_type=MERGE_PATCH)
    except ApiException as exc:
        if exc.status != 404:
            raise
        _create(policy)


def _settled(pending: str, members: set[str]) -> bool:
    kind, node = (pending.split() + ["", ""])[:2]
    return (kind == "AddMember") == (node in members)


def _expired(pending: str, now: float) -> bool:
    """An uncertain change older than every call's timeout can no longer land."""
    parts = pending.split()
    try:
        return len(parts) > 2 and now - float(parts[2]) > PENDING_EXPIRY
    except ValueError:
        return False


def _leader_admin(obs: Observed) -> tuple[str, int]:
    for p in obs.pods:
        if p.node is not None and p.node.role == "leader":
            return _admin(obs.name, obs.namespace, p.ordinal)
    raise RuntimeError("no leader to send the change to")


def _ordinal(node: str) -> int:
    return int(node.rsplit("-", 1)[1])


_ALPHANUMERIC = string.ascii_letters + string.digits


def new_password(length: int = 24) -> str:
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(length))


def new_admin_token() -> str:
    return secrets.token_hex(16)  # 32 hex digits


def _create_default_user(spec: Spec, name: str, ns: str) -> None:
    """Without spec.auth: NAME-default-user, created once with random values; an
    existing one (409) is kept (the users' clients and the nodes hold them)."""
    if spec.auth_secret is None:
        _create(build_default_user_secret(name, ns, DEFAULT_USERNAME, new_password(),
                                          new_admin_token()))


def execute(action: Action, spec: Spec, obs: Observed, patch_status: dict[str, Any]) -> None:
    name, ns = obs.name, obs.namespace
    apps, core = client.AppsV1Api(), client.CoreV1Api()
    token = _token(obs.admin_token)
    tls = _tls_kwargs(obs.admin_tls)
    if spec.admin_tls and obs.admin_tls is None and isinstance(action, ADMIN_CALLS):
        raise RuntimeError(f"Secret {admin_tls_secret_name(name)} is missing or incomplete: "
                           "no admin call in clear (spec.adminTls)")
    if isinstance(action, CreateResources):
        # first, so no pod starts without them; an existing one (409) is kept: the
        # members' volumes were formed with that password
        _create(build_raft_secret(name, ns, secrets.token_urlsafe(32)))
        _create_default_user(spec, name, ns)
        ensure_admin_tls(spec, name, ns)
        for manifest in build_all(spec, name, ns, pdb_version(), obs.uid):
            _create(manifest)
    elif isinstance(action, ScaleStatefulSet):
        # the rebuilt template may name NAME-default-user for the first time
        # (spec.auth removed since the cluster was created)
        _create_default_user(spec, name, ns)
        ensure_admin_tls(spec, name, ns)
        apps.patch_namespaced_stateful_set(name, ns, {"spec": {"replicas": action.replicas}})
        # the template tracks the spec (image, resources...) but keeps the planned replicas
        _roll_out(spec, name, ns, action.replicas, obs.uid)
    elif isinstance(action, UpdateTemplate):
        ensure_admin_tls(spec, name, ns)  # spec.adminTls turned on since the cluster was made
        _roll_out(spec, name, ns, obs.sts_replicas, obs.uid)
    elif isinstance(action, AddMember | RemoveMember):
        host, port = _leader_admin(obs)
        # Kept in the status only if the call fails with an uncertain outcome
        # (timeout, node gone): then no other change starts until the member
        # set shows this one, or PENDING_EXPIRY has passed.
        patch_status["pendingChange"] = f"{type(action).__name__} {action.node} {time.time():.0f}"
        try:
            if isinstance(action, AddMember):
                result = call_add_member(host, port, action.node, action.address, token=token,
                                         **tls)
            else:
                result = call_remove_member(host, port, action.node, token=token, **tls)
        except grpc.RpcError as exc:
            if exc.code() in DEFINITE_REFUSALS:  # nothing happened: nothing to wait for
                patch_status["pendingChange"] = None
            raise
        patch_status["pendingChange"] = None
        members = sorted((result.get("status") or {}).get("members") or ())
        cm = build_configmap(spec, name, ns, members, formed=obs.formed)
        core.patch_namespaced_config_map(name, ns, {"data": {"members": cm["data"]["members"]}})
    elif isinstance(action, TransferLeadership):
        # asked of the leader being removed; it picks the most caught-up follower
        call_transfer_leadership(*_admin(name, ns, _ordinal(action.from_node)), token=token,
                                 **tls)
    elif isinstance(action, ReviveMember):
        call_revive(*_admin(name, ns, _ordinal(action.node)), DRAIN_TIMEOUT, token=token, **tls)
    elif isinstance(action, DrainMember):
        # Asked of the member itself: it closes its AMQP clients (320), refuses new
        # ones, and leaves the in-sync set for good (a replicated flag).
        call_drain(*_admin(name, ns, _ordinal(action.node)), DRAIN_TIMEOUT, token=token, **tls)
    elif isinstance(action, MarkFormed):
        core.patch_namespaced_config_map(name, ns, {"data": {"formed": "true"}})
    elif isinstance(action, UpdateStatus):
        patch_status.update({
            "members": list(action.members), "leader": action.leader,
            "inSync": list(action.in_sync), "observedGeneration": action.observed_generation,
            "volumes": dict(action.volumes),
            "conditions": [{"type": c.type, "status": c.status, "reason": c.reason,
                            "message": c.message} for c in action.conditions],
        })
    elif isinstance(action, WaitFor):
        pass


ADMIN_CALLS = (AddMember, RemoveMember, TransferLeadership, ReviveMember, DrainMember)
_served: list[str] | None = None  # the API server's group versions (discovery, once)


def pdb_version() -> str | None:
    """The PDB API this server offers: policy/v1 from Kubernetes 1.21,
    policy/v1beta1 before (issue 13: a 404 on policy/v1 used to abort every
    reconcile on 1.20, and no StatefulSet was ever made)."""
    global _served
    if _served is None:
        try:
            groups = client.ApisApi().get_api_versions().groups or []
        except ApiException as exc:  # a server without group discovery (test emulators)
            log.warning("API group discovery failed (%s); assuming policy/v1", exc.status)
            return "policy/v1"
        _served = [v.group_version for g in groups for v in (g.versions or [])]
    version = pdb_api_version(_served)
    if version is None:
        log.warning("the API server offers no PodDisruptionBudget API: clusters go without one")
    return version


def _create_pdb_v1beta1(ns: str, manifest: dict[str, Any]) -> None:
    # the kubernetes client dropped its policy/v1beta1 classes: the dynamic client
    pdbs = dynamic.DynamicClient(client.ApiClient()).resources.get(
        api_version="policy/v1beta1", kind="PodDisruptionBudget")
    pdbs.create(body=manifest, namespace=ns)


def _create(manifest: dict[str, Any]) -> None:
    kind, ns = manifest["kind"], manifest["metadata"]["namespace"]
    if kind == "PodDisruptionBudget" and manifest["apiVersion"] == "policy/v1beta1":
        kind = "PodDisruptionBudget/v1beta1"
    create: Any = {
        "ConfigMap": client.CoreV1Api().create_namespaced_config_map,
        "Secret": client.CoreV1Api().create_namespaced_secret,
        "Service": client.CoreV1Api().create_namespaced_service,
        "StatefulSet": client.AppsV1Api().create_namespaced_stateful_set,
        "PodDisruptionBudget": client.PolicyV1Api().create_namespaced_pod_disruption_budget,
        "PodDisruptionBudget/v1beta1": _create_pdb_v1beta1,
        "NetworkPolicy": client.NetworkingV1Api().create_namespaced_network_policy,
    }[kind]
    try:
        create(ns, manifest)
    except ApiException as exc:
        if exc.status != 409:  # already exists: idempotent
            raise
