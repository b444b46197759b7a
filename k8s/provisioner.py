"""A hostPath provisioner for the tests' one-node clusters (what kind's or Rancher's
local-path provisioner does): a PersistentVolumeClaim without a storage class that
nothing binds gets a hostPath PersistentVolume under `root` made for it (claimRef
set, so the PV controller binds the two); one it made whose claim is gone
(Released) is deleted with its directory, as a reclaim policy of Delete would.
Used by the node agent and beside the real kubelet."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

from k8s.api import Api, ApiError

LABEL = "mirrorq.io/node-agent"  # marks the PVs made here (kept: PVs of older runs carry it)


class HostPathProvisioner:
    def __init__(self, api: Api, root: Path) -> None:
        self.api = api
        self.root = Path(root)
        self._made: set[str] = set()

    def sync(self) -> None:
        for pvc in self.api.get("/api/v1/persistentvolumeclaims")["items"]:
            self._provide(pvc)
        pvs = self.api.get(f"/api/v1/persistentvolumes?labelSelector={LABEL.replace('/', '%2F')}"
                           "%3Dtrue")
        for pv in pvs["items"]:
            if pv.get("status", {}).get("phase") == "Released":
                with contextlib.suppress(ApiError):
                    self.api.call("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
                path = (pv["spec"].get("hostPath") or {}).get("path", "")
                if path.startswith(str(self.root) + "/"):
                    shutil.rmtree(path, ignore_errors=True)

    def _provide(self, pvc: dict[str, Any]) -> None:
        meta, spec = pvc["metadata"], pvc["spec"]
        if pvc.get("status", {}).get("phase") != "Pending" or spec.get("volumeName") \
                or spec.get("storageClassName") or meta.get("deletionTimestamp"):
            return
        name = f"pv-{meta['uid'][:13]}"
        if name in self._made:
            return
        path = self.root / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        path.mkdir(parents=True, exist_ok=True)
        # world-writable, as local-path-provisioner makes them: the kubelet applies no
        # fsGroup to hostPath volumes, so a non-root pod could not write otherwise
        path.chmod(0o777)
        size = spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")
        pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {
            "name": name, "labels": {LABEL: "true"}}, "spec": {
            "capacity": {"storage": size}, "accessModes": spec.get("accessModes")
            or ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "", "hostPath": {"path": str(path), "type": ""},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "namespace": meta["namespace"], "name": meta["name"],
                         "uid": meta["uid"]}}}
        try:
            self.api.call("POST", "/api/v1/persistentvolumes", pv)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._made.add(name)
