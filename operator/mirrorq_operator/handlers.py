"""Thin kopf handlers: observe, plan, execute. Run: kopf run -m mirrorq_operator.handlers

Environment (read once at start):
  MIRRORQ_OPERATOR_RECONCILE_SECONDS  timer period (default 10; idle half of it),
                                      also the retry delay after a failed pass
  MIRRORQ_OPERATOR_LOCAL_BASE_PORT    local addressing (model.Addressing), for
                                      development and tests; unset in a cluster
"""
from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kopf

from . import kube
from .model import Spec, SpecError, UpdateStatus, WaitFor
from .plan import describe, plan, with_failure

GROUP, VERSION, PLURAL = "mirrorq.io", "v1alpha1", "mirrorqclusters"
RECONCILE_SECONDS = float(os.environ.get("MIRRORQ_OPERATOR_RECONCILE_SECONDS") or 10.0)
if not RECONCILE_SECONDS > 0:
    raise ValueError(f"MIRRORQ_OPERATOR_RECONCILE_SECONDS must be > 0, got {RECONCILE_SECONDS}")

# kopf runs the timer beside the create/update handlers of the same object (both
# sync, in its thread pool): one reconcile pass per cluster at a time, so that two
# passes never plan from the same observation and both act.
_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


@kopf.on.startup()
def _startup(logger: Any, **_: Any) -> None:
    kube.load()
    where = (f"local, base port {kube.ADDRESSING.local_base_port}" if kube.ADDRESSING.local
             else "in-cluster DNS")
    logger.info(f"mirrorq operator: pods addressed {where}; reconcile every {RECONCILE_SECONDS}s")


def reconcile(spec: Any, name: str, namespace: str, meta: Any, status: Any,
              patch: kopf.Patch, logger: Any = None) -> None:
    with _lock(namespace, name):
        _reconcile(spec, name, namespace, meta, status, patch, logger)


def _reconcile(spec: Any, name: str, namespace: str, meta: Any, status: Any,
               patch: kopf.Patch, logger: Any) -> None:
    started = time.monotonic()
    done: list[str] = []
    try:
        cr_spec = Spec.from_cr(dict(spec))
    except SpecError as exc:
        # nothing to retry until the spec changes (an update handler runs then); the
        # status says why, and nothing is created or changed from a spec we refuse
        patch.status["lastError"] = f"invalid spec: {exc}"
        raise kopf.PermanentError(f"invalid spec: {exc}") from None
    obs = kube.observe(name, namespace, int(meta.get("generation") or 0), dict(status))
    out: dict[str, Any] = {"lastError": None}
    waiting: list[str] = []
    error: str | None = None
    for action in plan(cr_spec, obs, kube.ADDRESSING):
        if isinstance(action, WaitFor):
            waiting.append(action.reason)
            continue
        if error is not None:
            if not isinstance(action, UpdateStatus):
                continue  # nothing after a failed step but the status, which says so
            action = with_failure(action, error)
        try:
            kube.execute(action, cr_spec, obs, out)
        except Exception as exc:
            error = out["lastError"] = f"{type(action).__name__}: {exc}"
        if not isinstance(action, UpdateStatus):
            done.append(describe(action))
    _stamp(out, dict(status))
    patch.status.update(out)
    if logger is not None and (done or error):  # what this pass changed, and how long it took
        logger.info(f"reconcile: {'; '.join(done)}{f' FAILED {error}' if error else ''} "
                    f"({time.monotonic() - started:.2f}s)")
    if waiting:
        kopf.info(dict(meta), reason="Waiting", message="; ".join(waiting))


def _stamp(out: dict[str, Any], old: dict[str, Any]) -> None:
    """lastTransitionTime: kept while a condition's status is unchanged."""
    before = {c.get("type"): c for c in old.get("conditions") or ()}
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for cond in out.get("conditions") or ():
        prev = before.get(cond["type"])
        same = prev is not None and prev.get("status") == cond["status"]
        cond["lastTransitionTime"] = prev.get("lastTransitionTime", now) if same and prev else now


@kopf.on.create(GROUP, VERSION, PLURAL, backoff=RECONCILE_SECONDS)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", backoff=RECONCILE_SECONDS)
def on_change(**kw: Any) -> None:
    reconcile(kw["spec"], kw["name"], kw["namespace"], kw["meta"], kw["status"], kw["patch"],
              kw.get("logger"))


@kopf.timer(GROUP, VERSION, PLURAL, interval=RECONCILE_SECONDS, idle=RECONCILE_SECONDS / 2,
            backoff=RECONCILE_SECONDS)
def on_timer(**kw: Any) -> None:
    reconcile(kw["spec"], kw["name"], kw["namespace"], kw["meta"], kw["status"], kw["patch"],
              kw.get("logger"))
