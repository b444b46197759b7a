"""A node agent for the tests' real control plane (issue 13): what a kubelet does,
with runc as its container runtime and no image registry: pods of an image it was
given (`images`, e.g. the broker's, built by k8s/image.sh and extracted with
export_image) run as runc containers of it; pods of any other image run their
command as a process of this machine's venv.

    agent = NodeAgent(cp, workdir)      # cp: k8s.control_plane.ControlPlane
    agent.start()                       # registers a Ready Node, runs its pods
    ...                                 # the scheduler binds pods to it; it runs them
    agent.stop()                        # SIGKILLs what it started, removes its network

What it does, and what it leaves to the real control plane:
- **Node.** Registers one Node (`mirrorq-agent`), Ready, with capacity for the
  tests' pods. The scheduler places pods on it; StatefulSet ordering, PVC
  creation, owner references, garbage collection and RBAC are the real
  controllers' and the API server's.
- **Volumes.** A PersistentVolumeClaim without a storage class that nothing
  binds gets a hostPath PersistentVolume made for it (claimRef set, the PV
  controller binds them); a Released one it made is deleted with its directory
  (reclaim policy Delete, as a dynamic provisioner would).
- **Pods.** Each pod gets a network namespace of its own (a veth on a private
  bridge: its own IP, the containers' real ports; `chaosmirrorq.netns.NetLab`).
  A container of a known image runs under `runc` from an OCI bundle: the image's
  root filesystem (shared, read-only), entrypoint/cmd unless the pod sets
  command/args, env, working dir and user (runAsUser/runAsGroup win), the pod's
  fsGroup as a supplementary group (volumes chgrp'd and group-writable, as the
  kubelet does), securityContext.capabilities (drop, add), PID/IPC/UTS/mount
  namespaces of its own and the pod's network namespace; no rlimits (this sandbox refuses setrlimit to runtimes). Any other
  container runs as a process in a mount and UTS namespace of its own. Either
  way: the pod's env (values, fieldRef, secretKeyRef, configMapKeyRef),
  configMap / secret / emptyDir / persistentVolumeClaim volumes bind-mounted at
  their mountPaths (read-only where asked). The service-account
  token Secret the admission plugin mounts is one of those volumes, and
  KUBERNETES_SERVICE_HOST/PORT name the `kubernetes` Service, whose IP is DNATed
  in the pod's namespace to the API server: `load_incluster_config()` works.
  /etc/hosts (kept current) names every pod as the headless Service's DNS would:
  `HOST.SUBDOMAIN.NS.svc(.cluster.local)`; there is no DNS server (resolv.conf
  names loopback, where nothing answers: a lookup beyond /etc/hosts fails at once).
- **Probes.** readinessProbe and livenessProbe: exec (`runc exec` in the
  container, or nsenter into the process's namespaces with its env), tcpSocket and httpGet, with their period, timeout,
  thresholds and initial delay. Liveness failures restart the container.
- **Status.** phase, podIP, hostIP, startTime, PodScheduled / Initialized /
  ContainersReady / Ready conditions, containerStatuses (ready, restartCount,
  state, lastState). A container that exits is restarted with the kubelet's
  back-off (10 s doubling to 5 min, CrashLoopBackOff); one whose Secret or
  ConfigMap is missing waits (CreateContainerConfigError).
- **Deletion.** A pod with a deletionTimestamp gets SIGTERM, then SIGKILL after
  its grace period, then the final delete (grace 0) that lets the StatefulSet
  controller replace it. A pod that vanished from the API is SIGKILLed.

Not done: pulling images (only the ones given), the image of a process-run pod
(its command runs from this machine's venv, as the agent's user), resource
limits and cgroups accounting, seccomp profiles (runc gets none),
fsGroupChangePolicy (the volume is always walked), ClusterIP Services (no
kube-proxy; clients use pod addresses), a DNS server, init containers.
Needs root (namespaces, mounts, iptables, runc).
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaosmirrorq.netns import NetLab, NsNode, ensure_iptables

from k8s.api import Api, ApiError
from k8s.provisioner import HostPathProvisioner

NODE_NAME = "mirrorq-agent"
CRASH_BACKOFF = 10.0
CRASH_BACKOFF_MAX = 300.0
POLL = 0.5
REFRESH_VOLUMES = 5.0  # how often configMap/secret volumes follow their objects
SLOTS = 14  # pod network namespaces made up front (pods at once)
KEEP_DIR = "/run/mirrorq-agent-keep"  # mount points (in each pod's mount namespace)
REPO = Path(__file__).resolve().parents[1]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- images ---------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    """An image the agent can run pods of: its root filesystem (extracted once,
    shared read-only by every container of it) and its config."""
    ref: str
    rootfs: Path
    env: tuple[str, ...] = ()
    user: tuple[int, int] = (0, 0)
    workdir: str = "/"
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


def export_image(ref: str, dest: Path, storage: str = "vfs") -> Image:
    """Extract a local image (podman's store, e.g. built by k8s/image.sh) to dest."""
    store = ["--storage-driver", storage]
    raw = subprocess.run(["podman", *store, "image", "inspect", ref, "--format",
                          "{{json .Config}}"], capture_output=True, text=True, check=True).stdout
    cfg = json.loads(raw)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    cid = subprocess.run(["podman", *store, "create", ref], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        exp = subprocess.Popen(["podman", *store, "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-C", str(dest), "-xf", "-"], stdin=exp.stdout, check=True)
        assert exp.wait() == 0, f"podman export {ref} failed"
    finally:
        subprocess.run(["podman", *store, "rm", cid], capture_output=True)
    user, _, group = str(cfg.get("User") or "0").partition(":")
    return Image(ref, dest, tuple(cfg.get("Env") or ()), (int(user), int(group or user)),
                 cfg.get("WorkingDir") or "/", tuple(cfg.get("Entrypoint") or ()),
                 tuple(cfg.get("Cmd") or ()))


# ---- pods ---------------------------------------------------------------------

@dataclass
class Probe:
    kind: str  # exec | tcp | http
    spec: dict[str, Any]
    period: float
    timeout: float
    failures: int
    delay: float

    @classmethod
    def from_spec(cls, probe: dict[str, Any] | None) -> Probe | None:
        if not probe:
            return None
        kind = "exec" if "exec" in probe else "tcp" if "tcpSocket" in probe else \
            "http" if "httpGet" in probe else ""
        if not kind:
            return None
        return cls(kind, probe, float(probe.get("periodSeconds", 10)),
                   float(probe.get("timeoutSeconds", 1)), int(probe.get("failureThreshold", 3)),
                   float(probe.get("initialDelaySeconds", 0)))


def _port(value: Any, container: dict[str, Any]) -> int:
    if isinstance(value, int):
        return value
    for p in container.get("ports") or ():
        if p.get("name") == value:
            return int(p["containerPort"])
    return int(value)


class PodWorker(threading.Thread):
    """Runs one pod (by uid) until it is deleted: volumes, process, probes, status."""

    def __init__(self, agent: NodeAgent, pod: dict[str, Any], slot: NsNode) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['name']}", daemon=True)
        self.agent = agent
        self.api = agent.api
        self.pod = pod
        self.ns = meta["namespace"]
        self.name = meta["name"]
        self.uid = meta["uid"]
        self.slot = slot
        self.dir = agent.workdir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.container = pod["spec"]["containers"][0]
        # a container of its image when the agent has it, else a process of the venv
        self.image = agent.images.get(self.container.get("image", ""))
        self.cid = ""  # the runc container id of the current start
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.ready = False
        self.started_at: str | None = None
        self.last_state: dict[str, Any] = {}
        self.waiting: str | None = "ContainerCreating"
        self.stop_grace: float | None = None  # set: terminate within this many seconds
        self.vanished = False
        self.done = threading.Event()
        self.events: list[str] = []
        self._last_status: Any = None
        self._volume_sources: dict[str, tuple[str, str]] = {}  # volume -> (kind, object name)

    # -- control (from the agent's loop)
    def terminate(self, grace: float) -> None:
        if self.stop_grace is None:
            self.stop_grace = max(0.0, grace)

    def vanish(self) -> None:
        self.vanished = True
        self.terminate(0.0)

    def note(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")
        del self.events[:-50]

    # -- the loop
    def run(self) -> None:
        try:
            self._run()
        except Exception:  # noqa: BLE001 - an agent bug must not leave processes behind
            self.note("worker failed:\n" + traceback.format_exc())
            self._kill()
        finally:
            self.done.set()

    def _run(self) -> None:
        backoff = CRASH_BACKOFF
        next_start = 0.0
        while self.stop_grace is None:
            if self.proc is None and time.monotonic() >= next_start:
                try:
                    self._prepare()
                    self._start()
                except PodNotReady as exc:
                    self.waiting = exc.reason
                    self.note(f"waiting: {exc}")
                    self._status()
                    self._sleep(1.0)
                    continue
            if self.proc is not None:
                code = self._supervise()
                if code is None:  # asked to stop
                    break
                self.last_state = {"terminated": {"exitCode": code, "finishedAt": _now(),
                                                  "reason": "Error" if code else "Completed"}}
                self.note(f"container exited {code}; restart in {backoff:.0f}s")
                self.proc = None
                self.ready = False
                self.restarts += 1
                self.waiting = "CrashLoopBackOff"
                self._status()
                next_start = time.monotonic() + backoff
                backoff = min(backoff * 2, CRASH_BACKOFF_MAX)
            else:
                self._sleep(0.2)
        self._shutdown()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.stop_grace is None and time.monotonic() < end:
            time.sleep(0.05)

    # -- volumes and env
    @property
    def fs_group(self) -> int | None:
        group = (self.pod["spec"].get("securityContext") or {}).get("fsGroup")
        return int(group) if group is not None else None

    def _own(self, path: Path) -> None:
        """fsGroup: the volume belongs to the pod's group, group-writable, setgid."""
        group = self.fs_group
        if group is None:
            return
        for root, _dirs, files in os.walk(path):
            os.chown(root, -1, group)
            os.chmod(root, os.stat(root).st_mode | 0o2070)
            for f in files:
                fp = os.path.join(root, f)
                os.chown(fp, -1, group, follow_symlinks=False)
                if not os.path.islink(fp):
                    os.chmod(fp, os.stat(fp).st_mode | 0o060)

    def _prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.mounts = self._volumes()
        self.env = self._env()

    def _volumes(self) -> list[tuple[str, str, bool]]:
        """[(host dir, mountPath, read-only)] in mount order."""
        sources: dict[str, str] = {}
        for vol in self.pod["spec"].get("volumes") or ():
            name = vol["name"]
            path = self.dir / "volumes" / name
            if "configMap" in vol or "secret" in vol:
                kind = "configMap" if "configMap" in vol else "secret"
                obj = vol[kind].get("name") or vol[kind].get("secretName")
                self._volume_sources[name] = (kind, obj)
                self._write_volume(name, kind, obj, vol[kind])
            elif "emptyDir" in vol:
                path.mkdir(parents=True, exist_ok=True)
                os.chmod(path, 0o777)  # as the kubelet makes one: any user of the pod writes it
                self._own(path)
            elif "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                pvc = self.api.get_or_none(
                    f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim}")
                if pvc is None or pvc.get("status", {}).get("phase") != "Bound":
                    raise PodNotReady("ContainerCreating", f"claim {claim} is not bound")
                pv = self.api.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
                host = (pv["spec"].get("hostPath") or {}).get("path")
                if not host:
                    raise PodNotReady("ContainerCreating", f"volume of {claim} is not a hostPath")
                Path(host).mkdir(parents=True, exist_ok=True)
                path = Path(host)
                self._own(path)
            else:
                raise PodNotReady("CreateContainerError", f"volume {name}: unsupported kind")
            sources[name] = str(path)
        out = []
        for m in self.container.get("volumeMounts") or ():
            if m["name"] not in sources:
                raise PodNotReady("CreateContainerError", f"mount of unknown volume {m['name']}")
            out.append((sources[m["name"]], m["mountPath"], bool(m.get("readOnly"))))
        out.sort(key=lambda t: t[1])  # parents first
        return out

    def _write_volume(self, name: str, kind: str, obj: str, spec: dict[str, Any]) -> bool:
        """Write a configMap/secret volume's files; True when something changed."""
        res = "configmaps" if kind == "configMap" else "secrets"
        data_obj = self.api.get_or_none(f"/api/v1/namespaces/{self.ns}/{res}/{obj}")
        optional = bool(spec.get("optional"))
        if data_obj is None:
            if optional:
                data_obj = {}
            else:
                raise PodNotReady("ContainerCreating", f"{kind} {obj} not found")
        raw: dict[str, bytes] = {}
        for k, v in (data_obj.get("data") or {}).items():
            raw[k] = base64.b64decode(v) if kind == "secret" else v.encode()
        for k, v in (data_obj.get("binaryData") or {}).items():
            raw[k] = base64.b64decode(v)
        items = spec.get("items")
        files = {it["path"]: raw[it["key"]] for it in items if it["key"] in raw} if items else raw
        # the file modes a kubelet writes: an item's mode, else the volume's defaultMode
        # (the API server fills in 0644), so a non-root container can read its token
        default_mode = int(spec.get("defaultMode", 0o644))
        modes = {it["path"]: int(it.get("mode", default_mode)) for it in items or ()}
        if items and not optional:
            missing = [it["key"] for it in items if it["key"] not in raw]
            if missing:
                raise PodNotReady("ContainerCreating", f"{kind} {obj} has no key {missing[0]}")
        path = self.dir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        changed = False
        for rel, content in files.items():
            target = path / rel
            if (target.exists() and target.read_bytes() == content
                    and target.stat().st_mode & 0o777 == modes.get(rel, default_mode) & 0o777):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(content)
            os.chmod(tmp, modes.get(rel, default_mode) & 0o777)
            if self.fs_group is not None:  # readable by the pod's group, as the kubelet does
                os.chown(tmp, 0, self.fs_group)
            os.replace(tmp, target)  # the directory is what is bind-mounted: renames show
            changed = True
        for old in path.iterdir():
            if old.is_file() and not old.name.startswith(".") and old.name not in files:
                old.unlink()
                changed = True
        return changed

    def refresh_volumes(self) -> None:
        for vol in self.pod["spec"].get("volumes") or ():
            src = self._volume_sources.get(vol["name"])
            if src is not None:
                with contextlib.suppress(PodNotReady, ApiError, OSError):
                    self._write_volume(vol["name"], src[0], src[1], vol[src[0]])

    def _field(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        values = {"metadata.name": self.name, "metadata.namespace": self.ns,
                  "metadata.uid": self.uid, "spec.nodeName": NODE_NAME,
                  "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
                  "status.podIP": self.slot.addr, "status.hostIP": self.agent.host_ip}
        if path in values:
            return values[path]
        if path.startswith("metadata.labels['"):
            return (meta.get("labels") or {}).get(path[17:-2], "")
        raise PodNotReady("CreateContainerConfigError", f"fieldRef {path} unsupported")

    def _key(self, kind: str, ref: dict[str, Any]) -> str | None:
        res = "secrets" if kind == "secret" else "configmaps"
        obj = self.api.get_or_none(f"/api/v1/namespaces/{self.ns}/{res}/{ref['name']}")
        value = ((obj or {}).get("data") or {}).get(ref["key"])
        if value is None:
            if ref.get("optional"):
                return None
            raise PodNotReady("CreateContainerConfigError",
                              f"{kind} {ref['name']} key {ref['key']} not found")
        return base64.b64decode(value).decode() if kind == "secret" else value

    def _env(self) -> dict[str, str]:
        env = {"PATH": f"{self.agent.venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                       "/usr/bin:/sbin:/bin",
               "HOME": "/root", "HOSTNAME": self.hostname,
               "KUBERNETES_SERVICE_HOST": self.agent.kubernetes_ip,
               "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
               "PYTHONUNBUFFERED": "1"}
        for item in self.container.get("env") or ():
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            src = item.get("valueFrom") or {}
            if "fieldRef" in src:
                env[item["name"]] = self._field(src["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in src or "configMapKeyRef" in src:
                kind = "secret" if "secretKeyRef" in src else "configMap"
                value = self._key(kind, src[f"{kind}KeyRef"])
                if value is not None:
                    env[item["name"]] = value
        return env

    @property
    def hostname(self) -> str:
        return str(self.pod["spec"].get("hostname") or self.name)[:63]

    # -- the process
    def _wrap(self, argv: list[str]) -> list[str]:
        """argv run in the pod's namespaces: its network namespace, a private mount
        namespace with the volumes and /etc/hosts, its hostname."""
        lines = ["set -e", f"mount --bind {shlex.quote(str(self.agent.hosts_file))} /etc/hosts",
                 f"mount --bind {shlex.quote(str(self.agent.resolv_file))} /etc/resolv.conf",
                 f"hostname {shlex.quote(self.hostname)}"]
        # What a container has in its own image, these processes take from the
        # host: the project and its venv, and the agent's directory (the volumes'
        # sources). A volume mounted over one of their ancestors (an emptyDir at
        # /tmp) would hide them: they are kept aside first and bound back after.
        keep = self.agent.keep_paths
        for i, k in enumerate(keep):
            lines.append(f"mkdir -p {KEEP_DIR}/{i} && mount --bind {shlex.quote(k)} {KEEP_DIR}/{i}")
        for src, target, ro in self.mounts:
            t = shlex.quote(target)
            lines.append(f"mkdir -p {t}" if Path(src).is_dir() else f"touch {t}")
            lines.append(f"mount --bind {shlex.quote(src)} {t}")
            if ro:
                lines.append(f"mount -o remount,bind,ro {t}")
            for i, k in enumerate(keep):
                if k.startswith(target.rstrip("/") + "/"):
                    lines.append(f"mkdir -p {shlex.quote(k)} && "
                                 f"mount --bind {KEEP_DIR}/{i} {shlex.quote(k)}")
        lines.append(f"cd {shlex.quote(self.container.get('workingDir') or '/')}")
        lines.append('exec "$@"')
        script = self.dir / "run.sh"
        script.write_text("\n".join(lines) + "\n")
        return ["ip", "netns", "exec", self.slot.ns, "unshare", "--mount", "--uts",
                "--propagation", "private", "/bin/sh", str(script), *argv]

    def _runc(self, argv: list[str]) -> list[str]:
        """`runc run` of an OCI bundle: the image's shared read-only rootfs, the pod's
        network namespace, its volumes, env, user (runAsUser or the image's) and
        fsGroup; no rlimits (this sandbox refuses setrlimit to runtimes)."""
        assert self.image is not None
        img = self.image
        self.cid = f"{self.ns}_{self.name}_{self.uid[:8]}_{self.restarts}"
        bundle = self.dir / "bundle"
        bundle.mkdir(parents=True, exist_ok=True)
        spec = json.loads(json.dumps(self.agent.runc_template()))
        sec = {**(self.pod["spec"].get("securityContext") or {}),
               **(self.container.get("securityContext") or {})}
        uid = int(sec.get("runAsUser", img.user[0]))
        gid = int(sec.get("runAsGroup", img.user[1] if "runAsUser" not in sec else uid))
        user: dict[str, Any] = {"uid": uid, "gid": gid}
        if self.fs_group is not None:
            user["additionalGids"] = [self.fs_group]
        env = dict(e.split("=", 1) for e in img.env if "=" in e)
        env.update({k: v for k, v in self.env.items() if k not in ("PATH", "HOME")})
        proc = spec["process"]
        proc.update(args=argv, env=[f"{k}={v}" for k, v in env.items()], user=user,
                    cwd=self.container.get("workingDir") or img.workdir, terminal=False,
                    noNewPrivileges=True)
        proc.pop("rlimits", None)
        _apply_capabilities(proc, sec.get("capabilities") or {})
        spec["root"] = {"path": str(img.rootfs), "readonly": True}
        spec["hostname"] = self.hostname
        mounts = spec["mounts"]
        for etc, dst in ((self.agent.hosts_file, "/etc/hosts"),
                         (self.agent.resolv_file, "/etc/resolv.conf")):
            mounts.append({"destination": dst, "type": "bind", "source": str(etc),
                           "options": ["rbind", "ro"]})
        for src, target, ro in self.mounts:
            mounts.append({"destination": target, "type": "bind", "source": src,
                           "options": ["rbind", "ro" if ro else "rw"]})
        spec["linux"]["namespaces"] = [
            ns for ns in spec["linux"]["namespaces"] if ns["type"] != "network"
        ] + [{"type": "network", "path": f"/run/netns/{self.slot.ns}"}]
        (bundle / "config.json").write_text(json.dumps(spec))
        return ["runc", "--root", str(self.agent.runc_root), "run", "--bundle", str(bundle),
                self.cid]

    def _argv(self) -> list[str]:
        command = list(self.container.get("command") or ())
        args = list(self.container.get("args") or ())
        if self.image is not None:  # the image's entrypoint/cmd where the pod sets none
            if not command:
                command = list(self.image.entrypoint)
                args = args or list(self.image.cmd)
        argv = [*command, *args]
        if not argv:
            raise PodNotReady("CreateContainerError", "no command, and no image the agent has "
                              f"({self.container.get('image')!r}) to take one from")
        return argv

    def _start(self) -> None:
        argv = self._argv()
        cmd = self._runc(argv) if self.image is not None else self._wrap(argv)
        log = open(self.dir / "container.log", "ab")  # noqa: SIM115 - kept by the child
        try:
            self.proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        finally:
            log.close()
        self.started_at = _now()
        self.waiting = None
        self.ready = False
        how = f"container {self.cid} of {self.image.ref}" if self.image else "process"
        self.note(f"started {how}, pid {self.proc.pid}: {' '.join(argv)[:200]}")
        self._status()

    def _supervise(self) -> int | None:
        """Probe until the process exits (its code) or a stop is asked (None)."""
        assert self.proc is not None
        ready_probe = Probe.from_spec(self.container.get("readinessProbe"))
        live_probe = Probe.from_spec(self.container.get("livenessProbe"))
        t0 = time.monotonic()
        next_ready = t0 + (ready_probe.delay if ready_probe else 0)
        next_live = t0 + (live_probe.delay if live_probe else 0)
        next_refresh = t0 + REFRESH_VOLUMES
        ready_fail = live_fail = 0
        if ready_probe is None:
            self.ready = True
            self._status()
        while self.stop_grace is None:
            code = self.proc.poll()
            if code is not None:
                return code
            now = time.monotonic()
            if ready_probe is not None and now >= next_ready:
                ok = self._probe(ready_probe)
                ready_fail = 0 if ok else ready_fail + 1
                ready = ok or (self.ready and ready_fail < ready_probe.failures)
                if ready != self.ready:
                    self.ready = ready
                    self.note(f"ready={ready}")
                    self._status()
                next_ready = time.monotonic() + ready_probe.period
            if live_probe is not None and now >= next_live:
                live_fail = 0 if self._probe(live_probe) else live_fail + 1
                next_live = time.monotonic() + live_probe.period
                if live_fail >= live_probe.failures:
                    self.note("liveness failed: restarting the container")
                    self._stop_process(float(self.pod["spec"].get(
                        "terminationGracePeriodSeconds", 30)))
                    return 137
            if now >= next_refresh:
                self.refresh_volumes()
                next_refresh = now + REFRESH_VOLUMES
            time.sleep(0.1)
        return None

    def _probe(self, probe: Probe) -> bool:
        try:
            if probe.kind == "exec":
                assert self.proc is not None
                if self.image is not None:
                    argv = ["runc", "--root", str(self.agent.runc_root), "exec", self.cid,
                            *probe.spec["exec"]["command"]]
                else:
                    argv = ["nsenter", "-t", str(self.proc.pid), "-n", "-m", "-u", "--",
                            *probe.spec["exec"]["command"]]
                res = subprocess.run(argv, env=self.env, capture_output=True,
                                     timeout=probe.timeout, cwd="/")
                return res.returncode == 0
            if probe.kind == "tcp":
                port = _port(probe.spec["tcpSocket"]["port"], self.container)
                with socket.create_connection((self.slot.addr, port), timeout=probe.timeout):
                    return True
            get = probe.spec["httpGet"]
            url = f"http://{self.slot.addr}:{_port(get['port'], self.container)}" \
                  f"{get.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=probe.timeout) as rsp:
                return 200 <= rsp.status < 400
        except (OSError, subprocess.TimeoutExpired, urllib.error.URLError):
            return False

    def _stop_process(self, grace: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.note(f"still running after {grace:.0f}s: SIGKILL")
        self._kill()

    def _kill(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if self.image is not None and self.cid:
            # the container's processes are not in runc's process group
            subprocess.run(["runc", "--root", str(self.agent.runc_root), "kill", self.cid,
                            "KILL"], capture_output=True, timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if self.image is not None and self.cid:
            subprocess.run(["runc", "--root", str(self.agent.runc_root), "delete", "--force",
                            self.cid], capture_output=True, timeout=30)

    def _shutdown(self) -> None:
        grace = self.stop_grace or 0.0
        self.note(f"terminating (grace {grace:.0f}s)")
        self._stop_process(grace)
        self.proc = None
        self.ready = False
        if self.vanished:
            return
        with contextlib.suppress(ApiError):
            self.api.call("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{self.name}", {
                "kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": self.uid}})
        self.note("deleted")

    # -- status
    def _status(self) -> None:
        running = self.proc is not None and self.proc.poll() is None
        state: dict[str, Any] = ({"running": {"startedAt": self.started_at}} if running
                                 else {"waiting": {"reason": self.waiting or "ContainerCreating"}})
        ready = "True" if (self.ready and running) else "False"
        cond = [{"type": t, "status": s, "lastProbeTime": None}
                for t, s in (("PodScheduled", "True"), ("Initialized", "True"),
                             ("ContainersReady", ready), ("Ready", ready))]
        status = {
            "phase": "Running" if running or self.restarts else "Pending",
            "hostIP": self.agent.host_ip, "podIP": self.slot.addr,
            "podIPs": [{"ip": self.slot.addr}], "startTime": self.agent.start_time(self.uid),
            "conditions": cond,
            "containerStatuses": [{
                "name": self.container["name"], "ready": ready == "True",
                "restartCount": self.restarts, "image": self.container.get("image", ""),
                "imageID": "", "started": running, "state": state,
                "lastState": self.last_state}],
        }
        key = json.dumps({k: v for k, v in status.items() if k != "conditions"}, sort_keys=True) \
            + ready
        if key == self._last_status:
            return
        try:
            self.api.merge(f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status",
                           {"status": status})
            self._last_status = key
        except ApiError as exc:
            self.note(f"status update failed: {exc}")


class PodNotReady(Exception):
    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason


# ---- the agent ------------------------------------------------------------------

@dataclass
class NodeAgent:
    server: str
    token: str
    ca_file: Path
    workdir: Path
    venv_bin: Path = field(default_factory=lambda: Path(sys.executable).parent)
    api_port: int = 0
    # image reference -> Image: pods of these run as runc containers of the image
    images: dict[str, Image] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.api = Api(self.server, self.token, self.ca_file)
        self.api_port = int(self.server.rsplit(":", 1)[1])
        self.hosts_file = self.workdir / "hosts"
        venv = Path(sys.prefix).resolve()
        self.keep_paths = [str(p) for p in (REPO, venv, self.workdir)
                           if p == REPO or not p.is_relative_to(REPO)]
        self.resolv_file = self.workdir / "resolv.conf"
        self.workers: dict[str, PodWorker] = {}
        self.free: list[NsNode] = []
        self.lab: NetLab | None = None
        self.host_ip = ""
        self.kubernetes_ip = ""
        self.errors: list[str] = []
        self.history: list[str] = []  # the last events of pods that are gone
        self._starts: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.provisioner = HostPathProvisioner(self.api, self.workdir / "volumes")
        self._hosts_lock = threading.Lock()

    @classmethod
    def for_control_plane(cls, cp: Any, workdir: Path,
                          images: dict[str, Image] | None = None) -> NodeAgent:
        return cls(cp.server, cp.token, cp.ca_file, workdir, images=dict(images or {}))

    @property
    def runc_root(self) -> Path:
        return self.workdir / "runc"

    def runc_template(self) -> dict[str, Any]:
        """runc's default spec (`runc spec`), made once."""
        path = self.workdir / "runc-spec" / "config.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            _run("runc", "spec", "--bundle", str(path.parent))
        spec: dict[str, Any] = json.loads(path.read_text())
        return spec

    def start_time(self, uid: str) -> str:
        return self._starts.setdefault(uid, _now())

    # -- life
    def start(self) -> NodeAgent:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ensure_iptables()
        svc = self.api.get("/api/v1/namespaces/default/services/kubernetes")
        self.kubernetes_ip = svc["spec"]["clusterIP"]
        self.lab = NetLab(SLOTS)
        self.lab.__enter__()
        try:
            self.host_ip = self.lab.bridge_addr
            for slot in self.lab.nodes:
                nsx = ("ip", "netns", "exec", slot.ns)
                _run(*nsx, "ip", "route", "add", "default", "via", self.host_ip)
                # the `kubernetes` Service: kube-proxy's DNAT, for this one Service
                _run(*nsx, "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp",
                     "-d", self.kubernetes_ip, "--dport", "443", "-j", "DNAT",
                     "--to-destination", f"{self.host_ip}:{self.api_port}")
            self.free = list(self.lab.nodes)
            # no cluster DNS: names come from /etc/hosts; a resolver that asks a
            # server (gRPC's c-ares for AAAA) is refused at once by loopback
            # instead of waiting on the host's unreachable one
            self.resolv_file.write_text("nameserver 127.0.0.1\noptions ndots:1 timeout:1 "
                                        "attempts:1\n")
            self._write_hosts()
            self._register_node()
        except BaseException:
            self.lab.close()
            raise
        self._thread = threading.Thread(target=self._loop, name="node-agent", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for w in list(self.workers.values()):
            w.vanish()
        for w in list(self.workers.values()):
            w.done.wait(15)
        with contextlib.suppress(ApiError, OSError):
            self.api.call("DELETE", f"/api/v1/nodes/{NODE_NAME}")
        if self.lab is not None:
            self.lab.close()

    def _register_node(self) -> None:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME,
                                          "kubernetes.io/os": "linux",
                                          "kubernetes.io/arch": "amd64"}}}
        try:
            self.api.call("POST", "/api/v1/nodes", node)
        except ApiError as exc:
            if exc.status != 409:
                raise
        cap = {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        self.api.merge(f"/api/v1/nodes/{NODE_NAME}/status", {"status": {
            "capacity": cap, "allocatable": cap,
            "addresses": [{"type": "InternalIP", "address": self.host_ip},
                          {"type": "Hostname", "address": NODE_NAME}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "mirrorq node agent", "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now()}],
            "nodeInfo": {"kubeletVersion": "v1.20.2", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "process://",
                         "kernelVersion": os.uname().release, "osImage": "Debian",
                         "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                         "bootID": ""}}})
        # the TaintNodesByCondition admission taints a new Node not-ready; the node
        # lifecycle controller would lift it once Ready, and it is off here
        # (control_plane.DEFAULT_CONTROLLERS: no heartbeats to judge)
        self.api.merge(f"/api/v1/nodes/{NODE_NAME}", {"spec": {"taints": None}})

    # -- the loop
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.provisioner.sync()
                self._sync_pods()
            except Exception:  # noqa: BLE001 - keep serving; the test reads errors
                self.errors.append(traceback.format_exc())
                del self.errors[:-20]
            self._stop.wait(POLL)

    def _sync_pods(self) -> None:
        pods = self.api.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE_NAME}")["items"]
        seen = set()
        for pod in pods:
            meta = pod["metadata"]
            uid = meta["uid"]
            seen.add(uid)
            worker = self.workers.get(uid)
            if worker is None:
                if meta.get("deletionTimestamp"):
                    # never started here (or the agent restarted): nothing to stop
                    with contextlib.suppress(ApiError):
                        self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/"
                                      f"{meta['name']}", {"kind": "DeleteOptions",
                                                          "apiVersion": "v1",
                                                          "gracePeriodSeconds": 0})
                    continue
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                if not self.free:
                    self.errors.append(f"no free pod network for {meta['name']}")
                    continue
                worker = PodWorker(self, pod, self.free.pop(0))
                self.workers[uid] = worker
                self._write_hosts()
                worker.start()
            elif meta.get("deletionTimestamp"):
                worker.terminate(float(meta.get("deletionGracePeriodSeconds") or 0))
        for uid, worker in list(self.workers.items()):
            if uid not in seen and not worker.done.is_set():
                worker.vanish()
            if worker.done.is_set():
                del self.workers[uid]
                self.history += [f"{worker.ns}/{worker.name}: {e}" for e in worker.events[-6:]]
                del self.history[:-200]
                self._release(worker)

    def _release(self, worker: PodWorker) -> None:
        # nothing of the pod may outlive it in its namespace
        res = _run("ip", "netns", "pids", worker.slot.ns, check=False)
        for tok in res.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(tok), signal.SIGKILL)
        self.free.append(worker.slot)
        self._write_hosts()

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        for w in self.workers.values():
            if w.done.is_set():
                continue
            spec = w.pod["spec"]
            names = []
            if spec.get("subdomain"):
                fq = f"{w.hostname}.{spec['subdomain']}.{w.ns}.svc"
                names += [f"{fq}.cluster.local", fq]
            names.append(w.hostname)
            lines.append(f"{w.slot.addr}\t{' '.join(names)}")
        text = "\n".join(lines) + "\n"
        with self._hosts_lock:
            # in place: pods bind-mount this very file (a rename would not reach them)
            with open(self.hosts_file, "a+") as f:
                f.seek(0)
                if f.read() == text:
                    return
                f.seek(0)
                f.truncate()
                f.write(text)

    # -- for tests
    def pod_ip(self, namespace: str, name: str) -> str | None:
        for w in list(self.workers.values()):
            if w.ns == namespace and w.name == name and not w.done.is_set():
                return w.slot.addr
        return None

    def diagnostics(self) -> str:
        out = [f"agent errors: {self.errors[-5:]}"]
        for w in list(self.workers.values()):
            out.append(f"-- pod {w.ns}/{w.name} ip={w.slot.addr} ready={w.ready} "
                       f"restarts={w.restarts} waiting={w.waiting}")
            out += [f"   {e}" for e in w.events[-12:]]
            log = w.dir / "container.log"
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-15:]
                out += [f"   | {line}" for line in tail]
        return "\n".join(out)


def _apply_capabilities(proc: dict[str, Any], caps: dict[str, Any]) -> None:
    """securityContext.capabilities on runc's process spec: drop (ALL or names), then add."""
    drop = {str(c).upper() for c in caps.get("drop") or ()}
    add = [f"CAP_{str(c).upper().removeprefix('CAP_')}" for c in caps.get("add") or ()]
    sets = proc.setdefault("capabilities", {})
    for kind in ("bounding", "effective", "permitted", "ambient", "inheritable"):
        have = [] if "ALL" in drop else [c for c in sets.get(kind) or ()
                                         if c.removeprefix("CAP_") not in drop]
        if kind in sets or add:
            sets[kind] = have + [c for c in add if c not in have]


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res
