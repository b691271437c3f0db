#!/usr/bin/env bash
# A real, local Kubernetes control plane for tests and the demo: etcd + kube-apiserver on
# loopback, RBAC authorization, the ValidatingAdmissionWebhook plugin, client-certificate auth
# for an admin kubeconfig. No kubelet, scheduler or controller-manager runs here (node.sh adds them).
#
# Usage:
#   controlplane.sh start DIR          start etcd + kube-apiserver, state and logs in DIR;
#                                      writes DIR/kubeconfig and DIR/env (KUBECONFIG=..., ports)
#   controlplane.sh stop DIR           stop both (TERM, then KILL after 10 s)
#   controlplane.sh stop-apiserver DIR / start-apiserver DIR
#                                      stop or restart only kube-apiserver (etcd keeps the state)
#   controlplane.sh register-webhook DIR URL CA_FILE
#                                      create/replace the ValidatingWebhookConfiguration
#                                      "aether-endpointpolicy" pointing at URL
#                                      (endpointpolicies CREATE/UPDATE only, failurePolicy Fail)
#   controlplane.sh delete-webhook DIR remove it
# Env: AETHER_TOOLS_DIR (default <repo>/.cache/tools): where build-tools.sh put the binaries.
#      AETHER_APISERVER_ADDRESS (default 127.0.0.1): the address kube-apiserver binds, advertises
#        and writes into the kubeconfig. node.sh sets the node's bridge address, so pods reach the
#        API server through the `kubernetes` Service (lease endpoint reconciler, a serving cert
#        naming that address and the Service IP 10.96.0.1), the Node authorizer and NodeRestriction
#        admit the kubelet, and kube-apiserver calls the kubelet with the admin client cert.
#      AETHER_SERVICE_CIDR (default 10.96.0.0/16): --service-cluster-ip-range, one range or a
#        pair of families, the primary first (node.sh AETHER_IP_FAMILY=dual or ipv6).
#      AETHER_APISERVER_SERVICE_IP (default 10.96.0.1): the `kubernetes` Service's IP (the first
#        of the primary range), which the serving cert names. AETHER_APISERVER_ADDRESS may be IPv6.
#      AETHER_APISERVER_ENDPOINT_ROUTING=1: kube-apiserver calls webhooks (and aggregated APIs) at
#        their Service's endpoint IPs instead of its ClusterIP (--enable-aggregator-routing), for a
#        host that runs no kube-proxy (multinode.sh: every kube-proxy is in a node's namespace).
#      AETHER_APISERVER_RESTRICTED=1: an AdmissionConfiguration as a locked-down managed cluster
#        has: Pod Security enforces `restricted` in every namespace without its own label
#        (kube-system exempt), and ResourceQuota admission limits the system-node-critical and
#        system-cluster-critical priority classes to namespaces with a quota scoped to them
#        (limitedResources, as GKE sets).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}/bin
address=${AETHER_APISERVER_ADDRESS:-127.0.0.1}
# The address in a URL (an IPv6 one in brackets).
case $address in *:*) url_address="[$address]" ;; *) url_address=$address ;; esac
log() { printf '[controlplane] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=tests/harness/pids.sh
. "$repo/tests/harness/pids.sh"

mint_pki() {
  local pki=$1
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=aether-test-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  local san="IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  san+=",DNS:kubernetes.default.svc.cluster.local,IP:${AETHER_APISERVER_SERVICE_IP:-10.96.0.1}"
  [ "$address" = 127.0.0.1 ] || san+=",IP:$address"
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" > "$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
    -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=aether-admin" -keyout "$pki/admin.key" -out "$pki/admin.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' > "$pki/admin.ext"
  openssl x509 -req -in "$pki/admin.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
    -extfile "$pki/admin.ext" -out "$pki/admin.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

# restricted_admission: the AdmissionConfiguration of AETHER_APISERVER_RESTRICTED=1 (PodSecurity
# and ResourceQuota are default admission plugins; this file only configures them).
restricted_admission() {
  cat <<'YAML'
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: PodSecurity
    configuration:
      apiVersion: pod-security.admission.config.k8s.io/v1
      kind: PodSecurityConfiguration
      defaults: {enforce: restricted, enforce-version: latest, audit: restricted, audit-version: latest, warn: restricted, warn-version: latest}
      exemptions: {usernames: [], runtimeClasses: [], namespaces: [kube-system]}
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - {scopeName: PriorityClass, operator: In, values: [system-node-critical, system-cluster-critical]}
YAML
}

# start_apiserver DIR: (re)start kube-apiserver with the arguments saved by `start`.
start_apiserver() {
  local dir=$1
  local args
  eval "args=($(cat "$dir/apiserver.args"))"
  # Started directly (not through eval or a subshell) so that $! is kube-apiserver itself.
  "$tools/kube-apiserver" "${args[@]}" >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
}

wait_ready() {
  local dir=$1 deadline=$((SECONDS + 120))
  until "$tools/kubectl" --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; do
    kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null || { tail -n 30 "$dir/apiserver.log" >&2; die "kube-apiserver exited"; }
    [ $SECONDS -lt $deadline ] || { tail -n 30 "$dir/apiserver.log" >&2; die "kube-apiserver not ready after 120 s"; }
    sleep 0.5
  done
}

start() {
  local dir=$1
  for b in etcd kube-apiserver kubectl; do
    [ -x "$tools/$b" ] || die "$tools/$b is missing: run tests/harness/build-tools.sh first"
  done
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ -f "$dir/apiserver.pid" ] && kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null && die "a control plane already runs in $dir"
  mint_pki "$dir/pki"
  local etcd_port etcd_peer api_port
  etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port)

  log "starting etcd on 127.0.0.1:$etcd_port (log: $dir/etcd.log)"
  "$tools/etcd" --name aether-test --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "aether-test=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync \
    --log-level warn >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"

  log "starting kube-apiserver on https://$url_address:$api_port (log: $dir/apiserver.log)"
  local args=(
    --etcd-servers "http://127.0.0.1:$etcd_port"
    --bind-address "$address" --advertise-address "$address" --secure-port "$api_port"
    --tls-cert-file "$dir/pki/apiserver.crt" --tls-private-key-file "$dir/pki/apiserver.key"
    --client-ca-file "$dir/pki/ca.crt"
    --service-account-issuer https://kubernetes.default.svc.cluster.local
    --service-account-key-file "$dir/pki/sa.pub" --service-account-signing-key-file "$dir/pki/sa.key"
    --service-cluster-ip-range "${AETHER_SERVICE_CIDR:-10.96.0.0/16}"
    --allow-privileged=true
    --cert-dir "$dir/pki"
    --v 1
  )
  if [ "$address" = 127.0.0.1 ]; then
    # No node: the `kubernetes` Service gets no endpoints (a loopback address is not routable).
    args+=(--authorization-mode RBAC --endpoint-reconciler-type none
      --enable-admission-plugins ValidatingAdmissionWebhook)
  else
    args+=(--authorization-mode Node,RBAC --endpoint-reconciler-type lease
      --enable-admission-plugins NodeRestriction,ValidatingAdmissionWebhook
      --kubelet-client-certificate "$dir/pki/admin.crt" --kubelet-client-key "$dir/pki/admin.key"
      --kubelet-preferred-address-types InternalIP)
  fi
  [ "${AETHER_APISERVER_ENDPOINT_ROUTING:-}" != 1 ] || args+=(--enable-aggregator-routing=true)
  if [ "${AETHER_APISERVER_RESTRICTED:-}" = 1 ]; then
    restricted_admission >"$dir/admission.yaml"
    args+=(--admission-control-config-file "$dir/admission.yaml")
  fi
  printf '%q ' "${args[@]}" >"$dir/apiserver.args"
  start_apiserver "$dir"

  cat >"$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: aether-test
  cluster:
    server: https://$url_address:$api_port
    certificate-authority: $dir/pki/ca.crt
users:
- name: admin
  user:
    client-certificate: $dir/pki/admin.crt
    client-key: $dir/pki/admin.key
contexts:
- name: aether-test
  context: {cluster: aether-test, user: admin, namespace: default}
current-context: aether-test
KC
  cat >"$dir/env" <<ENV
export KUBECONFIG=$dir/kubeconfig
export AETHER_APISERVER_PORT=$api_port
export AETHER_ETCD_PORT=$etcd_port
export AETHER_APISERVER_ADDRESS=$address
ENV
  local deadline=$((SECONDS + 120))
  until "$tools/kubectl" --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; do
    kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null || { tail -n 30 "$dir/apiserver.log" >&2; die "kube-apiserver exited"; }
    kill -0 "$(cat "$dir/etcd.pid")" 2>/dev/null || { tail -n 30 "$dir/etcd.log" >&2; die "etcd exited"; }
    [ $SECONDS -lt $deadline ] || { tail -n 30 "$dir/apiserver.log" >&2; die "kube-apiserver not ready after 120 s"; }
    sleep 0.5
  done
  # The default namespace is made by a controller loop inside the apiserver; wait for it too.
  until "$tools/kubectl" --kubeconfig "$dir/kubeconfig" get namespace default >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "namespace default not created after 120 s"
    sleep 0.5
  done
  log "ready: KUBECONFIG=$dir/kubeconfig"
}

stop() {
  local dir=$1
  stop_pid "$dir/apiserver.pid"
  stop_pid "$dir/etcd.pid"
  log "stopped control plane in $dir"
}

register_webhook() {
  local dir=$1 url=$2 ca=$3
  local bundle
  bundle=$(base64 -w0 <"$ca")
  "$tools/kubectl" --kubeconfig "$dir/kubeconfig" apply -f - >/dev/null <<VWC
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: aether-endpointpolicy
webhooks:
- name: endpointpolicies.config.aether.io
  clientConfig:
    url: $url
    caBundle: $bundle
  rules:
  - apiGroups: ["config.aether.io"]
    apiVersions: ["v1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["endpointpolicies"]
    scope: Namespaced
  sideEffects: None
  failurePolicy: Fail
  admissionReviewVersions: ["v1"]
  timeoutSeconds: 5
VWC
  log "registered ValidatingWebhookConfiguration aether-endpointpolicy -> $url"
}

cmd=${1:-}; shift || true
case $cmd in
  start) [ $# -eq 1 ] || die "usage: $0 start DIR"; start "$1" ;;
  stop) [ $# -eq 1 ] || die "usage: $0 stop DIR"; stop "$1" ;;
  stop-apiserver) [ $# -eq 1 ] || die "usage: $0 stop-apiserver DIR"; stop_pid "$1/apiserver.pid"; log "stopped kube-apiserver" ;;
  start-apiserver) [ $# -eq 1 ] || die "usage: $0 start-apiserver DIR"; start_apiserver "$1"; wait_ready "$1"; log "kube-apiserver ready" ;;
  register-webhook) [ $# -eq 3 ] || die "usage: $0 register-webhook DIR URL CA_FILE"; register_webhook "$@" ;;
  delete-webhook) [ $# -eq 1 ] || die "usage: $0 delete-webhook DIR"
    "$tools/kubectl" --kubeconfig "$1/kubeconfig" delete validatingwebhookconfiguration aether-endpointpolicy --ignore-not-found >/dev/null ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
