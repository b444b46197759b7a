"""Isolation attack 3 of issue 42 (bench/attack_target.py's interface): a
policymaker confined to its own vhost fills it with policies (1,100 asked
for: past the 1,024-entry RE2 cache every match used to recompile; the node
refuses past `max_policies_per_vhost`, 1,000 by default) and 20 queues, then
keeps rewriting one policy that matches every queue, alternating its
priority between the highest and the lowest: each write makes the winner of
every queue move, the most a policy write costs the apply (every queue
matched against every policy of the vhost).

Before issue 42 one such PUT stalled every member ~2 s; tests/integration/
test_policy_isolation.py runs this attack against a real node.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import requests

from bench.attack_target import Target

NAME = "policies"
VHOST = "attack-policies"
USER = "attack-policymaker"
PASSWORD = "attack-policymaker-password"
POLICIES = 1100
QUEUES = 20
TIMEOUT = 60.0


def _session(auth: tuple[str, str]) -> requests.Session:
    s = requests.Session()
    s.auth = auth
    return s


def _ok(r: requests.Response, *codes: int) -> requests.Response:
    if r.status_code not in codes:
        raise RuntimeError(f"{r.request.method} {r.url}: {r.status_code} {r.text[:200]}")
    return r


def policy_body(i: int) -> dict[str, Any]:
    """Policy i: a pattern of its own (no two alike: every one a separate
    compiled pattern) that matches none of the queues."""
    return {"pattern": f"^q-{i:04d}$", "definition": {"max-length": 1000 + i},
            "priority": i % 50, "apply-to": "queues"}


def _top(base: str) -> str:
    return f"{base}/api/policies/{quote(VHOST, safe='')}/top"


def top_body(priority: int) -> dict[str, Any]:
    """The policy the attack rewrites: it matches every queue."""
    return {"pattern": "^q-", "definition": {"max-length": 100000}, "priority": priority,
            "apply-to": "queues"}


def setup(t: Target, policies: int = POLICIES, queues: int = QUEUES) -> dict[str, float]:
    """The tenant's vhost, user (policymaker, permissions on its vhost only),
    its policies (as many as the node takes of `policies`: a 400 is the cap)
    and queues; the policy the attack rewrites is created first. Returns
    {"policies": created (the rewritten one included), "refused": refused}."""
    base = t.http[0]
    admin = _session((t.user, t.password))
    v = quote(VHOST, safe="")
    _ok(admin.put(f"{base}/api/vhosts/{v}", timeout=TIMEOUT), 201, 204)
    _ok(admin.put(f"{base}/api/users/{USER}", json={"password": PASSWORD, "tags": "policymaker"},
                  timeout=TIMEOUT), 201, 204)
    _ok(admin.put(f"{base}/api/permissions/{v}/{USER}",
                  json={"configure": ".*", "write": ".*", "read": ".*"}, timeout=TIMEOUT), 201, 204)
    tenant = _session((USER, PASSWORD))
    _ok(tenant.put(_top(base), json=top_body(-1), timeout=TIMEOUT), 201, 204)
    local = threading.local()

    def put(i: int) -> int:
        s = getattr(local, "s", None)
        if s is None:
            s = local.s = _session((USER, PASSWORD))
        r = s.put(f"{base}/api/policies/{v}/p{i:04d}", json=policy_body(i), timeout=TIMEOUT)
        return _ok(r, 201, 204, 400).status_code

    # policies before queues: on a build that matched every queue per write
    # this order keeps the setup short; the attack is the writes that follow
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(put, range(policies)))
    for i in range(queues):
        _ok(tenant.put(f"{base}/api/queues/{v}/q-{i:02d}", json={"durable": True},
                       timeout=TIMEOUT), 201, 204)
    return {"policies": float(1 + codes.count(201) + codes.count(204)),
            "refused": float(codes.count(400))}


def run(t: Target, stop: threading.Event) -> dict[str, float]:
    """Rewrite one policy matching every queue, its priority alternating
    between the highest and the lowest, until `stop`. Returns the PUTs made
    and their slowest and median durations (s)."""
    base = t.http[0]
    tenant = _session((USER, PASSWORD))
    url = _top(base)
    took: list[float] = []
    while not stop.is_set():
        prio = 1_000_000 if len(took) % 2 == 0 else -1
        t0 = time.monotonic()
        _ok(tenant.put(url, json=top_body(prio), timeout=TIMEOUT), 201, 204)
        took.append(time.monotonic() - t0)
    s = sorted(took)
    return {"policy_puts": float(len(took)),
            "put_p50_s": s[len(s) // 2] if s else 0.0,
            "put_max_s": s[-1] if s else 0.0}
