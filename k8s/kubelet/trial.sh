#!/usr/bin/env bash
# k8s/kubelet/trial.sh IMAGE_REF: a real kubelet and container runtime against the
# tests' control plane, by hand (issue 30's first trial; the tests use k8s/node.py).
#
# containerd 1.6 (Debian's, CRI plugin, overlayfs snapshotter, runc through
# k8s/kubelet/runc-wrap), CNI bridge + host-local + portmap (Debian's
# containernetworking-plugins), a pause image built from the kubernetes source,
# kubelet v1.20.2 (cgroupfs, cgroup v1) and kube-proxy (iptables) from
# k8s/build.sh. Then: a pod of IMAGE_REF (imported into containerd, pull
# policy Never) as uid 10001 with a read-only root, an emptyDir and an exec
# readiness probe; a pod serving HTTP with an httpGet probe behind a ClusterIP
# Service, fetched through kube-proxy's rules. Everything it starts is stopped at
# the end, the host's iptables KUBE-* chains removed. Needs root.
set -uo pipefail
cd "$(dirname "$0")/../.."
IMAGE="${1:?usage: k8s/kubelet/trial.sh IMAGE_REF (e.g. localhost/mirrorq:0.1.0, built by make image)}"
CPB="$(bash k8s/build.sh --print-dir)/bin"
NB="$CPB"
W="${MIRRORQ_KUBELET_WORK:-/var/tmp/mirrorq-kubelet-trial}"
PY="${PYTHON:-.venv/bin/python}"
K() { "$CPB/kubectl" --kubeconfig "$W/cp/kubeconfig" "$@"; }
say() { echo "trial: $*" >&2; }
for need in "$NB/kubelet" "$NB/kube-proxy" "$NB/pause" "$CPB/kubectl"; do
  [ -x "$need" ] || { say "missing $need: bash k8s/build.sh"; exit 2; }
done
command -v containerd >/dev/null && [ -x /usr/lib/cni/bridge ] || \
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd containernetworking-plugins >/dev/null
rm -rf "$W"; mkdir -p "$W/etc" "$W/cni" "$W/log"

cleanup() {
  K delete pod --all --grace-period=5 --wait=true >/dev/null 2>&1
  for p in kube-proxy kubelet containerd; do [ -f "$W/$p.pid" ] && kill "$(cat "$W/$p.pid")" 2>/dev/null; done
  sleep 1; pkill -f "containerd-shim-runc-v2 -namespace k8s.io -address $W" 2>/dev/null
  "$PY" -m k8s.control_plane down "$W/cp" >/dev/null 2>&1
  for t in filter nat mangle; do  # kubelet's and kube-proxy's chains, jumps first
    iptables -t "$t" -S | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE' | sed 's/^-A/-D/' | \
      while read -r rule; do eval iptables -t "$t" "$rule"; done
    for c in $(iptables -t "$t" -S | awk '/^-N KUBE/ {print $2}'); do iptables -t "$t" -F "$c"; done
    for c in $(iptables -t "$t" -S | awk '/^-N KUBE/ {print $2}'); do iptables -t "$t" -X "$c"; done
  done
  ip link del mqcni0 2>/dev/null; rm -rf /var/lib/cni/networks/mirrorq; true
}
trap cleanup EXIT

# containerd: its own root, state and socket; the CRI base spec without rlimits
ctr oci spec | python3 -c 'import json,sys; s=json.load(sys.stdin); s["process"].pop("rlimits",None); json.dump(s,sys.stdout)' > "$W/etc/base-spec.json"
cat > "$W/etc/containerd.toml" <<T
version = 2
root = "$W/containerd/root"
state = "$W/containerd/state"
[grpc]
  address = "$W/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:3.4.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "$W/etc/base-spec.json"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$PWD/k8s/kubelet/runc-wrap"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni"
T
cat > "$W/cni/10-mirrorq.conflist" <<C
{"cniVersion": "0.4.0", "name": "mirrorq", "plugins": [
 {"type": "bridge", "bridge": "mqcni0", "isGateway": true, "ipMasq": true,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
 {"type": "portmap", "capabilities": {"portMappings": true}}]}
C
containerd --config "$W/etc/containerd.toml" > "$W/log/containerd.log" 2>&1 & echo $! > "$W/containerd.pid"
for _ in $(seq 100); do [ -S "$W/containerd.sock" ] && break; sleep 0.1; done
CTR=(ctr -a "$W/containerd.sock" -n k8s.io)
# images without a registry: pause (built from the kubernetes tree) and IMAGE, by podman save
c=$(buildah --storage-driver vfs from scratch)
buildah --storage-driver vfs copy "$c" "$NB/pause" /pause >/dev/null
buildah --storage-driver vfs config --entrypoint '["/pause"]' --user 65535:65535 "$c"
buildah --storage-driver vfs commit -q "$c" localhost/pause:3.4.1 >/dev/null; buildah --storage-driver vfs rm "$c" >/dev/null
for ref in localhost/pause:3.4.1 "$IMAGE"; do
  podman --storage-driver vfs save --format docker-archive -o "$W/img.tar" "$ref" >/dev/null 2>&1 || { say "podman save $ref failed"; exit 1; }
  "${CTR[@]}" images import "$W/img.tar" >/dev/null || { say "ctr import $ref failed"; exit 1; }
  rm -f "$W/img.tar"
done

"$PY" -m k8s.control_plane up "$W/cp" --detach > "$W/log/cp.out" 2>&1 || { cat "$W/log/cp.out"; exit 1; }
cat > "$W/etc/kubelet.yaml" <<Y
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failSwapOn: false
clusterDomain: cluster.local
address: 127.0.0.1
readOnlyPort: 0
enforceNodeAllocatable: []
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
Y
"$NB/kubelet" --config="$W/etc/kubelet.yaml" --kubeconfig="$W/cp/kubeconfig" --container-runtime=remote \
  --container-runtime-endpoint="unix://$W/containerd.sock" --root-dir="$W/kubelet" \
  --cert-dir="$W/kubelet/pki" --hostname-override=mq-kubelet --v=1 > "$W/log/kubelet.log" 2>&1 &
echo $! > "$W/kubelet.pid"
"$NB/kube-proxy" --kubeconfig="$W/cp/kubeconfig" --proxy-mode=iptables --cluster-cidr=10.244.0.0/16 \
  --hostname-override=mq-kubelet --conntrack-max-per-core=0 --oom-score-adj=0 > "$W/log/kube-proxy.log" 2>&1 &
echo $! > "$W/kube-proxy.pid"
for _ in $(seq 120); do K get node mq-kubelet 2>/dev/null | grep -q ' Ready ' && break; sleep 0.5; done
K get nodes -o wide
# the node lifecycle controller is off in the tests' control plane: it would lift
# the taint the kubelet registers with once the node is Ready
K taint nodes mq-kubelet node.kubernetes.io/not-ready- >/dev/null
cat > "$W/pods.yaml" <<P
apiVersion: v1
kind: Pod
metadata: {name: probe, namespace: default}
spec:
  securityContext: {runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001, runAsNonRoot: true}
  containers:
  - name: c
    image: $IMAGE
    imagePullPolicy: Never
    command: ["python", "-c", "import os,time; print('uid', os.getuid(), os.getgroups(), flush=True); open('/data/x','w').write('ok'); time.sleep(3600)"]
    securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
    volumeMounts: [{name: data, mountPath: /data}]
    readinessProbe: {exec: {command: ["cat", "/data/x"]}, periodSeconds: 2}
  volumes: [{name: data, emptyDir: {}}]
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  securityContext: {runAsUser: 10001, runAsGroup: 10001, runAsNonRoot: true}
  containers:
  - name: c
    image: $IMAGE
    imagePullPolicy: Never
    command: ["python", "-m", "http.server", "8080", "--directory", "/opt"]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
P
K apply -f "$W/pods.yaml" >/dev/null
K wait --for=condition=Ready pod/probe pod/web --timeout=120s || { K describe pods | tail -30; exit 1; }
K get pods -o wide
# (kubectl logs would need the API server to resolve the node's name: no DNS here)
say "probe's output: $(cat /var/log/pods/default_probe_*/c/*.log 2>/dev/null | tail -1)"
ip=$(K get svc web -o jsonpath='{.spec.clusterIP}')
for _ in $(seq 40); do curl -sf -m 2 "http://$ip/" -o /dev/null && break; sleep 0.5; done
curl -sf -m 5 "http://$ip/" -o /dev/null && say "ClusterIP $ip:80 -> web:8080 through kube-proxy: OK" || { say "ClusterIP $ip did not answer"; exit 1; }
say "kubelet $("$NB/kubelet" --version), $(containerd --version | awk '{print $3}'), $(runc --version | head -1): OK"
