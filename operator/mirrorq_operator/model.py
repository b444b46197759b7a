"""Typed inputs (Spec, Observed) and outputs (Action) of the pure planner."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

AMQP_PORT = 5672
RAFT_PORT = 25672
ADMIN_PORT = 15672
METRICS_PORT = 15692


@dataclass(frozen=True)
class Spec:
    replicas: int = 3
    image: str = "mirrorq:0.1.0"
    resources: Mapping[str, Any] = field(default_factory=dict)
    storage_class: str | None = None
    storage_size: str = "10Gi"
    service_type: str = "ClusterIP"
    tls_secret: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_cr(cls, spec: Mapping[str, Any]) -> Spec:
        persistence = spec.get("persistence") or {}
        return cls(
            replicas=int(spec.get("replicas", 3)),
            image=str(spec.get("image", cls.image)),
            resources=dict(spec.get("resources") or {}),
            storage_class=persistence.get("storageClassName"),
            storage_size=str(persistence.get("size", "10Gi")),
            service_type=str((spec.get("service") or {}).get("type", "ClusterIP")),
            tls_secret=(spec.get("tls") or {}).get("secretName"),
            config=dict(spec.get("config") or {}),
        )


def pod_name(cluster: str, ordinal: int) -> str:
    return f"{cluster}-{ordinal}"


def headless_name(cluster: str) -> str:
    return f"{cluster}-headless"


def raft_address(cluster: str, namespace: str, ordinal: int) -> str:
    return f"{pod_name(cluster, ordinal)}.{headless_name(cluster)}.{namespace}.svc:{RAFT_PORT}"


@dataclass(frozen=True)
class NodeStatus:
    """One node's answer to the admin Status call."""
    role: str
    leader: str | None
    members: tuple[str, ...]
    in_sync: tuple[str, ...]
    has_quorum: bool
    blocked: bool = False

    @classmethod
    def from_admin(cls, doc: Mapping[str, Any]) -> NodeStatus:
        return cls(role=str(doc.get("role")), leader=doc.get("leader"),
                   members=tuple(sorted(doc.get("members") or ())),
                   in_sync=tuple(sorted(doc.get("in_sync") or ())),
                   has_quorum=bool(doc.get("has_quorum")), blocked=bool(doc.get("blocked")))


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
class ScaleStatefulSet:
    replicas: int


@dataclass(frozen=True)
class MarkFormed:
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


Action = (CreateResources | AddMember | RemoveMember | TransferLeadership | DrainMember
          | ScaleStatefulSet | MarkFormed | WaitFor | UpdateStatus)
MEMBERSHIP_CHANGES = (AddMember, RemoveMember)
