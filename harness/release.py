"""An older release of mirrorq run next to this checkout's build: the rolling
upgrade and old-data-dir tests (tests/cluster/test_rolling_upgrade.py).

The release is tests/data/release-<commit>.tar.gz, the node/ package of that
commit (made by tests/data/make-release-fixture.sh, refreshed at each
release; no git history is needed at test time). A ClusterNode whose
source_dir is the extracted tree runs it with this venv's python and
dependencies; `imported_from` reads back which node package a started
process really imported.

    old = extract(tmp_path)                  # .../release-61cf98e
    node.source_dir = old; node.start()
    assert imported_from(node) == old / "node" / "__init__.py"
"""
from __future__ import annotations

import tarfile
from pathlib import Path

from harness.process import ClusterNode

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
MARK = "mirrorq: node package "  # harness.process.RUN_FROM_SOURCE's line


def fixture() -> Path:
    """The one release-*.tar.gz in tests/data (the refresh script replaces it)."""
    found = sorted(DATA.glob("release-*.tar.gz"))
    assert len(found) == 1, f"expected one tests/data/release-*.tar.gz, found {[p.name for p in found]}"
    return found[0]


def release_name(tarball: Path | None = None) -> str:
    """`release-<commit>`: the tarball's name and its top directory."""
    return (tarball or fixture()).name.removesuffix(".tar.gz")


def extract(dest: Path, tarball: Path | None = None) -> Path:
    """Unpack the release under `dest`; the directory holding its node/ package."""
    tarball = tarball or fixture()
    root = dest / release_name(tarball)
    if not (root / "node" / "__init__.py").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as t:
            t.extractall(dest, filter="data")
    assert (root / "node" / "app" / "__main__.py").is_file(), f"{tarball} holds no node/app package"
    return root


def imported_from(node: ClusterNode) -> Path | None:
    """The node/__init__.py that `node`'s latest start imported, as the process
    itself printed it (only nodes started with a source_dir print it)."""
    text = node.log_path.read_text(errors="replace")
    last_start = text.rfind("\n==== start ")
    for line in text[last_start + 1:].splitlines():
        if line.startswith(MARK):
            return Path(line[len(MARK):].strip())
    return None
