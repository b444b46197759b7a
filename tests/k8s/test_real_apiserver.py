"""Issue 13, against a real Kubernetes v1.20.2 control plane (etcd, kube-apiserver,
controller-manager, scheduler built by `make k8s-build`, started here by
k8s/control_plane.py): the CRD is a structural schema the server accepts and
validates, the chart renders the PDB API the server offers (policy/v1beta1 on
1.20), and the operator's API discovery picks it and creates the PDB."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def test_chart_renders_the_pdb_api_the_server_offers(cp: ControlPlane) -> None:
    """helm asks the real server for its APIs: 1.20 has no policy/v1."""
    res = subprocess.run([str(cp.bindir / "helm"), "install", "mq", str(REPO / "helm" / "mirrorq"),
                          "-n", "chart-test", "--create-namespace", "--dry-run"],
                         capture_output=True, text=True, env=cp.env(), timeout=120)
    assert res.returncode == 0, res.stderr
    docs = res.stdout.split("\n---")
    pdbs = [d for d in docs if "kind: PodDisruptionBudget" in d]
    assert len(pdbs) == 1 and "apiVersion: policy/v1beta1" in pdbs[0], pdbs


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
