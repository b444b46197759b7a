"""Fixtures for the cluster suite: real 3-node clusters of mirrorq processes."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.process import Cluster


@pytest.fixture(autouse=True)
def _own_nodes_only() -> None:
    if os.environ.get("MIRRORQ_TARGET"):
        pytest.skip("cluster tests start their own mirrorq processes")


@pytest.fixture
def cluster_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Cluster]]:
    """Make (not start) clusters; every process any of them started is SIGKILLed at
    teardown, and their log tails are printed when the test failed."""
    made: list[Cluster] = []

    def make(n: int = 3, **kw: Any) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", n=n, **kw)
        made.append(c)
        return c

    try:
        yield make
    finally:
        rep = getattr(request.node, "rep_call", None)
        for c in made:
            c.kill_all()
            if rep is not None and rep.failed:
                c.dump_logs(25)
            for node in c.nodes + c.removed:
                bad = [line for line in node.tail_log(100000).splitlines()
                       if "CRITICAL" in line or "Traceback" in line]
                if bad:
                    sys.stderr.write(f"{node.node_id}: {len(bad)} CRITICAL/Traceback log lines, "
                                     f"first: {bad[0]}\n")


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    """A started 3-node cluster (leader elected, every member in sync)."""
    return cluster_factory(3).start()

