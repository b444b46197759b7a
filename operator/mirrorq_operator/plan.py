"""The pure planner: plan(spec, observed) -> actions. No I/O, no clock.

At most one membership change (AddMember / RemoveMember) per plan, and none
while one is in flight. The same observation always yields the same plan.
"""
from __future__ import annotations

from dataclasses import replace

from .model import (
    IN_CLUSTER,
    Action,
    AddMember,
    Addressing,
    Condition,
    CreateResources,
    DrainMember,
    MarkFormed,
    NodeStatus,
    Observed,
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


def cluster_view(obs: Observed) -> NodeStatus | None:
    """The view of the leader that has quorum (lowest ordinal if several claim it)."""
    for p in sorted(obs.pods, key=lambda p: p.ordinal):
        if p.node is not None and p.node.role == "leader" and p.node.has_quorum:
            return p.node
    return None


def views_disagree(obs: Observed, view: NodeStatus) -> bool:
    """Reachable members report different member sets: a change is propagating.

    Pods that are not members (a removed pod not yet stopped) do not count."""
    views = {p.node.members for p in obs.pods
             if p.node is not None and pod_name(obs.name, p.ordinal) in view.members
             and not volume_lost(obs, p.ordinal)}
    return len(views) > 1


def volume_lost(obs: Observed, ordinal: int) -> bool:
    p = obs.pod(ordinal)
    recorded = obs.volumes.get(pod_name(obs.name, ordinal))
    return p is not None and p.pvc_uid is not None and recorded is not None and recorded != p.pvc_uid


def conditions(spec: Spec, obs: Observed, view: NodeStatus | None,
               progress: str | None) -> tuple[Condition, ...]:
    ready = obs.sts_replicas == spec.replicas and obs.sts_ready == spec.replicas
    all_ready = Condition("AllReplicasReady", "True" if ready else "False",
                          "AllPodsReady" if ready else "PodsNotReady",
                          f"{obs.sts_ready}/{spec.replicas} pods ready")
    if view is None:
        available = Condition("ClusterAvailable", "False", "NoLeader",
                              "no reachable leader with quorum")
        quorum = Condition("QuorumStatus", "False" if obs.exists else "Unknown",
                           "QuorumLost" if obs.exists else "NotCreated", "")
    else:
        available = Condition("ClusterAvailable", "True", "LeaderElected",
                              f"leader {view.leader}")
        quorum = Condition("QuorumStatus", "True", "QuorumPresent",
                           f"{len(view.in_sync)}/{len(view.members)} members in sync")
    if obs.last_error:
        recon = Condition("ReconcileSuccess", "False", "ActionFailed", obs.last_error)
    elif progress:
        recon = Condition("ReconcileSuccess", "True", "InProgress", progress)
    else:
        recon = Condition("ReconcileSuccess", "True", "Converged", "")
    return (all_ready, available, recon, quorum)


def with_failure(status: UpdateStatus, error: str) -> UpdateStatus:
    """The status to write when an action of this pass failed: ReconcileSuccess False."""
    failed = Condition("ReconcileSuccess", "False", "ActionFailed", error)
    return replace(status, conditions=tuple(failed if c.type == failed.type else c
                                            for c in status.conditions))


def _status(spec: Spec, obs: Observed, view: NodeStatus | None,
            actions: list[Action], extra_volumes: dict[str, str] | None = None) -> UpdateStatus:
    progress = "; ".join(describe(a) for a in actions) or None
    volumes = dict(obs.volumes)
    # a member seen for the first time: remember its volume
    if view is not None:
        for p in obs.pods:
            name = pod_name(obs.name, p.ordinal)
            if name in view.members and name not in volumes and p.pvc_uid is not None:
                volumes[name] = p.pvc_uid
    volumes.update(extra_volumes or {})
    return UpdateStatus(
        members=view.members if view else (),
        leader=view.leader if view else None,
        in_sync=view.in_sync if view else (),
        observed_generation=obs.generation,
        conditions=conditions(spec, obs, view, progress),
        volumes=tuple(sorted(volumes.items())),
    )


def describe(a: Action) -> str:
    if isinstance(a, WaitFor):
        return f"waiting: {a.reason}"
    return type(a).__name__ + ("(" + ", ".join(str(v) for v in vars(a).values()) + ")"
                               if vars(a) else "")


def _healthy(obs: Observed, view: NodeStatus, upto: int) -> str | None:
    """Why pods 0..upto-1 are not all ready, members and in sync (None: they are)."""
    for k in range(upto):
        name = pod_name(obs.name, k)
        p = obs.pod(k)
        if p is None or not p.ready:
            return f"{name} not ready"
        if name not in view.members:
            return f"{name} not a member"
        if name not in view.in_sync:
            return f"{name} not in sync"
    return None


def plan(spec: Spec, obs: Observed, addressing: Addressing = IN_CLUSTER) -> list[Action]:
    """`addressing` only decides the Raft address an AddMember carries."""
    if not obs.exists:
        first: list[Action] = [CreateResources()]
        return [*first, _status(spec, obs, None, first)]
    view = cluster_view(obs)
    actions = _steps(spec, obs, view, addressing)
    extra = {a.node: a.pvc_uid for a in actions if isinstance(a, AddMember) and a.pvc_uid}
    return [*actions, _status(spec, obs, view, actions, extra)]


def _steps(spec: Spec, obs: Observed, view: NodeStatus | None,
           addressing: Addressing) -> list[Action]:
    name = obs.name
    raft_address = addressing.raft_address
    if obs.pending_change:
        return [WaitFor(f"membership change in flight: {obs.pending_change}")]
    if view is None:
        return [WaitFor("no leader with quorum")]
    if views_disagree(obs, view):
        return [WaitFor("members disagree on membership: change propagating")]
    steps: list[Action] = [] if obs.formed else [MarkFormed()]
    current, desired = obs.sts_replicas, max(spec.replicas, 1)

    # a member drained for a scale-down that was then called off: serve again
    for m in view.draining:
        j = _ordinal(name, m)
        if m in view.members and j is not None and j < desired:
            return [*steps, ReviveMember(m)]

    # a pod whose volume was lost: remove its old identity, then add it back fresh
    for k in range(current):
        if volume_lost(obs, k):
            node = pod_name(name, k)
            if node in view.members:
                return [*steps, RemoveMember(node)]
            p = obs.pod(k)
            return [*steps, AddMember(node, raft_address(name, obs.namespace, k),
                                      p.pvc_uid if p else None)]

    # members beyond the StatefulSet (a scale-down interrupted after the shrink)
    for m in sorted(view.members, reverse=True):
        j = _ordinal(name, m)
        if j is not None and j >= current and j >= desired:
            if m == view.leader:
                return [*steps, TransferLeadership(m)]
            return [*steps, RemoveMember(m)]

    if desired > current:  # scale up: pod `current` joins, one at a time
        why = _healthy(obs, view, current)
        if why:
            return [*steps, WaitFor(why)]
        node = pod_name(name, current)
        if node not in view.members:
            p = obs.pod(current)
            return [*steps, AddMember(node, raft_address(name, obs.namespace, current),
                                      p.pvc_uid if p else None)]
        return [*steps, ScaleStatefulSet(current + 1)]

    if desired < current:  # scale down: the highest pod leaves, one at a time
        k = current - 1
        node = pod_name(name, k)
        if node in view.members:
            why = _healthy(obs, view, k)
            if why:
                return [*steps, WaitFor(why)]
            if view.leader == node:
                return [*steps, TransferLeadership(node)]
            if node in view.in_sync:
                return [*steps, DrainMember(node), WaitFor(f"{node} to leave the in-sync set")]
            return [*steps, RemoveMember(node)]
        return [*steps, ScaleStatefulSet(k)]

    # steady state: every pod is a member (a pod recreated with its volume rejoins as itself)
    for k in range(current):
        node = pod_name(name, k)
        if node not in view.members:
            p = obs.pod(k)
            return [*steps, AddMember(node, raft_address(name, obs.namespace, k),
                                      p.pvc_uid if p else None)]
    # a changed spec rolls out once every member is healthy (the StatefulSet
    # controller then restarts one pod at a time, each back in sync before the next)
    if obs.template_stale:
        why = _healthy(obs, view, current)
        if why:
            return [*steps, WaitFor(f"{why} (before rolling out the new spec)")]
        return [*steps, UpdateTemplate()]
    return steps


def _ordinal(cluster: str, node: str) -> int | None:
    prefix = cluster + "-"
    if node.startswith(prefix) and node[len(prefix):].isdigit():
        return int(node[len(prefix):])
    return None
