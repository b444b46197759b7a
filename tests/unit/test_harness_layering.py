"""harness/ sits below tests, chaos, bench, soak and k8s: it imports none of them, and
bench, chaos, soak and k8s never import tests/ (issue 25)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ABOVE = ("tests", "chaosmirrorq", "bench", "soak", "k8s", "mirrorq_operator")


def _imported(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_harness_imports_nothing_above_it() -> None:
    bad = {str(p.relative_to(REPO)): sorted(_imported(p) & set(ABOVE))
           for p in (REPO / "harness").glob("*.py")}
    assert not {k: v for k, v in bad.items() if v}


def test_bench_chaos_soak_k8s_never_import_tests() -> None:
    files = [p for d in ("bench", "chaos", "soak", "k8s") for p in (REPO / d).rglob("*.py")]
    bad = [str(p.relative_to(REPO)) for p in files if "tests" in _imported(p)]
    assert not bad
