#!/usr/bin/env bash
# The demo: a real kube-apiserver + etcd on loopback, the EndpointPolicy CRD, aether-controller's
# TLS admission webhook registered by URL, then `kubectl apply` of every example policy in
# crds/examples/ and what kubectl printed, then `kubectl get epol`. Cleans up on exit.
# Run it with `make demo` (which builds what it needs first).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}/bin
work=$(mktemp -d /tmp/aether-demo.XXXXXX)
controller_pid=

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
cleanup() {
  step "cleaning up"
  [ -n "$controller_pid" ] && kill "$controller_pid" 2>/dev/null && wait "$controller_pid" 2>/dev/null || true
  "$repo/tests/harness/controlplane.sh" stop "$work/cp" || true
  rm -rf "$work"
}
trap cleanup EXIT

step "starting etcd + kube-apiserver (RBAC, ValidatingAdmissionWebhook) on loopback"
"$repo/tests/harness/controlplane.sh" start "$work/cp"
export KUBECONFIG=$work/cp/kubeconfig
kubectl() { "$tools/kubectl" "$@"; }
kubectl version 2>&1 | sed 's/^/    /' || true

step "installing the EndpointPolicy CRD (charts/aether-crds)"
kubectl apply --server-side -f "$repo/charts/aether-crds/templates/endpointpolicy-crd.yaml"
kubectl wait --for condition=Established --timeout 60s crd/endpointpolicies.config.aether.io

step "minting the webhook's CA and serving certificate (rcgen)"
"$repo/target/debug/aether-webhook-certs" mint --out-dir "$work/certs" --name 127.0.0.1 --name localhost

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
admin=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
step "starting aether-controller run (webhook https://127.0.0.1:$port/validate, admin :$admin)"
"$repo/target/debug/aether-controller" run --webhook-addr "127.0.0.1:$port" --admin-addr "127.0.0.1:$admin" \
  --tls-dir "$work/certs" --kubelet-pods-dir /var/lib/kubelet/pods >"$work/controller.log" 2>&1 &
controller_pid=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$admin/readyz"

step "registering the ValidatingWebhookConfiguration (endpointpolicies CREATE/UPDATE, failurePolicy Fail)"
"$repo/tests/harness/controlplane.sh" register-webhook "$work/cp" "https://127.0.0.1:$port/validate" "$work/certs/ca.crt"

for f in "$repo"/crds/examples/*.yaml; do
  step "kubectl apply -f crds/examples/$(basename "$f")    ($(head -n1 "$f" | sed 's/^# //'))"
  sed -n '2,3p' "$f" | sed 's/^/    /'
  kubectl apply -f "$f" 2>&1 | sed 's/^/    /' || true
done

step "kubectl get epol"
kubectl get epol

step "the same decisions offline: aether-controller validate -f crds/examples/*.yaml"
"$repo/target/debug/aether-controller" validate -f "$repo"/crds/examples/*.yaml || true

step "what the webhook logged"
sed 's/^/    /' "$work/controller.log" | grep -E "decided|listening" | tail -n 12
