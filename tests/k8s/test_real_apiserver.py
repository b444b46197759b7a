"""Issue 13, against a real Kubernetes v1.20.2 control plane (etcd, kube-apiserver,
controller-manager, scheduler built by `make k8s-build`, started here by
k8s/control_plane.py): the CRD is a structural schema the server accepts and
validates, `helm install --dry-run` renders the MirrorqCluster and the operator
(no PDB nor StatefulSet: the operator builds those), and the operator's API
discovery picks the PDB API the server offers (policy/v1beta1 on 1.20) and
creates the PDB."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from k8s.control_plane import ControlPlane, bin_dir, missing_binaries, up

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "helm" / "mirrorq" / "crds"


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    missing = missing_binaries(bin_dir())
    assert not missing, f"run `make k8s-build` first (missing in {bin_dir()}: {missing})"
    plane = up(tmp_path_factory.mktemp("k8s"))
    try:
        yield plane
    finally:
        plane.down()


def cluster_cr(name: str, replicas: int) -> str:
    return json.dumps({"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster",
                       "metadata": {"name": name, "namespace": "default"},
                       "spec": {"replicas": replicas}})


def test_crd_is_accepted_and_established(cp: ControlPlane) -> None:
    cp.kubectl("apply", "-f", str(CRDS))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/mirrorqclusters.mirrorq.io")
    crd = json.loads(cp.kubectl("get", "crd", "mirrorqclusters.mirrorq.io", "-o", "json").stdout)
    assert crd["status"]["acceptedNames"]["kind"] == "MirrorqCluster"
    # stored and served back as written (a structural schema keeps the fields it names)
    status, body = cp.get("/apis/mirrorq.io/v1alpha1")
    assert status == 200 and any(r["name"] == "mirrorqclusters" for r in body["resources"]), body


def test_server_side_validation_rejects_zero_replicas(cp: ControlPlane) -> None:
    cp.kubectl("apply", "-f", str(CRDS))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/mirrorqclusters.mirrorq.io")
    bad = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=cluster_cr("bad", 0), check=False)
    assert bad.returncode != 0
    assert "spec.replicas" in bad.stderr and "greater than or equal to 1" in bad.stderr, bad.stderr
    good = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=cluster_cr("good", 3), check=False)
    assert good.returncode == 0, good.stderr


def test_chart_dry_run_renders_the_cluster_and_the_operator(cp: ControlPlane) -> None:
    """`helm install --dry-run` against the real server (its APIs, its OpenAPI for
    validation): one MirrorqCluster and the operator; the StatefulSet and the PDB
    are the operator's to build, not the chart's."""
    # a dry run does not install crds/: the server must know the kind already
    cp.kubectl("apply", "-f", str(CRDS))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/mirrorqclusters.mirrorq.io")
    res = subprocess.run([str(cp.bindir / "helm"), "install", "mq", str(REPO / "helm" / "mirrorq"),
                          "-n", "chart-test", "--create-namespace", "--dry-run"],
                         capture_output=True, text=True, env=cp.env(), timeout=120)
    assert res.returncode == 0, res.stderr
    manifest = res.stdout.split("\nNOTES:")[0]
    docs = [d for d in yaml.safe_load_all(manifest.split("\nMANIFEST:", 1)[1]) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds.count("MirrorqCluster") == 1 and kinds.count("Deployment") == 1, kinds
    assert not {"PodDisruptionBudget", "StatefulSet", "ConfigMap", "Service"} & set(kinds), kinds
    (cr,) = [d for d in docs if d["kind"] == "MirrorqCluster"]
    (op,) = [d for d in docs if d["kind"] == "Deployment"]
    assert cr["metadata"]["name"] == "mq-mirrorq" and cr["spec"]["auth"]["secretName"] == "mq-mirrorq"
    assert op["metadata"]["name"] == "mq-mirrorq-operator"
    assert "kubectl -n chart-test get mirrorqcluster mq-mirrorq" in res.stdout  # NOTES
    # and the server accepts that MirrorqCluster as rendered (its CRD schema), pruning
    # nothing: an unknown field would be dropped silently, not refused, on 1.20
    cr["metadata"]["namespace"] = "default"  # the dry run created no namespace
    ok = cp.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(cr),
                    check=False)
    assert ok.returncode == 0, ok.stderr
    stored = json.loads(ok.stdout)["spec"]
    assert {k: stored.get(k) for k in cr["spec"]} == cr["spec"], stored


def test_operator_discovers_the_pdb_api_and_creates_the_pdb(cp: ControlPlane) -> None:
    script = f"""
import json
from kubernetes import client, config
config.load_kube_config({str(cp.kubeconfig)!r})
from mirrorq_operator import kube
from mirrorq_operator.builders import build_pdb
version = kube.pdb_version()
client.CoreV1Api().create_namespace({{"metadata": {{"name": "op-test"}}}})
pdb = build_pdb(None, "mq", "op-test", version)
kube._create(pdb)
kube._create(pdb)  # exists: idempotent
print(json.dumps({{"version": version}}))
"""
    import sys
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {"version": "policy/v1beta1"}
    got = json.loads(cp.kubectl("-n", "op-test", "get", "pdb", "mq", "-o", "json").stdout)
    assert got["apiVersion"] == "policy/v1beta1" and got["spec"]["maxUnavailable"] == 1


def test_network_policy_metrics_service_and_https_fields_on_the_real_server(
        cp: ControlPlane) -> None:
    """Issue 26 item 11 against the real API server: the CRD keeps spec.tls.
    managementTlsOnly and spec.networkPolicy (nothing pruned) and refuses a
    non-boolean; the operator's NetworkPolicy, client, headless and metrics
    Services and ConfigMap are created as built and read back unchanged. No CNI
    runs here: the NetworkPolicy is accepted and stored, not enforced."""
    cp.kubectl("apply", "-f", str(CRDS))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/mirrorqclusters.mirrorq.io")
    spec = {"replicas": 3, "tls": {"secretName": "mq-tls", "managementTlsOnly": False},
            "networkPolicy": {
                "enabled": True,
                "metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}},
                                 "podSelector": {"matchLabels": {"app": "prometheus"}}}],
                "adminFrom": [{"podSelector": {"matchExpressions": [
                    {"key": "app", "operator": "In", "values": ["ops"]}]}}],
                "clientFrom": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}}]}}
    cr = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster",
          "metadata": {"name": "np", "namespace": "default"}, "spec": spec}
    cp.kubectl("apply", "-f", "-", input=json.dumps(cr))
    stored = json.loads(cp.kubectl("get", "mirrorqcluster", "np", "-o", "json").stdout)["spec"]
    assert stored["tls"] == spec["tls"] and stored["networkPolicy"] == spec["networkPolicy"]
    defaulted = json.loads(cp.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                                      input=cluster_cr("dflt", 3)).stdout)["spec"]
    assert "networkPolicy" not in defaulted  # absent: the operator's defaults apply
    for bad in ({"tls": {"secretName": "x", "managementTlsOnly": "yes"}},
                {"networkPolicy": {"metricsFrom": []}},
                {"networkPolicy": {"clientFrom": [{"ipBlock": {}}]}}):
        doc = {**cr, "metadata": {"name": "bad", "namespace": "default"}, "spec": bad}
        res = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc),
                         check=False)
        assert res.returncode != 0, bad

    script = f"""
import json
from kubernetes import client, config
config.load_kube_config({str(cp.kubeconfig)!r})
from mirrorq_operator import kube
from mirrorq_operator.builders import build_all
from mirrorq_operator.model import Spec
client.CoreV1Api().create_namespace({{"metadata": {{"name": "np-test"}}}})
spec = json.loads({json.dumps(stored)!r})
built = [m for m in build_all(Spec.from_cr(spec), "mq", "np-test", None)
         if m["kind"] != "StatefulSet"]
for m in built:
    kube._create(m)
print(json.dumps(built))
"""
    import sys
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    built = {(m["kind"], m["metadata"]["name"]): m
             for m in json.loads(res.stdout.strip().splitlines()[-1])}
    assert set(built) == {("ConfigMap", "mq"), ("Service", "mq"), ("Service", "mq-headless"),
                          ("Service", "mq-metrics"), ("NetworkPolicy", "mq")}

    def get(kind: str, name: str) -> dict:
        return json.loads(cp.kubectl("-n", "np-test", "get", kind, name, "-o", "json").stdout)

    np = get("networkpolicy", "mq")
    assert np["spec"] == built[("NetworkPolicy", "mq")]["spec"]  # stored as built
    by_port = {r["ports"][0]["port"]: r for r in np["spec"]["ingress"]}
    assert by_port[15692]["from"] == spec["networkPolicy"]["metricsFrom"]
    assert by_port[5672]["from"] == spec["networkPolicy"]["clientFrom"]
    assert {p["port"] for p in by_port[5672]["ports"]} == {5672, 5671, 15672, 15671}
    client_ports = {p["name"]: p["port"] for p in get("service", "mq")["spec"]["ports"]}
    assert client_ports == {"amqp": 5672, "amqps": 5671, "management": 15672,
                            "management-tls": 15671}
    metrics = get("service", "mq-metrics")
    assert metrics["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in metrics["spec"]["ports"]] == [15692]
    assert metrics["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
    assert "tls_port = 15671" in get("configmap", "mq")["data"]["mirrorq.toml"]

    # a spec change rolls out to the exposure too (kube.sync_exposure, from _roll_out):
    # HTTPS only, clients from anywhere, NAME-metrics recreated; then the policy off
    cp.kubectl("-n", "np-test", "delete", "service", "mq-metrics")
    sync = f"""
from kubernetes import config
config.load_kube_config({str(cp.kubeconfig)!r})
from mirrorq_operator import kube
from mirrorq_operator.model import Spec
kube.sync_exposure(Spec.from_cr({{"tls": {{"secretName": "mq-tls"}}}}), "mq", "np-test", None)
"""
    res = subprocess.run([sys.executable, "-c", sync], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    client_ports = {p["name"]: p["port"] for p in get("service", "mq")["spec"]["ports"]}
    assert client_ports == {"amqp": 5672, "amqps": 5671, "management-tls": 15671}
    np = get("networkpolicy", "mq")
    open_ports = {p["port"] for r in np["spec"]["ingress"] if "from" not in r
                  for p in r["ports"]}
    assert open_ports == {5672, 5671, 15671}
    assert get("service", "mq-metrics")["spec"]["clusterIP"] == "None"
    res = subprocess.run([sys.executable, "-c", sync.replace(
        '{"tls": {"secretName": "mq-tls"}}', '{"networkPolicy": {"enabled": False}}')],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    gone = cp.kubectl("-n", "np-test", "get", "networkpolicy", "mq", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_operator_creates_the_admin_ca_secret_once_and_reuses_it(cp: ControlPlane) -> None:
    """Issue 26 (items 9, 11) against the real API server: the CRD keeps
    spec.adminTls and refuses a non-boolean; the operator's CreateResources makes
    NAME-admin-tls (a CA, the pods' and the operator's certificates) before the
    StatefulSet that mounts it; a later pass (UpdateTemplate) keeps it untouched
    (same resourceVersion, same CA), and observe() reads it back as the
    credentials every admin call of a pass uses."""
    cp.kubectl("apply", "-f", str(CRDS))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/mirrorqclusters.mirrorq.io")
    cr = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster",
          "metadata": {"name": "atls", "namespace": "default"}, "spec": {"adminTls": False}}
    stored = json.loads(cp.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                                   input=json.dumps(cr)).stdout)["spec"]
    assert stored["adminTls"] is False
    defaulted = json.loads(cp.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                                      input=cluster_cr("atls", 3)).stdout)["spec"]
    assert defaulted["adminTls"] is True  # the CRD's default: on
    bad = {**cr, "spec": {"adminTls": "no"}}
    assert cp.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(bad),
                      check=False).returncode != 0

    script = f"""
import base64, json
from kubernetes import client, config
config.load_kube_config({str(cp.kubeconfig)!r})
from mirrorq_operator import kube
from mirrorq_operator.model import CreateResources, Spec, UpdateTemplate
ns = "atls-test"
core = client.CoreV1Api()
core.create_namespace({{"metadata": {{"name": ns}}}})
spec = Spec.from_cr({{"replicas": 1}})
kube._served = ["policy/v1beta1"]

def secret():
    s = core.read_namespaced_secret("mq-admin-tls", ns)
    return s.metadata.resource_version, s.data

def observe():
    return kube.observe("mq", ns, 1, {{}}, auth_secret="mq-default-user", spec=spec)

before = observe().admin_tls
kube.execute(CreateResources(), spec, observe(), {{}})
rv1, data1 = secret()
obs = observe()
kube.execute(UpdateTemplate(), spec, obs, {{}})
kube.execute(CreateResources(), spec, obs, {{}})  # a repeated create: 409, kept
rv2, data2 = secret()
sts = client.AppsV1Api().read_namespaced_stateful_set("mq", ns).to_dict()
vols = sts["spec"]["template"]["spec"]["volumes"]
cm = core.read_namespaced_config_map("mq", ns).data["mirrorq.toml"]
dec = {{k: base64.b64decode(v) for k, v in data2.items()}}
print(json.dumps({{"before": before, "same_rv": rv1 == rv2, "same_data": data1 == data2,
                  "keys": sorted(data2),
                  "observed": obs.admin_tls == (dec["ca.crt"], dec["client.crt"], dec["client.key"]),
                  "volume": [v["secret"] for v in vols if v["name"] == "admin-tls"],
                  "config": [l for l in cm.splitlines() if l.startswith("admin.")]}}))
"""
    import sys
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["before"] is None  # no Secret yet: observe() made no admin call in clear
    assert got["same_rv"] and got["same_data"], got
    assert got["keys"] == ["ca.crt", "ca.key", "client.crt", "client.key", "tls.crt", "tls.key"]
    assert got["observed"]
    (vol,) = got["volume"]
    assert vol["secret_name"] == "mq-admin-tls" and vol["default_mode"] == 0o440
    assert [i["key"] for i in vol["items"]] == ["ca.crt", "tls.crt", "tls.key"]
    assert sorted(got["config"]) == [
        'admin.tls_cert = "/etc/mirrorq-admin-tls/tls.crt"',
        'admin.tls_client_ca = "/etc/mirrorq-admin-tls/ca.crt"',
        'admin.tls_key = "/etc/mirrorq-admin-tls/tls.key"']
