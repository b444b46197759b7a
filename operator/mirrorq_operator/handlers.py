"""Thin kopf handlers: observe, plan, execute. Run: kopf run -m mirrorq_operator.handlers"""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf

from . import kube
from .model import Spec, UpdateStatus, WaitFor
from .plan import plan

GROUP, VERSION, PLURAL = "mirrorq.io", "v1alpha1", "mirrorqclusters"


@kopf.on.startup()
def _startup(**_: Any) -> None:
    kube.load()


def reconcile(spec: Any, name: str, namespace: str, meta: Any, status: Any,
              patch: kopf.Patch) -> None:
    cr_spec = Spec.from_cr(dict(spec))
    obs = kube.observe(name, namespace, int(meta.get("generation") or 0), dict(status))
    out: dict[str, Any] = {"lastError": None}
    waiting: list[str] = []
    for action in plan(cr_spec, obs):
        if isinstance(action, WaitFor):
            waiting.append(action.reason)
            continue
        try:
            kube.execute(action, cr_spec, obs, out)
        except Exception as exc:
            out["lastError"] = f"{type(action).__name__}: {exc}"
            if not isinstance(action, UpdateStatus):
                break
    _stamp(out, dict(status))
    patch.status.update(out)
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


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def on_change(**kw: Any) -> None:
    reconcile(kw["spec"], kw["name"], kw["namespace"], kw["meta"], kw["status"], kw["patch"])


@kopf.timer(GROUP, VERSION, PLURAL, interval=10.0, idle=5.0)
def on_timer(**kw: Any) -> None:
    reconcile(kw["spec"], kw["name"], kw["namespace"], kw["meta"], kw["status"], kw["patch"])
