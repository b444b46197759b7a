"""Pure tests of plan(spec, observed): membership one change at a time."""
from __future__ import annotations

from mirrorq_operator.model import (
    AddMember,
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
    WaitFor,
)
from mirrorq_operator.plan import plan, with_failure

NAME, NS = "mirrorq", "prod"


def node(k: int) -> str:
    return f"{NAME}-{k}"


def cluster(replicas: int, members: list[int], in_sync: list[int] | None = None,
            leader: int = 0, ready: list[int] | None = None,
            volumes: dict[int, str] | None = None, pvc: dict[int, str] | None = None,
            pending: str | None = None, draining: list[int] | None = None) -> Observed:
    """A StatefulSet of `replicas` pods; all reachable pods agree on `members`."""
    ids = tuple(sorted(node(k) for k in members))
    sync = tuple(sorted(node(k) for k in (members if in_sync is None else in_sync)))
    ready_set = set(range(replicas) if ready is None else ready)
    pods = []
    for k in range(replicas):
        up = k in ready_set
        status = NodeStatus(role="leader" if k == leader else "follower", leader=node(leader),
                            members=ids, in_sync=sync, has_quorum=True,
                            draining=tuple(node(k) for k in draining or ())) if up else None
        pods.append(PodObs(ordinal=k, ready=up, pvc_uid=(pvc or {}).get(k, f"uid-{k}"),
                           node=status))
    recorded = {node(k): v for k, v in (volumes or {}).items()}
    return Observed(name=NAME, namespace=NS, exists=True, sts_replicas=replicas,
                    sts_ready=len(ready_set), generation=7, pods=tuple(pods),
                    volumes=recorded, pending_change=pending, formed=True)


def steps(actions: list) -> list:
    assert isinstance(actions[-1], UpdateStatus)
    return [a for a in actions[:-1] if not isinstance(a, MarkFormed)]


def membership_changes(actions: list) -> list:
    return [a for a in actions if isinstance(a, AddMember | RemoveMember)]


def test_create_when_nothing_exists():
    obs = Observed(name=NAME, namespace=NS, exists=False)
    actions = plan(Spec(replicas=3), obs)
    assert actions[0] == CreateResources()
    assert isinstance(actions[-1], UpdateStatus)


def test_steady_state_does_nothing_and_reports_conditions():
    actions = plan(Spec(replicas=3), cluster(3, [0, 1, 2]))
    assert steps(actions) == []
    status = actions[-1]
    assert status.members == (node(0), node(1), node(2)) and status.leader == node(0)
    assert status.observed_generation == 7
    conds = {c.type: c for c in status.conditions}
    assert set(conds) == {"AllReplicasReady", "ClusterAvailable", "ReconcileSuccess",
                          "QuorumStatus"}
    assert all(c.status == "True" for c in conds.values())
    assert conds["ReconcileSuccess"].reason == "Converged"
    # first sight of the members: their volumes are recorded
    assert dict(status.volumes) == {node(k): f"uid-{k}" for k in range(3)}


def test_scale_up_3_to_5_one_member_at_a_time():
    spec = Spec(replicas=5)
    # members 0..2, sts 3: add pod 3 before it starts
    a = steps(plan(spec, cluster(3, [0, 1, 2])))
    assert a == [AddMember(node(3), f"{node(3)}.{NAME}-headless.{NS}.svc:25672", None)]
    # pod 3 is a member now: start it
    assert steps(plan(spec, cluster(3, [0, 1, 2, 3], in_sync=[0, 1, 2]))) == [ScaleStatefulSet(4)]
    # pod 3 starting, not in sync yet: wait, never add pod 4 meanwhile
    a = steps(plan(spec, cluster(4, [0, 1, 2, 3], in_sync=[0, 1, 2], ready=[0, 1, 2])))
    assert len(a) == 1 and isinstance(a[0], WaitFor) and membership_changes(a) == []
    a = steps(plan(spec, cluster(4, [0, 1, 2, 3], in_sync=[0, 1, 2])))
    assert len(a) == 1 and isinstance(a[0], WaitFor)
    # pod 3 in sync: add pod 4, then scale to 5
    a = steps(plan(spec, cluster(4, [0, 1, 2, 3])))
    assert [type(x) for x in a] == [AddMember] and a[0].node == node(4)
    assert steps(plan(spec, cluster(4, [0, 1, 2, 3, 4], in_sync=[0, 1, 2, 3]))) == \
        [ScaleStatefulSet(5)]
    assert steps(plan(spec, cluster(5, [0, 1, 2, 3, 4]))) == []


def test_every_plan_has_at_most_one_membership_change():
    spec = Spec(replicas=5)
    for obs in (cluster(3, [0, 1, 2]), cluster(5, [0, 1, 2]), cluster(5, [0, 1, 2, 3, 4, 5, 6])):
        assert len(membership_changes(plan(spec, obs))) <= 1


def test_scale_down_5_to_3_transfers_leadership_waits_removes_shrinks():
    spec = Spec(replicas=3)
    # pod 4 leads: move leadership away first
    assert steps(plan(spec, cluster(5, [0, 1, 2, 3, 4], leader=4))) == \
        [TransferLeadership(node(4))]
    # pod 4 follower but still in sync: drain and wait, no removal yet
    a = steps(plan(spec, cluster(5, [0, 1, 2, 3, 4], leader=1)))
    assert a[0] == DrainMember(node(4)) and isinstance(a[1], WaitFor)
    assert membership_changes(a) == []
    # left the in-sync set: remove it from Raft
    assert steps(plan(spec, cluster(5, [0, 1, 2, 3, 4], in_sync=[0, 1, 2, 3], leader=1))) == \
        [RemoveMember(node(4))]
    # no longer a member: shrink the StatefulSet
    assert steps(plan(spec, cluster(5, [0, 1, 2, 3], leader=1))) == [ScaleStatefulSet(4)]
    # then the same for pod 3
    a = steps(plan(spec, cluster(4, [0, 1, 2, 3], in_sync=[0, 1, 2], leader=1)))
    assert a == [RemoveMember(node(3))]
    assert steps(plan(spec, cluster(4, [0, 1, 2], leader=1))) == [ScaleStatefulSet(3)]
    assert steps(plan(spec, cluster(3, [0, 1, 2], leader=1))) == []


def test_removed_pod_still_running_with_a_stale_view_does_not_block_the_shrink():
    obs = cluster(5, [0, 1, 2, 3], leader=1)
    stale = NodeStatus(role="follower", leader=None, members=tuple(node(k) for k in range(5)),
                       in_sync=(), has_quorum=False)
    pods = (*obs.pods[:4], PodObs(ordinal=4, ready=False, pvc_uid="uid-4", node=stale))
    obs = Observed(**{**obs.__dict__, "pods": pods})
    assert steps(plan(Spec(replicas=3), obs)) == [ScaleStatefulSet(4)]


def test_member_left_behind_by_an_interrupted_scale_down_is_removed():
    # sts already shrunk to 3 but pod 3 still a member
    assert steps(plan(Spec(replicas=3), cluster(3, [0, 1, 2, 3], in_sync=[0, 1, 2]))) == \
        [RemoveMember(node(3))]


def test_pod_recreated_with_its_volume_rejoins_as_itself():
    # pod 1 restarted: same PVC uid as recorded, not ready yet -> nothing to do
    obs = cluster(3, [0, 1, 2], in_sync=[0, 2], ready=[0, 2],
                  volumes={0: "uid-0", 1: "uid-1", 2: "uid-2"})
    assert membership_changes(plan(Spec(replicas=3), obs)) == []
    assert steps(plan(Spec(replicas=3), obs)) == []


def test_lost_volume_removes_then_adds_fresh():
    recorded = {0: "uid-0", 1: "uid-1", 2: "uid-2"}
    obs = cluster(3, [0, 1, 2], in_sync=[0, 2], volumes=recorded, pvc={1: "uid-1-new"})
    assert steps(plan(Spec(replicas=3), obs)) == [RemoveMember(node(1))]
    obs = cluster(3, [0, 2], volumes=recorded, pvc={1: "uid-1-new"})
    actions = plan(Spec(replicas=3), obs)
    assert steps(actions) == [AddMember(node(1), f"{node(1)}.{NAME}-headless.{NS}.svc:25672",
                                        "uid-1-new")]
    # the fresh volume is recorded with the add: the next pass sees it as itself
    assert dict(actions[-1].volumes)[node(1)] == "uid-1-new"
    obs = cluster(3, [0, 1, 2], volumes={**recorded, 1: "uid-1-new"}, pvc={1: "uid-1-new"})
    assert steps(plan(Spec(replicas=3), obs)) == []


def test_change_in_flight_waits():
    for spec, obs in ((Spec(replicas=5), cluster(3, [0, 1, 2], pending="AddMember mirrorq-3")),
                      (Spec(replicas=3), cluster(5, [0, 1, 2, 3, 4], pending="RemoveMember x"))):
        a = steps(plan(spec, obs))
        assert len(a) == 1 and isinstance(a[0], WaitFor) and "in flight" in a[0].reason


def test_members_disagreeing_means_a_change_is_propagating():
    obs = cluster(3, [0, 1, 2])
    lagging = NodeStatus(role="follower", leader=node(0), members=(node(0), node(1)),
                         in_sync=(node(0), node(1), node(2)), has_quorum=True)
    pods = (obs.pods[0], obs.pods[1], PodObs(ordinal=2, ready=True, pvc_uid="uid-2", node=lagging))
    obs = Observed(**{**obs.__dict__, "pods": pods})
    a = steps(plan(Spec(replicas=5), obs))
    assert len(a) == 1 and isinstance(a[0], WaitFor)


def test_no_quorum_waits_and_reports_it():
    obs = cluster(3, [0, 1, 2], ready=[])
    actions = plan(Spec(replicas=5), obs)
    assert isinstance(steps(actions)[0], WaitFor)
    conds = {c.type: c for c in actions[-1].conditions}
    assert conds["ClusterAvailable"].status == "False"
    assert conds["QuorumStatus"].status == "False"
    assert conds["AllReplicasReady"].status == "False"


def test_plan_is_idempotent():
    cases = [(Spec(replicas=5), cluster(3, [0, 1, 2])),
             (Spec(replicas=3), cluster(5, [0, 1, 2, 3, 4], leader=4)),
             (Spec(replicas=3), cluster(3, [0, 1, 2], volumes={1: "a"}, pvc={1: "b"})),
             (Spec(replicas=3), Observed(name=NAME, namespace=NS, exists=False))]
    for spec, obs in cases:
        assert plan(spec, obs) == plan(spec, obs)


def test_credentials_do_not_change_the_plan():
    """The admin token (kube.py reads it for the calls) and the auth, TLS and grace
    settings (builders) leave the planner's decisions alone."""
    spec = Spec(replicas=5, auth_secret="orders-creds", grace_seconds=300, tls_secret="mq-tls")
    for obs in (cluster(3, [0, 1, 2]), cluster(5, [0, 1, 2, 3, 4], leader=4)):
        with_token = Observed(**{**obs.__dict__, "admin_token": "0123abcd"})
        assert plan(spec, with_token) == plan(spec, obs)
        assert plan(spec, obs) == plan(Spec(replicas=5), obs)
        assert "0123abcd" not in repr(plan(spec, with_token)) + repr(with_token)


def test_unformed_cluster_is_marked_formed_once_available():
    obs = Observed(**{**cluster(3, [0, 1, 2]).__dict__, "formed": False})
    assert MarkFormed() in plan(Spec(replicas=3), obs)
    assert MarkFormed() not in plan(Spec(replicas=3), cluster(3, [0, 1, 2]))


def test_last_error_fails_reconcile_condition():
    obs = Observed(**{**cluster(3, [0, 1, 2]).__dict__, "last_error": "boom"})
    conds = {c.type: c for c in plan(Spec(replicas=3), obs)[-1].conditions}
    assert conds["ReconcileSuccess"].status == "False" and conds["ReconcileSuccess"].message == "boom"


def test_a_failed_action_turns_reconcile_success_false_and_keeps_the_rest():
    status = plan(Spec(replicas=3), cluster(5, [0, 1, 2, 3, 4], leader=1))[-1]
    failed = with_failure(status, "DrainMember: boom")
    conds = {c.type: c for c in failed.conditions}
    assert conds["ReconcileSuccess"].status == "False"
    assert conds["ReconcileSuccess"].message == "DrainMember: boom"
    assert [c.type for c in failed.conditions] == [c.type for c in status.conditions]
    assert failed.members == status.members and failed.volumes == status.volumes


def test_called_off_scale_down_revives_the_drained_member():
    # 5 -> 3 drained pod 4, then the user asked for 5 again: it serves again first
    obs = cluster(5, [0, 1, 2, 3, 4], in_sync=[0, 1, 2, 3], leader=1, draining=[4])
    assert steps(plan(Spec(replicas=5), obs)) == [ReviveMember(node(4))]
    # still going down: the drained member is removed, not revived
    assert steps(plan(Spec(replicas=3), obs)) == [RemoveMember(node(4))]


def test_changed_spec_rolls_out_once_every_member_is_healthy():
    from dataclasses import replace

    from mirrorq_operator.model import UpdateTemplate
    stale = replace(cluster(3, [0, 1, 2]), template_stale=True)
    assert steps(plan(Spec(replicas=3), stale)) == [UpdateTemplate()]
    # one member out of sync: wait, a rollout would take a second one down
    lagging = replace(cluster(3, [0, 1, 2], in_sync=[0, 1]), template_stale=True)
    [wait] = steps(plan(Spec(replicas=3), lagging))
    assert isinstance(wait, WaitFor) and "mirrorq-2 not in sync" in wait.reason
    # a scale in progress comes first (its ScaleStatefulSet rebuilds the template too)
    growing = replace(cluster(3, [0, 1, 2]), template_stale=True)
    assert not any(isinstance(a, UpdateTemplate) for a in steps(plan(Spec(replicas=5), growing)))
    # nothing stale: nothing to do
    assert steps(plan(Spec(replicas=3), cluster(3, [0, 1, 2]))) == []
