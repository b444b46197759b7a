#!/usr/bin/env bash
# Build mirrorq's OCI image (the broker, and the operator's `kopf run` beside it)
# from the Dockerfile without Docker and without a registry (issues 13, 30):
# Debian's mmdebstrap makes a bookworm root filesystem with
# Python 3.11 (what python:3.11-slim-bookworm carries), podman imports it as the
# base image, and buildah builds the Dockerfile on it (storage driver vfs,
# chroot isolation, the host's network for pip). Needs root and the Debian
# mirror and PyPI. Prints the image id and its size.
#
#   bash k8s/image.sh [TAG]          # default localhost/mirrorq:<the chart's appVersion>
#   bash k8s/image.sh --check        # then runs both entry points in it (runc)
set -euo pipefail
cd "$(dirname "$0")/.."

# the chart's default image (values.yaml image.repository, tag = appVersion)
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' helm/mirrorq/Chart.yaml)
TAG=localhost/mirrorq:${APP_VERSION:?no appVersion in helm/mirrorq/Chart.yaml}
CHECK=0
for a in "$@"; do
  case "$a" in
    --check) CHECK=1 ;;
    -*) echo "usage: $0 [--check] [TAG]" >&2; exit 2 ;;
    *) TAG="$a" ;;
  esac
done
BASE=localhost/mirrorq-base:bookworm
STORE=(--storage-driver vfs)

need=()
for tool in mmdebstrap buildah podman; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "image.sh: installing ${need[*]} (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

work=$(mktemp -d /var/tmp/mirrorq-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)
# python:slim has python3 + pip + venv on Debian bookworm; pip there may install
# into the system Python (the image is the environment), so PEP 668's guard is off
mmdebstrap --variant=minbase --quiet \
  --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,passwd \
  bookworm "$work/rootfs.tar"
podman "${STORE[@]}" import --quiet \
  --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'CMD ["python3"]' \
  "$work/rootfs.tar" "$BASE" >/dev/null
t1=$(date +%s)
# the build's downloads (pip from PyPI) trust what this machine trusts (e.g. an
# egress proxy's CA): its CA bundle is mounted for the RUN steps only, nothing of
# it stays in the image
buildah "${STORE[@]}" bud --quiet --isolation chroot --network host --layers=false \
  -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
  --build-arg "PYTHON_IMAGE=$BASE" -t "$TAG" -f Dockerfile .
t2=$(date +%s)
podman "${STORE[@]}" image inspect "$TAG" --format '{{.Id}} {{.Size}}' | \
  awk -v tag="$TAG" -v a=$((t1 - t0)) -v b=$((t2 - t1)) \
  '{printf "image.sh: %s id %.12s, %.0f MB (base %d s, build %d s)\n", tag, $1, $2/1e6, a, b}'
if [ "$CHECK" = 1 ]; then
  # podman's runtimes (crun, runc) set RLIMIT_NOFILE/NPROC, which this sandbox
  # refuses (EPERM) even at the current values: run it with runc directly from an
  # OCI bundle whose spec sets no rlimits (the image's user, read-only root)
  bundle="$work/bundle"
  mkdir -p "$bundle/rootfs"
  cid=$(podman "${STORE[@]}" create "$TAG")
  podman "${STORE[@]}" export "$cid" | tar -C "$bundle/rootfs" -xf -
  podman "${STORE[@]}" rm "$cid" >/dev/null
  command -v runc >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
  (cd "$bundle" && runc spec && python3 - <<'PY'
import json
c = json.load(open("config.json"))
p = c["process"]
# both entry points: the broker's, and the operator's handlers as `kopf run` imports them
p.update(args=["/bin/sh", "-c", "mirrorq --help | head -3 && kopf --version && "
               "python -c 'import mirrorq_operator.handlers; print(\"operator: importable\")'"],
         terminal=False, user={"uid": 10001, "gid": 10001})
p["env"] = p["env"] + ["PATH=/opt/mirrorq/bin:/usr/local/bin:/usr/bin:/bin"]
p.pop("rlimits", None)
c["root"]["readonly"] = True
json.dump(c, open("config.json", "w"))
PY
  runc run "mirrorq-check-$$")
fi
