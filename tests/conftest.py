from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker_proc import Broker, NodeProcess, RemoteBroker


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    """item.rep_call: fixtures that print diagnostics (cluster logs, the operator's and the
    node agent's output) do it only when the test itself failed."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker shared by the semantic tests (use uniq() queue names)."""
    target = os.environ.get("MIRRORQ_TARGET")
    if target:
        yield RemoteBroker(target)
        return
    node = NodeProcess(tmp_path_factory.mktemp("shared") / "data")
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[NodeProcess]:
    """A node of the test's own, to kill -9, restart or misconfigure."""
    if os.environ.get("MIRRORQ_TARGET"):
        pytest.skip("needs a mirrorq node of its own")
    node = NodeProcess(tmp_path / "data")
    try:
        yield node
    finally:
        node.kill9()
