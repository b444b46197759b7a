#!/bin/sh
# tests/data/release-<commit>.tar.gz: the node/ package of a release, the "old build"
# that tests/cluster/test_rolling_upgrade.py rolls a cluster from and whose data dir
# the new build must read. The tests extract it and run it with the same venv's python
# (harness/release.py); they never need git history (a CI clone may be shallow).
# node/ is all a node imports from the checkout at run time (its dependencies come from
# the venv; node/http/static and node/admin/admin.proto are inside node/).
#
# Refresh at each release (the commit main's HEAD is when it is tagged):
#     tests/data/make-release-fixture.sh <commit>      (default HEAD)
# It replaces the previous release-*.tar.gz: the tests take the only one there is.
set -eu
rel=${1:-HEAD}
cd "$(git rev-parse --show-toplevel)"
short=$(git rev-parse --short=7 "$rel^{commit}")
out=tests/data/release-$short.tar.gz
# -n: no name or time stamp in the gzip header (git archive sets the members' mtime
# to the commit's), so the same commit gives the same bytes
git archive --format=tar --prefix="release-$short/" "$short" node | gzip -9 -n > "$out.part"
for old in tests/data/release-*.tar.gz; do
    [ -e "$old" ] && [ "$old" != "$out" ] && git rm -q --cached --ignore-unmatch "$old" && rm -f "$old"
done
mv "$out.part" "$out"
echo "$out: $(tar tzf "$out" | grep -c '\.py$') .py files, $(wc -c < "$out") bytes"
