#!/usr/bin/env bash
# The node shapes `make test` does not run (docs/compatibility.md): `make demo` once per lane, each
# on a fresh node (node.sh up/down inside the demo), one line per lane with its result and
# minutes, the demo's output in a log per lane. `make test` itself runs containerd 2.x, the
# single-node suite dual-stack and the two-node suite IPv4.
#
# Usage: scripts/test-matrix.sh [LANE ...]   (make test-matrix; default: every lane)
#   ipv6        AETHER_IP_FAMILY=ipv6: an IPv6-only node (API server, pods, Services, cluster DNS)
#   dual        AETHER_IP_FAMILY=dual: a dual-stack node, IPv4 primary
#   dual6       AETHER_IP_FAMILY=dual6: a dual-stack node, IPv6 primary
#   containerd1 AETHER_CONTAINERD=1: Debian's containerd 1.6 and runc 1.1
#   two-nodes   AETHER_NODES=2: two nodes, a cross-node call and a drain
#   two-nodes-dual  AETHER_NODES=2 AETHER_IP_FAMILY=dual: the same, dual-stack, each ClusterIP
#               family of a RequireDualStack Service called from both nodes
#   crio        AETHER_RUNTIME=crio: CRI-O instead of containerd (built the first time: minutes)
# Env: AETHER_MATRIX_LOGS (default .cache/matrix): where each lane's log goes.
# Exit: 0 when every lane passed, 1 otherwise. Needs root, as `make demo`.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
logs=${AETHER_MATRIX_LOGS:-$repo/.cache/matrix}
mkdir -p "$logs"

lane_env() {
  case $1 in
    ipv6) echo AETHER_IP_FAMILY=ipv6 ;;
    dual) echo AETHER_IP_FAMILY=dual ;;
    dual6) echo AETHER_IP_FAMILY=dual6 ;;
    containerd1) echo AETHER_CONTAINERD=1 ;;
    two-nodes) echo AETHER_NODES=2 ;;
    two-nodes-dual) echo AETHER_NODES=2 AETHER_IP_FAMILY=dual ;;
    crio) echo AETHER_RUNTIME=crio ;;
    *) return 1 ;;
  esac
}

lanes=("$@")
[ ${#lanes[@]} -gt 0 ] || lanes=(ipv6 dual dual6 containerd1 two-nodes two-nodes-dual crio)
for lane in "${lanes[@]}"; do
  lane_env "$lane" >/dev/null || { echo "test-matrix: unknown lane '$lane' (known: ipv6 dual dual6 containerd1 two-nodes two-nodes-dual crio)" >&2; exit 2; }
done

failed=0
results=()
for lane in "${lanes[@]}"; do
  env_kv=$(lane_env "$lane")
  log=$logs/$lane.log
  start=$SECONDS
  echo "[test-matrix] $lane: $env_kv make demo (log: $log) ..." >&2
  # shellcheck disable=SC2086 # one VAR=value word each
  if env $env_kv make -C "$repo" demo </dev/null >"$log" 2>&1; then
    result=pass
  else
    result="FAIL (exit $?; tail: $(tail -n 1 "$log"))"
    failed=1
  fi
  results+=("$(date -u +%F) $lane ($env_kv): $result in $(((SECONDS - start + 30) / 60)) min")
done
printf '%s\n' "${results[@]}"
exit $failed
