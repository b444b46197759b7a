"""Started clusters that tests share (tests/cluster/conftest.py's `shared_cluster`
and `shared_http_cluster`, and any fixture named shared_*): the pool that holds
one at a time, what a test created and is deleted after it, and the checks that
tell whether the next test may have it. The rule for which tests may: the
docstring of tests/cluster/conftest.py."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.process import Cluster, ClusterNode, free_port, wait_for
from node.admin import client as admin


def bad_lines(node: ClusterNode, text: str) -> None:
    """The CRITICAL/Traceback lines of `text` (from node's log), counted on stderr."""
    bad = [line for line in text.splitlines() if "CRITICAL" in line or "Traceback" in line]
    if bad:
        sys.stderr.write(f"{node.node_id}: {len(bad)} CRITICAL/Traceback log lines, "
                         f"first: {bad[0]}\n")


# a kind's recipe: an unstarted Cluster in the directory given, with what the tests
# get besides it (`extra`) and what to close once it is killed
Prepared = tuple[Cluster, Any, Callable[[], None] | None]


@dataclass
class Shared:
    kind: str
    cluster: Cluster
    extra: Any
    close: Callable[[], None] | None
    pids: dict[str, int | None]
    marks: dict[str, int] = field(default_factory=dict)  # log sizes when the test began
    before: dict[str, dict[tuple[Any, ...], Any]] = field(default_factory=dict)  # _definitions


def _definitions(node: ClusterNode) -> dict[str, dict[tuple[Any, ...], Any]]:
    """What the admin API lists on `node`, keyed by identity, with each item's value."""
    kw: dict[str, Any] = {"token": node.admin_token}
    h, p = node.host, node.admin_port
    out: dict[str, dict[tuple[Any, ...], Any]] = {
        "queues": {(q["vhost"], q["name"]): q["durable"]
                   for q in admin.call_list_queues(h, p, **kw)["queues"]},
        "vhosts": {(v["name"],): None for v in admin.call_vhost_list(h, p, **kw)["vhosts"]},
        "users": {(u["name"],): tuple(u["tags"]) for u in admin.call_user_list(h, p, **kw)["users"]},
        "permissions": {(x["user"], x["vhost"]): (x["configure"], x["write"], x["read"])
                        for x in admin.call_permission_list(h, p, **kw)["permissions"]},
        "limits": {(x["scope"], x["owner"], x["name"]): x["value"]
                   for x in admin.call_limit_list(h, p, **kw)["limits"]},
        "policies": {},
    }
    for operator in (False, True):
        for x in admin.call_policy_list(h, p, operator=operator, **kw)["policies"]:
            out["policies"][(x["vhost"], x["name"], operator)] = (
                x["pattern"], x["apply-to"], repr(x["definition"]), x["priority"])
    return out


def _undo(node: ClusterNode, before: dict[str, dict[tuple[Any, ...], Any]]) -> None:
    """Delete through `node` (the leader) what was created since `before`; raise if
    something that was there before changed or went."""
    now = _definitions(node)
    changed = [f"{what} {key}: {old!r} -> {now[what].get(key, '<gone>')!r}"
               for what, items in before.items() for key, old in items.items()
               if now[what].get(key, "<gone>") != old]
    if changed:
        raise AssertionError("a test on a shared cluster changed what it did not create "
                             f"(give it a cluster of its own): {changed}")
    new = {what: [k for k in items if k not in before[what]] for what, items in now.items()}
    kw: dict[str, Any] = {"token": node.admin_token}
    h, p = node.host, node.admin_port
    for scope, owner, name in new["limits"]:
        admin.call_limit_clear(h, p, scope, owner, name, **kw)
    for vhost, name, operator in new["policies"]:
        admin.call_policy_clear(h, p, vhost, name, operator=operator, **kw)
    for user, vhost in new["permissions"]:
        admin.call_permission_clear(h, p, user, vhost, **kw)
    for (user,) in new["users"]:
        admin.call_user_delete(h, p, user, **kw)
    for (vhost,) in new["vhosts"]:
        admin.call_vhost_delete(h, p, vhost, **kw)  # its queues and exchanges with it
    queues = [(v, q) for v, q in new["queues"] if (v,) in before["vhosts"]]
    if queues:
        import pika
        import pika.exceptions
        for vhost in sorted({v for v, _q in queues}):
            conn = pika.BlockingConnection(pika.ConnectionParameters(
                host=node.host, port=node.amqp_port, virtual_host=vhost, heartbeat=0,
                socket_timeout=10, credentials=pika.PlainCredentials(node.user, node.password)))
            try:
                for v, q in queues:
                    if v == vhost:
                        ch = conn.channel()
                        try:
                            ch.queue_delete(q)
                        except pika.exceptions.ChannelClosedByBroker:
                            pass  # exclusive to a connection still closing: goes with it
            finally:
                conn.close()

    def clean() -> bool:
        now = _definitions(node)
        return all(set(now[what]) == set(before[what]) for what in before)
    wait_for(clean, timeout=20, what="the shared cluster back to what it held before the test")


class SharedClusters:
    """At most one started shared cluster at a time (tests/cluster/conftest.py's docstring)."""

    def __init__(self) -> None:
        self.base: Path | None = None
        self.current: Shared | None = None
        self.started: dict[str, int] = {}

    def release(self, dump: bool = False) -> None:
        sh, self.current = self.current, None
        if sh is None:
            return
        sh.cluster.kill_all()
        if dump:
            sh.cluster.dump_logs(25)
        for node in sh.cluster.nodes + sh.cluster.removed:
            bad_lines(node, node.log_since(sh.marks.get(node.node_id, 0)))
        if sh.close is not None:
            sh.close()

    def _healthy(self, sh: Shared, timeout: float) -> None:
        """Every member the process it was, running, not paused, in sync."""
        c = sh.cluster
        now = {n.node_id: n.pid for n in c.nodes}
        assert now == sh.pids and not c.removed, f"members changed: {sh.pids} -> {now}"
        dead = [n.node_id for n in c.nodes if not n.alive()]
        assert not dead, f"not running: {dead}"
        paused = [n.node_id for n in c.nodes if n.paused]
        assert not paused, f"paused: {paused}"
        c.wait_healthy(timeout)

    def acquire(self, kind: str, prepare: Callable[[Path], Prepared]) -> Shared:
        sh = self.current
        if sh is not None and sh.kind != kind:
            self.release()
            sh = None
        if sh is not None:
            try:
                self._healthy(sh, 30)
            except AssertionError as exc:
                sys.stderr.write(f"shared cluster {kind} unhealthy before a test, replaced: {exc}\n")
                self.release(dump=True)
                sh = None
        if sh is None:
            assert self.base is not None, "the shared_pool fixture sets the base directory"
            n = self.started[kind] = self.started.get(kind, 0) + 1
            c, extra, close = prepare(self.base / f"{kind}-{n}")
            sh = Shared(kind, c, extra, close, {})
            self.current = sh
            try:
                c.start()
            except BaseException:
                self.release()
                raise
            sh.pids = {node.node_id: node.pid for node in c.nodes}
        return sh

    def finish(self, sh: Shared, failed: bool) -> None:
        """After a test: what tests/cluster/conftest.py's docstring says."""
        for node in sh.cluster.nodes + sh.cluster.removed:
            bad_lines(node, node.log_since(sh.marks.get(node.node_id, 0)))
        sh.marks = {node.node_id: node.log_mark() for node in sh.cluster.nodes}
        if failed:
            self.release(dump=True)
            return
        try:
            self._healthy(sh, 30)
            _undo(sh.cluster.leader(), sh.before)
            self._healthy(sh, 30)
        except Exception as exc:
            self.release(dump=True)
            raise AssertionError(f"the test left the shared cluster {sh.kind} unclean or "
                                 f"unhealthy (replaced for the next test): {exc}") from exc


POOL = SharedClusters()


def use_shared(pool: SharedClusters, request: pytest.FixtureRequest,
               prepare: Callable[[Path], Prepared]) -> Iterator[Shared]:
    """The body of a shared_* fixture: the kind is the fixture's name."""
    assert pool is POOL, "tests/support/shared_cluster.py imported twice: two pools"
    sh = pool.acquire(request.fixturename, prepare)
    try:
        sh.before = _definitions(sh.cluster.leader())
    except BaseException:
        pool.release(dump=True)
        raise
    sh.marks = {node.node_id: node.log_mark() for node in sh.cluster.nodes}
    yield sh
    rep = getattr(request.node, "rep_call", None)
    pool.finish(sh, failed=rep is None or rep.failed)


def with_http(c: Cluster, member_urls: bool = True) -> Cluster:
    """Every node of `c` (not started) with the management HTTP API on its own port
    (node.http_port) and, with `member_urls`, told every other's URL (--http-member-url)."""
    for n in c.nodes:
        n.http_port = free_port()  # type: ignore[attr-defined]
        n.extra_args += ["--http-port", str(n.http_port)]  # type: ignore[attr-defined]
    if member_urls:
        urls = {n.node_id: f"http://{n.host}:{n.http_port}/" for n in c.nodes}  # type: ignore[attr-defined]
        for n in c.nodes:
            n.extra_args += [arg for other, u in urls.items() if other != n.node_id
                             for arg in ("--http-member-url", f"{other}={u}")]
    return c


def shared_kind(item: pytest.Item) -> str | None:
    """The shared cluster kind `item` uses: the name of its shared_* fixture."""
    names = getattr(item, "fixturenames", ())
    return next((f for f in names if f.startswith("shared_") and f != "shared_pool"), None)
