#!/usr/bin/env bash
# make bench: measured speed and scale of the agent, the webhook, convergence and the data plane.
# Not part of `make test`. Needs the control-plane tools and Envoy (make tools); builds oha (the
# load generator, from crates.io) into .cache/tools once, the workspace in release mode, runs the
# agent's criterion benches, then `aether-bench`, which starts the real components, prints the
# sections below and writes docs/benchmarks.md.
#
# Environment: BENCH_REPS (3), BENCH_SECS (4), BENCH_CHANGES (50), BENCH_REPINS (20), BENCH_FLOOD_FILES
# (100000), BENCH_FLOOD_BASELINE (another aether-agent binary section 3g also measures), BENCH_SECTIONS
# (agent,webhook,convergence,gateway,repin,flood,dataplane,proxy-memory,continuity,rss,per-change,fleet,nodes; repin, flood and nodes need root), BENCH_OUT (docs/benchmarks.md; "-" = do
# not write).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
cargo=${CARGO:-cargo}
tools=$root/.cache/tools
out_dir=$root/target/aether-bench
sections=${BENCH_SECTIONS:-agent,webhook,convergence,gateway,repin,flood,dataplane,proxy-memory,continuity,rss,per-change,fleet,nodes}

log() { printf '\n== %s\n' "$*" >&2; }

if [[ ! -x $tools/bin/oha ]]; then
  log "installing oha (HTTP load generator) into .cache/tools (once; takes minutes)"
  "$cargo" install oha --locked --root "$tools"
fi

log "building the workspace (release)"
"$cargo" build --release --workspace --bins
if [[ ,$sections, == *,nodes,* ]]; then
  # Section 7 runs the real nodes' images, packed from the debug binaries (tests/harness/images.sh).
  log "building the workspace (debug, for the real nodes' images)"
  "$cargo" build --workspace --bins
fi

mkdir -p "$out_dir"
if [[ ,$sections, == *,agent,* ]]; then
  log "agent: criterion benches (fold and render scale) and memory per pod"
  AETHER_BENCH_OUT=$out_dir CRITERION_HOME=$out_dir/criterion \
    "$cargo" bench -p aether-agent-reconciler --bench scale -- --noplot
  AETHER_BENCH_OUT=$out_dir "$cargo" bench -p aether-agent-reconciler --bench memory
fi

log "webhook, convergence and data plane against the real components"
args=(--oha "$tools/bin/oha" --agent-out "$out_dir" --criterion "$out_dir/criterion"
  --reps "${BENCH_REPS:-3}" --secs "${BENCH_SECS:-4}" --changes "${BENCH_CHANGES:-50}" --repins "${BENCH_REPINS:-20}"
  --flood-files "${BENCH_FLOOD_FILES:-100000}"
  --sections "$sections")
if [[ ${BENCH_OUT:-} == - ]]; then args+=(--no-write); else args+=(--out "${BENCH_OUT:-$root/docs/benchmarks.md}"); fi
"$root/target/release/aether-bench" "${args[@]}"
