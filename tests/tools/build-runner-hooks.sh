#!/bin/sh
# Builds actions/runner-container-hooks' k8s hook at the released versions that
# tests/sizing/test_runner_merges.py runs (tests/runner_hooks.py), with node and npm: the sources from
# a clone of https://github.com/actions/runner-container-hooks (its tags), the dependencies from the
# npm registry (`npm ci`, each package's own lock file). The hooks are not on the npm registry, so a
# machine without the clone or the registry cannot build them, and those tests skip, saying so.
#
#   tests/tools/build-runner-hooks.sh ~/src/runner-container-hooks /tmp/runner-hooks
#   CI_SIZER_RUNNER_HOOKS=/tmp/runner-hooks pytest tests/sizing/test_runner_merges.py
set -eu
src=$1
out=$2
for version in v0.7.0 v0.8.1; do
  rm -rf "${out:?}/$version"
  mkdir -p "$out/$version"
  git -C "$src" archive "$version" packages tsconfig.json | tar -x -C "$out/$version"
  for package in hooklib k8s; do
    (cd "$out/$version/packages/$package" && npm ci --no-audit --no-fund --ignore-scripts >/dev/null && npx --no-install tsc)
  done
  echo "built $out/$version/packages/k8s/lib/index.js"
done
