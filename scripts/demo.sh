#!/usr/bin/env bash
# The demo, on a real node: kubelet + containerd + controller-manager + scheduler + kube-proxy +
# CoreDNS (tests/harness/node.sh) with images built from this workspace (no registry), `helm install` of
# both charts, the installed webhook answering `kubectl apply` through its Service, policy status
# and warnings, a UDS-only app whose socket in its emptyDir the node's Envoy reaches at the
# kubelet's path, a policy switching a pod to its socket and back, a pod Event for a socket over
# the budget, both binaries' metrics, and `helm uninstall`.
#
# AETHER_RUNTIME=crio runs the node on CRI-O instead of containerd (tests/harness/node.sh says
# what that changes); the chart is then told CRI-O's socket (agent.criSocket).
#
# It needs root and changes the host while it runs (a bridge aether0 with 10.244.77.1/24, iptables
# chains, net.ipv4.ip_forward and the sysctls kubelet sets, /run/netns as a shared mount,
# /var/lib/kubelet); everything is restored on exit, Ctrl-C included. Run it with `make demo`.
set -euo pipefail
# Several nodes (AETHER_NODES=2 make demo): the cross-node call and a drain (scripts/demo-nodes.sh).
[ "${AETHER_NODES:-1}" = 1 ] || exec "$(dirname "$0")/demo-nodes.sh"
repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}/bin
NS=aether-system
NODE_NS=aether-node

# shellcheck source=scripts/demo-common.sh
. "$repo/scripts/demo-common.sh"

cat <<'NOTE'
This demo runs a real single-node Kubernetes cluster on this machine. While it runs it changes the
host: a bridge aether0 (10.244.77.1/24) with a route for the Service range 10.96.0.0/16, iptables
chains (kubelet, kube-proxy, AETHER-NODE), net.ipv4.ip_forward and the sysctls kubelet sets,
/run/netns made a shared mount, /var/lib/kubelet and /run/aether. All of it is restored when the
demo ends, also on Ctrl-C.
NOTE
[ "$(id -u)" = 0 ] || { echo "demo: needs root (it starts containerd and kubelet); run: sudo make demo" >&2; exit 1; }

work=$(mktemp -d /tmp/aether-demo-XXXX)
# What the demo checks and found wrong: it goes on to the end, then says so and exits 1.
failed=()
teardown() {
  step "restoring the host (tests/harness/node.sh down $work)"
  "$repo/tests/harness/node.sh" down "$work" 2>&1 | tail -n 3 | indent
}
trap teardown EXIT
trap 'exit 130' INT TERM

step "bringing up a real node (${AETHER_RUNTIME:-containerd}, kubelet, controller-manager, scheduler, kube-proxy, CoreDNS; images imported)"
"$repo/tests/harness/node.sh" up "$work" 2>&1 | grep -E '^\[(node|dns)' | indent
# shellcheck disable=SC1091
. "$work/env"
kubectl get nodes -o wide | indent
if [ -n "${AETHER_DEMO_REGISTRY:-}" ]; then
  [ "${AETHER_RUNTIME:-containerd}" = containerd ] || { echo "demo: AETHER_DEMO_REGISTRY needs containerd" >&2; exit 1; }
  registry_hosts "$work/containerd"
  echo "  (charts and the controller and agent images from the registry at $AETHER_DEMO_REGISTRY)"
fi
# What the chart needs to know of this node beyond the README's install (node.sh's
# AETHER_CHART_SETS: CRI-O's socket, no priority class where critical pods cannot start).
node_values=()
for s in $AETHER_CHART_SETS; do node_values+=(--set "$s"); done
[ ${#node_values[@]} -eq 0 ] || echo "  (this node: ${node_values[*]})"

from="the packaged charts of make charts, the release images of make images"
[ -z "${AETHER_DEMO_REGISTRY:-}" ] || from="the charts and the controller and agent images pulled from $AETHER_DEMO_REGISTRY"
step "helm install aether-crds; helm install aether -n $NS --set daemonset.namespace=$NODE_NS --wait --wait-for-jobs (the README's install: $from)"
helm install aether-crds "${crds_chart[@]}" --wait | grep -E '^(NAME|STATUS)' | indent
echo "  \$ kubectl create namespace $NS    (the controller's; the chart makes $NODE_NS for the node pods, labelled privileged)"
kubectl create namespace $NS | indent
helm install aether "${aether_chart[@]}" -n $NS --set daemonset.namespace=$NODE_NS --wait --wait-for-jobs --timeout 300s "${images[@]}" "${node_values[@]}" \
  | grep -E '^(NAME|STATUS)' | indent
kubectl get pods -A -o wide | indent
if [ -n "${AETHER_DEMO_REGISTRY:-}" ]; then
  # Each container of the release's controller and agent images, pulled from the registry: its
  # imageID is the registry's digest reference (an image imported by hand has none there).
  ids=$(kubectl get pods -n $NS -o jsonpath='{range .items[*]}{range .status.initContainerStatuses[*]}{.image} {.imageID}{"\n"}{end}{range .status.containerStatuses[*]}{.image} {.imageID}{"\n"}{end}{end}'
    kubectl get pods -n $NODE_NS -o jsonpath='{range .items[*]}{range .status.initContainerStatuses[*]}{.image} {.imageID}{"\n"}{end}{range .status.containerStatuses[*]}{.image} {.imageID}{"\n"}{end}{end}')
  pulled=$(grep -E "^$AETHER_DEMO_REGISTRY/aether-(controller|agent):" <<<"$ids" | sort -u || true)
  printf '%s\n' "$pulled" | indent
  bad=$(awk -v r="$AETHER_DEMO_REGISTRY/" '$2 !~ "^" r { print }' <<<"$pulled")
  if [ -z "$pulled" ] || [ -n "$bad" ]; then
    failed+=("the controller and agent containers run images pulled from $AETHER_DEMO_REGISTRY (got: ${bad:-none})")
  fi
fi
echo "  \$ helm test aether -n $NS    (aether-controller verify-install: webhook denial, admission, every agent's /readyz)"
helm test aether -n $NS 2>&1 | grep -E '^(TEST SUITE|Phase|Error)' | sort -u | indent || true

step "kubectl apply of each example: kube-apiserver calls the installed webhook through its Service"
kubectl create service clusterip echo --tcp=8080 | indent
for f in "$repo"/crds/examples/*.yaml; do
  echo "  \$ kubectl apply -f crds/examples/$(basename "$f")    ($(head -n1 "$f" | sed 's/^# //'))"
  # A deny-* example is refused (by the CRD's rules or the webhook), an ok-* one admitted.
  rc=0; out=$(kubectl apply -f "$f" 2>&1) || rc=$?
  printf '%s\n' "$out" | indent
  case $(basename "$f"):$rc in
    deny-*:0) failed+=("crds/examples/$(basename "$f") was admitted") ;;
    ok-*:[1-9]*) failed+=("crds/examples/$(basename "$f") was refused") ;;
  esac
done
echo "  \$ kubectl apply of echo-uds-b (a second policy for Service echo: kubectl prints the webhook's warning)"
kubectl apply -f - 2>&1 <<'EPOL' | indent
apiVersion: config.aether.io/v1
kind: EndpointPolicy
metadata: {name: echo-uds-b, namespace: default}
spec:
  targetRef: {kind: Service, name: echo}
  udsSocket: sockets/b.sock
EPOL
for _ in $(seq 1 50); do
  [ "$(kubectl get epol echo-uds-b -o jsonpath='{.status.conditions[0].reason}')" = Conflicted ] && break; sleep 0.2
done
kubectl get epol | indent
kubectl get epol -o wide | indent
kubectl delete epol --all >/dev/null

app() { # app NAME ANNOTATION TCP: a managed pod serving uds-echo on /s/app.sock (and on TCP :8080 with TCP=tcp)
  cat <<Y
apiVersion: v1
kind: ServiceAccount
metadata: {name: $1, namespace: default}
---
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  labels: {aether.io/managed: "true", app: $1}
  annotations: {$2}
spec:
  serviceAccountName: $1
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: app, image: localhost/aether/uds-echo:dev, imagePullPolicy: Never, args: [--socket, /s/app.sock, --name, $1], volumeMounts: [{name: s, mountPath: /s}]}
$( [ "$3" = tcp ] && echo "  - {name: tcp, image: localhost/aether/uds-echo:dev, imagePullPolicy: Never, args: [--tcp, '0.0.0.0:8080', --name, $1-tcp]}" )
  volumes: [{name: s, emptyDir: {}}]
Y
}
admin=/run/aether/envoy/admin.sock   # Envoy's admin: a root-only Unix socket (docs/design-notes.md)
endpoint() { curl -s --unix-socket "$admin" "http://localhost/clusters" | grep -E "^$1::.*::health_flags::" || echo "    ($1: not in Envoy)"; }
wait_endpoint() { for _ in $(seq 1 150); do endpoint "$1" | grep -- "$2.*::healthy" >/dev/null && return 0; sleep 0.2; done; return 1; }

# The Quickstart's workload and request, with the README's own files (examples/quickstart/).
step "the Quickstart's workload: Service echo in namespace shop, its pod serving only on uds/app.sock; the policy crds/examples/ok-echo-uds.yaml"
echo "  \$ kubectl apply -f examples/quickstart/echo.yaml"
kubectl apply -f "$repo/examples/quickstart/echo.yaml" | indent
echo "  \$ kubectl -n shop apply -f crds/examples/ok-echo-uds.yaml    (no warning: 12 bytes, 4 to spare)"
kubectl -n shop apply -f "$repo/crds/examples/ok-echo-uds.yaml" 2>&1 | indent
for _ in $(seq 1 50); do
  [ "$(kubectl -n shop get epol echo-uds -o jsonpath='{.status.conditions[0].reason}')" = Accepted ] && break; sleep 0.2
done
kubectl -n shop get epol | indent
[ "$(kubectl -n shop get epol echo-uds -o jsonpath='{.status.conditions[0].reason}')" = Accepted ] \
  || failed+=("policy shop/echo-uds did not report Accepted")
echo "  \$ kubectl -n shop rollout status deploy/echo    (Ready once the kubelet's probe of <pod IP>:8080 reaches the socket)"
kubectl -n shop rollout status deploy/echo --timeout=120s | indent
pod=$(kubectl -n shop get pod -l app=echo -o jsonpath='{.items[0].metadata.name}')
uid=$(kubectl -n shop get pod "$pod" -o jsonpath='{.metadata.uid}')
sock=/var/lib/kubelet/pods/$uid/volumes/kubernetes.io~empty-dir/uds/app.sock
echo "  the socket the app made, at the kubelet's emptyDir path ($(printf %s "$sock" | wc -c) bytes):"
ls -l "$sock" | indent
echo "  Envoy (in the aether-proxy pod) health-checks it (through the agent's pin /run/aether-pins/<uid>.sock, the chart's default):"
wait_endpoint "app_shop_${pod}_8080" "$uid" || true
endpoint "app_shop_${pod}_8080" | indent
health() { curl -s -o /dev/null -w '%{http_code}' --unix-socket /run/aether/health.sock "http://localhost/healthz/$1"; }
for _ in $(seq 1 100); do [ "$(health "health_shop_$pod")" = 200 ] && break; sleep 0.2; done
echo "  \$ curl --unix-socket /run/aether/health.sock http://localhost/healthz/health_shop_$pod"
echo "    HTTP $(health "health_shop_$pod")"
echo "  Envoy's listeners (\$ curl --unix-socket $admin http://localhost/listeners): inbound_shop_${pod}_8080 is bound in the pod's network namespace"
curl -s --unix-socket "$admin" http://localhost/listeners | indent

step "the Quickstart's request: a client pod calls Service echo by name -> ClusterIP -> pod IP:8080 (Envoy's listener) -> the socket"
echo "  \$ kubectl apply -f examples/quickstart/client.yaml"
kubectl apply -f "$repo/examples/quickstart/client.yaml" | indent
kubectl -n shop wait --for=jsonpath='{.status.phase}'=Succeeded pod/client --timeout=60s >/dev/null || true
echo "  \$ kubectl -n shop logs client"
out=$(kubectl -n shop logs client 2>&1) || true
printf '%s\n' "$out" | indent
grep -q 'over unix:/uds/app.sock' <<<"$out" || failed+=("the Quickstart's request was not served over the socket")

if [ "${AETHER_IP_FAMILY:-ipv4}" = dual ] || [ "${AETHER_IP_FAMILY:-ipv4}" = dual6 ]; then
  step "dual-stack: Service echo-dual (ipFamilyPolicy: RequireDualStack) reaches the socket over IPv4 and over IPv6"
  dual_service shop echo-dual echo
  for ip in $(kubectl -n shop get service echo-dual -o jsonpath='{.spec.clusterIPs[*]}'); do
    host=$(url_host "$ip")
    name=client-$(case $ip in *:*) echo ipv6 ;; *) echo ipv4 ;; esac)
    sed -e "s/^  name: client$/  name: $name/" -e "s|http://echo.shop.svc.cluster.local:8080/hello|http://$host:8080/hello|" \
      "$repo/examples/quickstart/client.yaml" | kubectl apply -f - >/dev/null
    kubectl -n shop wait --for=jsonpath='{.status.phase}'=Succeeded "pod/$name" --timeout=60s >/dev/null || true
    echo "  \$ kubectl -n shop logs $name    (GET http://$host:8080/hello)"
    kubectl -n shop logs "$name" | indent
    kubectl -n shop logs "$name" | grep -q 'over unix:/uds/app.sock' || failed+=("ClusterIP $ip of Service echo-dual was not served over the socket")
    kubectl -n shop delete pod "$name" --wait=false >/dev/null
  done
  kubectl -n shop delete service echo-dual >/dev/null
fi

step "a policy switches pod shop (app on TCP :8080 and on s/app.sock) to its socket, and back"
app shop "" tcp | kubectl apply -f - >/dev/null
kubectl create service clusterip shop --tcp=8080 >/dev/null
kubectl wait --for=condition=Ready pod/shop --timeout=90s >/dev/null
wait_endpoint app_default_shop_8080 ":8080" || true
echo "  no policy:"; endpoint app_default_shop_8080 | indent
kubectl apply -f - <<'EPOL' | indent
apiVersion: config.aether.io/v1
kind: EndpointPolicy
metadata: {name: shop-uds, namespace: default}
spec:
  targetRef: {kind: Service, name: shop}
  udsSocket: s/app.sock
EPOL
wait_endpoint app_default_shop_8080 "\.sock" || true   # the pin (chart default) or the kubelet path
echo "  with the policy:"; endpoint app_default_shop_8080 | indent
kubectl delete epol shop-uds | indent
wait_endpoint app_default_shop_8080 ":8080" || true
echo "  policy deleted:"; endpoint app_default_shop_8080 | indent

step "a pod whose socket value is over the budget gets one Warning Event (delivered over TCP)"
app long 'endpoint.aether.io/uds-socket: sockets/app1.sock' "" | kubectl apply -f - >/dev/null
for _ in $(seq 1 50); do kubectl get events --field-selector involvedObject.name=long -o name 2>/dev/null | grep . >/dev/null && break; sleep 0.2; done
kubectl get events --field-selector involvedObject.name=long -o custom-columns='TYPE:.type,REASON:.reason,MESSAGE:.message' | indent
kubectl wait --for=condition=Ready pod/long --timeout=90s >/dev/null || true
for target in "-n shop pod/$pod" "pod/long"; do
  echo "  \$ kubectl aether why $target    (the node agent's live decision, read through a port-forward to its loopback-only debug port)"
  # shellcheck disable=SC2086 # $target is the namespace flag and the pod, split on purpose
  "$repo/target/debug/kubectl-aether" --kubeconfig "$KUBECONFIG" why $target 2>&1 | indent || true
done

step "metrics: the agent (node IP :9091) and a controller replica (pod IP :9090)"
curl -s "http://$(url_host "$AETHER_NODE_IP"):9091/metrics" | grep -E '^aether_agent_(pods|tcp_fallbacks)\{.*\} [1-9]' | indent || true
for cip in $(kubectl get pods -n $NS -l app.kubernetes.io/component=controller -o jsonpath='{.items[*].status.podIP}'); do
  curl -s "http://$(url_host "$cip"):9090/metrics" | grep -E '^aether_(admission_requests_total|status_leader)' | sed "s/^/$cip: /" | indent || true
done

step "helm uninstall aether: no release object, nothing of ours on the host"
kubectl delete -f "$repo/examples/quickstart/client.yaml" -f "$repo/examples/quickstart/echo.yaml" --wait=true >/dev/null
kubectl delete pod shop long --wait=true >/dev/null
ls -l /run/aether | indent
# --wait includes the node pods' namespace: a namespace controller that found a pod still running
# there checks again only after that pod's terminationGracePeriodSeconds (the proxy's 420 s), even
# when the pods are gone sooner, so helm's default 5 minutes is not always enough.
helm uninstall aether -n $NS --wait --timeout 10m | indent
kubectl get all,secrets,leases -n $NS 2>&1 | indent
echo "  namespace $NODE_NS: $(kubectl get namespace $NODE_NS -o name 2>&1)"
echo "  /run/aether: $(ls -A /run/aether 2>/dev/null | wc -l) entries"
report_failed
