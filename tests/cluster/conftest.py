"""Fixtures for the cluster suite: real 3-node clusters of mirrorq processes.

`cluster` and `cluster_factory` give a test clusters of its own. `shared_cluster`
and `shared_http_cluster` give it a started cluster that other tests use too
(starting one costs 4-5 s: processes, election, every member in sync). Only a
test that leaves every member as it found it may use one: it kills, pauses,
stops or restarts no node, partitions nothing, adds or removes no member,
changes no node's config or files, fills no disk, changes nothing it did not
create (guest, "/", a limit or policy it did not set), and counts nothing
since the node's start (make a figure relative: read it before, compare after;
look at log lines written after a `ClusterNode.log_mark()`). It names its
queues, exchanges, users and vhosts uniquely (harness.client.uniq_queue,
tests.broker_proc.uniq).

Between two tests on a shared cluster, the fixture
- writes the CRITICAL/Traceback lines the test's time left in the logs to stderr
  (as the `cluster` fixture does for a whole log);
- if the test failed (or never ran its body), dumps the log tails, kills the
  cluster and starts a fresh one for the next test: a failure cannot cascade;
- otherwise deletes what the test created (queues, vhosts, users, permissions,
  policies, limits: the admin API's lists before and after) and checks that
  every member is still the process it was, alive, a member and in sync under
  one agreed leader (Cluster.wait_healthy). A test that changed what it did not
  create or left the cluster unhealthy gets an error at its teardown, and the
  cluster is replaced.

The tests of one kind run one after the other (pytest_collection_modifyitems
below moves them to the front of tests/cluster, in their file order), and the
cluster is killed (by pid, every process) as soon as the next test is not of its
kind, and at the end of the session.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.process import Cluster
from tests.support.shared_cluster import (
    POOL,
    SharedClusters,
    bad_lines,
    shared_kind,
    use_shared,
    with_http,
)

HERE = Path(__file__).resolve().parent


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
                bad_lines(node, node.tail_log(100000))


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    """A started 3-node cluster (leader elected, every member in sync)."""
    return cluster_factory(3).start()


@pytest.fixture(scope="session")
def shared_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedClusters]:
    POOL.base = tmp_path_factory.mktemp("shared-clusters")
    try:
        yield POOL
    finally:
        POOL.release()


@pytest.fixture
def shared_cluster(shared_pool: SharedClusters, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A started 3-node cluster that other tests use too (the rule: this module's docstring)."""
    for sh in use_shared(shared_pool, request, lambda base: (Cluster(base, 3), None, None)):
        yield sh.cluster


@pytest.fixture
def shared_http_cluster(shared_pool: SharedClusters,
                        request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A shared 3-node cluster (the same rule) whose nodes serve the management HTTP
    API (node.http_port) and know each other's URL (with_http)."""
    for sh in use_shared(shared_pool, request, lambda base: (with_http(Cluster(base, 3)), None, None)):
        yield sh.cluster


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """The tests of tests/cluster that share a cluster first, kind by kind (in the
    order of each kind's first test), each in its file order; the rest after, in
    theirs. The other folders' tests keep their places."""
    here = [i for i, item in enumerate(items) if HERE in Path(item.path).resolve().parents]
    kinds: list[str] = []
    for i in here:
        k = shared_kind(items[i])
        if k is not None and k not in kinds:
            kinds.append(k)

    def key(item: pytest.Item) -> int:
        k = shared_kind(item)
        return kinds.index(k) if k is not None else len(kinds)
    ordered = sorted((items[i] for i in here), key=key)
    for i, item in zip(here, ordered, strict=True):
        items[i] = item


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Kill the shared cluster as soon as the next test does not use its kind."""
    yield
    sh = POOL.current
    if sh is not None and (nextitem is None or shared_kind(nextitem) != sh.kind):
        POOL.release()
