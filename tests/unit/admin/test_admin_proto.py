"""The generated admin code is checked in (the runtime needs only grpcio and
protobuf): regenerating it from admin.proto must give the same files, so the
two cannot drift (`make proto` after editing the .proto)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
GENERATED = ("admin_pb2.py", "admin_pb2.pyi", "admin_pb2_grpc.py")


def test_generated_admin_code_matches_the_proto(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc")
    (tmp_path / "node" / "admin").mkdir(parents=True)
    shutil.copy(REPO / "node" / "admin" / "admin.proto", tmp_path / "node" / "admin")
    # the same invocation as `make proto`, run from a copy so the tree stays untouched
    args = ["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", str(tmp_path / "node" / "admin" / "admin.proto")]
    assert protoc.main(args) == 0
    for name in GENERATED:
        fresh = (tmp_path / "node" / "admin" / name).read_text()
        checked_in = (REPO / "node" / "admin" / name).read_text()
        assert fresh == checked_in, f"node/admin/{name} is stale: run `make proto`"
