"""The chart, operator and broker pods on the real control plane: the release's
names, an Env that drives kubectl/helm and reads the MirrorqCluster, its pods and their
admin Status, and a polling wait with diagnostics."""
from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from k8s.control_plane import ControlPlane, bin_dir
from node.admin.client import call_status

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "mirrorq"
NS = "mq"
RELEASE = "mirrorq"
NAME = "mirrorq"  # the chart's fullname for this release: the MirrorqCluster's name
SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/managed-by=mirrorq-operator"


def wait(cond: Callable[[], T | None], timeout: float, what: str,
         diag: Callable[[], str] | None = None, interval: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
            last = value
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last one
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"
                         + (f"\n{diag()}" if diag else ""))


class Node(Protocol):
    """What runs the pods: k8s.node.KubeletNode (a real kubelet) or k8s.node_agent.NodeAgent."""
    def pod_ip(self, namespace: str, name: str) -> str | None: ...
    def diagnostics(self) -> str: ...


@dataclass(frozen=True)
class PodEndpoint:
    """What the harness's publishers and drain need of a node."""
    node_id: str
    host: str
    user: str
    password: str
    amqp_port: int = 5672


class Env:
    def __init__(self, cp: ControlPlane, agent: Node, workdir: Path) -> None:
        self.cp = cp
        self.agent = agent
        self.workdir = workdir
        self.values = workdir / "values.yaml"
        self.views: list[tuple[float, tuple[str, ...]]] = []  # leader's member set over time
        self._watch_stop = threading.Event()
        self._watch: threading.Thread | None = None

    # -- the API
    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cp.kubectl("-n", NS, *args, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm(self, *args: str, timeout: float = 120) -> str:
        res = subprocess.run([str(bin_dir() / "helm"), "--kubeconfig", str(self.cp.kubeconfig),
                              "-n", NS, *args], capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, f"helm {' '.join(args)}: {res.stderr or res.stdout}"
        return res.stdout

    def cr(self) -> dict[str, Any]:
        out: dict[str, Any] = self.json("mirrorqcluster", NAME)
        return out

    def status(self) -> dict[str, Any]:
        return dict(self.cr().get("status") or {})

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.json("pods", "-l", SELECTOR)["items"]
        return items

    def ready_pods(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.pods()
                      if not p["metadata"].get("deletionTimestamp")
                      and any(c["type"] == "Ready" and c["status"] == "True"
                              for c in p.get("status", {}).get("conditions") or ()))

    def secret(self, key: str) -> str:
        data = self.json("secret", NAME)["data"]
        return base64.b64decode(data[key]).decode()

    def endpoints(self) -> list[PodEndpoint]:
        user, password = self.secret("username"), self.secret("password")
        out = []
        for p in self.pods():
            ip = p.get("status", {}).get("podIP")
            if ip and not p["metadata"].get("deletionTimestamp"):
                out.append(PodEndpoint(p["metadata"]["name"], ip, user, password))
        return sorted(out, key=lambda e: e.node_id)

    def admin_tls(self, pod: str) -> dict[str, Any]:
        """call_status's TLS arguments for `pod` (dialled by IP): the operator's CA and
        client certificate from NAME-admin-tls, the pod's DNS name as the server name."""
        data = self.json("secret", f"{NAME}-admin-tls")["data"]
        pem = {k: base64.b64decode(v) for k, v in data.items()}
        return {"tls_ca": pem["ca.crt"], "tls_cert": pem["client.crt"],
                "tls_key": pem["client.key"],
                "tls_server_name": f"{pod}.{NAME}-headless.{NS}.svc"}

    def admin_status(self, pod: str) -> dict[str, Any]:
        ip = self.agent.pod_ip(NS, pod)
        assert ip, f"{pod} runs nowhere"
        return call_status(ip, 15682, 3.0, token=self.secret("admin-token"),
                           **self.admin_tls(pod))

    def converged(self, n: int) -> dict[str, Any] | None:
        """The CR says n members, all in sync, a leader, available; n pods Ready."""
        st = self.status()
        want = [f"{NAME}-{k}" for k in range(n)]
        cond = {c["type"]: c["status"] for c in st.get("conditions") or ()}
        ok = (sorted(st.get("members") or ()) == want and sorted(st.get("inSync") or ()) == want
              and st.get("leader") in want and cond.get("ClusterAvailable") == "True"
              and cond.get("AllReplicasReady") == "True" and self.ready_pods() == want)
        return st if ok else None

    # -- membership, as the leader reports it, over time
    def watch_members(self) -> None:
        token = self.secret("admin-token")

        def run() -> None:
            while not self._watch_stop.is_set():
                for e in self.endpoints():
                    try:
                        st = call_status(e.host, 15682, 2.0, token=token,
                                         **self.admin_tls(e.node_id))
                    except Exception:  # noqa: BLE001 - a pod coming or going
                        continue
                    if st.get("role") == "leader":
                        members = tuple(sorted(st.get("members") or ()))
                        if not self.views or self.views[-1][1] != members:
                            self.views.append((time.monotonic(), members))
                        break
                self._watch_stop.wait(0.3)

        self._watch_stop.clear()
        self._watch = threading.Thread(target=run, daemon=True)
        self._watch.start()

    def stop_watch(self) -> None:
        self._watch_stop.set()
        if self._watch is not None:
            self._watch.join(10)

    def diagnostics(self) -> str:
        parts = []
        for args in (("get", "mirrorqcluster", "-o", "yaml"), ("get", "pods,pvc,sts", "-o", "wide"),
                     ("get", "events", "--sort-by=.lastTimestamp")):
            res = self.kubectl(*args, check=False)
            parts.append(f"==== kubectl {' '.join(args)}\n{res.stdout[-4000:]}{res.stderr[-500:]}")
        parts.append(f"==== leader member views: {self.views}")
        parts.append("==== node\n" + self.agent.diagnostics())
        return "\n".join(parts)
