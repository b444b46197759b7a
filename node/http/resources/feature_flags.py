"""/api/feature-flags and /api/deprecated-features, read-only. mirrorq's
counterpart of RabbitMQ's feature flags is the machine version
(node/replication/machine/version.py): each version is listed as a flag,
enabled once the cluster applied it. There is nothing to enable by hand:
the leader raises the version once every member runs it (docs/operations.md,
Rolling upgrades). No feature of RabbitMQ's deprecated list exists here."""
from __future__ import annotations

from typing import Any

from node.http.auth import Principal
from node.http.context import Context
from node.http.query import filter_sort_page
from node.http.server import Request, Response

# what each machine version brought (a summary of version.py's docstring)
MACHINE_VERSIONS = {
    1: "the machine before versions",
    2: "records and snapshots carry their field counts",
    3: "RabbitMQ 4.3's quorum-queue semantics (delivery limit 20, acquired count)",
    4: "vhost and user limits, topic permissions, the connection table",
    5: "packed snapshots, at-least-once dead-lettering, quorum-queue overflow",
    6: "global parameters (a settable cluster name), vhost deletion protection",
    7: "binding limits (key words, per exchange, per vhost, wildcard trie nodes)",
}


def flag_rows(cluster_version: int, runs_version: int) -> list[dict[str, Any]]:
    """One flag per machine version this build knows: enabled when the
    cluster applied it, else disabled (it will be once every member runs it)."""
    return [{"name": f"mirrorq_machine_version_{v}",
             "desc": MACHINE_VERSIONS.get(v, f"machine version {v}"),
             "doc_url": "", "stability": "required" if v == 1 else "stable",
             "provided_by": "mirrorq",
             "state": "enabled" if v <= cluster_version else "disabled"}
            for v in range(1, max(runs_version, cluster_version) + 1)]


async def feature_flags(ctx: Context, req: Request, _p: dict[str, str], p: Principal) -> Response:
    st = ctx.b.status()
    return filter_sort_page(req, flag_rows(st.machine_version, st.runs_machine_version))


async def deprecated_features(ctx: Context, req: Request, _p: dict[str, str],
                              p: Principal) -> Response:
    return filter_sort_page(req, [])
