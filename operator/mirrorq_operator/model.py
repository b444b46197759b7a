"""Typed inputs (Spec, Observed) and outputs (Action) of the pure planner."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

AMQP_PORT = 5672
AMQPS_PORT = 5671  # spec.tls.secretName set: the amqps listener
RAFT_PORT = 25672
ADMIN_PORT = 15682  # mirrorq's gRPC admin API
HTTP_PORT = 15672  # the management HTTP API and console (RabbitMQ's port)
HTTPS_PORT = 15671  # spec.tls set: the management API over HTTPS (RabbitMQ's port)
METRICS_PORT = 15692

# A Secret's name: a DNS-1123 subdomain (lower case alphanumerics, '-' and '.').
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# [raft] keys that spec.raftTls sets: spec.config may not set them itself.
RAFT_TLS_CONFIG_KEYS = ("raft.tls_cert", "raft.tls_key", "raft.tls_ca")
# [tls] keys that spec.tls sets (the amqps listener and management HTTPS): likewise.
TLS_CONFIG_KEYS = ("tls.port", "tls.cert", "tls.key", "http.tls_port", "http.tls_only",
                   "http.tls_cert", "http.tls_key")
# [admin] keys that spec.adminTls (default on) sets from the operator's CA Secret.
ADMIN_TLS_CONFIG_KEYS = ("admin.tls_cert", "admin.tls_key", "admin.tls_client_ca")
# spec.networkPolicy's peer lists (NetworkPolicyPeer objects, passed through)
# and their defaults. Prometheus: prometheus-operator's and the Prometheus
# chart's pods carry this label, in whatever namespace. The operator: the
# chart's operator pods (any namespace: --all-namespaces installs watch others).
DEFAULT_METRICS_FROM: tuple[Mapping[str, Any], ...] = (
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},)
DEFAULT_ADMIN_FROM: tuple[Mapping[str, Any], ...] = (
    {"namespaceSelector": {},
     "podSelector": {"matchLabels": {"app.kubernetes.io/name": "mirrorq-operator"}}},)
_PEER_KEYS = {"podSelector", "namespaceSelector", "ipBlock"}
DEFAULT_GRACE_SECONDS = 120


class SpecError(ValueError):
    """A MirrorqCluster spec the operator cannot act on (one line: field and why)."""


@dataclass(frozen=True)
class Spec:
    replicas: int = 3
    image: str = "mirrorq:0.1.0"
    image_pull_policy: str | None = None  # spec.imagePullPolicy (None: Kubernetes' default)
    image_pull_secrets: tuple[str, ...] = ()  # spec.imagePullSecrets[].name
    resources: Mapping[str, Any] = field(default_factory=dict)
    storage_class: str | None = None
    storage_size: str = "10Gi"
    service_type: str = "ClusterIP"
    tls_secret: str | None = None
    # spec.tls.managementTlsOnly (default true): with spec.tls, the management API
    # is HTTPS only (15671); false keeps plain HTTP on 15672 beside it
    management_tls_only: bool = True
    # spec.raftTls.secretName: a kubernetes.io/tls Secret with tls.crt, tls.key and
    # ca.crt (cert-manager's layout); set = mutual TLS on the Raft links
    raft_tls_secret: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    # spec.auth.secretName: a Secret with username, password and admin-token
    # (the nodes refuse an admin port without one); None = the operator's own
    # NAME-default-user Secret
    auth_secret: str | None = None
    # spec.adminTls (default true): mutual TLS on the admin port from the operator's
    # per-cluster CA (NAME-admin-tls); false: plaintext gRPC, for debugging only
    admin_tls: bool = True
    grace_seconds: int = DEFAULT_GRACE_SECONDS  # spec.terminationGracePeriodSeconds
    # spec.networkPolicy: the NetworkPolicy (on by default) and who may reach what.
    # Raft is always members only; client_from None = AMQP/management from anywhere
    network_policy: bool = True
    metrics_from: tuple[Mapping[str, Any], ...] = DEFAULT_METRICS_FROM
    admin_from: tuple[Mapping[str, Any], ...] = DEFAULT_ADMIN_FROM
    client_from: tuple[Mapping[str, Any], ...] | None = None

    @classmethod
    def from_cr(cls, spec: Mapping[str, Any]) -> Spec:
        persistence = spec.get("persistence") or {}
        config = dict(spec.get("config") or {})
        raft_tls_secret = _secret_ref(
            spec.get("raftTls"), "spec.raftTls",
            "a kubernetes.io/tls Secret in the cluster's namespace with tls.crt, tls.key and ca.crt")
        auth_secret = _secret_ref(
            spec.get("auth"), "spec.auth",
            "a Secret in the cluster's namespace with username, password and admin-token")
        for keys, owner in ((RAFT_TLS_CONFIG_KEYS, "spec.raftTls.secretName"),
                            (TLS_CONFIG_KEYS, "spec.tls.secretName")):
            reserved = sorted(k for k in config if k in keys)
            if reserved:
                raise SpecError(f"spec.config: {', '.join(reserved)} cannot be set in config; "
                                f"name a kubernetes.io/tls Secret in {owner} instead")
        admin_tls = spec.get("adminTls", True)
        if not isinstance(admin_tls, bool):
            raise SpecError(f"spec.adminTls must be true or false, got {admin_tls!r}")
        reserved = sorted(k for k in config if k in ADMIN_TLS_CONFIG_KEYS) if admin_tls else []
        if reserved:
            raise SpecError(f"spec.config: {', '.join(reserved)} cannot be set in config: "
                            "the operator's CA serves the admin port (spec.adminTls)")
        tls = spec.get("tls") or {}
        tls_only = tls.get("managementTlsOnly", True)
        if not isinstance(tls_only, bool):
            raise SpecError(f"spec.tls.managementTlsOnly must be true or false, got {tls_only!r}")
        np = spec.get("networkPolicy") or {}
        if not isinstance(np, Mapping):
            raise SpecError(f"spec.networkPolicy must be an object, got {np!r}")
        enabled = np.get("enabled", True)
        if not isinstance(enabled, bool):
            raise SpecError(f"spec.networkPolicy.enabled must be true or false, got {enabled!r}")
        client_from = _peers(np, "clientFrom")
        pull_policy = spec.get("imagePullPolicy")
        if pull_policy is not None and pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise SpecError(f"spec.imagePullPolicy must be Always, IfNotPresent or Never, got {pull_policy!r}")
        pull_secrets = spec.get("imagePullSecrets") or []
        if not isinstance(pull_secrets, list) or not all(
                isinstance(s, Mapping) and isinstance(s.get("name"), str) and s["name"] for s in pull_secrets):
            raise SpecError(f"spec.imagePullSecrets must be a list of {{name: SECRET}}, got {pull_secrets!r}")
        return cls(
            replicas=int(spec.get("replicas", 3)),
            image=str(spec.get("image", cls.image)),
            image_pull_policy=pull_policy,
            image_pull_secrets=tuple(str(s["name"]) for s in pull_secrets),
            resources=dict(spec.get("resources") or {}),
            storage_class=persistence.get("storageClassName"),
            storage_size=str(persistence.get("size", "10Gi")),
            service_type=str((spec.get("service") or {}).get("type", "ClusterIP")),
            tls_secret=tls.get("secretName"),
            management_tls_only=tls_only,
            raft_tls_secret=raft_tls_secret,
            config=config,
            auth_secret=auth_secret,
            admin_tls=admin_tls,
            grace_seconds=_grace_seconds(spec.get("terminationGracePeriodSeconds")),
            network_policy=enabled,
            metrics_from=_peers(np, "metricsFrom") or DEFAULT_METRICS_FROM,
            admin_from=_peers(np, "adminFrom") or DEFAULT_ADMIN_FROM,
            client_from=client_from,
        )


def _peers(np: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], ...] | None:
    """spec.networkPolicy.KEY: absent = None (the default); else a non-empty list of
    NetworkPolicyPeer objects (podSelector, namespaceSelector, ipBlock)."""
    value = np.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(
            isinstance(p, Mapping) and p and set(p) <= _PEER_KEYS for p in value):
        raise SpecError(f"spec.networkPolicy.{key} must be a non-empty list of NetworkPolicy "
                        "peers (podSelector, namespaceSelector, ipBlock)")
    return tuple(dict(p) for p in value)


def _secret_ref(ref: Any, path: str, what: str) -> str | None:
    """spec.raftTls / spec.auth: absent (or null) = not set; else {secretName: NAME},
    NAME a Secret name. `what` says what the Secret must be (in the error)."""
    if ref is None:
        return None
    if not isinstance(ref, Mapping):
        raise SpecError(f"{path} must be an object {{secretName: NAME}}, got {ref!r}")
    unknown = sorted(str(k) for k in ref if k != "secretName")
    if unknown:
        raise SpecError(f"{path}: unknown field(s) {', '.join(unknown)} (only secretName)")
    name = ref.get("secretName")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{path}.secretName is required: the name of {what}")
    if len(name) > 253 or not _SECRET_NAME.fullmatch(name):
        raise SpecError(f"{path}.secretName {name!r} is not a Secret name (a DNS-1123 "
                        "subdomain: lower case letters, digits, '-' and '.', at most 253)")
    return name


def _grace_seconds(value: Any) -> int:
    """spec.terminationGracePeriodSeconds: absent (or null) = 120; else an integer >= 1."""
    if value is None:
        return DEFAULT_GRACE_SECONDS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"spec.terminationGracePeriodSeconds must be an integer >= 1, "
                        f"got {value!r}")
    return value


def pod_name(cluster: str, ordinal: int) -> str:
    return f"{cluster}-{ordinal}"


def headless_name(cluster: str) -> str:
    return f"{cluster}-headless"


PORT_NAMES = ("amqp", "raft", "admin", "metrics", "http")
IN_CLUSTER_PORTS = {"amqp": AMQP_PORT, "raft": RAFT_PORT, "admin": ADMIN_PORT,
                    "metrics": METRICS_PORT, "http": HTTP_PORT}
LOCAL_BASE_PORT_ENV = "MIRRORQ_OPERATOR_LOCAL_BASE_PORT"
LOCAL_HOST = "127.0.0.1"
LOCAL_STRIDE = 10  # ports per ordinal in local mode
MAX_ORDINAL = 8  # the CRD allows at most 9 replicas


@dataclass(frozen=True)
class Addressing:
    """Where the operator reaches pod `ordinal` of a cluster (its Raft and admin endpoints).

    In-cluster (the default, local_base_port None): the pod's stable DNS name
    NAME-k.NAME-headless.NS.svc behind the headless Service, on the fixed ports
    (AMQP 5672, Raft 25672, admin gRPC 15682, metrics 15692, HTTP 15672).

    Local (development and tests, no Kubernetes DNS): every pod on 127.0.0.1,
    pod k on ports P+10k (AMQP), P+10k+1 (Raft), P+10k+2 (admin), P+10k+3
    (metrics), P+10k+4 (HTTP), P = local_base_port. Selected by MIRRORQ_OPERATOR_LOCAL_BASE_PORT=P.
    Whatever runs the pods starts them on these ports (development without DNS).
    """
    local_base_port: int | None = None

    def __post_init__(self) -> None:
        p = self.local_base_port
        if p is not None and not 1024 <= p <= 65535 - LOCAL_STRIDE * (MAX_ORDINAL + 1):
            raise ValueError(f"local base port {p} out of range "
                             f"1024..{65535 - LOCAL_STRIDE * (MAX_ORDINAL + 1)}")

    @property
    def local(self) -> bool:
        return self.local_base_port is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Addressing:
        """In-cluster unless MIRRORQ_OPERATOR_LOCAL_BASE_PORT is set (to a port number)."""
        raw = (env.get(LOCAL_BASE_PORT_ENV) or "").strip()
        if not raw:
            return cls()
        if not raw.isdigit():
            raise ValueError(f"{LOCAL_BASE_PORT_ENV} must be a port number, got {raw!r}")
        return cls(local_base_port=int(raw))

    def host(self, cluster: str, namespace: str, ordinal: int) -> str:
        if self.local_base_port is not None:
            return LOCAL_HOST
        return f"{pod_name(cluster, ordinal)}.{headless_name(cluster)}.{namespace}.svc"

    def port(self, ordinal: int, name: str) -> int:
        if name not in PORT_NAMES:
            raise ValueError(f"unknown port {name!r}")
        if self.local_base_port is None:
            return IN_CLUSTER_PORTS[name]
        return self.local_base_port + LOCAL_STRIDE * ordinal + PORT_NAMES.index(name)

    def raft_address(self, cluster: str, namespace: str, ordinal: int) -> str:
        """HOST:PORT a member is known by in Raft (AddMember, peers)."""
        return f"{self.host(cluster, namespace, ordinal)}:{self.port(ordinal, 'raft')}"

    def admin_endpoint(self, cluster: str, namespace: str, ordinal: int) -> tuple[str, int]:
        return self.host(cluster, namespace, ordinal), self.port(ordinal, "admin")

    def amqp_endpoint(self, cluster: str, namespace: str, ordinal: int) -> tuple[str, int]:
        return self.host(cluster, namespace, ordinal), self.port(ordinal, "amqp")


IN_CLUSTER = Addressing()


def raft_address(cluster: str, namespace: str, ordinal: int) -> str:
    """The in-cluster Raft address of pod `ordinal` (see Addressing for the local mode)."""
    return IN_CLUSTER.raft_address(cluster, namespace, ordinal)


@dataclass(frozen=True)
class NodeStatus:
    """One node's answer to the admin Status call."""
    role: str
    leader: str | None
    members: tuple[str, ...]
    in_sync: tuple[str, ...]
    has_quorum: bool
    blocked: bool = False
    draining: tuple[str, ...] = ()  # members in maintenance mode (admin Drain)

    @classmethod
    def from_admin(cls, doc: Mapping[str, Any]) -> NodeStatus:
        return cls(role=str(doc.get("role")), leader=doc.get("leader"),
                   members=tuple(sorted(doc.get("members") or ())),
                   in_sync=tuple(sorted(doc.get("in_sync") or ())),
                   has_quorum=bool(doc.get("has_quorum")), blocked=bool(doc.get("blocked")),
                   draining=tuple(sorted(doc.get("draining") or ())))


@dataclass(frozen=True)
class PodObs:
    ordinal: int
    ready: bool = False
    pvc_uid: str | None = None  # uid of the pod's data PersistentVolumeClaim
    node: NodeStatus | None = None  # None: admin API unreachable


@dataclass(frozen=True)
class Observed:
    name: str
    namespace: str
    exists: bool  # the StatefulSet exists
    sts_replicas: int = 0
    sts_ready: int = 0
    generation: int = 0
    pods: tuple[PodObs, ...] = ()
    # pod name -> PVC uid it had when it was last a member (kept in the CR's status)
    volumes: Mapping[str, str] = field(default_factory=dict)
    pending_change: str | None = None  # a membership change the operator started, not confirmed
    last_error: str | None = None
    formed: bool = False  # the cluster has formed once: empty pods must --join from now on
    # the auth Secret's admin-token, for every admin call of this pass (None: no
    # Secret or no key, and then the nodes have no token either); never printed
    admin_token: str | None = field(default=None, repr=False)
    # (CA, client certificate, client key) PEMs from NAME-admin-tls for every admin
    # call of this pass; None: plaintext (spec.adminTls false)
    admin_tls: tuple[bytes, bytes, bytes] | None = field(default=None, repr=False)
    # the StatefulSet's pod template predates the spec (its config hash differs)
    template_stale: bool = False
    uid: str | None = None  # the MirrorqCluster's: what the built objects are owned by

    def pod(self, ordinal: int) -> PodObs | None:
        for p in self.pods:
            if p.ordinal == ordinal:
                return p
        return None


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" / "False" / "Unknown"
    reason: str
    message: str = ""


# -- actions ---------------------------------------------------------------

@dataclass(frozen=True)
class CreateResources:
    pass


@dataclass(frozen=True)
class AddMember:
    node: str
    address: str
    pvc_uid: str | None = None  # recorded as the member's volume once added


@dataclass(frozen=True)
class RemoveMember:
    node: str


@dataclass(frozen=True)
class TransferLeadership:
    from_node: str


@dataclass(frozen=True)
class DrainMember:
    """Ask a member to leave the in-sync set (it stays a Raft member)."""
    node: str


@dataclass(frozen=True)
class ReviveMember:
    """Undo a drain of a member that stays (a scale-down changed its mind)."""
    node: str


@dataclass(frozen=True)
class ScaleStatefulSet:
    replicas: int


@dataclass(frozen=True)
class MarkFormed:
    pass


@dataclass(frozen=True)
class UpdateTemplate:
    """The spec changed (config, image, resources...): new ConfigMap files and pod
    template; the StatefulSet controller restarts the pods one at a time."""
    pass


@dataclass(frozen=True)
class WaitFor:
    reason: str


@dataclass(frozen=True)
class UpdateStatus:
    members: tuple[str, ...]
    leader: str | None
    in_sync: tuple[str, ...]
    observed_generation: int
    conditions: tuple[Condition, ...]
    volumes: tuple[tuple[str, str], ...] = ()


Action = (CreateResources | AddMember | RemoveMember | TransferLeadership | DrainMember | ReviveMember
          | ScaleStatefulSet | MarkFormed | UpdateTemplate | WaitFor | UpdateStatus)
MEMBERSHIP_CHANGES = (AddMember, RemoveMember)
