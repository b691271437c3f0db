#!/usr/bin/env bash
# The demo: a real kube-apiserver + etcd on loopback, the EndpointPolicy CRD, aether-controller's
# TLS admission webhook registered by URL, then `kubectl apply` of every example policy in
# crds/examples/ and what kubectl printed, then `kubectl get epol`. Then the node side: aether-agent
# and a real Envoy bootstrapped to its ADS, a Pod whose app listens only on a Unix socket in its
# emptyDir (the script plays kubelet), and curl through Envoy while a policy and an annotation
# switch delivery live. Cleans up on exit.
# Run it with `make demo` (which builds what it needs first).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}/bin
work=$(mktemp -d /tmp/adXXXX)   # short: socket paths under it must fit in sun_path
controller_pid=
agent_pid=
envoy_pid=
echo_pid=

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
cleanup() {
  step "cleaning up"
  for pid in "$echo_pid" "$envoy_pid" "$agent_pid" "$controller_pid"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
  "$repo/tests/harness/controlplane.sh" stop "$work/cp" || true
  rm -rf "$work"
}
trap cleanup EXIT
# wait_for 'shell condition': true once it holds, false after 10 s.
wait_for() { for _ in $(seq 1 50); do eval "$1" && return 0; sleep 0.2; done; return 1; }

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
  sed -n '2,$p' "$f" | sed -n '/^#/p' | sed 's/^/    /'
  kubectl apply -f "$f" 2>&1 | sed 's/^/    /' || true
done

step "status: kubectl create service clusterip echo (grpc-api has none), then a second policy for echo"
kubectl create service clusterip echo --tcp=8080 2>&1 | sed 's/^/    /'
echo "    kubectl apply of echo-uds-b (targets Service echo too; kubectl prints the webhook's warnings):"
kubectl apply -f - 2>&1 <<EPOL | sed 's/^/    /'
apiVersion: config.aether.io/v1
kind: EndpointPolicy
metadata: {name: echo-uds-b}
spec:
  targetRef: {kind: Service, name: echo}
  udsSocket: sockets/b.sock
EPOL
status_of() { kubectl get epol "$1" -o jsonpath='{.status.conditions[?(@.type=="Accepted")].reason}' 2>/dev/null; }
wait_for '[ "$(status_of echo-uds)" = Accepted ] && [ "$(status_of echo-uds-b)" = Conflicted ] && [ "$(status_of grpc-api-uds)" = TargetNotFound ]' || true

step "kubectl get epol (ACCEPTED is the status writer's Accepted condition)"
kubectl get epol
kubectl get epol -o custom-columns='NAME:.metadata.name,REASON:.status.conditions[0].reason,GEN:.status.conditions[0].observedGeneration,MESSAGE:.status.conditions[0].message' | sed 's/^/    /'

step "kubectl get events (the status writer records each change of reason)"
kubectl get events --field-selector reason=Conflicted 2>&1 | sed 's/^/    /'

step "kubectl delete epol echo-uds: the next policy by name, echo-uds-b, is promoted"
kubectl delete epol echo-uds | sed 's/^/    /'
wait_for '[ "$(status_of echo-uds-b)" = Accepted ]' || true
kubectl get epol | sed 's/^/    /'

step "the same decisions offline: aether-controller validate -f crds/examples/*.yaml"
"$repo/target/debug/aether-controller" validate -f "$repo"/crds/examples/*.yaml || true

step "what the webhook logged"
sed 's/^/    /' "$work/controller.log" | grep -E "decided|listening" | tail -n 12

# ------------------------------------------------------------------------------ the node side
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pods_dir=$work/pods
mkdir -p "$pods_dir" "$work/run" "$work/state"
step "starting aether-agent (node demo-node, pods dir $pods_dir) and a real Envoy bootstrapped to its ADS"
agent_admin=$(free_port)
"$repo/target/debug/aether-agent" run --node-name demo-node --kubelet-pods-dir "$pods_dir" \
  --state-dir "$work/state" --xds-address "unix://$work/run/xds.sock" --health-socket "$work/run/health.sock" \
  --admin-addr "127.0.0.1:$agent_admin" --recheck-seconds 2 >"$work/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$agent_admin/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "http://127.0.0.1:$agent_admin/readyz" | sed 's/^/    /'
envoy=$("$repo/tests/harness/install-envoy.sh")
inbound=$(free_port); envoy_admin=$(free_port)
cat >"$work/envoy.json" <<JSON
{
  "node": {"id": "demo-node", "cluster": "aether"},
  "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": $envoy_admin}}},
  "dynamic_resources": {
    "ads_config": {"api_type": "GRPC", "transport_api_version": "V3",
                   "grpc_services": [{"envoy_grpc": {"cluster_name": "aether_xds"}}]},
    "cds_config": {"ads": {}, "resource_api_version": "V3"},
    "lds_config": {"ads": {}, "resource_api_version": "V3"}
  },
  "static_resources": {
    "clusters": [{"name": "aether_xds", "type": "STATIC", "connect_timeout": "1s",
      "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}},
      "load_assignment": {"cluster_name": "aether_xds", "endpoints": [{"lb_endpoints": [{"endpoint":
        {"address": {"pipe": {"path": "$work/run/xds.sock"}}}}]}]}}],
    "listeners": [{"name": "inbound", "address": {"socket_address": {"address": "127.0.0.1", "port_value": $inbound}},
      "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
          "stat_prefix": "inbound",
          "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster_header": "x-aether-cluster", "timeout": "5s"}}]}]},
          "http_filters": [{"name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}]
  }
}
JSON
"$envoy" -c "$work/envoy.json" --disable-hot-restart --concurrency 1 --base-id-path "$work/envoy.base-id" \
  --log-path "$work/envoy.log" >/dev/null 2>&1 &
envoy_pid=$!
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$envoy_admin/ready" >/dev/null 2>&1 && break; sleep 0.1; done
echo "    envoy $("$envoy" --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*' | head -n1): inbound 127.0.0.1:$inbound (routes by header x-aether-cluster), admin :$envoy_admin"

step "creating Pod shop/echo-1 on demo-node (managed, emptyDir volume \"s\"); playing kubelet: its app listens on the socket only"
kubectl create namespace shop >/dev/null
kubectl create serviceaccount -n shop echo >/dev/null
kubectl create service clusterip -n shop echo --tcp=8080 >/dev/null
kubectl apply -f - <<POD
apiVersion: v1
kind: Pod
metadata:
  name: echo-1
  namespace: shop
  labels: {aether.io/managed: "true"}
spec:
  nodeName: demo-node
  serviceAccountName: echo
  containers: [{name: app, image: registry.example/uds-echo:demo}]
  volumes: [{name: s, emptyDir: {}}]
POD
uid=$(kubectl get pod -n shop echo-1 -o jsonpath='{.metadata.uid}')
vol=$pods_dir/$uid/volumes/kubernetes.io~empty-dir/s
mkdir -p "$vol"
"$repo/target/debug/uds-echo" --socket "$vol/app.sock" --name echo-1 2>/dev/null &
echo_pid=$!
echo "    app socket: $vol/app.sock"

through_envoy() {
  local code
  code=$(curl -s -o "$work/body" -w '%{http_code}' -H "x-aether-cluster: app_shop_echo-1_8080" "http://127.0.0.1:$inbound/hello")
  echo "    curl -H 'x-aether-cluster: app_shop_echo-1_8080' http://127.0.0.1:$inbound/hello -> $code $(head -c 160 "$work/body")"
}
endpoint() {
  curl -s "http://127.0.0.1:$envoy_admin/config_dump?resource=dynamic_active_clusters" | python3 -c '
import json, sys
for c in json.load(sys.stdin).get("configs", []):
    c = c["cluster"]
    if c["name"] == "app_shop_echo-1_8080":
        print("    Envoy cluster app_shop_echo-1_8080 dials", json.dumps(c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]))
        break
else:
    print("    Envoy has no cluster app_shop_echo-1_8080 (TCP delivery, and the pod has no IP here)")'
}
pipe_up() { curl -s -H "x-aether-cluster: app_shop_echo-1_8080" "http://127.0.0.1:$inbound/hello" | grep -q "over unix"; }

step "no annotation, no policy: TCP"
sleep 1; endpoint; through_envoy

step "kubectl apply an EndpointPolicy for Service shop/echo: socket s/app.sock"
kubectl apply -f - <<EPOL
apiVersion: config.aether.io/v1
kind: EndpointPolicy
metadata: {name: echo-uds, namespace: shop}
spec:
  targetRef: {kind: Service, name: echo}
  udsSocket: s/app.sock
EPOL
wait_for pipe_up || true
endpoint; through_envoy
kubectl get epol -n shop | sed 's/^/    /'
echo "    health gateway: curl --unix-socket $work/run/health.sock http://localhost/healthz/health_shop_echo-1 -> $(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$work/run/health.sock" http://localhost/healthz/health_shop_echo-1)"

step "kubectl delete the policy: back to TCP"
kubectl delete epol -n shop echo-uds
wait_for '! pipe_up' || true
endpoint; through_envoy

step "kubectl annotate the pod endpoint.aether.io/uds-socket=s/app.sock: the annotation path"
kubectl annotate pod -n shop echo-1 endpoint.aether.io/uds-socket=s/app.sock
wait_for pipe_up || true
endpoint; through_envoy

step "Pod shop/echo-2 annotated s/a-very-long-socket-name.sock (over this node's budget): one Event on the pod"
kubectl apply -f - <<POD
apiVersion: v1
kind: Pod
metadata:
  name: echo-2
  namespace: shop
  labels: {aether.io/managed: "true"}
  annotations: {endpoint.aether.io/uds-socket: s/a-very-long-socket-name.sock}
spec:
  nodeName: demo-node
  serviceAccountName: echo
  containers: [{name: app, image: registry.example/uds-echo:demo}]
  volumes: [{name: s, emptyDir: {}}]
POD
wait_for 'kubectl get events -n shop --field-selector involvedObject.name=echo-2 -o name 2>/dev/null | grep -q .' || true
kubectl label pod -n shop echo-2 demo=resync >/dev/null   # an unrelated update: no second Event
sleep 1
kubectl get events -n shop --field-selector involvedObject.name=echo-2 \
  -o custom-columns='TYPE:.type,REASON:.reason,COUNT:.count,FROM:.reportingComponent,MESSAGE:.message' | sed 's/^/    /'

step "metrics: aether-agent /metrics and aether-controller /metrics (excerpts)"
curl -s "http://127.0.0.1:$agent_admin/metrics" \
  | grep -E '^aether_(agent_pods|agent_tcp_fallbacks\{reason="path-too-long"|agent_pod_events_total|xds_(pushes|acks|nacks)_total|xds_change_to_ack_seconds_count)' \
  | grep -v ' 0$' | sed 's/^/    /'
curl -s "http://127.0.0.1:$admin/metrics" \
  | grep -E '^aether_(admission_requests_total|admission_warnings_total|status_patches_total|status_leader)' | sed 's/^/    /'

step "what the agent logged"
grep -E "delivering|declared|CRD|budget" "$work/agent.log" | sed 's/^/    /' | tail -n 8

step "offline: aether-agent plan of the same pod manifest"
kubectl get pod -n shop echo-1 -o yaml >"$work/pod.yaml"
"$repo/target/debug/aether-agent" plan --pods "$work/pod.yaml" --kubelet-pods-dir "$pods_dir" | sed 's/^/    /'
