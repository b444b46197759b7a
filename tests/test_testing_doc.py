"""docs/testing.md held to the tree (issue 41): nothing that guards a
documented guarantee leaves the gate. The gate is `make test`: every test
under tests/ not marked `long` (`@pytest.mark.long` on it, or a module-level
`pytestmark` that includes `pytest.mark.long`).

- Every `path::test_name` (or `path::Class::test_name`) named in the
  guarantee tables and in the gate column of the Pairs table is a test of
  that file (a module-level `def` / `async def`) and is not marked long.
- Every long test named in the Pairs table is marked long, and every test
  marked long under tests/ has its row there: moving a test to `long`
  without naming the cheaper test in the gate that proves the same fails.
- Every S-id of docs/semantics.md (its `### Sxx` headings), M1-M7, I1-I9, F1-F5 and
  every item of docs/security.md's "Defaults that hold today" (SEC-1.. in
  their order, the row starting with the item's title) has exactly one row,
  and every row names at least one test.

Pure `ast`, reading only the files the doc names and those that mention
`mark.long`: well under a second. The last tests run the same checks on a
small tree of their own and show that each can fail."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

GUARANTEES = "## Guarantees and the tests in the gate"
SLOWEST = "## The 40 slowest tests"
PAIRS = "## Pairs:"
SECURITY_DEFAULTS = "## Defaults that hold today"

REF = re.compile(r"`(tests/[\w./-]+?\.py)::(\w+(?:::\w+)?)`")
ID = re.compile(r"^(S\d\d|M\d|I\d|F\d|SEC-\d+)$")
LONG_TEXT = re.compile(r"\bmark\s*\.\s*long\b")
S_HEADING = re.compile(r"^### (S\d\d)\b", re.M)
SEC_ITEM = re.compile(r"^- \*\*(.+?)\*\*", re.M)
RULES = [f"M{i}" for i in range(1, 8)] + [f"I{i}" for i in range(1, 10)] + [f"F{i}" for i in range(1, 6)]


# ------------------------------------------------------------------ the tree's tests
def _is_test_file(path: Path) -> bool:
    return path.suffix == ".py" and (path.name.startswith("test_") or path.stem.endswith("_test"))


def _long_mark(node: ast.AST) -> bool:
    """`pytest.mark.long` or `mark.long` (called or not) anywhere in `node`."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr == "long":
            v = n.value
            if (isinstance(v, ast.Attribute) and v.attr == "mark") or \
                    (isinstance(v, ast.Name) and v.id == "mark"):
                return True
    return False


def _pytestmark_long(body: list[ast.stmt]) -> bool:
    for n in body:
        if isinstance(n, ast.Assign):
            targets: list[ast.expr] = n.targets
        elif isinstance(n, ast.AnnAssign) and n.value is not None:
            targets = [n.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) \
                and n.value is not None and _long_mark(n.value):
            return True
    return False


def collected_tests(path: Path) -> dict[str, bool]:
    """The tests of one file ("name" or "Class::name") -> marked long."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    module_long = _pytestmark_long(tree.body)
    out: dict[str, bool] = {}
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test"):
            out[n.name] = module_long or any(_long_mark(d) for d in n.decorator_list)
        elif isinstance(n, ast.ClassDef) and n.name.startswith("Test"):
            class_long = module_long or _pytestmark_long(n.body) or \
                any(_long_mark(d) for d in n.decorator_list)
            for m in n.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test"):
                    out[f"{n.name}::{m.name}"] = class_long or any(_long_mark(d) for d in m.decorator_list)
    return out


class Tree:
    """The tests of the files under `root`/tests that are asked about, parsed once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: dict[str, dict[str, bool] | None] = {}

    def tests(self, rel: str) -> dict[str, bool] | None:
        """None when `rel` is not a test file of the tree."""
        if rel not in self._files:
            path = self.root / rel
            self._files[rel] = collected_tests(path) if path.is_file() and _is_test_file(path) else None
        return self._files[rel]

    def long_tests(self) -> set[str]:
        """`path::name` of every test marked long under tests/."""
        found = set()
        for path in sorted((self.root / "tests").rglob("*.py")):
            if not _is_test_file(path) or not LONG_TEXT.search(path.read_text(encoding="utf-8")):
                continue
            rel = path.relative_to(self.root).as_posix()
            found |= {f"{rel}::{name}" for name, long in (self.tests(rel) or {}).items() if long}
        return found


# ------------------------------------------------------------------ docs/testing.md
def section(text: str, heading: str) -> str:
    """From the `## ` heading that starts with `heading` to the next `## `."""
    m = re.search(rf"^{re.escape(heading)}.*$", text, re.M)
    assert m, f"no section {heading!r}"
    end = re.search(r"^## ", text[m.end():], re.M)
    return text[m.end():m.end() + end.start()] if end else text[m.end():]


def rows(text: str) -> list[list[str]]:
    """The cells of every table row in `text`, without header and separator rows."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ("id", "long test") or set(cells[0]) <= set("-: "):
            continue
        out.append(cells)
    return out


def refs(cell: str) -> list[str]:
    return [f"{path}::{name}" for path, name in REF.findall(cell)]


def _check_ref(tree: Tree, ref: str, want_long: bool, where: str) -> str | None:
    rel, name = ref.split("::", 1)
    tests = tree.tests(rel)
    if tests is None:
        return f"{where}: {ref}: no test file {rel}"
    if name not in tests:
        return f"{where}: {ref}: no test {name} in {rel} (renamed or moved? fix docs/testing.md)"
    if tests[name] and not want_long:
        return (f"{where}: {ref} is marked long, so it is not in the gate: name a test in the "
                f"gate, or take the mark off")
    if want_long and not tests[name]:
        return f"{where}: {ref} is not marked long: drop its row from the Pairs table"
    return None


def guarantee_rows(doc: str) -> list[list[str]]:
    return [r for r in rows(section(doc, GUARANTEES)) if ID.match(r[0])]


def guarantee_problems(doc: str, tree: Tree) -> list[str]:
    """Tests named for a guarantee that are missing or not in the gate."""
    out = []
    for r in guarantee_rows(doc):
        named = refs(r[-1])
        if not named:
            out.append(f"{r[0]}: no test named (the tests column needs `path::test_name`)")
        out += [p for ref in named if (p := _check_ref(tree, ref, False, r[0]))]
    return out


def coverage_problems(doc: str, semantics: str, security: str) -> list[str]:
    """Every S-id, M and I rule and security item has exactly one row; no row for
    an id the documents do not have; SEC-n rows in security.md's order."""
    ids = [r[0] for r in guarantee_rows(doc)]
    out = [f"{i}: {ids.count(i)} rows" for i in sorted(set(ids)) if ids.count(i) > 1]
    titles = SEC_ITEM.findall(section(security, SECURITY_DEFAULTS))
    want = S_HEADING.findall(semantics) + RULES + [f"SEC-{k}" for k in range(1, len(titles) + 1)]
    out += [f"{i}: no row in docs/testing.md" for i in want if i not in ids]
    out += [f"{i}: a row for an id the documents do not have" for i in ids if i not in want]
    cells = {r[0]: r[1] for r in guarantee_rows(doc)}
    for k, title in enumerate(titles, 1):
        cell = cells.get(f"SEC-{k}")
        if cell is not None and not cell.startswith(title):
            out.append(f"SEC-{k}: should start with docs/security.md's item {k} title {title!r}: {cell!r}")
    return out


def pair_rows(doc: str) -> list[list[str]]:
    return rows(section(doc, PAIRS))


def pair_problems(doc: str, tree: Tree) -> list[str]:
    """Each Pairs row: one long test, and cheaper tests that exist and are in the gate."""
    out = []
    for r in pair_rows(doc):
        if len(r) != 3:
            out.append(f"Pairs: a row needs 3 cells (long test | what it proves | gate tests): {r}")
            continue
        long_refs, gate_refs = refs(r[0]), refs(r[2])
        if len(long_refs) != 1:
            out.append(f"Pairs: the first cell names one long test: {r[0]!r}")
        if not gate_refs:
            out.append(f"Pairs: {r[0]}: no cheaper test in the gate named")
        out += [p for ref in long_refs if (p := _check_ref(tree, ref, True, "Pairs (long)"))]
        out += [p for ref in gate_refs if (p := _check_ref(tree, ref, False, "Pairs (gate)"))]
    return out


def unpaired_long_tests(doc: str, tree: Tree) -> list[str]:
    """Tests marked long with no row in the Pairs table."""
    paired = {ref for r in pair_rows(doc) for ref in refs(r[0])}
    return sorted(tree.long_tests() - paired)


# ------------------------------------------------------------------ on the real tree
def _read(rel: str) -> str:
    return (REPO / rel).read_text(encoding="utf-8")


TREE = Tree(REPO)


def test_every_test_named_for_a_guarantee_exists_and_is_in_the_gate() -> None:
    problems = guarantee_problems(_read("docs/testing.md"), TREE)
    assert not problems, "\n".join(problems)


def test_every_guarantee_has_a_row() -> None:
    problems = coverage_problems(_read("docs/testing.md"), _read("docs/semantics.md"),
                                 _read("docs/security.md"))
    assert not problems, "\n".join(problems)


def test_each_long_test_in_the_pairs_is_long_and_its_cheaper_tests_are_in_the_gate() -> None:
    doc = _read("docs/testing.md")
    assert pair_rows(doc), "docs/testing.md: the Pairs table has no row"
    problems = pair_problems(doc, TREE)
    assert not problems, "\n".join(problems)


def test_every_long_test_names_its_cheaper_pair() -> None:
    missing = unpaired_long_tests(_read("docs/testing.md"), TREE)
    assert not missing, ("marked long without a row in docs/testing.md's Pairs table (a test may "
                         "leave the gate only with the cheaper test in it that proves the same):\n"
                         + "\n".join(missing))


def test_the_sections_the_lead_fills_are_there() -> None:
    assert section(_read("docs/testing.md"), SLOWEST).strip()


# ------------------------------------------------------------------ the checker checked
SAMPLE_TESTS = {
    "tests/unit/test_a.py": "def test_cheap():\n    pass\n\n\nasync def test_async():\n    pass\n\n\n"
                            "class TestK:\n    def test_m(self):\n        pass\n",
    "tests/cluster/test_b.py": "import pytest\n\n\n@pytest.mark.long\ndef test_slow():\n    pass\n\n\n"
                               "@pytest.mark.timeout(9)\ndef test_fine():\n    pass\n",
    "tests/k8s/test_c.py": "import pytest\n\npytestmark = [pytest.mark.skipif(False, reason=''), "
                           "pytest.mark.long]\n\n\ndef test_all_long():\n    pass\n",
    "tests/support/helpers.py": "import pytest\n\n\n@pytest.mark.long\ndef test_not_collected():\n    pass\n",
}
SAMPLE_SEMANTICS = "# S\n\n### S01\none\n\n### S02\ntwo\n"
SAMPLE_SECURITY = "## Defaults that hold today\n- **Logins** (x): ...\n- **Files**: ...\n\n## Still open\n"


def _doc(s02: str = "`tests/unit/test_a.py::test_async`",
         pair_gate: str = "`tests/cluster/test_b.py::test_fine`",
         extra_pair: str = "| `tests/k8s/test_c.py::test_all_long` | all | `tests/unit/test_a.py::test_cheap` |\n",
         sec2: str = "Files: modes") -> str:
    rules = "".join(f"| {i} | r | `tests/unit/test_a.py::TestK::test_m` |\n" for i in RULES)
    return (f"# T\n\n{GUARANTEES}\n\n| id | guarantee | test(s) in the gate |\n|---|---|---|\n"
            f"| S01 | one | `tests/unit/test_a.py::test_cheap`<br>`tests/cluster/test_b.py::test_fine` |\n"
            f"| S02 | two | {s02} |\n{rules}"
            f"| SEC-1 | Logins: throttle | `tests/unit/test_a.py::test_cheap` |\n"
            f"| SEC-2 | {sec2} | `tests/unit/test_a.py::test_cheap` |\n\n"
            f"{SLOWEST}\n\nfilled from the CI run\n\n{PAIRS} long and cheap\n\n"
            "| long test | what it proves | the cheaper test in the gate |\n|---|---|---|\n"
            f"| `tests/cluster/test_b.py::test_slow` | slow | {pair_gate} |\n{extra_pair}")


def _sample(tmp_path: Path) -> Tree:
    for rel, text in SAMPLE_TESTS.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    return Tree(tmp_path)


def test_the_checks_pass_on_a_sample_tree(tmp_path: Path) -> None:
    tree = _sample(tmp_path)
    doc = _doc()
    assert tree.long_tests() == {"tests/cluster/test_b.py::test_slow", "tests/k8s/test_c.py::test_all_long"}
    assert guarantee_problems(doc, tree) == []
    assert coverage_problems(doc, SAMPLE_SEMANTICS, SAMPLE_SECURITY) == []
    assert pair_problems(doc, tree) == []
    assert unpaired_long_tests(doc, tree) == []


def test_each_check_can_fail(tmp_path: Path) -> None:
    tree = _sample(tmp_path)
    # a renamed test, a missing file, a long test named as the gate's
    for s02, text in (("`tests/unit/test_a.py::test_gone`", "no test test_gone"),
                      ("`tests/unit/test_z.py::test_cheap`", "no test file"),
                      ("`tests/cluster/test_b.py::test_slow`", "is marked long"),
                      ("`tests/k8s/test_c.py::test_all_long`", "is marked long"),
                      ("nothing", "no test named")):
        [problem] = guarantee_problems(_doc(s02=s02), tree)
        assert text in problem and problem.startswith("S02"), problem
    # a new S-id, a security item without its row, a row out of order
    assert coverage_problems(_doc(), SAMPLE_SEMANTICS + "### S03\nthree\n", SAMPLE_SECURITY) == \
        ["S03: no row in docs/testing.md"]
    assert coverage_problems(_doc(), SAMPLE_SEMANTICS.replace("### S02\ntwo\n", ""), SAMPLE_SECURITY) == \
        ["S02: a row for an id the documents do not have"]
    more = SAMPLE_SECURITY.replace("\n\n## Still", "\n- **Memory**: ...\n\n## Still")
    assert coverage_problems(_doc(), SAMPLE_SEMANTICS, more) == ["SEC-3: no row in docs/testing.md"]
    [problem] = coverage_problems(_doc(sec2="Memory: x"), SAMPLE_SEMANTICS, SAMPLE_SECURITY)
    assert problem.startswith("SEC-2: should start with") and "'Files'" in problem
    # the Pairs table: a long test as the cheaper one, a missing pair, a long one no longer long
    [problem] = pair_problems(_doc(pair_gate="`tests/k8s/test_c.py::test_all_long`"), tree)
    assert "is marked long" in problem
    [problem] = pair_problems(_doc(pair_gate="the chaos suite"), tree)
    assert "no cheaper test in the gate named" in problem
    assert unpaired_long_tests(_doc(extra_pair=""), tree) == ["tests/k8s/test_c.py::test_all_long"]
    not_long = _doc(extra_pair="| `tests/cluster/test_b.py::test_fine` | x | `tests/unit/test_a.py::test_cheap` |\n")
    [problem] = pair_problems(not_long, tree)
    assert "is not marked long" in problem
