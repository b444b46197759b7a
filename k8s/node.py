"""A real Kubernetes node for the tests' control plane (issue 30): the kubelet and
kube-proxy v1.20.2 built from Debian's `kubernetes` source (k8s/build.sh),
containerd 1.6 with runc as its runtime and the CNI bridge plugin (Debian 12's
packages), the cluster DNS of k8s/dns.py and the hostPath provisioner of
k8s/provisioner.py. Pods run from images imported into containerd (no registry:
`podman save` of what k8s/image.sh built, then `ctr images import`).

    node = KubeletNode(cp, workdir, images=["localhost/mirrorq:e2e"]).start()
    node.pod_ip("mq", "mirrorq-0"); node.diagnostics(); node.stop()

Where this sandbox differs from a cluster machine, and what is done about it
(docs/kubernetes.md has the errors):
- setrlimit is refused (EPERM) to every runtime: containerd's CRI base spec has
  no rlimits, and k8s/kubelet/runc-wrap removes a negative oomScoreAdj (no
  CAP_SYS_RESOURCE) before it execs runc.
- the control plane runs without the node lifecycle controller, which would lift
  the not-ready taint the kubelet registers with: it is lifted here once the
  node is Ready.
- the `kubernetes` Service has no endpoint reconciler: its Endpoints are set here
  to the API server's port on the pod bridge's gateway, where kube-proxy's rules
  send pods.
The node's processes run in this machine's network namespace: the pod bridge
(`mqcni0`, 10.244.0.0/16) is routed from here, so tests reach pod IPs and
ClusterIPs directly. `stop()` kills every container (by their cgroups), the
shims, containerd, the kubelet and kube-proxy, unmounts what they mounted and
removes the bridge, the pods' network namespaces, and the KUBE-* and CNI-*
iptables chains. Needs root.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from k8s.api import Api, ApiError
from k8s.control_plane import bin_dir, wait_until
from k8s.dns import ClusterDns
from k8s.provisioner import HostPathProvisioner
from k8s.sandbox_reaper import SandboxReaper

REPO = Path(__file__).resolve().parents[1]
NODE_NAME = "mq-kubelet"
BRIDGE = "mqcni0"
POD_CIDR = "10.244.0.0/16"
GATEWAY = "10.244.0.1"
PAUSE_IMAGE = "localhost/pause:3.4.1"
CGROUP_ROOT = Path("/sys/fs/cgroup")
POD_LOGS = "/var/log/pods"


def node_bin_dir() -> Path:
    """kubelet, kube-proxy and pause: k8s/build.sh builds them with the control plane."""
    return bin_dir()


def missing_node_binaries() -> list[str]:
    missing = [str(node_bin_dir() / b) for b in ("kubelet", "kube-proxy", "pause")
               if not os.access(node_bin_dir() / b, os.X_OK)]
    missing += [t for t in ("containerd", "ctr", "runc", "buildah", "podman")
                if shutil.which(t) is None]
    if not os.access("/usr/lib/cni/bridge", os.X_OK):
        missing.append("/usr/lib/cni/bridge (containernetworking-plugins)")
    return missing


def _run(*argv: str, check: bool = True, timeout: float = 120,
         input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                         input=input.decode() if input is not None else None)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): "
                           f"{res.stderr.strip()[-800:]}")
    return res


def _quiet(cond: Callable[[], Any]) -> Callable[[], bool]:
    """cond() as a bool, an exception (a daemon not answering yet) as False."""
    def run() -> bool:
        try:
            return bool(cond())
        except Exception:  # noqa: BLE001 - polled again until the deadline
            return False
    return run


class KubeletNode:
    def __init__(self, cp: Any, workdir: Path, images: list[str],
                 storage: str = "vfs") -> None:
        self.cp = cp
        self.work = Path(workdir).resolve()
        self.images = list(images)
        self.storage = storage
        self.bin = node_bin_dir()
        self.api = Api(cp.server, cp.token, cp.ca_file)
        self.api_port = int(cp.server.rsplit(":", 1)[1])
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.dns: ClusterDns | None = None
        self.provisioner = HostPathProvisioner(self.api, self.work / "volumes")
        self.reaper: SandboxReaper | None = None
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._netns_before: set[str] = set()
        self._pod_logs_before: set[str] = set()
        self.timings: dict[str, float] = {}

    @property
    def sock(self) -> Path:
        return self.work / "containerd.sock"

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "-a", str(self.sock), "-n", "k8s.io", *args, timeout=timeout)

    # -- life
    def start(self) -> KubeletNode:
        for d in ("etc", "cni", "log", "volumes"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        self._netns_before = set(os.listdir("/var/run/netns")) if os.path.isdir(
            "/var/run/netns") else set()
        self._pod_logs_before = set(os.listdir(POD_LOGS)) if os.path.isdir(POD_LOGS) else set()
        try:
            self._bridge()
            self._containerd()
            self._import_images()
            self._endpoints()
            self.dns = ClusterDns(self.api, GATEWAY).start()
            self._kubelet()
            self._kube_proxy()
            self._lift_taint()
        except BaseException:
            self.stop()
            raise
        # a deleted pod leaves the API only once its sandbox is removed (k8s/sandbox_reaper.py)
        self.reaper = SandboxReaper(self.sock, lambda ns, name: self.api.get_or_none(
            f"/api/v1/namespaces/{ns}/pods/{name}"))
        self._thread = threading.Thread(target=self._loop, name="provisioner", daemon=True)
        self._thread.start()
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.work / "log" / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def dead(self) -> str | None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.work / "log" / f"{name}.log").read_text(errors="replace")
                return f"{name} exited {p.returncode}:\n{tail[-3000:]}"
        return None

    def _bridge(self) -> None:
        # made before the CNI plugin would, so the DNS can listen on the gateway
        _run("ip", "link", "del", BRIDGE, check=False)
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/16", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        shutil.rmtree("/var/lib/cni/networks/mirrorq", ignore_errors=True)
        (self.work / "cni" / "10-mirrorq.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "mirrorq", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR,
                                                              "gateway": GATEWAY}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))

    def _containerd(self) -> None:
        spec = json.loads(_run("ctr", "oci", "spec").stdout)
        spec["process"].pop("rlimits", None)  # setrlimit is refused here
        base = self.work / "etc" / "base-spec.json"
        base.write_text(json.dumps(spec))
        w = self.work
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (w / "etc" / "containerd.toml").write_text(f"""version = 2
root = "{w}/containerd/root"
state = "{w}/containerd/state"
[grpc]
  address = "{self.sock}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "{base}"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{REPO}/k8s/kubelet/runc-wrap"
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{w}/cni"
""")
        self._spawn("containerd", ["containerd", "--config", str(w / "etc" / "containerd.toml")])
        wait_until(_quiet(lambda: self.sock.exists() and self.ctr("version", timeout=10)),
                   30, "containerd's socket", self.dead)

    def _import_images(self) -> None:
        t0 = time.monotonic()
        vfs = f"--storage-driver={self.storage}"
        c = _run("buildah", vfs, "from", "scratch").stdout.strip()
        try:
            _run("buildah", vfs, "copy", c, str(self.bin / "pause"), "/pause")
            _run("buildah", vfs, "config", "--entrypoint", '["/pause"]', "--user", "65535:65535", c)
            _run("buildah", vfs, "commit", "-q", c, PAUSE_IMAGE)
        finally:
            _run("buildah", vfs, "rm", c, check=False)
        for ref in [PAUSE_IMAGE, *self.images]:
            tar = self.work / "image.tar"
            _run("podman", vfs, "save", "--format", "docker-archive", "-o", str(tar), ref,
                 timeout=600)
            try:
                self.ctr("images", "import", str(tar), timeout=600)
            finally:
                tar.unlink(missing_ok=True)
        self.timings["image import"] = time.monotonic() - t0

    def _endpoints(self) -> None:
        body = {"apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": "kubernetes", "namespace": "default"},
                "subsets": [{"addresses": [{"ip": GATEWAY}],
                             "ports": [{"name": "https", "port": self.api_port,
                                        "protocol": "TCP"}]}]}
        path = "/api/v1/namespaces/default/endpoints"
        try:
            self.api.call("POST", path, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            self.api.call("PUT", f"{path}/kubernetes", body)

    def _kubelet(self) -> None:
        w = self.work
        (w / "etc" / "kubelet.yaml").write_text(f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: ["{GATEWAY}"]
address: {GATEWAY}
readOnlyPort: 0
enforceNodeAllocatable: []
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}}
# no image garbage collection: the imported images (pause among them) cannot be pulled back
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
""")
        self._spawn("kubelet", [
            str(self.bin / "kubelet"), f"--config={w / 'etc' / 'kubelet.yaml'}",
            f"--kubeconfig={self.cp.kubeconfig}", "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{self.sock}", f"--root-dir={w / 'kubelet'}",
            f"--cert-dir={w / 'kubelet' / 'pki'}", f"--hostname-override={NODE_NAME}",
            f"--node-ip={GATEWAY}", "--v=1"])

        def ready() -> bool:
            node = self.api.get_or_none(f"/api/v1/nodes/{NODE_NAME}")
            conds = {c["type"]: c["status"] for c in
                     ((node or {}).get("status") or {}).get("conditions") or ()}
            return conds.get("Ready") == "True"
        t0 = time.monotonic()
        wait_until(_quiet(ready), 90, f"node {NODE_NAME} Ready", self.dead)
        self.timings["kubelet ready"] = time.monotonic() - t0

    def _kube_proxy(self) -> None:
        self._spawn("kube-proxy", [
            str(self.bin / "kube-proxy"), f"--kubeconfig={self.cp.kubeconfig}",
            "--proxy-mode=iptables", f"--cluster-cidr={POD_CIDR}",
            f"--hostname-override={NODE_NAME}", "--conntrack-max-per-core=0",
            "--oom-score-adj=0"])
        wait_until(_quiet(lambda: "KUBE-SERVICES" in _run("iptables", "-t", "nat", "-S").stdout),
                   60, "kube-proxy's KUBE-SERVICES chain", self.dead)

    def _lift_taint(self) -> None:
        # the node lifecycle controller (off in the tests' control plane) would do this
        node = self.api.get(f"/api/v1/nodes/{NODE_NAME}")
        taints = [t for t in (node.get("spec") or {}).get("taints") or ()
                  if t.get("key") != "node.kubernetes.io/not-ready"]
        self.api.merge(f"/api/v1/nodes/{NODE_NAME}", {"spec": {"taints": taints or None}})

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.provisioner.sync()
                if self.reaper is not None:
                    self.reaper.sync()
            except Exception:  # noqa: BLE001 - keep serving; diagnostics show it
                self.errors.append(traceback.format_exc())
                del self.errors[:-20]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self.reaper is not None:
            self.reaper.close()
        with contextlib.suppress(ApiError, OSError):
            self.api.call("DELETE", f"/api/v1/nodes/{NODE_NAME}")
        for name in ("kube-proxy", "kubelet"):
            self._end(name)
        self._kill_containers()
        _run("pkill", "-9", "-f", f"containerd-shim-runc-v2 .*-address {self.sock}",
             check=False)
        self._end("containerd")
        if self.dns is not None:
            self.dns.stop()
        self._unmount()
        for ns in set(os.listdir("/var/run/netns")) - self._netns_before \
                if os.path.isdir("/var/run/netns") else ():
            if ns.startswith("cni-"):
                _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        shutil.rmtree("/var/lib/cni/networks/mirrorq", ignore_errors=True)
        remove_chains(("KUBE-", "CNI-"))
        # the kubelet keeps container logs in /var/log/pods whatever its root-dir
        for d in set(os.listdir(POD_LOGS)) - self._pod_logs_before if os.path.isdir(POD_LOGS) \
                else ():
            shutil.rmtree(os.path.join(POD_LOGS, d), ignore_errors=True)

    def _end(self, name: str) -> None:
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def _kill_containers(self) -> None:
        """SIGKILL every process in the kubelet's cgroups (kubepods), until none is left."""
        root = CGROUP_ROOT / "pids" / "kubepods"
        for _ in range(50):
            pids = {int(x) for f in root.rglob("cgroup.procs") if f.exists()
                    for x in f.read_text().split()} if root.exists() else set()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for ctl in CGROUP_ROOT.iterdir():
            top = ctl / "kubepods"
            if top.is_dir():
                for d in sorted((p for p in top.rglob("*") if p.is_dir()),
                                key=lambda p: len(p.parts), reverse=True):
                    with contextlib.suppress(OSError):
                        d.rmdir()
                with contextlib.suppress(OSError):
                    top.rmdir()

    def _unmount(self) -> None:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        # ours only: containerd's state and the kubelet's root are under work (the
        # pods' network namespaces go with `ip netns del` below)
        mine = sorted({m for m in mounts if m.startswith(str(self.work) + "/")},
                      key=len, reverse=True)
        for m in mine:
            _run("umount", "-l", m, check=False)

    # -- for tests
    def pod_ip(self, namespace: str, name: str) -> str | None:
        pod = self.api.get_or_none(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return None
        ip: str | None = (pod.get("status") or {}).get("podIP")
        return ip

    def diagnostics(self) -> str:
        out = [f"node errors: {self.errors[-5:]}", f"dead: {self.dead()}",
               f"dns errors: {self.dns.errors[-5:] if self.dns else None}"]
        for name in ("kubelet", "containerd"):
            log = self.work / "log" / f"{name}.log"
            if log.exists():
                lines = [x for x in log.read_text(errors="replace").splitlines()
                         if " E" in x[:30] or "error" in x.lower()][-15:]
                out += [f"== {name} errors"] + [f"   | {x[:400]}" for x in lines]
        pods = Path(POD_LOGS)
        for d in sorted(pods.glob("*")) if pods.exists() else ():
            for f in sorted(d.rglob("*.log"))[-2:]:
                tail = f.read_text(errors="replace").splitlines()[-12:]
                out += [f"== {f.relative_to(pods)}"] + [f"   | {x[:400]}" for x in tail]
        return "\n".join(out)


def remove_chains(prefixes: tuple[str, ...]) -> None:
    """The jumps to, then the rules of, then the chains named with these prefixes,
    in the filter, nat and mangle tables (what the kubelet, kube-proxy and the CNI
    bridge plugin leave)."""
    for table in ("filter", "nat", "mangle"):
        rules = _run("iptables", "-t", table, "-S", check=False).stdout.splitlines()
        chains = [r.split()[1] for r in rules if r.startswith("-N ")
                  and r.split()[1].startswith(prefixes)]
        for r in rules:
            parts = r.split()
            if parts[:1] == ["-A"] and not parts[1].startswith(prefixes) and any(
                    f"-j {c}" in r for c in chains):
                _run("sh", "-c", f"iptables -t {table} -D {r[3:]}", check=False)
        for c in chains:
            _run("iptables", "-t", table, "-F", c, check=False)
        for c in chains:
            _run("iptables", "-t", table, "-X", c, check=False)
