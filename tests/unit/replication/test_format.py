"""The table of formats (node/replication/format.py): magics unique and 8
bytes, each written version among those read, FORMATS complete, the snapshot's
versions by machine version consistent; and docs/formats.md's table lists
exactly FORMATS (artifact, magic, version, reads, since, module), naming for
each old version a test that exists; each Format's `where` exists and takes
that Format from format.py."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from node.replication import format as fmt
from node.replication.format import FORMATS, Format
from node.replication.machine.version import MACHINE_VERSION

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "formats.md"
COLUMNS = ["artifact", "magic", "current version", "versions still read",
           "written since machine version", "module", "the test that reads each old version"]


def _magics() -> dict[str, bytes]:
    """Every magic format.py defines: the formats' and the old ones (META_V1_MAGIC)."""
    found = {f.name: f.magic for f in FORMATS}
    found.update({k: v for k, v in vars(fmt).items() if k.endswith("_MAGIC") and isinstance(v, bytes)})
    return found


def test_magics_are_unique_and_8_bytes() -> None:
    magics = _magics()
    assert len(magics) > len(FORMATS)  # the old meta magic is among them
    assert all(len(m) == 8 for m in magics.values()), magics
    assert len(set(magics.values())) == len(magics), magics


def test_each_version_written_is_read_and_since_is_a_machine_version() -> None:
    for f in FORMATS:
        assert f.version in f.reads and f.version == max(f.reads), f
        assert list(f.reads) == sorted(set(f.reads)), f
        assert 1 <= f.since <= MACHINE_VERSION, f


def test_formats_holds_every_format_of_the_module() -> None:
    defined = [v for v in vars(fmt).values() if isinstance(v, Format)]
    assert sorted(f.name for f in defined) == sorted(f.name for f in FORMATS)
    assert len({f.name for f in FORMATS}) == len(FORMATS)


def test_snapshot_versions_by_machine_version() -> None:
    since = fmt.SNAPSHOT_VERSION_SINCE
    assert set(since) <= set(fmt.SNAPSHOT.reads)
    assert since[fmt.SNAPSHOT.version] == fmt.SNAPSHOT.since
    assert fmt.snapshot_version(MACHINE_VERSION) == fmt.SNAPSHOT.version
    assert fmt.snapshot_version(1) == min(since)


def _table() -> list[list[str]]:
    """The cells of docs/formats.md's table, one list per row, header first."""
    lines = [line.strip() for line in DOC.read_text(encoding="utf-8").splitlines()
             if line.strip().startswith("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [r for r in rows if not all(re.fullmatch(r":?-+:?", c) for c in r)]


def _code(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return cell[1:-1]


def test_the_doc_table_lists_exactly_formats() -> None:
    header, *rows = _table()
    assert header == COLUMNS
    assert [r[0] for r in rows] == [f.name for f in FORMATS]
    for row, f in zip(rows, FORMATS, strict=True):
        name, magic, version, reads, since, where, _tests = row
        assert _code(magic) == repr(f.magic), (name, magic)
        assert int(version) == f.version, name
        assert tuple(int(v) for v in reads.split(", ")) == f.reads, name
        assert int(since) == f.since, name
        assert _code(where) == f.where, name


def _defines(path: Path, test: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == test
               for n in ast.walk(tree))


def test_the_doc_names_an_existing_test_for_each_old_version() -> None:
    header, *rows = _table()
    for row, f in zip(rows, FORMATS, strict=True):
        cell = row[-1]
        old = set(f.reads) - {f.version}
        if not old:
            assert cell == "—", (f.name, cell)
            continue
        covered: set[int] = set()
        for part in cell.split("; "):
            versions, _, where = part.partition(": ")
            covered |= {int(v.removeprefix("v")) for v in versions.split(", ")}
            path, _, test = _code(where).partition("::")
            assert (REPO / path).is_file() and _defines(REPO / path, test), (f.name, where)
        assert covered == old, (f.name, cell)


def _constant_of(f: Format) -> str:
    """The name format.py gives `f` (SEGMENT, SNAPSHOT, ...)."""
    (name,) = [k for k, v in vars(fmt).items() if v is f]
    return name


def _uses(source: str, constant: str) -> bool:
    """`<format module>.<constant>` (the module as `from node.replication import
    format [as x]` binds it) or `from node.replication.format import <constant>`."""
    tree = ast.parse(source)
    names = {a.asname or a.name for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and n.module == "node.replication"
             for a in n.names if a.name == "format"}
    for n in ast.walk(tree):
        if (isinstance(n, ast.Attribute) and n.attr == constant
                and isinstance(n.value, ast.Name) and n.value.id in names):
            return True
        if (isinstance(n, ast.ImportFrom) and n.module == "node.replication.format"
                and any(a.name == constant for a in n.names)):
            return True
    return False


def test_each_format_names_an_existing_module_that_takes_its_magic_from_here() -> None:
    for f in FORMATS:
        path = REPO / f.where
        assert path.is_file() or path.is_dir(), (f.name, f.where)
        sources = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        constant = _constant_of(f)
        assert any(_uses(s.read_text(encoding="utf-8"), constant) for s in sources), (f.name, constant)
