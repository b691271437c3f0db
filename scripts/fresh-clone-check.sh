#!/usr/bin/env bash
# The fresh-machine check before every stop: clones this repository's HEAD into a temporary folder
# and runs the README's two commands there, `make demo` then `make test`, each timed, so a missing
# install step shows here rather than in CI. The clone has no cargo target dir, no Envoy venv and
# no cargo-deny (a cached k8s-cri build would hide a missing protoc); it reuses only the Go-built
# tools (about 20 minutes cold) through AETHER_TOOLS_DIR, unless FRESH_COLD=1.
#
# Usage: scripts/fresh-clone-check.sh            (make fresh-check)
# Env:   AETHER_TOOLS_DIR  Go-built tools to reuse (default: <repo>/.cache/tools)
#        FRESH_COLD=1      reuse nothing: the clone builds its own tools into its own .cache
#        FRESH_DIR         where to clone (default: a new mktemp -d folder); kept afterwards,
#                          with make-demo.log and make-test.log, for reading
#        FRESH_STEPS       the make targets to run (default: "demo test"); the step `ci` runs
#                          .ci/run itself, as CI does (make lint, make tools, make test)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${FRESH_DIR:-$(mktemp -d /tmp/aether-fresh-XXXX)}
log() { printf '[fresh-check] %s\n' "$*" >&2; }

[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] \
  || log "note: uncommitted changes are not in the clone; it checks HEAD $(git -C "$repo" rev-parse --short HEAD)"
git clone -q "$repo" "$dir/aether"
cd "$dir/aether"
unset CARGO_TARGET_DIR AETHER_ENVOY AETHER_ENVOY_VENV AETHER_CARGO_TOOLS_DIR AETHER_IMAGES_DIR
if [ "${FRESH_COLD:-}" = 1 ]; then
  unset AETHER_TOOLS_DIR
  log "cold: the clone builds its own Go tools"
else
  export AETHER_TOOLS_DIR=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
  log "reusing the Go-built tools in $AETHER_TOOLS_DIR"
fi
log "clone of $(git rev-parse --short HEAD) in $dir/aether"
summary=()
for step in ${FRESH_STEPS:-demo test}; do
  log "make $step (log: $dir/make-$step.log) ..."
  start=$SECONDS
  rc=0
  if [ "$step" = ci ]; then run=(.ci/run); else run=(make "$step"); fi
  "${run[@]}" </dev/null >"$dir/make-$step.log" 2>&1 || rc=$?
  summary+=("make $step: exit $rc in $((SECONDS - start)) s")
  log "${summary[-1]}"
  if [ $rc -ne 0 ]; then
    tail -n 40 "$dir/make-$step.log" >&2
    break
  fi
done
printf '%s\n' "${summary[@]}"
[ "${rc:-0}" -eq 0 ]
