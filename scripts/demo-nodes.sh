#!/usr/bin/env bash
# The demo on several real nodes (`AETHER_NODES=2 make demo`; scripts/demo.sh hands over to this
# script): AETHER_NODES nodes on this machine (tests/harness/node.sh, which runs multinode.sh: each
# node its own network, mount and UTS namespaces, containerd, kubelet and kube-proxy; one control
# plane; CoreDNS), `helm install` of both charts, a UDS-only app on the last node called by its
# Service's DNS name from a pod on the first, and `kubectl drain` of the last node: the app's pod
# moves to another node and is served over its socket there, nothing of it left behind. With
# AETHER_IP_FAMILY=dual (a dual-stack cluster, IPv4 primary: multinode.sh), a Service with
# ipFamilyPolicy RequireDualStack in front of that app is called at its IPv4 and at its IPv6
# ClusterIP from a client on the app's node and from one on another node; the demo exits 1 if any
# of those requests is not served over the app's socket.
#
# It needs root and changes the host while it runs (a bridge aethern0 with 10.244.64.1/24 and a
# veth per node, routes to the pod CIDRs, an iptables chain AETHER-NODES, the sysctls kubelet sets,
# cgroups /sys/fs/cgroup/*/aether-node-<i>; for dual also fd00:10:244:64::1/64 on the bridge, IPv6
# routes to the pod CIDRs and the chain AETHER-NODES in ip6tables); everything is restored on exit,
# Ctrl-C included.
set -euo pipefail
[ -z "${AETHER_DEMO_REGISTRY:-}" ] || { echo "demo-nodes: AETHER_DEMO_REGISTRY is for the one-node demo" >&2; exit 1; }
repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}/bin
NS=aether-system
NODE_NS=aether-node
nodes=${AETHER_NODES:-2}
family=${AETHER_IP_FAMILY:-ipv4}
# What went wrong in a step that checks a result: the demo exits 1 at the end when not empty.
failed=()

# shellcheck source=scripts/demo-common.sh
. "$repo/scripts/demo-common.sh"

[ "$(id -u)" = 0 ] || { echo "demo: needs root (it starts containerd and kubelet); run: sudo AETHER_NODES=$nodes make demo" >&2; exit 1; }
work=$(mktemp -d /tmp/aether-demo-nodes-XXXX)
teardown() {
  step "restoring the host (tests/harness/node.sh down $work)"
  "$repo/tests/harness/node.sh" down "$work" 2>&1 | tail -n 2 | indent
}
trap teardown EXIT
trap 'exit 130' INT TERM

step "bringing up $nodes real nodes, each in its own network, mount and UTS namespaces"
AETHER_NODES=$nodes AETHER_IP_FAMILY=$family "$repo/tests/harness/node.sh" up "$work" 2>&1 | grep -E '^\[(nodes|dns)' | indent
# shellcheck disable=SC1091
. "$work/env"
first=$AETHER_NODE_1_NAME
last_i=$nodes
last=$(eval echo "\$AETHER_NODE_${last_i}_NAME")
last_pid=$(eval echo "\$AETHER_NODE_${last_i}_PID")
kubectl get nodes -o wide | indent
# in_node PID CMD...: CMD in that node's network and mount namespaces (its Envoy admin, its files).
in_node() { local pid=$1; shift; nsenter -t "$pid" -n -m -- "$@"; }
# Envoy's admin on a node: its root-only Unix socket (docs/design-notes.md, "Envoy's admin").
envoy_admin() { local pid=$1; shift; in_node "$pid" curl -s --unix-socket /run/aether/envoy/admin.sock "http://localhost$1"; }

step "helm install aether-crds; helm install aether -n $NS --set daemonset.namespace=$NODE_NS --wait --wait-for-jobs (the README's install)"
helm install aether-crds "${crds_chart[@]}" --wait | grep -E '^(NAME|STATUS)' | indent
echo "  \$ kubectl create namespace $NS    (the controller's; the chart makes $NODE_NS for the node pods, labelled privileged)"
kubectl create namespace $NS | indent
helm install aether "${aether_chart[@]}" -n $NS --set daemonset.namespace=$NODE_NS --wait --wait-for-jobs --timeout 300s "${images[@]}" \
  | grep -E '^(NAME|STATUS)' | indent
kubectl rollout status -n $NODE_NS daemonset/aether-node --timeout=120s >/dev/null
kubectl rollout status -n $NODE_NS daemonset/aether-proxy --timeout=120s >/dev/null
kubectl get pods -n $NS -o wide | indent
kubectl get pods -n $NODE_NS -o wide | indent

# The two-node cluster enforces Pod Security "restricted" in namespaces without their own label
# (tests/harness/controlplane.sh, AETHER_APISERVER_RESTRICTED), as a locked-down cluster does: the
# demo's pods meet it (uds-echo's image runs as a non-root user).
restricted_pod='{"runAsNonRoot":true,"seccompProfile":{"type":"RuntimeDefault"}}'
restricted_container='{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}'
app() { # app NAME AFFINITY: a UDS-only Deployment (the pod answers with its own name) and its Service
  cat <<Y
apiVersion: v1
kind: ServiceAccount
metadata: {name: $1, namespace: default}
---
apiVersion: v1
kind: Service
metadata: {name: $1, namespace: default}
spec: {selector: {app: $1}, ports: [{port: 8080}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1, namespace: default}
spec:
  selector: {matchLabels: {app: $1}}
  template:
    metadata:
      labels: {app: $1, aether.io/managed: "true"}
      annotations: {endpoint.aether.io/uds-socket: s/app.sock}
    spec:
      serviceAccountName: $1
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      securityContext: $restricted_pod
      $2
      containers:
      - name: app
        image: localhost/aether/uds-echo:dev
        imagePullPolicy: Never
        securityContext: $restricted_container
        args: [--socket, /s/app.sock, --name, \$(POD_NAME)]
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        volumeMounts: [{name: s, mountPath: /s}]
        readinessProbe: {httpGet: {path: /ready, port: 8080}, periodSeconds: 1}
      volumes: [{name: s, emptyDir: {}}]
Y
}
# client NAME NODE URL: a pod on NODE runs `uds-echo --get URL`; prints its log.
client() {
  kubectl run "$1" --image=localhost/aether/uds-echo:dev --image-pull-policy=Never --restart=Never \
    --override-type=strategic --overrides="{\"spec\":{\"nodeName\":\"$2\",\"securityContext\":$restricted_pod,\"containers\":[{\"name\":\"$1\",\"securityContext\":$restricted_container}]}}" \
    -- --get "$3" >/dev/null
  for _ in $(seq 1 300); do
    case "$(kubectl get pod "$1" -o jsonpath='{.status.phase}')" in Succeeded|Failed) break ;; esac; sleep 0.2
  done
  kubectl logs "$1" | indent
  kubectl delete pod "$1" --wait=false >/dev/null
}

step "a UDS-only app (Deployment web, no TCP port) on $last; a client pod on $first calls it by name"
app web "affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$last]}]}}]}}" \
  | kubectl apply -f - | indent
kubectl rollout status deployment/web --timeout=120s | indent
kubectl get pods -l app=web -o wide | indent
old=$(kubectl get pods -l app=web -o jsonpath='{.items[0].metadata.name}')
old_uid=$(kubectl get pods -l app=web -o jsonpath='{.items[0].metadata.uid}')
echo "  \$ kubectl run client --overrides='{\"spec\":{\"nodeName\":\"$first\"}}' ... -- --get http://web.default.svc.cluster.local:8080/hello"
client client "$first" http://web.default.svc.cluster.local:8080/hello
echo "  $last's Envoy: the inbound listener in the pod's netns counted it"
envoy_admin "$last_pid" "/stats?filter=^tcp.inbound_default_${old}_8080.downstream_cx_total$" | indent

step "kubectl drain $last: web's pod moves to another node and is served over its socket there"
kubectl drain "$last" --ignore-daemonsets --delete-emptydir-data --timeout=180s 2>&1 | grep -v '^evicting\|^WARNING' | indent
kubectl rollout status deployment/web --timeout=120s >/dev/null
kubectl get pods -l app=web -o wide | indent
client client-after-drain "$first" http://web.default.svc.cluster.local:8080/after-drain
for _ in $(seq 1 100); do
  envoy_admin "$last_pid" /clusters | grep -q "^app_default_${old}_8080::" || break; sleep 0.2
done
echo "  on $last: Envoy clusters of $old: $(envoy_admin "$last_pid" /clusters | grep -c "^app_default_${old}_8080::" || true)," \
  "listeners: $(envoy_admin "$last_pid" /listeners | grep -c "^inbound_default_${old}_8080::" || true)," \
  "pin /run/aether-pins/$old_uid.sock: $(in_node "$last_pid" ls /run/aether-pins/ | grep -c "^$old_uid.sock$" || true)"
kubectl uncordon "$last" | indent

if [ "$family" = dual ]; then
  step "dual-stack: Service web-dual (ipFamilyPolicy: RequireDualStack) reaches web's socket over IPv4 and IPv6, from both nodes"
  dual_service default web-dual web
  kubectl get pods -l app=web -o custom-columns='NAME:.metadata.name,NODE:.spec.nodeName,IPS:.status.podIPs[*].ip' | indent
  web_node=$(kubectl get pods -l app=web -o jsonpath='{.items[0].spec.nodeName}')
  # Both families' EndpointSlices name the pod before a client calls (kube-proxy follows within a second).
  for _ in $(seq 1 100); do
    [ "$(kubectl get endpointslices -l kubernetes.io/service-name=web-dual -o jsonpath='{.items[*].endpoints[*].addresses[*]}' | wc -w)" -ge 2 ] && break
    sleep 0.2
  done
  sleep 2
  n=0
  for i in $(seq 1 "$nodes"); do
    node=$(eval echo "\$AETHER_NODE_${i}_NAME")
    where=$([ "$node" = "$web_node" ] && echo "web's node" || echo "another node than web's")
    for ip in $(kubectl get service web-dual -o jsonpath='{.spec.clusterIPs[*]}'); do
      host=$(url_host "$ip") fam=ipv4; [ "$host" = "$ip" ] || fam=ipv6
      n=$((n + 1)) name=client-dual-$n
      echo "  \$ kubectl run $name on $node ($where) -- --get http://$host:8080/dual-$fam"
      out=$(client "$name" "$node" "http://$host:8080/dual-$fam" 2>&1 || true)
      echo "$out"
      grep -q 'over unix:/s/app.sock' <<<"$out" \
        || failed+=("$fam ClusterIP $ip of Service web-dual from $node ($where) was not served over the socket")
    done
  done
  kubectl delete service web-dual >/dev/null
fi

report_failed
