#!/usr/bin/env bash
# k8s/kubelet/build.sh: kubelet and kube-proxy v1.20.2 from Debian bookworm's
# `kubernetes` source package with Go 1.15.15 (as k8s/build.sh builds the control
# plane), into their own cache directory (issue 30, a trial: not used by make test
# yet). About 6 min on 2 cores, 3.5 GB of temporary tree.
#
#   bash k8s/kubelet/build.sh            # DIR/bin/kubelet, DIR/bin/kube-proxy
#   bash k8s/kubelet/build.sh --print-dir
set -euo pipefail
K8S_VERSION=v1.20.2
KUBE_DEB_UPSTREAM=1.20.5+really1.20.2
KUBE_TREE=kubernetes-1.20.2
GO_VERSION=1.15.15
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
CACHE="${MIRRORQ_KUBELET_CACHE:-/var/cache/mirrorq/node-${K8S_VERSION}-go${GO_VERSION}}"
[ "${1:-}" = "--print-dir" ] && { echo "$CACHE"; exit 0; }
say() { echo "k8s/kubelet/build.sh: $*" >&2; }
if [ -x "$CACHE/bin/kubelet" ] && [ -x "$CACHE/bin/kube-proxy" ]; then
  say "cached: $CACHE/bin"; exit 0
fi
command -v rsync >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsync >/dev/null
mkdir -p "$CACHE/bin"
WORK="$(mktemp -d "${MIRRORQ_K8S_BUILD_TMP:-/var/tmp}/mirrorq-kubelet.XXXXXX")"
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/apt/parts" "$WORK/dl"
cat >"$WORK/apt/sources.list" <<S
deb [signed-by=$KEYRING] http://deb.debian.org/debian bookworm main
deb-src [signed-by=$KEYRING] http://deb.debian.org/debian bookworm main
deb [signed-by=$KEYRING] http://deb.debian.org/debian bullseye main
S
A=(-o "Dir::Etc::SourceList=$WORK/apt/sources.list" -o "Dir::Etc::SourceParts=$WORK/apt/parts"
   -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache=$WORK/apt/cache" -o APT::Sandbox::User=root -q)
apt-get "${A[@]}" update >/dev/null
cd "$WORK/dl"
apt-get "${A[@]}" download golang-1.15-go golang-1.15-src >/dev/null
for d in golang-1.15-*.deb; do dpkg -x "$d" "$WORK/go"; done
apt-get "${A[@]}" source --download-only kubernetes >/dev/null
mkdir -p "$WORK/src"
tar -xzf "kubernetes_${KUBE_DEB_UPSTREAM}.orig.tar.gz" -C "$WORK/src"
export GOROOT="$WORK/go/usr/lib/go-1.15"
cd "$WORK/src/$KUBE_TREE"
unset GOFLAGS GOPATH GOBIN GOOS GOARCH GO111MODULE
export PATH="$GOROOT/bin:$PATH" GOPROXY=off KUBE_GIT_VERSION=$K8S_VERSION KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20
t=$SECONDS
make WHAT="cmd/kubelet cmd/kube-proxy" >"$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log" >&2; exit 1; }
o=_output/local/bin/linux/amd64; [ -d "$o" ] || o=_output/bin
# the pause image's binary, from the same tree (build/pause)
gcc -Os -Wall -static -DVERSION=v3.4-mirrorq -o "$CACHE/bin/pause" build/pause/linux/pause.c
cp "$o/kubelet" "$o/kube-proxy" "$CACHE/bin/"
say "built in $((SECONDS - t)) s: $("$CACHE/bin/kubelet" --version)"
