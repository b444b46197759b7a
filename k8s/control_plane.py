"""A real Kubernetes control plane for the tests (issue 13): etcd 3.4, kube-apiserver,
kube-controller-manager and kube-scheduler v1.20.2 as child processes, built once by
k8s/build.sh into a cache outside the work tree (the recipe: ../shared/K8S-RECIPE.md).

    from k8s.control_plane import up
    cp = up(tmp_path / "k8s")        # certs, token, free ports, 4 processes, waits until ready
    cp.kubectl("get", "ns")          # or KUBECONFIG=cp.kubeconfig for kopf, helm, kubernetes
    cp.down()                        # SIGTERM, then SIGKILL after a grace; by pid

RBAC on (--authorization-mode=Node,RBAC), TLS (the apiserver makes its own serving
certificate in --cert-dir, whose CA the kubeconfig embeds) and token auth (an admin
token in system:masters); service-account tokens signed by a key pair made here.
No kubelet: pods stay Pending until a node agent of the tests runs them.

CLI (make k8s-up / make k8s-down use it):

    python k8s/control_plane.py up DIR          # foreground until SIGINT/SIGTERM
    python k8s/control_plane.py up DIR --detach --pid-file F
                                                 # background; returns once ready
    python k8s/control_plane.py down DIR [--pid-file F]

`up` prints `export KUBECONFIG=DIR/kubeconfig` (and the PATH with kubectl and helm).
Runs with the project's venv (the harness's free_port; `cryptography` when present,
else `openssl`).
"""
from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.process import free_port  # below the ephemeral range (see there)

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
            "kubectl", "helm")
# the order they start in; down() stops them in reverse
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
STATE = "state.json"
# what up() owns inside its workdir (cleared at the next up())
OWNED = ("etcd-data", "certs", "kubeconfig", STATE,
         *(f"{c}.log" for c in COMPONENTS))
SERVICE_CIDR = "10.0.0.0/24"
DEFAULT_CONTROLLERS = "*,-nodelifecycle"

class ControlPlaneError(RuntimeError):
    pass


def cache_dir() -> Path:
    """The cache k8s/build.sh fills (MIRRORQ_K8S_CACHE, or the versioned default it
    prints with --print-dir: one place for the default)."""
    env = os.environ.get("MIRRORQ_K8S_CACHE")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(BUILD_SH), "--print-dir"], capture_output=True,
                         text=True, check=True)
    return Path(out.stdout.strip())


def bin_dir() -> Path:
    return cache_dir() / "bin"


def missing_binaries(bindir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bindir / b, os.X_OK)]


def _tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(lines[-n:])


def wait_until(cond: Callable[[], bool], timeout: float, what: str,
          alive: Callable[[], str | None] = lambda: None, interval: float = 0.2) -> None:
    """Poll cond() until it holds; alive() returns an error text once a process it
    watches has died (then fail at once, not at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        dead = alive()
        if dead:
            raise ControlPlaneError(f"{what}: {dead}")
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


# ---- certificates and tokens ------------------------------------------------

def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _service_account_keys(certs: Path) -> tuple[Path, Path]:
    """An RSA key pair: the apiserver checks and signs service-account tokens with
    it, the controller-manager's token controller signs with the private half."""
    key, pub = certs / "sa.key", certs / "sa.pub"
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
    except ImportError:
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True,
                       capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
                       check=True, capture_output=True)
        os.chmod(key, 0o600)
        return key, pub
    k = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(key, k.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.TraditionalOpenSSL,
                                        serialization.NoEncryption()))
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo))
    return key, pub


def _kubeconfig_text(server: str, ca_pem: bytes, token: str) -> str:
    ca = base64.b64encode(ca_pem).decode()
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: mirrorq-k8s\n"
        "  cluster:\n"
        f"    server: {server}\n"
        f"    certificate-authority-data: {ca}\n"
        "users:\n"
        "- name: admin\n"
        "  user:\n"
        f"    token: {token}\n"
        "contexts:\n"
        "- name: mirrorq-k8s\n"
        "  context:\n"
        "    cluster: mirrorq-k8s\n"
        "    user: admin\n"
        "    namespace: default\n"
        "current-context: mirrorq-k8s\n"
    )


# ---- processes --------------------------------------------------------------

def _die_with_parent() -> None:  # pragma: no cover - runs in the child after fork
    """preexec_fn: SIGTERM this child when the process that started it dies (a
    SIGKILLed test run or supervisor leaves no control plane behind)."""
    parent = os.getppid()
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pid_runs(pid: int, exe: str) -> bool:
    """pid is alive and still the program recorded for it (not a reused pid)."""
    if not _pid_alive(pid):
        return False
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except OSError:
        return False
    return argv0 == exe or Path(argv0).name == Path(exe).name


def _stop_pids(pids: dict[str, int], grace: float) -> None:
    """SIGTERM, wait up to grace, SIGKILL, for processes that are not our children."""
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids.values():
        if _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)


@dataclass
class ControlPlane:
    workdir: Path
    bindir: Path
    server: str
    token: str
    kubeconfig: Path
    ca_file: Path
    ports: dict[str, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ready_seconds: float = 0.0

    # -- use --------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """os.environ with KUBECONFIG and kubectl/helm first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bindir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True,
                             timeout=timeout)
        if check and res.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} exited {res.returncode}: "
                                    f"{res.stderr.strip() or res.stdout.strip()}")
        return res

    def get(self, path: str, timeout: float = 5) -> tuple[int, Any]:
        """GET an API path with the admin token: (status, parsed JSON body or text)."""
        return _api_get(self.server, path, self.token, self.ca_file, timeout)

    def log(self, component: str) -> Path:
        return self.workdir / f"{component}.log"

    def dead(self) -> str | None:
        """The first component that has exited, with its log's tail; None if all run."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                return (f"{name} exited with {p.returncode}; its log ({self.log(name)}) "
                        f"ends:\n{_tail(self.log(name))}")
        return None

    # -- stop ---------------------------------------------------------------
    def down(self, grace: float = 10.0) -> None:
        """Stop every process by pid, clients first and etcd last: SIGTERM, then
        SIGKILL after `grace` seconds. Idempotent."""
        order = [c for c in reversed(COMPONENTS) if c in self.procs]
        # the two clients together, then the apiserver, then etcd
        batches = [[c for c in order if c in ("kube-scheduler", "kube-controller-manager")],
                   [c for c in order if c == "kube-apiserver"],
                   [c for c in order if c == "etcd"]]
        for batch in batches:
            live = [self.procs[c] for c in batch if self.procs[c].poll() is None]
            for p in live:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for p in live:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        self.procs.clear()
        with contextlib.suppress(OSError):
            state = json.loads((self.workdir / STATE).read_text())
            state["processes"] = {}
            state["stopped"] = True
            _write_private(self.workdir / STATE, json.dumps(state, indent=1).encode())

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def _ssl_context(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


def _api_get(server: str, path: str, token: str, ca_file: Path,
             timeout: float = 5) -> tuple[int, Any]:
    req = urllib.request.Request(server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=_ssl_context(ca_file)) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    text = body.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _http_ok(url: str, timeout: float = 2) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return bool(r.status == 200)
    except (OSError, ValueError):
        return False


def _running_state(workdir: Path) -> dict[str, Any] | None:
    """The recorded state of a control plane in workdir if any of it still runs."""
    try:
        state = json.loads((workdir / STATE).read_text())
    except (OSError, ValueError):
        return None
    procs = state.get("processes", {})
    if any(_pid_runs(p["pid"], p["exe"]) for p in procs.values()):
        return dict(state)
    return None


def up(workdir: Path | str, *, bindir: Path | str | None = None, timeout: float = 120.0,
       controllers: str = DEFAULT_CONTROLLERS, die_with_parent: bool = True,
       stop_at_exit: bool = True) -> ControlPlane:
    """Start etcd, kube-apiserver, kube-controller-manager and kube-scheduler with
    their data, certificates and logs in workdir; return once the apiserver's
    /readyz answers 200 to the admin token and the controller-manager has made the
    default ServiceAccount and its token (pods can be created).

    Raises ControlPlaneError (with the failing component's log tail) when a binary
    is missing (run k8s/build.sh), a process exits, or `timeout` passes; whatever
    was started is stopped again then."""
    t0 = time.monotonic()
    workdir = Path(workdir).resolve()
    bdir = Path(bindir) if bindir is not None else bin_dir()
    missing = missing_binaries(bdir)
    if missing:
        raise ControlPlaneError(f"{', '.join(missing)} missing in {bdir}: run `make k8s-build` "
                                "(k8s/build.sh) first")
    workdir.mkdir(parents=True, exist_ok=True)
    running = _running_state(workdir)
    if running:
        raise ControlPlaneError(f"a control plane already runs in {workdir} "
                                f"(server {running.get('server')}); stop it first")
    for name in OWNED:
        p = workdir / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()

    certs = workdir / "certs"
    certs.mkdir(mode=0o700)
    (workdir / "etcd-data").mkdir(mode=0o700)
    token = secrets.token_hex(24)
    _write_private(certs / "tokens.csv", f'{token},admin,admin,"system:masters"\n'.encode())
    sa_key, sa_pub = _service_account_keys(certs)

    ports = {"etcd": free_port(), "etcd-peer": free_port(), "kube-apiserver": free_port()}
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    server = f"https://127.0.0.1:{ports['kube-apiserver']}"
    kubeconfig = workdir / "kubeconfig"
    ca_file = certs / "apiserver.crt"  # written by the apiserver (--cert-dir): cert + its CA

    cp = ControlPlane(workdir=workdir, bindir=bdir, server=server, token=token,
                      kubeconfig=kubeconfig, ca_file=ca_file, ports=ports)
    deadline = t0 + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    def start(name: str, args: list[str]) -> None:
        exe = str(bdir / name)
        with open(workdir / f"{name}.log", "ab") as log:
            cp.procs[name] = subprocess.Popen(
                [exe, *args], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=workdir, start_new_session=True,
                preexec_fn=_die_with_parent if die_with_parent else None)
        _record(cp)

    try:
        start("etcd", [
            "--name", "mirrorq-k8s", "--data-dir", str(workdir / "etcd-data"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"mirrorq-k8s={peer_url}",
        ])
        wait_until(lambda: _http_ok(f"{etcd_url}/health"), left(), "etcd /health", cp.dead)

        start("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            # all addresses: pods in their network namespaces reach it through the
            # `kubernetes` Service's IP (the node agent's DNAT); its serving
            # certificate names that IP (the service range's first address)
            f"--secure-port={ports['kube-apiserver']}", "--bind-address=0.0.0.0",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--cert-dir={certs}", f"--token-auth-file={certs / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            # no DNS for node names here: logs and exec reach a kubelet by its address
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
        ])

        def apiserver_ready() -> bool:
            if not ca_file.exists():
                return False
            try:
                status, _ = _api_get(server, "/readyz", token, ca_file, timeout=3)
            except (OSError, ssl.SSLError):
                return False
            return status == 200

        wait_until(apiserver_ready, left(), "kube-apiserver /readyz", cp.dead)
        _write_private(kubeconfig, _kubeconfig_text(server, ca_file.read_bytes(), token).encode())

        start("kube-controller-manager", [
            f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--port=0",
            "--secure-port=0", f"--service-account-private-key-file={sa_key}",
            f"--root-ca-file={ca_file}", f"--controllers={controllers}",
        ])
        start("kube-scheduler", [
            f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--port=0",
            "--secure-port=0",
        ])

        def default_service_account() -> bool:
            try:
                status, sa = cp.get("/api/v1/namespaces/default/serviceaccounts/default")
            except OSError:
                return False
            return status == 200 and bool(sa.get("secrets"))

        wait_until(default_service_account, left(),
              "kube-controller-manager (the default ServiceAccount and its token)", cp.dead)
        dead = cp.dead()
        if dead:
            raise ControlPlaneError(dead)
    except BaseException:
        cp.down(grace=3)
        raise
    cp.ready_seconds = time.monotonic() - t0
    _record(cp, ready=True)
    if stop_at_exit:
        atexit.register(cp.down)
    return cp


def _record(cp: ControlPlane, ready: bool = False) -> None:
    """workdir/state.json: what down(workdir) and `control_plane.py down` need to
    stop it from another process, and what a test needs to reach it."""
    state = {
        "server": cp.server, "kubeconfig": str(cp.kubeconfig), "bin": str(cp.bindir),
        "token": cp.token, "ports": cp.ports, "ready": ready,
        "ready_seconds": round(cp.ready_seconds, 2), "supervisor": os.getpid(),
        "processes": {n: {"pid": p.pid, "exe": str(p.args[0])}  # type: ignore[index]
                      for n, p in cp.procs.items()},
    }
    _write_private(cp.workdir / STATE, json.dumps(state, indent=1).encode())


def down(workdir: Path | str, grace: float = 10.0) -> list[str]:
    """Stop the processes a control plane recorded in workdir/state.json (from any
    process; pids are checked to still be those programs). Returns their names."""
    workdir = Path(workdir)
    try:
        state = json.loads((workdir / STATE).read_text())
    except (OSError, ValueError):
        return []
    procs = state.get("processes", {})
    live = {n: p["pid"] for n, p in procs.items() if _pid_runs(p["pid"], p["exe"])}
    for batch in (("kube-scheduler", "kube-controller-manager"), ("kube-apiserver",),
                  ("etcd",)):
        pids = {n: live[n] for n in batch if n in live}
        if pids:
            _stop_pids(pids, grace)
    state["processes"] = {}
    state["stopped"] = True
    _write_private(workdir / STATE, json.dumps(state, indent=1).encode())
    return sorted(live)


# ---- CLI ----------------------------------------------------------------------

def _exports(kubeconfig: Path, bindir: Path) -> str:
    return f"export KUBECONFIG={kubeconfig}\nexport PATH={bindir}:$PATH"


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _supervisor_runs(pid: int) -> bool:
    if not _pid_alive(pid):
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"control_plane.py" in cmd


def _cmd_up(args: argparse.Namespace) -> int:
    workdir = Path(args.dir).resolve()
    pid_file = Path(args.pid_file).resolve() if args.pid_file else None
    if args.detach:
        return _up_detached(workdir, pid_file, args.timeout)

    stop = {"signal": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if pid_file:
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(f"{os.getpid()}\n")
    rc = 0
    try:
        try:
            cp = up(workdir, timeout=args.timeout, stop_at_exit=False)
        except ControlPlaneError as e:
            print(f"control plane: {e}", file=sys.stderr)
            return 1
        print(f"control plane ready in {cp.ready_seconds:.1f} s: {cp.server} "
              f"(logs and certs in {workdir})", file=sys.stderr)
        print(_exports(cp.kubeconfig, cp.bindir), flush=True)
        try:
            while not stop["signal"]:
                dead = cp.dead()
                if dead:
                    print(f"control plane: {dead}", file=sys.stderr)
                    rc = 1
                    break
                time.sleep(0.5)
        finally:
            cp.down()
        if stop["signal"]:
            print(f"control plane: stopped (signal {stop['signal']})", file=sys.stderr)
        return rc
    finally:
        if pid_file and _read_pid(pid_file) == os.getpid():
            pid_file.unlink(missing_ok=True)


def _up_detached(workdir: Path, pid_file: Path | None, timeout: float) -> int:
    """Start `up DIR` as a background supervisor (its own session, output in
    DIR/control-plane.log), wait until it is ready, print the exports."""
    pid_file = pid_file or workdir / "control-plane.pid"
    old = _read_pid(pid_file)
    if old and _supervisor_runs(old):
        state = _running_state(workdir)
        if state and state.get("ready"):
            print(f"control plane already running (pid {old}, {state['server']})",
                  file=sys.stderr)
            print(_exports(Path(state["kubeconfig"]), Path(state["bin"])), flush=True)
            return 0
        print(f"control plane: pid {old} ({pid_file}) runs but is not ready; "
              "`control_plane.py down` it first", file=sys.stderr)
        return 1
    workdir.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "control-plane.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        sup = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "up", str(workdir),
             "--pid-file", str(pid_file), "--timeout", str(timeout)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    pid_file.write_text(f"{sup.pid}\n")

    def ready() -> bool:
        try:
            state = json.loads((workdir / STATE).read_text())
        except (OSError, ValueError):
            return False
        return bool(state.get("ready")) and state.get("supervisor") == sup.pid

    def sup_dead() -> str | None:
        if sup.poll() is None:
            return None
        return f"the supervisor exited with {sup.returncode}; {log_path}:\n{_tail(log_path)}"

    try:
        wait_until(ready, timeout + 15, "waiting until ready", sup_dead)
    except ControlPlaneError as e:
        print(f"control plane: {e}", file=sys.stderr)
        if sup.poll() is None:
            sup.terminate()
            try:
                sup.wait(timeout=20)
            except subprocess.TimeoutExpired:
                sup.kill()
        down(workdir, grace=3)
        pid_file.unlink(missing_ok=True)
        return 1
    state = json.loads((workdir / STATE).read_text())
    print(f"control plane ready in {time.monotonic() - t0:.1f} s: {state['server']} "
          f"(pid {sup.pid} in {pid_file}; logs in {workdir})", file=sys.stderr)
    print(_exports(Path(state["kubeconfig"]), Path(state["bin"])), flush=True)
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    workdir = Path(args.dir).resolve()
    pid_file = Path(args.pid_file).resolve() if args.pid_file else workdir / "control-plane.pid"
    pid = _read_pid(pid_file)
    stopped = False
    if pid and _supervisor_runs(pid):
        os.kill(pid, signal.SIGTERM)  # it stops its processes in order, then exits
        deadline = time.monotonic() + args.grace + 30
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        stopped = True
    leftovers = down(workdir, grace=args.grace)
    pid_file.unlink(missing_ok=True)
    if leftovers:
        print(f"control plane: stopped leftover {', '.join(leftovers)}", file=sys.stderr)
    print("control plane: stopped" if stopped or leftovers else "control plane: not running",
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="control_plane.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start a control plane in DIR")
    u.add_argument("dir")
    u.add_argument("--detach", action="store_true",
                   help="run in the background; return once it is ready")
    u.add_argument("--pid-file", help="where the supervisor's pid goes")
    u.add_argument("--timeout", type=float, default=120.0,
                   help="seconds allowed until ready (default 120)")
    d = sub.add_parser("down", help="stop the control plane of DIR")
    d.add_argument("dir")
    d.add_argument("--pid-file", help="the supervisor's pid file (default DIR/control-plane.pid)")
    d.add_argument("--grace", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL (default 10)")
    args = ap.parse_args(argv)
    return _cmd_up(args) if args.cmd == "up" else _cmd_down(args)


if __name__ == "__main__":
    sys.exit(main())
