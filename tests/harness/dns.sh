#!/usr/bin/env bash
# Cluster DNS for the real node (node.sh up runs it): CoreDNS (build-tools.sh coredns, the image
# <prefix>/coredns:<tag> from images.sh, already imported into containerd) as the Deployment
# `coredns` behind the Service `kube-dns` in kube-system, the way kubeadm clusters have it. It
# answers for the cluster domain (Services, pods, reverse lookups) and nothing else: there is no
# `forward` (the test machine has no upstream resolver), so other names get SERVFAIL (and an
# "[ERROR] ... no next plugin found" line in its log).
#
# Usage:
#   dns.sh up KUBECONFIG REPLICAS   server-side apply the ServiceAccount, RBAC, Corefile ConfigMap,
#                                   Deployment (REPLICAS pods, spread over nodes when it can) and
#                                   Service; then wait (120 s at most) until the Deployment has
#                                   REPLICAS available pods and the Service's EndpointSlices list
#                                   them ready. On timeout it names each pod's state and prints
#                                   the tail of its log. Idempotent (re-applying changes nothing).
#
# Env: AETHER_TOOLS_DIR (default <repo>/.cache/tools): kubectl from its bin/.
#      AETHER_IMAGE_PREFIX, AETHER_IMAGE_TAG: the image's name, as images.sh
#        (defaults: localhost/aether, dev; pulled never: it must be imported already).
#      AETHER_DNS_TIMEOUT: seconds to wait for the pods (default 120).
#      AETHER_DNS_IP: Service kube-dns's ClusterIP (default 10.96.0.10; node.sh sets an IPv6 one
#        on an IPv6-only node).
#      AETHER_DNS_PRIORITY_CLASS: the pods' priority class (default system-cluster-critical;
#        empty: none, for a node where critical pods cannot start: node.sh's AETHER_CRITICAL_PODS).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
image=${AETHER_IMAGE_PREFIX:-localhost/aether}/coredns:${AETHER_IMAGE_TAG:-dev}
# The Service's ClusterIP (in kube-apiserver's --service-cluster-ip-range, 10.96.0.0/16 unless
# AETHER_DNS_IP says otherwise) and the
# cluster domain. The kubelet's `clusterDNS` and `clusterDomain` (node.sh's KubeletConfiguration)
# must match them: that is the nameserver and search path it writes into every pod's resolv.conf.
dns_ip=${AETHER_DNS_IP:-10.96.0.10}
priority_class=${AETHER_DNS_PRIORITY_CLASS-system-cluster-critical}
domain=cluster.local
ns=kube-system
timeout=${AETHER_DNS_TIMEOUT:-120}

log() { printf '[dns] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

manifests() {
  local replicas=$1
  cat <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: $ns}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: $ns}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: $ns}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes $domain in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
    }
---
# CoreDNS runs at system-cluster-critical: where ResourceQuota admission limits that class
# (controlplane.sh's AETHER_APISERVER_RESTRICTED=1, as GKE) kube-system needs a quota scoped to
# it, as GKE's clusters ship one.
apiVersion: v1
kind: ResourceQuota
metadata: {name: critical-pods, namespace: $ns}
spec:
  hard: {pods: "1000"}
  scopeSelector:
    matchExpressions:
    - {scopeName: PriorityClass, operator: In, values: [system-node-critical, system-cluster-critical]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: $ns, labels: {k8s-app: kube-dns}}
spec:
  replicas: $replicas
  selector: {matchLabels: {k8s-app: kube-dns}}
  # A new pod first, then the old one goes: re-applying never leaves the cluster without DNS.
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: "$priority_class"
      # CoreDNS itself resolves nothing through the cluster DNS (it talks to kube-apiserver by
      # the kubernetes Service's IP).
      dnsPolicy: Default
      affinity:
        podAntiAffinity:
          # Soft: two replicas land on two nodes when there are two, and still run on one node.
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: kubernetes.io/hostname
              labelSelector: {matchLabels: {k8s-app: kube-dns}}
      containers:
      - name: coredns
        image: $image
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: health, containerPort: 8080, protocol: TCP}
        - {name: ready, containerPort: 8181, protocol: TCP}
        resources:
          requests: {cpu: 10m, memory: 32Mi}
          limits: {memory: 170Mi}
        # The image runs as root to bind port 53; of root's capabilities it keeps only that one.
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 1
          failureThreshold: 3
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 10
          periodSeconds: 10
          failureThreshold: 5
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: $ns, labels: {k8s-app: kube-dns}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: $dns_ip
  ports:
  - {name: dns, port: 53, targetPort: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 53, protocol: TCP}
YAML
}

# why_not_ready: each CoreDNS pod's state (phase, false conditions, container state) and the tail
# of its log; the Deployment's conditions when there is no pod.
why_not_ready() {
  local pods p
  pods=$("${k[@]}" get pods -n "$ns" -l k8s-app=kube-dns -o name 2>/dev/null || true)
  if [ -z "$pods" ]; then
    local conds
    conds=$("${k[@]}" get deployment coredns -n "$ns" \
      -o jsonpath='{range .status.conditions[*]}  {.type}={.status} {.reason}: {.message}{"\n"}{end}' 2>&1 || true)
    if [ -n "$conds" ]; then log "no CoreDNS pod exists; the Deployment's conditions:"; printf '%s\n' "$conds" >&2
    else log "no CoreDNS pod exists, and the Deployment has no conditions (does kube-controller-manager run?)"; fi
    return 0
  fi
  for p in $pods; do
    log "$p:"
    "${k[@]}" get "$p" -n "$ns" -o jsonpath='  node {.spec.nodeName}, phase {.status.phase}{"\n"}{range .status.conditions[?(@.status=="False")]}  {.type}=False {.reason} {.message}{"\n"}{end}{range .status.containerStatuses[*]}  container {.name}: ready={.ready} restarts={.restartCount} state={.state}{"\n"}{end}' >&2 || true
    log "last lines of its log:"
    "${k[@]}" logs "$p" -n "$ns" --tail 20 >&2 || true
  done
}

up() {
  local kubeconfig=$1 replicas=$2
  [[ $replicas =~ ^[1-9][0-9]*$ ]] || die "REPLICAS must be a positive number, got '$replicas'"
  [[ $timeout =~ ^[1-9][0-9]*$ ]] || die "AETHER_DNS_TIMEOUT must be a positive number of seconds, got '$timeout'"
  [ -f "$kubeconfig" ] || die "$kubeconfig: no such kubeconfig"
  [ -x "$tools/bin/kubectl" ] || die "$tools/bin/kubectl missing: run tests/harness/build-tools.sh (make tools)"
  k=("$tools/bin/kubectl" --kubeconfig "$kubeconfig")
  local t0=$SECONDS
  log "applying CoreDNS ($image, $replicas replica(s)) and Service kube-dns ($dns_ip, domain $domain) in $ns"
  manifests "$replicas" | "${k[@]}" apply --server-side --force-conflicts --field-manager aether-dns -f - >&2 \
    || die "kubectl apply of the CoreDNS manifests failed"
  local gen obs total upd avail ready
  while :; do
    # As `kubectl rollout status`: every pod runs the current spec (none of an older one is
    # left) and is available. '/'-separated: a count the API leaves out when it is 0 reads as
    # empty, not as the next one.
    IFS=/ read -r gen obs total upd avail < <("${k[@]}" get deployment coredns -n "$ns" \
      -o jsonpath='{.metadata.generation}/{.status.observedGeneration}/{.status.replicas}/{.status.updatedReplicas}/{.status.availableReplicas}{"\n"}' 2>/dev/null || echo)
    # Ready addresses in the Service's EndpointSlices: what kube-proxy programs for 10.96.0.10.
    ready=$("${k[@]}" get endpointslices -n "$ns" -l kubernetes.io/service-name=kube-dns \
      -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}x{"\n"}{end}' 2>/dev/null | grep -c x || true)
    if [ "${obs:-0}" -ge "${gen:-1}" ] && [ "${total:-0}" = "$replicas" ] && [ "${upd:-0}" = "$replicas" ] \
      && [ "${avail:-0}" = "$replicas" ] && [ "$ready" -ge "$replicas" ]; then
      break
    fi
    if [ $((SECONDS - t0)) -ge "$timeout" ]; then
      why_not_ready
      die "CoreDNS not available after $timeout s: ${total:-0} pods (want $replicas), ${upd:-0} of the current spec, ${avail:-0} available, $ready ready in the kube-dns EndpointSlices"
    fi
    sleep 0.5
  done
  log "CoreDNS available ($replicas/$replicas pods, Service kube-dns $dns_ip) in $((SECONDS - t0)) s"
}

cmd=${1:-}
case $cmd in
  up) [ $# -eq 3 ] || die "usage: $0 up KUBECONFIG REPLICAS"; up "$2" "$3" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
