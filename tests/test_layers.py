"""The layering rules of docs/ARCHITECTURE.md, checked on every import.

Each rule walks the Python files in its scope with `ast` (plain and `from`
imports anywhere in a file, TYPE_CHECKING blocks and function bodies
included, relative imports resolved, `importlib.import_module("...")` and
`__import__("...")` with a literal name too) and reports every forbidden
import as `path:line: imports module`. Rules are written for the layout of
issue 25; a folder that does not exist yet is simply empty. One parametrized
test checks every rule of RULES on the real tree, and another proves each one
can fail (its sample), so a rule cannot be declared and left unchecked.

Rules about third-party libraries (pysyncobj, pamqp, grpc) are about the
product, node/: tests and tools use pamqp and grpc as clients, and a few
tests open pysyncobj's journal directly. grpc and protobuf are imported in
node/admin/ only (nothing under node/app/ imports them: the CLI goes through
node/admin's `call_*` helpers), and the rule says exactly that. Each outside
library has one module (or folder) of node/ that owns it: cryptography's is
node/app/pki.py (node/http gets certificates' dates through its Backend).
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# never walked: not the repository's own source
_SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", "node_modules",
              ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}

# the modules of the snapshot file's format (node/replication/raft/snapshot/): pure,
# no pysyncobj (the package's other modules are pysyncobj's side of snapshots)
_SNAPSHOT_FORMAT = ("envelope", "fields", "message", "packed", "section", "sections", "writer",
                    "reader")

# the top-level names under which the tools are imported
_TOOLS = ("tests", "bench", "chaos", "chaosmirrorq", "soak", "k8s", "harness",
          "mirrorq_operator")


@dataclass(frozen=True)
class Rule:
    name: str
    scope: tuple[str, ...]  # repository paths (folders end with "/") the rule reads
    forbidden: tuple[str, ...]  # module prefixes no file in scope may import
    exempt: tuple[str, ...] = ()  # paths inside the scope where the rule does not apply
    allowed: tuple[str, ...] = ()  # module prefixes allowed although under `forbidden`
    bare_tests: bool = False  # also a bare `import cluster_proc` of a tests/*.py module
    sample: tuple[str, str] = ("", "")  # (path, source) that breaks the rule: the self-test


RULES = (
    Rule("pysyncobj is imported only under node/replication/raft/",
         scope=("node/",), exempt=("node/replication/raft/",), forbidden=("pysyncobj",),
         sample=("node/replication/raft_node.py", "from pysyncobj import SyncObj\n")),
    Rule("pamqp is imported only by node/amqp/frame.py",
         scope=("node/",), exempt=("node/amqp/frame.py",), forbidden=("pamqp",),
         sample=("node/amqp/channel.py", "import os\nfrom pamqp import commands\n")),
    Rule("cryptography is imported only by node/app/pki.py and the operator's pki.py "
         "(node/http gets certificates' dates from node/app through its Backend)",
         scope=("node/", "operator/"),
         exempt=("node/app/pki.py", "operator/mirrorq_operator/pki.py"),
         forbidden=("cryptography",),
         sample=("operator/mirrorq_operator/kube.py", "from cryptography import x509\n")),
    Rule("grpc and protobuf are imported only under node/admin/",
         scope=("node/",), exempt=("node/admin/",),
         forbidden=("grpc", "grpc_tools", "google.protobuf"),
         sample=("node/app/main.py", "def f():\n    import grpc\n")),
    Rule("the state machine and the broker model import no wire, raft, http, admin, app "
         "or asyncio",
         scope=("node/replication/machine/", "node/broker/"),
         forbidden=("node.amqp", "node.replication.raft", "node.replication.raft_node",
                    "pysyncobj", "node.http", "node.admin", "node.app", "asyncio"),
         sample=("node/replication/machine/delivery.py",
                 "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from node.amqp.connection import Connection\n")),
    Rule("node/broker imports nothing of node but node.broker",
         scope=("node/broker/",), forbidden=("node",), allowed=("node.broker",),
         sample=("node/broker/queue.py", "from node.replication.command import Batch\n")),
    Rule("node/amqp imports no http, admin, app, raft or pysyncobj",
         scope=("node/amqp/",),
         forbidden=("node.http", "node.admin", "node.app", "node.replication.raft",
                    "node.replication.raft_node", "pysyncobj"),
         sample=("node/amqp/server.py", "from node import app\n")),
    # as docs/ARCHITECTURE.md's map: amqp -> replication.{command,effect,port,read_model,
    # message_store}; message_store: server.py's read_stored reads a delivery's bytes
    Rule("node/amqp imports of node/replication are limited to command, effect, port, "
         "read_model and message_store",
         scope=("node/amqp/",), forbidden=("node.replication",),
         allowed=("node.replication.command", "node.replication.effect", "node.replication.port",
                  "node.replication.read_model", "node.replication.message_store"),
         sample=("node/amqp/connection.py", "from node.replication.pipeline import Pipeline\n")),
    # of node.amqp, http imports internal (AmqpReplyError, context.py), throttle (LoginGate,
    # app.py) and frame (encode_method, resources/queues.py); is_loopback comes from
    # node.broker.loopback (auth.py) and the product version from the Backend; besides,
    # node.replication.status (NodeStatus) and node.broker (the pure model)
    Rule("node/http imports of node/ are limited to node.http, node.amqp, node.broker, "
         "node.replication.read_model and node.replication.status (no app, admin or raft)",
         scope=("node/http/",), forbidden=("node",),
         allowed=("node.http", "node.amqp", "node.broker", "node.replication.read_model",
                  "node.replication.status"),
         sample=("node/http/resources/health.py", "from node.app.pki import file_validity\n")),
    Rule("node/admin imports nothing of node but node.admin (no broker logic)",
         scope=("node/admin/",), forbidden=("node",), allowed=("node.admin",),
         sample=("node/admin/convert.py", "from node.replication.status import NodeStatus\n")),
    Rule("node/replication imports nothing of node but node.replication and node.broker "
         "(no amqp, http, admin or app)",
         scope=("node/replication/",), forbidden=("node",),
         allowed=("node.replication", "node.broker"),
         sample=("node/replication/raft_node.py", "from node.amqp.server import AmqpServer\n")),
    # as the map: machine/ -> broker, replication.{command,effect,message_store}; message_store
    # for the PropsReader Protocol and pure helpers (make_loc, BUCKET_SHIFT,
    # with_delivery_count), never the log itself
    Rule("node/replication/machine imports of node/ are limited to node.broker and "
         "node.replication's machine, command, effect and message_store",
         scope=("node/replication/machine/",), forbidden=("node",),
         allowed=("node.broker", "node.replication.machine", "node.replication.command",
                  "node.replication.effect", "node.replication.message_store"),
         sample=("node/replication/machine/publish.py", "from node.replication.view import RaftView\n")),
    Rule("node/ imports no harness, chaos, bench, soak, k8s, operator or tests",
         scope=("node/",), forbidden=_TOOLS, bare_tests=True,
         sample=("node/app/local_cluster.py", "from harness.process import Cluster\n")),
    Rule("the tools (bench, chaos, soak, k8s, harness, operator) never import tests",
         scope=("bench/", "chaos/", "soak/", "k8s/", "harness/", "operator/"),
         forbidden=("tests",), bare_tests=True,
         sample=("bench/profile.py",
                 "import sys\nsys.path.insert(0, 'tests')\nimport cluster_proc\n")),
    Rule("harness imports none of chaos, bench, soak, k8s or tests",
         scope=("harness/",),
         forbidden=("chaos", "chaosmirrorq", "bench", "soak", "k8s", "tests"), bare_tests=True,
         sample=("harness/amqp.py", "from chaosmirrorq.cluster import free_port\n")),
    Rule("the snapshot format imports no pysyncobj and nothing of raft but the format",
         scope=tuple(f"node/replication/raft/snapshot/{m}.py" for m in _SNAPSHOT_FORMAT),
         forbidden=("pysyncobj", "node.replication.raft"),
         allowed=tuple(f"node.replication.raft.snapshot.{m}" for m in _SNAPSHOT_FORMAT),
         sample=("node/replication/raft/snapshot/writer.py",
                 "from node.replication.raft.snapshot.raft_data import raft_meta\n")),
)


# ------------------------------------------------------------------ the checker
@dataclass(frozen=True)
class Import:
    line: int
    module: str  # the dotted name imported (`from a.b import c` -> "a.b.c")
    bare: str  # the module as written for a plain import, else "" (for bare_tests)


def _package_of(rel: str) -> list[str]:
    """The package a file at `rel` belongs to, from its path (for relative imports)."""
    return list(Path(rel).with_suffix("").parts[:-1])


def imports_in(source: str, rel: str) -> Iterator[Import]:
    tree = ast.parse(source, filename=rel)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node.lineno, alias.name, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = _package_of(rel)
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                name = base if alias.name == "*" else f"{base}.{alias.name}".lstrip(".")
                yield Import(node.lineno, name, "" if node.level else (node.module or ""))
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
            yield Import(node.lineno, node.args[0].value, node.args[0].value)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _files(root: Path, scope: tuple[str, ...]) -> Iterator[Path]:
    for entry in scope:
        path = root / entry
        if entry.endswith("/"):
            if not path.is_dir():
                continue  # not there (yet): nothing to check
            for f in sorted(path.rglob("*.py")):
                parts = f.relative_to(root).parts
                if not any(p in _SKIP_DIRS or p.endswith(".egg-info") for p in parts):
                    yield f
        elif path.is_file():
            yield path


def _test_modules(root: Path) -> set[str]:
    """Modules directly in tests/, which a tool could import bare after a sys.path hack."""
    tests = root / "tests"
    return {f.stem for f in tests.glob("*.py") if f.stem != "__init__"} if tests.is_dir() else set()


def violations(rule: Rule, root: Path = REPO) -> list[str]:
    """One `path:line: imports a, b` per offending line, in file order."""
    bare_names = _test_modules(root) if rule.bare_tests else set()
    found: dict[tuple[str, int], list[str]] = {}
    for f in _files(root, rule.scope):
        rel = f.relative_to(root).as_posix()
        if any(rel == e or (e.endswith("/") and rel.startswith(e)) for e in rule.exempt):
            continue
        for imp in imports_in(f.read_text(encoding="utf-8"), rel):
            bad = (any(_within(imp.module, p) for p in rule.forbidden)
                   and not any(_within(imp.module, p) for p in rule.allowed))
            if not bad and imp.bare:
                top = imp.bare.split(".")[0]
                # a module of the file's own folder shadows a tests/ module of the same name
                own = f.parent / f"{top}.py"
                bad = top in bare_names and not own.exists() and not (f.parent / top).is_dir()
            if bad:
                found.setdefault((rel, imp.line), []).append(imp.module)
    return [f"{rel}:{line}: imports {', '.join(mods)}" for (rel, line), mods in found.items()]


def _check(rule: Rule) -> None:
    found = violations(rule)
    if found:
        pytest.fail(f"{rule.name}; broken by:\n" + "\n".join(found), pytrace=False)


def _rule(prefix: str) -> Rule:
    (rule,) = [r for r in RULES if r.name.startswith(prefix)]
    return rule


# ------------------------------------------------------------------ every rule on the real tree
@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_rule_holds(rule: Rule) -> None:
    _check(rule)


# ------------------------------------------------------------------ no pickle loader (issue 26)
# What node/ may take of a pickle module: pysyncobj's to_bytes (str -> bytes, for
# journal records); nothing that loads one (a pickle from a peer or a file can run code).
_PICKLE_MODULES = ("pickle", "_pickle", "cPickle", "cloudpickle", "dill", "shelve", "pysyncobj.pickle")
_PICKLE_ALLOWED = ("pysyncobj.pickle.to_bytes",)
_LOADERS = ("load", "loads", "Unpickler", "find_class")


def pickle_loaders(root: Path = REPO) -> list[str]:
    """`path:line: what` for every pickle import, pickle loader call or
    Unpickler under node/ (imports by name, by importlib, and attributes
    such as `pickle.loads` or `x.Unpickler` alike)."""
    found = []
    for f in _files(root, ("node/",)):
        rel = f.relative_to(root).as_posix()
        source = f.read_text(encoding="utf-8")
        for imp in imports_in(source, rel):
            if any(_within(imp.module, m) for m in _PICKLE_MODULES) and imp.module not in _PICKLE_ALLOWED:
                found.append(f"{rel}:{imp.line}: imports {imp.module}")
        for node in ast.walk(ast.parse(source, filename=rel)):
            name = (node.attr if isinstance(node, ast.Attribute)
                    else node.id if isinstance(node, ast.Name)
                    else node.name if isinstance(node, ast.FunctionDef | ast.ClassDef) else None)
            if name in ("Unpickler", "find_class"):
                found.append(f"{rel}:{node.lineno}: uses {name}")
            elif (isinstance(node, ast.Attribute) and name in _LOADERS
                  and "pickle" in ast.unparse(node.value).lower()):
                found.append(f"{rel}:{node.lineno}: calls {ast.unparse(node)}")
    return found


def test_node_loads_no_pickle() -> None:
    """Snapshots, the log and peer messages use our own formats (codec.py,
    raft/snapshot/): nothing under node/ may load a pickle."""
    found = pickle_loaders()
    if found:
        pytest.fail("a pickle loader under node/:\n" + "\n".join(found), pytrace=False)


@pytest.mark.parametrize("source", [
    "import pickle\n", "from pickle import loads\n", "import _pickle as p\n",
    "from pysyncobj.pickle import loads\n", "import pysyncobj.pickle\n",
    "importlib.import_module('pickle')\n", "x = mod.Unpickler(f)\n", "from pysyncobj.pickle import dumps\n",
    "class U(Base):\n    def find_class(self, m, n): ...\n", "data = pysyncobj_pickle.loads(b)\n",
])
def test_the_pickle_check_can_fail(source: str, tmp_path: Path) -> None:
    root = _tree(tmp_path, {"node/replication/raft/snapshot/reader.py": source})
    assert pickle_loaders(root), source
    ok = _tree(tmp_path / "ok", {"node/replication/raft/log/meta.py":
                                 "from pysyncobj.pickle import to_bytes\nimport json\njson.loads('1')\n"})
    assert pickle_loaders(ok) == []


# ------------------------------------------------------------------ the checker checked
def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_each_rule_can_fail(rule: Rule, tmp_path: Path) -> None:
    """Every rule reports its sample's forbidden import, with file and line."""
    path, source = rule.sample
    files = {path: source}
    if rule.bare_tests:
        files["tests/cluster_proc.py"] = ""
    root = _tree(tmp_path, files)
    found = violations(rule, root)
    last = len(source.rstrip("\n").split("\n"))
    assert found and found[0].startswith(f"{path}:{last}: imports "), found


def test_missing_folders_are_empty(tmp_path: Path) -> None:
    for rule in RULES:
        assert violations(rule, tmp_path) == []


def test_exempt_and_allowed_imports_pass(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "node/replication/raft/shim.py": "from pysyncobj import SyncObj\n",
        "node/amqp/frame.py": "from pamqp import commands\n",
        "node/admin/service.py": "import grpc\nfrom google.protobuf import descriptor\n",
        "node/broker/queue.py": "from node.broker.vhost import ResourceKey\nfrom . import ids\n",
        "node/replication/machine/state.py": "from node.broker.queue import Queue\n"
                                             "from node.replication.command import Batch\n",
        "node/amqp/channel.py": "from node.replication.command import Command\n",
        "node/amqp/server.py": "from node.replication.message_store import PayloadCache\n",
        "node/replication/raft_node.py": "import asyncio\nfrom node.replication.raft import shim\n",
        "node/replication/machine/publish.py": "from node.replication.message_store import loc\n",
        "node/app/pki.py": "from cryptography import x509\n",
        "node/http/context.py": "from node.amqp.internal import AmqpSession\n"
                                "from node.replication.read_model import ReadModel\n"
                                "from node.replication.status import NodeStatus\n",
        "node/admin/client.py": "from node.admin import admin_pb2\n",
        "bench/suite.py": "import sys\nsys.path.insert(0, 'bench')\nfrom cluster import X\n",
        "bench/cluster.py": "",
        "tests/cluster_proc.py": "",
        "tests/test_x.py": "from tests.cluster_proc import Cluster\n",
    })
    assert [f for r in RULES for f in violations(r, root)] == []


def test_import_forms_are_resolved(tmp_path: Path) -> None:
    """`from node import amqp`, relative imports and importlib are all seen."""
    root = _tree(tmp_path, {
        "node/broker/a.py": "from node import amqp\n",
        "node/broker/b.py": "from ..replication import raft_node\n",
        "node/broker/c.py": "import importlib\nm = importlib.import_module('node.http.routes')\n",
        "node/broker/d.py": "x = __import__('asyncio')\n",
        "node/broker/e.py": "from node.replication.raft.shim import RaftShim\n",
    })
    found = violations(_rule("the state machine"), root)
    assert found == ["node/broker/a.py:1: imports node.amqp",
                     "node/broker/b.py:1: imports node.replication.raft_node",
                     "node/broker/c.py:2: imports node.http.routes",
                     "node/broker/d.py:1: imports asyncio",
                     "node/broker/e.py:1: imports node.replication.raft.shim.RaftShim"]
    assert "node/broker/b.py:1: imports node.replication.raft_node" in violations(
        _rule("node/broker"), root)
    # raft_node is not node.replication.raft: prefixes match whole names only
    assert not _within("node.replication.raft_node", "node.replication.raft")


# ------------------------------------------------------------------ tests import helpers
def helper_violations(root: Path = REPO) -> list[str]:
    """Tests share helpers through tests/support/ (or plain helper modules), never by
    importing another test module or a conftest: `path:line: imports module`."""
    found = []
    for f in _files(root, ("tests/",)):
        rel = f.relative_to(root).as_posix()
        for imp in imports_in(f.read_text(encoding="utf-8"), rel):
            parts = imp.module.split(".")
            if parts[0] == "tests" and any(p.startswith("test_") or p == "conftest"
                                           for p in parts[1:]):
                found.append(f"{rel}:{imp.line}: imports {imp.module}")
    return found


def test_tests_import_no_test_module_or_conftest() -> None:
    found = helper_violations()
    if found:
        pytest.fail("a test imports another test module or a conftest (move the helper to "
                    "tests/support/); broken by:\n" + "\n".join(found), pytrace=False)


def test_test_helper_rule_can_fail(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "tests/unit/test_a.py": "from tests.support.machine import Harness\n",
        "tests/unit/test_b.py": "import os\nfrom tests.unit.test_a import helper\n",
        "tests/chaos/test_c.py": "from tests.chaos.conftest import short_env\n",
    })
    assert helper_violations(root) == ["tests/chaos/test_c.py:1: imports tests.chaos.conftest.short_env",
                                       "tests/unit/test_b.py:2: imports tests.unit.test_a.helper"]
