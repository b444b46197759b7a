"""An in-memory Kubernetes API server for the operator's end-to-end test: kmock's
KubernetesEmulator (PyPI kmock 0.8) served over HTTP on 127.0.0.1.

    python -m tests.operator.kmock_api --port P [--namespace NS]

No Kubernetes runs anywhere: this is the only mock. Objects live in memory and
are served on get/list/watch/create/patch/delete; nothing else happens by itself
(no controllers: tests/operator/kubelet.py plays the StatefulSet controller
and the kubelet).

What the stock emulator lacks, and MirrorqKubeAPI adds (kopf and the operator
need it):
- discovery of the MirrorqCluster resource (group mirrorq.io, v1alpha1, plural
  mirrorqclusters, namespaced, with the status subresource and the verbs kopf
  requires to list/watch/patch it), and of the built-in resources the operator
  touches;
- metadata the API server owns: uid, creationTimestamp, a resourceVersion that
  grows with every write (kopf checks its own patches against it), a
  generation that grows on spec changes only (the operator reports it as
  observedGeneration), names for generateName (kopf's Events);
- the status subresource: a write to .../status changes only the status, and
  creating or patching the main resource never changes the status;
- Namespaces: kmock 0.8's path parser fails on /api/v1/namespaces (it takes
  "namespaces" for the /namespaces/NS/ prefix of namespaced resources), and
  kopf lists and watches namespaces before it watches anything in them (an
  operator whose RBAC forbids that retries for about a minute, then falls
  back). Such requests are served under the path /api/v1/kmock-namespaces,
  which kmock stores, lists and watches like any cluster-scoped resource.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import datetime
import itertools
import re
import sys
import traceback
import uuid
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
# (group/version/plural, kind, namespaced, has a status subresource). kopf waits
# until namespaces and CRDs are in the discovery before it watches anything.
RESOURCES = [
    ("mirrorq.io/v1alpha1/mirrorqclusters", "MirrorqCluster", True, True),
    ("v1/namespaces", "Namespace", False, True),  # discovery only: served as kmock-namespaces
    ("v1/kmock-namespaces", "Namespace", False, True),
    ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False, True),
    ("v1/pods", "Pod", True, True),
    ("v1/configmaps", "ConfigMap", True, False),
    ("v1/secrets", "Secret", True, False),
    ("v1/services", "Service", True, True),
    ("v1/persistentvolumeclaims", "PersistentVolumeClaim", True, True),
    ("v1/events", "Event", True, False),
    ("apps/v1/statefulsets", "StatefulSet", True, True),
    ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget", True, True),
    ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy", True, False),
]

# /api/v1/namespaces[/NAME] (not /api/v1/namespaces/NS/PLURAL...): the Namespace resource
NAMESPACES = re.compile(r"^/api/v1/namespaces(/[^/]+)?/?$")
NAMESPACES_ALIAS = "/api/v1/kmock-namespaces"


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what kmock applies to stored objects too)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@attrs.define(kw_only=True)
class MirrorqKubeAPI(kmock.KubernetesEmulator):
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, kind, namespaced, status in RESOURCES:
            self.resources[key] = kmock.ResourceInfo(
                kind=kind, singular=kind.lower(), namespaced=namespaced, verbs=VERBS,
                subresources={"status"} if status else set())

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        m = NAMESPACES.match(raw_request.path)
        if m:
            url = raw_request.rel_url.with_path(NAMESPACES_ALIAS + (m.group(1) or "")) \
                .with_query(raw_request.rel_url.query)
            raw_request = raw_request.clone(rel_url=url)
        return await super().__call__(raw_request)

    def _has_status(self, resource: Any) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    def _current(self, request: kmock.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        raw: dict[str, Any] = self.objects[key].raw
        return raw

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # The stock emulator stores request.data as it is (create) or merges it in
        # (patch), under its lock, then serves the stored object. Stamping
        # request.data in place beforehand is enough to add what a real API
        # server adds. (Two spec patches of one object racing for that lock could
        # both read the same generation: the test changes a spec one at a time.)
        if request.resource is not None:
            if request.action == kmock.action.CREATE and isinstance(request.data, dict):
                self._on_create(request, request.data)
            elif request.action == kmock.action.UPDATE and request.name is not None:
                self._on_patch(request)
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchException as exc:
            # a JSON patch whose `test` failed (kopf tests metadata.resourceVersion
            # for optimistic concurrency): 422 as from Kubernetes, not kmock's 500
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc

    def _on_create(self, request: kmock.Request, obj: dict[str, Any]) -> None:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:8]}"
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        meta["generation"] = 1
        meta["creationTimestamp"] = _now()
        if self._has_status(request.resource):
            obj.pop("status", None)  # the status is written through /status only

    def _on_patch(self, request: kmock.Request) -> None:
        version = str(next(self._versions))
        data = request.data
        if isinstance(data, list):  # JSON patch (kopf, for finalizers): no spec changes here
            data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            return
        if not isinstance(data, dict):
            return
        current = self._current(request)
        if request.subresource == "status":
            for key in [k for k in data if k != "status"]:
                del data[key]
            data["metadata"] = {"resourceVersion": version}
            return
        if self._has_status(request.resource):
            data.pop("status", None)
        meta = data.get("metadata")
        meta = data["metadata"] = dict(meta) if isinstance(meta, dict) else {}
        for owned in ("uid", "generation", "creationTimestamp"):
            meta.pop(owned, None)
        meta["resourceVersion"] = version
        if current is not None and "spec" in data:
            old_spec = current.get("spec") or {}
            if merge_patch(old_spec, data["spec"]) != old_spec:
                meta["generation"] = int((current.get("metadata") or {}).get("generation") or 1) + 1

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if not isinstance(exc, kmock.KubernetesError):  # a bug here or in kmock: say so
            sys.stderr.write(f"kmock_api: {traceback.format_exc()}\n")
            sys.stderr.flush()
        return await super()._render_error(exc)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def serve(port: int) -> None:
    async with MirrorqKubeAPI() as api, kmock.Server(api, port=port):
        print(f"kmock_api: serving on http://127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()  # until SIGTERM/SIGKILL


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kmock_api")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
