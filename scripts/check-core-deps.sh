#!/usr/bin/env bash
# make lint: the agent's pure core (aether-agent-core) must stay free of I/O runtimes. Fails, naming
# the crates, if its normal dependency tree holds an async runtime, an HTTP/gRPC stack or the
# Kubernetes client, so every rule stays testable with plain values (docs/design-notes.md, "Agent").
set -euo pipefail
cd "$(dirname "$0")/.."
forbidden='^(tokio|tokio-[a-z-]+|mio|hyper|hyper-[a-z-]+|h2|tonic|tonic-[a-z-]+|tower|tower-[a-z-]+|axum|kube-client|kube-runtime|reqwest|rustls) '
tree=$(${CARGO:-cargo} tree -p aether-agent-core -e normal --prefix none)
found=$(grep -E "$forbidden" <<<"$tree" | awk '{print $1}' | sort -u || true)
if [[ -n $found ]]; then
  echo "aether-agent-core must not depend on: $(tr '\n' ' ' <<<"$found")" >&2
  echo "(see: cargo tree -p aether-agent-core -e normal -i <crate>)" >&2
  exit 1
fi
echo "aether-agent-core: $(sort -u <<<"$tree" | wc -l) crates in its tree, none of tokio/hyper/tonic/tower/axum/kube-client"
