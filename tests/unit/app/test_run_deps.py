"""`make run` installs only [project.dependencies]: so every module of the node
package (what `mirrorq serve` and `mirrorq local-cluster up` import, lazily or
not) must import with those alone, and the run target must not pull the test
extra (PySpark, matplotlib, mypy, ...)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from tests.broker_proc import REPO

# imports every module of the node package in a fresh interpreter, then names the
# distributions whose files the modules it loaded (beyond start-up's) came from
_PROBE = """
import importlib, json, pkgutil, sys
from importlib import metadata
from pathlib import Path
before = set(sys.modules)
import node
for mod in pkgutil.walk_packages(node.__path__, "node."):
    if not mod.name.endswith(".__main__"):  # runs the CLI
        importlib.import_module(mod.name)
candidates = metadata.packages_distributions()  # top-level name -> distributions
files = {}
def owns(dist, path):
    if dist not in files:
        d = metadata.distribution(dist)
        files[dist] = {str(Path(d.locate_file(f)).resolve()) for f in d.files or []}
    return path in files[dist]
used = set()
for name, mod in list(sys.modules.items()):
    path = getattr(mod, "__file__", None)
    if name in before or not path:
        continue
    path = str(Path(path).resolve())
    for dist in candidates.get(name.split(".")[0], []):
        if dist != "mirrorq" and owns(dist, path):
            used.add(dist)
print(json.dumps(sorted(used)))
"""


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements pull in, transitively (no extras)."""
    seen: set[str] = set()
    todo = [Requirement(r).name for r in requirements]
    while todo:
        name = _canon(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for req in metadata.requires(name) or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return seen


def test_everything_the_node_imports_is_a_runtime_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    allowed = _closure(project["dependencies"])
    res = subprocess.run([sys.executable, "-c", _PROBE], cwd=str(REPO), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    # grpc's __init__ imports grpc_tools when it happens to be installed (the test extra)
    used = {_canon(d) for d in json.loads(res.stdout)} - {"grpcio-tools"}
    assert used, "the probe found no third-party import at all"
    assert used <= allowed, (f"node imports {sorted(used - allowed)}, which `make run` does not "
                             "install: move it from the test extra to [project.dependencies]")


def _dry_run(target: str) -> str:
    """What `make TARGET` would run if pyproject.toml had just changed."""
    res = subprocess.run(["make", "-n", "-W", "pyproject.toml", target], cwd=str(REPO),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_installs_without_the_test_extra_and_make_test_with_it() -> None:
    run = _dry_run("run")
    assert "pip install -q -e ." in run and "[test]" not in run, run
    assert "local-cluster up" in run
    lint = _dry_run("lint")
    assert "pip install -q -e '.[test]'" in lint, lint
