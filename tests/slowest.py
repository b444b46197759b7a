"""The slowest tests of JUnit XML files (pytest --junitxml), setup and teardown
included: `python tests/slowest.py data/test-results/*.xml [--top 40] [--markdown]`.
tests/suite.sh and .ci/run print them; `--markdown` gives docs/testing.md's table,
with what each test proves: its docstring's first sentence, else its name."""
from __future__ import annotations

import argparse
import ast
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def durations(paths: list[Path]) -> list[tuple[float, str, str]]:
    """(seconds, test id, outcome) for every test case in the files."""
    rows = []
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            cls, name = case.get("classname", ""), case.get("name", "")
            outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                       else "skipped" if case.find("skipped") is not None else "passed")
            module = cls.replace(".", "/")
            test_id = f"{module}.py::{name}" if module else name
            rows.append((float(case.get("time", "0")), test_id, outcome))
    return sorted(rows, reverse=True)


def proves(test_id: str) -> str:
    """What a test proves, from its source: the docstring's first sentence, or its name."""
    path, _, name = test_id.partition("::")
    func = name.split("[")[0]
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == func:
            doc = " ".join((ast.get_docstring(node) or "").split())
            if doc:
                first = doc.split(". ")[0].rstrip(".")
                return first if len(first) <= 160 else first[:157] + "..."
    return func.removeprefix("test_").replace("_", " ")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--markdown", action="store_true", help="a table for docs/testing.md")
    args = ap.parse_args(argv)
    files = [f for f in args.files if f.is_file()]
    if not files:
        print("slowest: no JUnit XML files to read", file=sys.stderr)
        return 0
    rows = durations(files)
    total = sum(r[0] for r in rows)
    if args.markdown:
        print("| s | test | what it proves |\n|---|---|---|")
        for seconds, test_id, _outcome in rows[:args.top]:
            print(f"| {seconds:.0f} | `{test_id}` | {proves(test_id).replace('|', '/')} |")
        return 0
    print(f"== the {min(args.top, len(rows))} slowest of {len(rows)} tests "
          f"({total:.0f} s in tests in all) ==")
    for seconds, test_id, outcome in rows[:args.top]:
        mark = "" if outcome == "passed" else f"  [{outcome}]"
        print(f"{seconds:8.1f} s  {test_id}{mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
