"""Chaos suite tests: they start their own clusters through `chaos run` or the actions
module (helpers: tests/support/chaos_env.py, tests/support/chaos_lab.py)."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from chaosmirrorq import actions


@pytest.fixture(autouse=True)
def _own_nodes_only() -> None:
    if os.environ.get("MIRRORQ_TARGET"):
        pytest.skip("chaos tests start their own mirrorq processes")


@pytest.fixture
def state() -> Iterator[None]:
    """The actions module's cluster state, emptied for the test and restored after;
    whatever the test started (workload, nodes, namespaces) is stopped."""
    saved = dict(actions._STATE)
    actions._STATE.clear()
    try:
        yield
    finally:
        try:
            actions.stop_workload()
        finally:
            actions.stop_cluster()  # every node (removed ones too) and the namespaces
            actions._STATE.clear()
            actions._STATE.update(saved)
