#!/usr/bin/env bash
# `make test`'s body: the whole suite but the tests marked `long`, in two phases,
# with what only the Kubernetes tests need prepared in the background meanwhile.
#
#   1. k8s/build.sh (the control plane, kubelet and kube-proxy: about 11 min cold,
#      instant once cached) and then k8s/image.sh (the broker's image, about 2 min)
#      start in the background at nice 19: they take the CPU the tests leave idle
#      (waits for elections, timeouts, restarts) and yield it at once to the tests,
#      whose timing bounds are written for 2 cores of their own.
#   2. Every test outside tests/k8s and the background lane below, the cluster tests last
#      (the load tests with timing bounds: by then a cold build has had the most time to
#      finish). The build's temporary tree goes to /dev/shm when it has room, so that its
#      writes do not queue in front of the brokers' fsyncs.
#   3. The Kubernetes tests, once the background job is done (its log is printed if it
#      failed), with the image it built; beside them, at nice 19, the background lane:
#      `make lint` (ruff, mypy) and the tests that start no broker and bound no time
#      (the Spark history checker's tests, the fuzz smoke run, the bench helpers, the
#      layer and testing-doc rules), which take the CPU the kubelet's pods leave idle.
#      Its output is printed after. (make test-fast runs lint first, for quick feedback.)
#
# Each phase writes a JUnit XML file under $RESULTS; tests/slowest.py prints the 40
# slowest of both (.ci/run prints them again at the very end of its output).
# Usage: tests/suite.sh [PYTEST_ARGS...]   (extra arguments go to both phases)
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
RESULTS=${RESULTS:-data/test-results}
IMAGE_REF=localhost/mirrorq:e2e  # tests/k8s/conftest.py IMAGE_REF
mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.xml
touch "$RESULTS/main.xml.start"  # (what this run wrote is newer)
t0=$(date +%s)

prep_log="$RESULTS/k8s-prep.log"
prep() {
  if [ -z "${MIRRORQ_K8S_BUILD_TMP:-}" ] && [ -d /dev/shm ] \
      && [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -gt $((5 * 1024 * 1024)) ]; then
    export MIRRORQ_K8S_BUILD_TMP=/dev/shm
  fi
  bash k8s/build.sh || return 1
  [ "$(id -u)" = 0 ] || return 0  # the image and the kubelet tests need root
  command -v mmdebstrap >/dev/null 2>&1 || return 0  # built (and reported) by the fixture
  local s; s=$(date +%s)
  bash k8s/image.sh "$IMAGE_REF" || return 1
  echo "suite: image $IMAGE_REF built in $(( $(date +%s) - s )) s"
}
# its own process group (setsid), so that an interrupted run stops all of it
setsid nice -n 19 bash -c "$(declare -f prep); IMAGE_REF=$IMAGE_REF; prep" > "$prep_log" 2>&1 &
prep_pid=$!
trap 'kill -- -"$prep_pid" 2>/dev/null; [ -n "${lane_pid:-}" ] && kill "$lane_pid" 2>/dev/null; exit 130' INT TERM

# the background lane: no broker processes, no time bounds (see above)
LANE=(tests/analysis tests/fuzz tests/bench tests/test_layers.py tests/test_testing_doc.py)

common=(-q -p no:cacheprovider -m "not long")
first=()  # every folder and file of tests/ but k8s and the lane, tests/cluster last
for t in tests/*/ tests/test_*.py; do
  t=${t%/}
  case " tests/k8s tests/cluster tests/support tests/data tests/java ${LANE[*]} " in
    *" $t "*) ;;
    *) first+=("$t") ;;
  esac
done
first+=(tests/cluster)
"$PY" -m pytest "${common[@]}" --junitxml="$RESULTS/main.xml" "${first[@]}" "$@"
rc_main=$?
echo "suite: the first phase (all but tests/k8s and the background lane): exit $rc_main in $(( $(date +%s) - t0 )) s"

w0=$(date +%s)
wait "$prep_pid"
rc_prep=$?
echo "suite: waited $(( $(date +%s) - w0 )) s for the Kubernetes build and image (exit $rc_prep)"
if [ "$rc_prep" != 0 ]; then
  echo "suite: the background k8s/build.sh or k8s/image.sh failed; its log:" >&2
  tail -n 60 "$prep_log" >&2
  rc_k8s=1
fi
t1=$(date +%s)
lane_log="$RESULTS/background-lane.log"
# shellcheck disable=SC2016
nice -n 19 bash -c 'make --no-print-directory lint; lint=$?
  "$0" -m pytest "$@"; rc=$?
  echo "suite: lint (ruff, mypy) exit $lint"
  [ "$lint" = 0 ] && [ "$rc" = 0 ]' "$PY" "${common[@]}" --junitxml="$RESULTS/lane.xml" "${LANE[@]}" "$@" \
  > "$lane_log" 2>&1 &
lane_pid=$!
if [ "$rc_prep" = 0 ]; then
  MIRRORQ_PREBUILT_IMAGE=$IMAGE_REF "$PY" -m pytest "${common[@]}" \
    --junitxml="$RESULTS/k8s.xml" tests/k8s "$@"
  rc_k8s=$?
  echo "suite: tests/k8s: exit $rc_k8s in $(( $(date +%s) - t1 )) s"
fi
wait "$lane_pid"
rc_lane=$?
echo "suite: the background lane (lint, ${LANE[*]}): exit $rc_lane, done $(( $(date +%s) - t1 )) s after it started; its output:"
cat "$lane_log"

chaos_log=data/chaos-ci/suite.log  # tests/chaos/test_ci_subset.py's run of the CI chaos subset
if [ -f "$chaos_log" ] && [ "$chaos_log" -nt "$RESULTS/main.xml.start" ]; then
  echo "suite: the CI chaos subset (tests/chaos/test_ci_subset.py):"
  sed -n '/^| experiment/,$p' "$chaos_log"
fi
"$PY" tests/slowest.py "$RESULTS"/*.xml
echo "suite: make test's pytest phases took $(( $(date +%s) - t0 )) s in all"
[ "$rc_main" = 0 ] && [ "$rc_k8s" = 0 ] && [ "$rc_lane" = 0 ]
