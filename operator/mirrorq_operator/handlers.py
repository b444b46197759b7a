"""Thin kopf handlers: observe, plan, execute. Run: kopf run -m mirrorq_operator.handlers

Environment (read once at start):
  MIRRORQ_OPERATOR_RECONCILE_SECONDS  timer period (default 10; idle half of it),
                                      also the retry delay after a failed pass
  MIRRORQ_OPERATOR_LOCAL_BASE_PORT    local addressing (model.Addressing), for
                                      development and tests; unset in a cluster
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kopf

from . import kube
from .builders import auth_secret_name
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
    obs = kube.observe(name, namespace, int(meta.get("generation") or 0), dict(status),
                       auth_secret=auth_secret_name(cr_spec, name), spec=cr_spec,
                       uid=meta.get("uid"))
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
    generation = int(meta.get("generation") or 0)
    if error is None and obs.exists and generation != status.get("observedGeneration"):
        # the first pass after a spec change: Services and NetworkPolicy follow it
        # even when the pods' config did not change (no roll-out)
        try:
            kube.sync_exposure(cr_spec, name, namespace, meta.get("uid"))
        except Exception as exc:
            out["lastError"] = f"sync_exposure: {exc}"
    _stamp(out, dict(status))
    patch.status.update(out)
    if logger is not None and (done or error):  # what this pass changed, and how long it took
        logger.info(f"reconcile: {'; '.join(done)}{f' FAILED {error}' if error else ''} "
                    f"({time.monotonic() - started:.2f}s)")
    if waiting:
        # the object itself (kind, namespace, uid), not its metadata alone: kopf
        # posts the event in the object's namespace (else "default", forbidden by RBAC)
        # (kopf posts from its handlers' context only: the periodic pass's thread
        # has none, and its passes go without events)
        body: Any = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MirrorqCluster",
                     "metadata": dict(meta)}
        with contextlib.suppress(LookupError, RuntimeError):
            kopf.info(body, reason="Waiting", message="; ".join(waiting))


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


# The periodic pass. Not a kopf timer: kopf puts a finalizer on every object a
# timer watches, and `helm uninstall` deletes the operator together with its
# MirrorqCluster, which then could never be deleted (found on a real API
# server, issue 13). Watch events (no finalizer) say which clusters exist; one
# thread reconciles each of them every RECONCILE_SECONDS.
_known: dict[tuple[str, str], bool] = {}
_known_guard = threading.Lock()
_loop_started = threading.Event()


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_event(**kw: Any) -> None:
    namespace, name = kw["namespace"], kw["name"]
    with _known_guard:
        if kw.get("type") == "DELETED":
            _known.pop((namespace, name), None)
        else:
            _known[(namespace, name)] = True
    if not _loop_started.is_set():
        _loop_started.set()
        threading.Thread(target=_periodic, name="reconcile-loop", daemon=True).start()


class _StatusPatch:
    """What reconcile() writes (patch.status), applied by the periodic pass."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}


def _periodic() -> None:
    log = logging.getLogger("mirrorq_operator.periodic")
    while True:
        time.sleep(RECONCILE_SECONDS)
        with _known_guard:
            clusters = list(_known)
        for namespace, name in clusters:
            try:
                reconcile_once(namespace, name, log)
            except Exception as exc:  # noqa: BLE001 - the next pass retries
                log.warning(f"reconcile {namespace}/{name}: {type(exc).__name__}: {exc}")


def reconcile_once(namespace: str, name: str, logger: Any) -> None:
    body = kube.get_cluster(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    patch = _StatusPatch()
    try:
        reconcile(body.get("spec") or {}, name, namespace, body["metadata"],
                  body.get("status") or {}, patch, logger)  # type: ignore[arg-type]
    except kopf.PermanentError:
        pass  # the status says why (lastError)
    finally:
        if patch.status:
            kube.patch_cluster_status(namespace, name, patch.status)
