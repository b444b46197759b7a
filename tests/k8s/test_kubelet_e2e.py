"""Issue 30: the chart's pods under a real kubelet and container runtime, against
the tests' real control plane (k8s/control_plane.py): kubelet and kube-proxy
v1.20.2 built from Debian's kubernetes source, containerd 1.6 with runc, the CNI
bridge plugin, the cluster DNS of k8s/dns.py and a hostPath provisioner
(k8s/node.py). Nothing of the pods is ours: the kubelet creates the sandboxes,
mounts the volumes (the service-account token, ConfigMap, Secrets, the PVC),
applies the securityContext, runs the exec/tcp probes, enforces the memory
limit in cgroups, and restarts and deletes containers; kube-proxy routes
ClusterIPs; the brokers find each other through DNS.

In order on one release: `helm install` (the operator and 3 brokers from the image
`make image` builds: containerd, uid 10001, read-only root, no restart; AMQP through
each pod's IP and through the client Service's ClusterIP; `kubectl logs` and
`kubectl exec` through the kubelet; the wrong password refused; the admin port's
mutual TLS; the management API on every pod) -> 3 -> 5 -> 3 under streaming
confirms (0 confirmed lost, one membership change at a time) -> chaostoolkit's
leader-pod-kill (the leader's pod SIGKILLed twice under the chaos workload, 0
confirmed lost) -> the leader's pod deleted: recreated with a new IP, found again
by its name, back in sync -> a config change rolls the pods one at a time under
load -> a pod whose volume is lost comes back as a fresh member -> `helm
uninstall` keeps the PVCs -> the upgrade from the previous release: its CRD,
chart and image with a backlog, then `helm upgrade` to this one under streaming
confirms (one pod at a time, a mixed-version cluster confirming, 0 lost).
The leader-pod-kill experiment and the upgrade (its own image build) are marked
`long` (make test-long); docs/testing.md names the cheaper tests that keep their
guarantees in `make test`, which keeps this module near 10 minutes.
(The node agent, k8s/node_agent.py, runs only the long scale-out-in experiment of
tests/k8s/test_chaos_k8s.py, `make test-long`.)
"""
from __future__ import annotations

import base64
import functools
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from harness.body import body_ok
from harness.client import check_delivered, drain, uniq_queue
from harness.publisher import StreamPublisher
from k8s.control_plane import ControlPlaneError, bin_dir, missing_binaries, up
from k8s.node import KubeletNode, missing_node_binaries
from node.admin.client import call_status
from tests.support.k8s_chaos import run_experiment
from tests.support.k8s_env import CHART, NAME, RELEASE, SELECTOR, Env, PodEndpoint, wait
from tests.support.k8s_load import (
    amqp_roundtrip,
    delete_leader_pod_and_wait_for_it,
    one_change_at_a_time,
    publish_while,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the kubelet and containerd need "
                                "root (namespaces, mounts, cgroups, iptables)")


def _upgrade_selected(session: pytest.Session) -> bool:
    return any(item.name.startswith("test_upgrade_from_previous_release") for item in session.items)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, built_image: str,
        request: pytest.FixtureRequest) -> Iterator[Env]:
    missing = missing_binaries(bin_dir()) + missing_node_binaries()
    assert not missing, f"run `make k8s-build` first (missing: {missing})"
    images = [built_image]
    if _upgrade_selected(request.session):  # `make test-long`: build and import it too
        images.append(request.getfixturevalue("previous_release")[0])
    work = tmp_path_factory.mktemp("k8s-kubelet")
    cp = up(work / "k8s")
    node: KubeletNode | None = None
    try:
        # broker and operator pods: containers of the image built from the
        # Dockerfile (the chart names it for both), under a real kubelet and containerd
        t0 = time.monotonic()
        node = KubeletNode(cp, work / "node", images).start()
        print(f"kubelet node ready in {time.monotonic() - t0:.0f}s {node.timings}")
        e = Env(cp, node, work)
        repo, tag = built_image.rsplit(":", 1)
        # requests fit 5 members and the operator on 2 cores; the memory limit is real
        # (cgroups), so the watermark stays well below it
        e.values.write_text(
            "replicas: 3\n"
            f"image:\n  repository: {repo}\n  tag: {tag}\n  pullPolicy: Never\n"
            "persistence:\n  size: 1Gi\n"
            "resources:\n  requests: {cpu: 100m, memory: 256Mi}\n"
            "  limits: {memory: 1536Mi}\n"
            "terminationGracePeriodSeconds: 30\n"
            "config:\n  memory_high_watermark: 805306368\n"
            "operator:\n  extraEnv:\n"
            "    - {name: MIRRORQ_OPERATOR_RECONCILE_SECONDS, value: \"2\"}\n")
        yield e
        e.stop_watch()
    finally:
        if node is not None:
            node.stop()
        cp.down()


@pytest.fixture
def diag(env: Env, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(env.diagnostics())


def env_image_ref(env: Env) -> str:
    text = env.values.read_text()
    return f"{text.split('repository: ')[1].split()[0]}:{text.split('tag: ')[1].split()[0]}"


# the first test: its setup builds both images if this session has not yet and
# imports them into containerd (about 6 minutes from nothing)
@pytest.mark.timeout(1200)
def test_helm_install_under_the_kubelet_runs_the_image_as_its_user_with_dns_and_kube_proxy(
        env: Env, diag: None) -> None:
    t0 = time.monotonic()
    env.helm("install", RELEASE, str(CHART), "--create-namespace", "-f", str(env.values))
    # the operator: scheduled on the kubelet's Node, running with its own ServiceAccount
    op = wait(lambda: [p for p in env.json("pods", "-l", "app.kubernetes.io/component=operator")
                       ["items"] if p.get("status", {}).get("phase") == "Running"],
              60, "the operator pod running", env.diagnostics)[0]
    assert op["spec"]["serviceAccountName"] == f"{NAME}-operator"
    token_vols = [v["secret"]["secretName"] for v in op["spec"]["volumes"] if "secret" in v]
    assert any(v.startswith(f"{NAME}-operator-token-") for v in token_vols), token_vols
    st = wait(lambda: env.converged(3), 180, "3 members in sync, 3 pods Ready",
              env.diagnostics)
    print(f"install -> 3 Ready members: {time.monotonic() - t0:.1f}s; status {st}")
    assert {c["type"]: c["status"] for c in st["conditions"]}["QuorumStatus"] == "True"
    # the brokers and the operator are containers of the image built from the
    # Dockerfile (issue 30: one image, the chart's default for both), run by the real
    # kubelet through containerd: the image's user (uid 10001, with the broker pods'
    # fsGroup), a read-only root; seen through `kubectl exec` (API server -> kubelet)
    seen = []
    for p in env.json("pods")["items"]:
        name = p["metadata"]["name"]
        (cs,) = p["status"]["containerStatuses"]
        assert cs["containerID"].startswith("containerd://"), cs
        assert cs["image"].endswith(env_image_ref(env)), cs
        ident = env.kubectl("exec", name, "--", "sh", "-c",
                            "id -u; id -G; touch /x 2>&1 || true; cat /proc/1/cmdline"
                            ).stdout.split("\n")
        assert ident[0] == "10001", ident
        assert "10001" in ident[1].split(), ident  # fsGroup (the operator: its own group)
        assert "Read-only file system" in ident[2], ident
        seen.append((name, ident[3].replace("\0", " ")))
    ops = [cmd for name, cmd in seen if name.startswith(f"{NAME}-operator")]
    assert len(ops) == 1 and "kopf run -m mirrorq_operator.handlers" in ops[0], seen
    assert len(seen) == 4, seen
    # the brokers found each other by the headless Service's names (k8s/dns.py answers
    # them in the pods); the client Service's ClusterIP reaches a broker through
    # kube-proxy's rules; kubectl logs reads a broker's output through the kubelet
    client_ip = env.json("service", NAME)["spec"]["clusterIP"]
    ep0 = env.endpoints()[0]
    body = os.urandom(8192)
    assert amqp_roundtrip(PodEndpoint("clusterip", client_ip, ep0.user, ep0.password),
                          uniq_queue("svc"), body) == body
    logs = env.kubectl("logs", f"{NAME}-0", "--tail=200").stdout
    assert logs.strip(), "no log lines through the kubelet"
    # AMQP through each pod's own address, with the chart Secret's user
    eps = env.endpoints()
    assert len({e.host for e in eps}) == 3
    for e in eps:
        body = os.urandom(4096)
        assert amqp_roundtrip(e, uniq_queue("e2e"), body) == body
    # the wrong password is refused (only the Secret's user exists)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(
            host=eps[0].host, credentials=pika.PlainCredentials(eps[0].user, "wrong"),
            connection_attempts=1, socket_timeout=5))
    # the admin port is mutual TLS from the operator's CA (issue 26): the operator and
    # the readiness probes (3 Ready pods above) got through it; plaintext does not, and
    # TLS with the CA's client certificate still wants the token
    tls = env.admin_tls(eps[0].node_id)
    assert call_status(eps[0].host, 15682, 3.0, token=env.secret("admin-token"),
                       **tls)["node_id"] == eps[0].node_id
    with pytest.raises(Exception, match="UNAVAILABLE"):
        call_status(eps[0].host, 15682, 3.0, token=env.secret("admin-token"), tls_ca=b"")
    with pytest.raises(Exception, match="UNAUTHENTICATED|token"):
        call_status(eps[0].host, 15682, 3.0, token="", **tls)
    # the management HTTP API (15672) on every pod, with the Secret's user: each
    # names the same leader; no credentials is 401
    leaders = set()
    for e in eps:
        auth = base64.b64encode(f"{e.user}:{e.password}".encode()).decode()
        req = urllib.request.Request(f"http://{e.host}:15672/api/mirrorq/cluster",
                                     headers={"Authorization": f"Basic {auth}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            leaders.add(json.load(resp)["leader"])
    assert len(leaders) == 1 and None not in leaders, leaders
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"http://{eps[0].host}:15672/api/overview", timeout=10)
    assert denied.value.code == 401
    # the kubelet started each broker once: no crash-loop while a new pod's own DNS
    # name is not yet answered (it waits for it, node/app/main.py RESOLVE_WAIT)
    restarts = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
                for p in env.pods()}
    assert set(restarts.values()) == {0}, restarts


@pytest.mark.timeout(900)
def test_helm_upgrade_scales_3_5_3_one_member_at_a_time_under_load(env: Env, diag: None) -> None:
    env.watch_members()

    def scale() -> None:
        t0 = time.monotonic()
        env.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "replicas=5")
        wait(lambda: env.converged(5), 300, "5 members in sync", env.diagnostics)
        print(f"3 -> 5: {time.monotonic() - t0:.1f}s")
        t0 = time.monotonic()
        env.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "replicas=3")
        wait(lambda: env.converged(3) and len(env.pods()) == 3, 300,
             "back to 3 members and 3 pods", env.diagnostics)
        print(f"5 -> 3: {time.monotonic() - t0:.1f}s")

    publish_while(env, "scale", scale)
    env.stop_watch()
    sizes = [len(m) for _, m in env.views]
    assert 5 in sizes and sizes[-1] == 3, env.views
    one_change_at_a_time(env.views)


@pytest.mark.long  # the gate: the leader pod deleted below, and the chaos subset's leader kill loop
@pytest.mark.timeout(900)
def test_leader_pod_kill_experiment_loses_nothing_under_the_kubelet(env: Env, diag: None,
                                                                     tmp_path: Path) -> None:
    """chaos/experiments/k8s leader-pod-kill by `chaos run`: the leader's pod
    SIGKILLed (grace 0) twice under the chaos workload, each time until the
    StatefulSet has recreated it and the operator reports every member in sync;
    judged by the history checker (0 confirmed lost). After the scale test: a
    restarted member catches up from a snapshot over a log of GBs. 100 msg/s per
    publisher (1-256 KiB bodies): at 150 this machine's cluster confirms less
    than is offered, and a member behind cannot catch up until the load stops
    (docs/kubernetes.md, "Catching up under load")."""
    run_experiment(env, "leader-pod-kill", tmp_path, rate=100)


def test_deleted_leader_pod_is_recreated_and_rejoins(env: Env, diag: None) -> None:
    delete_leader_pod_and_wait_for_it(env)


@pytest.mark.timeout(900)
def test_config_change_rolls_pods_one_at_a_time_under_load(env: Env, diag: None) -> None:
    """`helm upgrade --set config.heartbeat=30`: the operator restarts the pods one at
    a time (at most one not Ready) under streaming confirms, 0 confirmed lost."""
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in env.pods()}
    most_down = [0]
    stop = threading.Event()

    def count_down() -> None:
        while not stop.is_set():
            try:
                with_uid = {p["metadata"]["name"] for p in env.pods()}
                down = 3 - len([n for n in env.ready_pods() if n in with_uid])
            except Exception:  # noqa: BLE001 - a kubectl call timed out: look again
                continue
            most_down[0] = max(most_down[0], down)
            stop.wait(0.3)

    watcher = threading.Thread(target=count_down, daemon=True)

    def roll() -> None:
        t0 = time.monotonic()
        watcher.start()
        env.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "config.heartbeat=30")
        wait(lambda: env.converged(3) and all(
            p["metadata"]["uid"] != before[p["metadata"]["name"]] for p in env.pods()), 600,
             "every pod restarted with the new config", env.diagnostics)
        stop.set()
        print(f"rolling restart of 3 pods: {time.monotonic() - t0:.1f}s")

    try:
        # 300 msg/s: a roll takes minutes under the kubelet (grace periods, catch-up),
        # and unbounded it left a backlog (537,259 in one run) no drain ends in time
        publish_while(env, "roll", roll, rate=300)
    finally:
        stop.set()
        watcher.join(10)
    assert most_down[0] <= 1, f"{most_down[0]} pods were down at once"
    cm = env.json("configmap", NAME)["data"]["mirrorq.toml"]
    assert "heartbeat = 30" in cm, cm


@pytest.mark.timeout(900)
def test_pod_whose_volume_is_lost_comes_back_as_a_fresh_member(env: Env, diag: None) -> None:
    """The claim, its volume and the pod go (a node's disk lost): the StatefulSet makes
    a new claim, the provisioner a new empty volume, and the operator brings the pod
    back as a fresh member (its old identity removed, the new one added and in sync)."""
    victim = f"{NAME}-2"
    pvc = env.json("pvc", f"data-{victim}")
    pv = pvc["spec"]["volumeName"]
    t0 = time.monotonic()
    env.kubectl("delete", "pvc", f"data-{victim}", "--wait=false")
    env.cp.kubectl("delete", "pv", pv, "--wait=false")
    env.kubectl("delete", "pod", victim, "--wait=false")

    def fresh_claim() -> bool:
        return bool(env.json("pvc", f"data-{victim}")["metadata"]["uid"] != pvc["metadata"]["uid"])

    def reschedule_if_stuck() -> bool:
        # a pod recreated while its old claim was still terminating waits for a
        # claim that will not come back (the StatefulSet controller makes claims
        # only with new pods): deleting that pod is part of the fault's routine
        try:
            if fresh_claim():
                return True
        except ControlPlaneError:  # not made yet
            pass
        for p in env.json("pods", "-l", SELECTOR)["items"]:
            if p["metadata"]["name"] == victim and p.get("status", {}).get("phase") == "Pending" \
                    and not p["spec"].get("nodeName"):
                env.kubectl("delete", "pod", victim, "--wait=false", check=False)
        return False

    wait(reschedule_if_stuck, 180, "a new claim for the pod", env.diagnostics, interval=2)
    st = wait(lambda: env.converged(3), 300, "the fresh member in sync", env.diagnostics)
    new_uid = env.json("pvc", f"data-{victim}")["metadata"]["uid"]
    assert st["volumes"][victim] == new_uid, st
    assert new_uid != pvc["metadata"]["uid"]
    print(f"volume of {victim} lost -> fresh member in sync: {time.monotonic() - t0:.1f}s")


def test_helm_uninstall_removes_the_release_and_keeps_the_pvcs(env: Env, diag: None) -> None:
    """`helm uninstall`: the kubelet stops every pod (none left Terminating), the
    release's objects go, and the claims (the data) stay, as a StatefulSet's do."""
    claims = sorted(c["metadata"]["name"] for c in env.json("pvc")["items"])
    assert {f"data-{NAME}-{k}" for k in range(3)} <= set(claims), claims
    t0 = time.monotonic()
    env.helm("uninstall", RELEASE)
    wait(lambda: not env.json("pods")["items"], 180, "every pod gone", env.diagnostics)

    def gone(kind: str) -> bool:
        return not [i for i in env.json(kind)["items"] if i["metadata"]["name"] != "kube-root-ca.crt"]

    for kind in ("statefulset", "service", "configmap", "deployment", "mirrorqcluster"):
        wait(functools.partial(gone, kind), 60, f"every {kind} removed", env.diagnostics)
    kept = sorted(c["metadata"]["name"] for c in env.json("pvc")["items"])
    assert kept == claims, (claims, kept)
    print(f"helm uninstall -> everything but the PVCs (and Secrets) gone: "
          f"{time.monotonic() - t0:.1f}s")


def image_of(pod: dict) -> str:
    return str(pod["spec"]["containers"][0]["image"])


@pytest.mark.long  # the gate: the config roll above and tests/cluster/test_rolling_upgrade.py
@pytest.mark.timeout(1500)
def test_upgrade_from_previous_release_rolls_one_pod_at_a_time_and_keeps_every_confirm(
        env: Env, previous_release: tuple[str, Path], diag: None) -> None:
    """The previous release's CRD, chart and image with a backlog in a queue; then
    this release by `kubectl apply` of the CRD and `helm upgrade` with the previous
    release's values file, under a streaming-confirm publisher: the operator is
    replaced, the brokers are rolled one pod at a time, the mixed-version cluster
    keeps confirming, and every message confirmed before or during it is there."""
    prev_ref, prev_chart = previous_release
    new_ref = env_image_ref(env)
    # a fresh start: the release of the tests above, its claims and this CRD go
    if env.json("pods")["items"]:
        env.helm("uninstall", RELEASE)
        wait(lambda: not env.json("pods")["items"], 180, "the release's pods gone",
             env.diagnostics)
        env.kubectl("delete", "pvc", "--all", "--wait=true")
    env.cp.kubectl("delete", "crd", "mirrorqclusters.mirrorq.io", "--ignore-not-found",
                   "--wait=true")
    prev_values = env.workdir / "previous-values.yaml"
    prev_values.write_text(env.values.read_text().replace(
        f"tag: {new_ref.rsplit(':', 1)[1]}", f"tag: {prev_ref.rsplit(':', 1)[1]}"))
    t0 = time.monotonic()
    env.helm("install", RELEASE, str(prev_chart), "--create-namespace", "-f", str(prev_values))
    wait(lambda: env.converged(3), 240, "the previous release: 3 members in sync",
         env.diagnostics)
    assert {image_of(p) for p in env.pods()} == {prev_ref}
    print(f"previous release {prev_ref} installed: {time.monotonic() - t0:.1f}s")
    # a backlog of random bodies (1-64 KiB), confirmed before the upgrade
    backlog_q = uniq_queue("upgrade-backlog")
    backlog = StreamPublisher("backlog", backlog_q, env.endpoints, total=3000, window=100,
                              size=1024, max_size=64 * 1024, seed="backlog", deadline=300)
    ep = env.endpoints()[0]
    amqp_roundtrip(ep, backlog_q, b"declare")  # declares the queue (durable), leaves it empty
    backlog.start()
    backlog.join(300)  # (finish() would stop it before its total)
    assert not backlog.is_alive(), backlog.summary()
    assert backlog.error is None and len(backlog.confirmed) == 3000, backlog.summary()

    old_uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in env.pods()}
    # pod -> [first seen not Ready or replaced, Ready again on the new image]
    rolled: dict[str, list[float]] = {}
    most_down = [0]
    stop = threading.Event()

    def observe() -> None:
        while not stop.is_set():
            try:
                pods = env.pods()
                ready = set(env.ready_pods())
            except Exception:  # noqa: BLE001 - a kubectl call timed out: look again
                continue
            now = time.monotonic()
            most_down[0] = max(most_down[0], 3 - len(ready))
            for p in pods:
                name = p["metadata"]["name"]
                replaced = p["metadata"]["uid"] != old_uids.get(name)
                if replaced or name not in ready:
                    rolled.setdefault(name, [now, 0.0])
                if replaced and image_of(p) == new_ref and name in ready \
                        and name in rolled and not rolled[name][1]:
                    rolled[name][1] = now
            stop.wait(0.3)

    def upgrade() -> None:
        t1 = time.monotonic()
        watcher = threading.Thread(target=observe, daemon=True)
        watcher.start()
        # helm installs crds/ on install only: the new CRD goes first (docs/kubernetes.md)
        env.cp.kubectl("apply", "-f", str(CHART / "crds"))
        env.helm("upgrade", RELEASE, str(CHART), "-f", str(prev_values),
                 "--set", f"image.tag={new_ref.rsplit(':', 1)[1]}")
        wait(lambda: env.converged(3) and all(
            image_of(p) == new_ref and p["metadata"]["uid"] != old_uids[p["metadata"]["name"]]
            for p in env.pods()), 900, "every broker pod on the new image, in sync",
             env.diagnostics)
        stop.set()
        watcher.join(10)
        print(f"upgrade of 3 pods: {time.monotonic() - t1:.1f}s; per pod (not Ready -> "
              f"Ready on the new image): " + ", ".join(
                  f"{n} {r[1] - r[0]:.1f}s" for n, r in sorted(rolled.items())))

    try:
        result = publish_while(env, "upgrade", upgrade, rate=300)
    finally:
        stop.set()
    assert most_down[0] <= 1, f"{most_down[0]} broker pods were not Ready at once"
    assert sorted(rolled) == sorted(old_uids) and all(r[1] for r in rolled.values()), rolled
    # mixed versions: from the first pod Ready on the new image to the last pod's
    # going down, old and new members served together and kept confirming
    mixed_from = min(r[1] for r in rolled.values())
    mixed_to = max(r[0] for r in rolled.values())
    in_mixed = sum(1 for t in result["confirm_times"] if mixed_from <= t <= mixed_to)
    gaps = [b - a for a, b in zip(result["confirm_times"], result["confirm_times"][1:],
                                  strict=False)]
    print(f"mixed-version window {mixed_to - mixed_from:.1f}s: {in_mixed} confirms; "
          f"longest pause between confirms during the upgrade {max(gaps):.1f}s")
    assert mixed_to > mixed_from and in_mixed > 0, (mixed_from, mixed_to, in_mixed)
    ops = [image_of(p) for p in env.json("pods", "-l", "app.kubernetes.io/component=operator")
           ["items"] if not p["metadata"].get("deletionTimestamp")]
    assert ops == [new_ref], ops
    got = drain(env.endpoints()[0], backlog_q)
    checked = check_delivered({"backlog": backlog.confirmed}, got)
    print(f"backlog: {len(backlog.confirmed)} confirmed before the upgrade -> "
          f"{checked['delivered']} delivered, {checked['lost_count']} lost")
    assert checked["lost_count"] == 0 and checked["delivered"] == 3000, checked
    assert all(body_ok(b) for b, _ in got), "a backlog message came back damaged"
