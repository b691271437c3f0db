#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, for the real-node suite and `make demo`:
# containerd 2.x + runc (built by `make tools`; AETHER_CONTAINERD below) + the bridge CNI (Debian
# package), and kubelet, kube-controller-manager,
# kube-scheduler and kube-proxy (iptables mode) built from the Go module proxy like kube-apiserver
# (build-tools.sh), on top of controlplane.sh's etcd + kube-apiserver, and cluster DNS (dns.sh:
# CoreDNS, Service kube-dns 10.96.0.10, cluster.local only). Images: images.sh; nothing is pulled.
#
# Usage:
#   node.sh up DIR     start everything; state and logs in DIR; writes DIR/env (KUBECONFIG=...,
#                      AETHER_NODE_NAME, AETHER_CONTAINERD_SOCK, ...). On any failure it tears
#                      down what it started before exiting non-zero. A node an earlier `up` left
#                      behind (its run was killed; none of its processes runs) is taken down first.
#   node.sh down DIR   stop what `up DIR` started (by the PIDs in DIR) and restore the host
#   node.sh env DIR    print DIR/env
#
# Needs root (it changes the host). What it changes, and `down` restores on every exit path:
#   - a bridge `aether0` with the node IP 10.244.77.1/24 (pods 10.244.77.0/24, default route via
#     it), a link route for the Service range 10.96.0.0/16 through it (host traffic to a ClusterIP
#     meets kube-proxy's DNAT and never leaves the machine), and a guard chain AETHER-NODE in
#     FORWARD that drops pod traffic leaving by any other interface; with AETHER_IP_FAMILY=dual or ipv6
#     the same in IPv6 too (fd00:10:244:77::1/64 on the bridge, added `nodad` so binds to it need
#     not wait for duplicate address detection; pods fd00:10:244:77::/64; Services
#     fd00:10:96::/112; the guard chain in ip6tables; net.ipv6.conf.all.forwarding=1);
#   - the iptables chains kubelet and kube-proxy add (only chains and jumps that were not there
#     before `up`), the sysctls they and this script set (net.ipv4.ip_forward, kernel.panic,
#     vm.overcommit_memory, ...: the values before `up` are saved in DIR/sysctl-before.txt);
#   - /run/netns made a shared mount (containerd keeps pod network namespaces there; the chart's
#     proxy mounts it with HostToContainer propagation), /run/aether-pins likewise (the agent's
#     socket pins, mounted Bidirectional), the kubelet's mounts under
#     /var/lib/kubelet, the host dirs that did not exist before (/var/lib/kubelet, /var/log/pods,
#     /run/aether, /var/lib/aether, ...), and empty cgroups made by kubelet and runc;
#   - with AETHER_RUNTIME=crio also what crio-lib.sh lists: /run/crio, the IPC and UTS namespaces
#     pinns pins under /run, and the hugetlb cgroup hierarchy where the kernel has it unmounted.
# Only processes whose PIDs `up` recorded in DIR are stopped (and containerd shims whose
# -address is this node's containerd socket; with CRI-O, the conmons writing to its exit dir).
#
# Env: AETHER_TOOLS_DIR (default <repo>/.cache/tools), AETHER_NODE_NAME (default aether-node),
#      AETHER_NODES (default 1): 2 to 8 brings up that many nodes instead (multinode.sh, whose
#      header says how each node is isolated; DIR/env then names each node's IP, PID and sockets).
#      AETHER_IP_FAMILY (default ipv4): ipv4; dual for a dual-stack node (IPv4 primary, as
#      kubelet's first --node-ip; every pod gets an IPv4 and an IPv6 address; Services are IPv4
#      unless they ask for IPv6 in spec.ipFamilies); or ipv6 for an IPv6-only node (node IP and
#      kube-apiserver at fd00:10:244:77::1, pods and Services only IPv6, the `kubernetes` Service
#      fd00:10:96::1, cluster DNS fd00:10:96::a), one node only; or dual6, dual-stack with IPv6
#      primary (node IP, kube-apiserver, `kubernetes` Service and cluster DNS as for ipv6; a
#      Service is IPv6 unless its spec.ipFamilies asks IPv4; every pod gets an IPv6 and an IPv4
#      address), one node only.
#      AETHER_CONTAINERD (default 2): 2 runs the containerd 2.x and runc that `make tools` built
#      (config version 3), 1 Debian's containerd 1.6 and runc 1.1 (node-lib.sh use_containerd).
#      AETHER_RUNTIME (default containerd): crio runs CRI-O instead (crio-lib.sh: built by
#      `tests/harness/build-tools.sh crio`, socket /run/crio/crio.sock, images loaded by copyimg).
#      One node only. DIR/env then says AETHER_RUNTIME=crio and AETHER_CRI_SOCK, and no
#      AETHER_CONTAINERD_SOCK. CRI-O sets the oom_score_adj kubelet asks for as it is (containerd
#      clamps it: restrict_oom_score_adj); where root may not lower it (no CAP_SYS_RESOURCE, as
#      here) a critical pod (-997) cannot start, so CoreDNS runs without its priority class and
#      DIR/env says AETHER_CRITICAL_PODS=no. DIR/env's AETHER_CHART_SETS lists the --set values
#      charts/aether needs on the node (agent.criSocket, daemonset.priorityClassName=): the demo
#      and the real-node suite pass them.
set -euo pipefail

# Several nodes (AETHER_NODES=N, N >= 2): multinode.sh brings them up, and takes down a DIR it
# brought up (DIR/nodes/count).
if { [ "${1:-}" = up ] && [ "${AETHER_NODES:-1}" != 1 ]; } || { [ "${1:-}" = down ] && [ -f "${2:-}/nodes/count" ]; }; then
  if [ "${1:-}" = up ] && { [ "${AETHER_IP_FAMILY:-ipv4}" = ipv6 ] || [ "${AETHER_IP_FAMILY:-ipv4}" = dual6 ]; }; then
    echo "node.sh: AETHER_IP_FAMILY=${AETHER_IP_FAMILY} brings up one node only (AETHER_NODES=1); several nodes take ipv4 or dual" >&2; exit 1
  fi
  if [ "${1:-}" = up ] && [ "${AETHER_RUNTIME:-containerd}" != containerd ]; then
    echo "node.sh: AETHER_RUNTIME=${AETHER_RUNTIME} brings up one node only (AETHER_NODES=1); several nodes run containerd" >&2; exit 1
  fi
  exec "$(dirname "$0")/multinode.sh" "$@"
fi

repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/tests/harness
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
node=${AETHER_NODE_NAME:-aether-node}
bridge=aether0 ip4=10.244.77.1 pod4=10.244.77.0/24 svc4=10.96.0.0/16
ip6=fd00:10:244:77::1 pod6=fd00:10:244:77::/64 svc6=fd00:10:96::/112
family=${AETHER_IP_FAMILY:-ipv4}
runtime=${AETHER_RUNTIME:-containerd}
# What kubelet, kube-proxy and the control plane are given (the primary family first), the
# `kubernetes` Service's IP (the first in the primary Service range) and cluster DNS's.
case $family in
  ipv6) node_ip=$ip6 node_ips=$ip6 pod_cidrs=$pod6 svc_cidrs=$svc6 api_svc_ip=fd00:10:96::1 dns_ip=fd00:10:96::a ;;
  dual) node_ip=$ip4 node_ips=$ip4,$ip6 pod_cidrs=$pod4,$pod6 svc_cidrs=$svc4,$svc6 api_svc_ip=10.96.0.1 dns_ip=10.96.0.10 ;;
  dual6) node_ip=$ip6 node_ips=$ip6,$ip4 pod_cidrs=$pod6,$pod4 svc_cidrs=$svc6,$svc4 api_svc_ip=fd00:10:96::1 dns_ip=fd00:10:96::a ;;
  *) node_ip=$ip4 node_ips=$ip4 pod_cidrs=$pod4 svc_cidrs=$svc4 api_svc_ip=10.96.0.1 dns_ip=10.96.0.10 ;;
esac
has4() { [ "$family" != ipv6 ]; }
has6() { [ "$family" != ipv4 ]; }
# An address in a URL: IPv6 in brackets.
url_host() { case $1 in *:*) echo "[$1]" ;; *) echo "$1" ;; esac; }
kubelet_root=/var/lib/kubelet
guard=AETHER-NODE
# Names the DIR of the node `up` brought up, until its `down` (reclaim_killed_node).
owner_mark=/run/aether-test-node.dir
# containerd's usual socket path, so the chart's default --cri-endpoint finds it.
containerd_sock=/run/containerd/containerd.sock
# shellcheck source=tests/harness/crio-lib.sh
. "$here/crio-lib.sh"
# The CRI socket kubelet and the agent use.
case $runtime in
  crio) cri_sock=$crio_sock ;;
  *) cri_sock=$containerd_sock ;;
esac
# Host paths this node may create (removed by `down` only if `up` created them; node-lib.sh).
HOST_DIRS=("$kubelet_root" /var/lib/cni /var/log/pods /var/log/containers /run/containerd /run/netns
  /run/aether /run/aether-cni /run/aether-pins /var/lib/aether /var/lib/kube-proxy /etc/kubernetes
  # The chart's proxy.handOver.hostPath, and the one the restarts case moves it to.
  /run/aether-proxy /run/aether-proxy-b "${CRIO_HOST_DIRS[@]}")
log() { printf '[node %4ss] %s\n' "$SECONDS" "$*" >&2; }
# shellcheck source=tests/harness/pids.sh
. "$here/pids.sh"
die() { log "error: $*"; exit 1; }
# shellcheck source=tests/harness/node-lib.sh
. "$here/node-lib.sh"

# ---------------------------------------------------------------------------------------------
# up

preflight() {
  [ "$(id -u)" = 0 ] || die "needs root: it creates a bridge, iptables chains, mounts and sysctls (run as root)"
  case $family in
    ipv4) ;;
    dual|dual6|ipv6) [ "$(cat /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null)" = 0 ] \
            || die "AETHER_IP_FAMILY=$family needs IPv6: net.ipv6.conf.all.disable_ipv6 is not 0 (or the kernel has no IPv6)" ;;
    *) die "AETHER_IP_FAMILY=$family: use ipv4, dual, dual6 or ipv6" ;;
  esac
  case $runtime in containerd|crio) ;; *) die "AETHER_RUNTIME=$runtime: use containerd or crio" ;; esac
  # The Debian packages of the node: scripts/install-deps.sh is the one place that installs them.
  "$repo/scripts/install-deps.sh" node || die "could not install the node's packages (scripts/install-deps.sh node)"
  local p
  for p in containerd ctr runc iptables ip6tables ip; do command -v "$p" >/dev/null || die "$p not found after scripts/install-deps.sh node"; done
  [ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge missing (package containernetworking-plugins)"
  for p in kube-apiserver etcd kubectl kubelet kube-controller-manager kube-scheduler kube-proxy coredns; do
    [ -x "$tools/bin/$p" ] || die "$tools/bin/$p missing: run tests/harness/build-tools.sh (make tools)"
  done
  [ -d /sys/fs/cgroup ] || die "no /sys/fs/cgroup"
  # Images, pod dirs and logs need room; below the kubelet's eviction threshold (256 MiB) pods
  # would stay Pending under a DiskPressure taint.
  local free_mib
  free_mib=$(df -Pm /var/lib | awk 'NR == 2 {print $4}')
  log "free disk on /var/lib's filesystem: ${free_mib} MiB"
  [ "$free_mib" -ge 1024 ] || die "only ${free_mib} MiB free on /var/lib's filesystem (kubelet, containerd): need 1024 MiB"
  reclaim_killed_node
  [ ! -e "$kubelet_root" ] || die "$kubelet_root exists: another kubelet, or a node that was not torn down (node.sh down DIR)"
  ip link show "$bridge" >/dev/null 2>&1 && die "bridge $bridge exists: a node already runs (node.sh down DIR)"
  [ ! -e "$containerd_sock" ] || die "$containerd_sock exists: another containerd runs on this host"
  if [ "$runtime" = crio ]; then
    "$repo/scripts/install-deps.sh" crio || die "could not install CRI-O's packages (scripts/install-deps.sh crio)"
    crio_preflight
  fi
  return 0
}

# A run killed before its `down` (a CI or session time limit, kill -9) leaves its node's host
# state behind, and the next `up` would refuse to start. `up` names its DIR in $owner_mark (on
# /run: gone at reboot); when that DIR's recorded processes are all gone, `down DIR` restores the
# host first. A node whose processes still run is never touched.
reclaim_killed_node() {
  [ -f "$owner_mark" ] || return 0
  local prev f
  prev=$(cat "$owner_mark")
  [ -n "$prev" ] && [ -d "$prev" ] || { rm -f "$owner_mark"; return 0; }
  for f in "$prev"/*.pid "$prev"/cp/*.pid; do
    [ -e "$f" ] || continue
    alive "$f" && die "the node of $prev still runs (pid $(cat "$f") in $f): node.sh down $prev"
  done
  log "the node of $prev was not torn down and none of its processes runs (its run was killed): node.sh down $prev first"
  ( down "$prev" ) || die "node.sh down $prev failed: restore the host by hand"
}

network_up() {
  local d=$1
  # A fixed, locally administered MAC: a bridge without one takes the lowest MAC of its ports, so
  # it changed whenever a pod's veth came or went, and pods that had the old one cached for the
  # node IP (their gateway, kube-apiserver) sent to a MAC nobody had until their neighbour entry
  # expired (seen here: the MAC changed as pods started).
  ip link add "$bridge" address 02:ae:00:00:00:01 type bridge
  echo "$bridge" >"$d/bridge.created"
  # The bridge keeps its IPv4 address in every family (an IPv6-only node gives it no pod or Service).
  ip addr add "$ip4/24" dev "$bridge"
  ip link set "$bridge" up
  ip route add "$svc4" dev "$bridge" scope link
  echo 1 >/proc/sys/net/ipv4/ip_forward
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] && echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
  iptables -N "$guard"
  iptables -A "$guard" -s "$pod4" ! -o "$bridge" -j DROP
  iptables -I FORWARD 1 -j "$guard"
  if has6; then
    ip -6 addr add "$ip6/64" dev "$bridge" nodad
    ip -6 route add "$svc6" dev "$bridge"
    echo 1 >/proc/sys/net/ipv6/conf/all/forwarding
    [ -e /proc/sys/net/bridge/bridge-nf-call-ip6tables ] && echo 1 >/proc/sys/net/bridge/bridge-nf-call-ip6tables
    ip6tables -N "$guard"
    ip6tables -A "$guard" -s "$pod6" ! -o "$bridge" -j DROP
    ip6tables -I FORWARD 1 -j "$guard"
  fi
  # containerd keeps pod netns in /run/netns; a HostToContainer mount of it needs a shared mount.
  mkdir -p /run/netns
  if ! mountpoint -q /run/netns; then
    mount --bind /run/netns /run/netns
    echo /run/netns >"$d/netns-mount.created"
  fi
  mount --make-shared /run/netns
  # The chart's socket pins (agent.pinning.hostPath): the agent's Bidirectional mount needs a
  # shared source (on systemd hosts / is shared; here it is private).
  mkdir -p /run/aether-pins
  if ! mountpoint -q /run/aether-pins; then
    mount --bind /run/aether-pins /run/aether-pins
    echo /run/aether-pins >"$d/pins-mount.created"
  fi
  mount --make-shared /run/aether-pins
  mkdir -p "$d/cni/net.d" "$d/cni/ipam"
  # One host-local range per family (the bridge plugin gives the pod one address from each), the
  # primary family's first: the pod's first IP is of the node's primary family.
  local range=() route=() ranges routes cidr
  for cidr in ${pod_cidrs//,/ }; do
    case $cidr in
      *:*) range+=("[{\"subnet\": \"$cidr\", \"gateway\": \"$ip6\"}]"); route+=('{"dst": "::/0"}') ;;
      *) range+=("[{\"subnet\": \"$cidr\", \"gateway\": \"$ip4\"}]"); route+=('{"dst": "0.0.0.0/0"}') ;;
    esac
  done
  ranges=$(IFS=,; echo "${range[*]}") routes=$(IFS=,; echo "${route[*]}")
  cat >"$d/cni/net.d/10-aether.conflist" <<CNI
{"cniVersion": "1.0.0", "name": "aether-node", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$d/cni/ipam", "ranges": [$ranges],
            "routes": [$routes]}},
  {"type": "loopback"}]}
CNI
}

containerd_up() {
  local d=$1 sock=$containerd_sock
  containerd_config "$d" "$sock"
  containerd --config "$d/containerd/config.toml" >"$d/logs/containerd.log" 2>&1 &
  echo $! >"$d/containerd.pid"
  echo "$sock" >"$d/containerd.sock.ours"
  local i
  for i in $(seq 1 100); do ctr -a "$sock" version >/dev/null 2>&1 && break; sleep 0.2; done
  ctr -a "$sock" version >/dev/null 2>&1 || { tail -n 20 "$d/logs/containerd.log" >&2; die "containerd did not start"; }
  log "containerd up (pid $(cat "$d/containerd.pid"), $sock)"
  AETHER_IMAGES_NO_CARGO=1 "$here/images.sh" build >&2
  "$here/images.sh" import "$sock" >&2
  log "images imported"
}

control_plane_up() {
  local d=$1
  AETHER_TOOLS_DIR=$tools AETHER_APISERVER_ADDRESS=$node_ip AETHER_SERVICE_CIDR=$svc_cidrs AETHER_APISERVER_SERVICE_IP=$api_svc_ip \
    "$here/controlplane.sh" start "$d/cp" 2>>"$d/logs/controlplane.log" \
    || { tail -n 20 "$d/logs/controlplane.log" >&2; die "control plane did not start"; }
  controllers_up "$d" "$svc_cidrs"
  client_cert "$d" kube-proxy system:kube-proxy system:node-proxier
  client_cert "$d" kubelet "system:node:$node" system:nodes
  kubeconfig "$d" kube-proxy
  kubeconfig "$d" kubelet
  log "control plane up: kube-apiserver https://$(url_host "$node_ip"), controller-manager, scheduler"
}

kubelet_up() {
  local d=$1
  mkdir -p "$d/kubelet"
  cat >"$d/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false            # this host is cgroup v1 (hybrid); kubelet 1.37 refuses v1 by default
cgroupDriver: cgroupfs         # containerd 2.x also says so (SystemdCgroup = false), CRI-O cgroup_manager; 1.6 cannot
containerRuntimeEndpoint: unix://$cri_sock
address: "$node_ip"            # kube-apiserver calls it here (logs, exec) with its client cert
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(free_port)
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $d/cp/pki/ca.crt}
authorization: {mode: Webhook}
resolvConf: ""                 # pods get only the cluster DNS: no upstream resolver on this machine
clusterDNS: ["$dns_ip"]       # dns.sh's Service kube-dns (AETHER_DNS_IP below; its domain must match)
clusterDomain: cluster.local
rotateCertificates: false
failSwapOn: false
# Absolute, small thresholds: on a shared CI disk 2% of 252 GiB (5 GiB) free is normal, and a
# DiskPressure taint would leave every pod (the chart's hook Job first) Pending with no error.
evictionHard: {memory.available: 100Mi, nodefs.available: 256Mi, imagefs.available: 256Mi}
imageGCHighThresholdPercent: 100   # images imported here have no registry: never collect them
imageGCLowThresholdPercent: 99
YAML
  local t0=$SECONDS
  start kubelet "$d" --config "$d/kubelet/config.yaml" --kubeconfig "$d/kubelet.kubeconfig" \
    --root-dir "$kubelet_root" --hostname-override "$node" --node-ip "$node_ips" --v 1
  cat >"$d/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $d/kube-proxy.kubeconfig}
mode: iptables
hostnameOverride: $node
clusterCIDR: $pod_cidrs
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
nodePortAddresses: [$(has4 && printf '"%s/32"' "$ip4")$(has4 && has6 && printf ', ')$(has6 && printf '"%s/128"' "$ip6")]
iptables: {localhostNodePorts: false}   # leaves net.ipv4.conf.all.route_localnet alone
conntrack: {maxPerCore: 0, min: 0}      # leaves nf_conntrack_max alone
YAML
  start kube-proxy "$d" --config "$d/kube-proxy.yaml" --v 1
  local k=("$tools/bin/kubectl" --kubeconfig "$d/cp/kubeconfig")
  until [ "$("${k[@]}" get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
    local p
    for p in kubelet kube-proxy kube-controller-manager kube-scheduler $(runtime_daemon); do
      kill -0 "$(cat "$d/$p.pid")" 2>/dev/null || { tail -n 30 "$d/logs/$p.log" >&2; die "$p exited (log: $d/logs/$p.log)"; }
    done
    [ $((SECONDS - t0)) -lt 120 ] || { tail -n 30 "$d/logs/kubelet.log" >&2; die "node $node not Ready after 120 s"; }
    sleep 0.5
  done
  log "node $node Ready $((SECONDS - t0)) s after kubelet start"
  # Pods reach kube-apiserver through the `kubernetes` Service ($api_svc_ip): wait until kube-proxy
  # has programmed it, so the first pod (the chart's hook Job) does not start into a crash-loop
  # back-off.
  local ipt=iptables rule="-d $api_svc_ip/32"
  case $api_svc_ip in *:*) ipt=ip6tables rule="-d $api_svc_ip/128" ;; esac
  until $ipt -w -t nat -S KUBE-SERVICES 2>/dev/null | grep -q -- "$rule"; do
    kill -0 "$(cat "$d/kube-proxy.pid")" 2>/dev/null || { tail -n 30 "$d/logs/kube-proxy.log" >&2; die "kube-proxy exited"; }
    [ $((SECONDS - t0)) -lt 120 ] || { tail -n 30 "$d/logs/kube-proxy.log" >&2; die "kube-proxy programmed no rule for Service $api_svc_ip in 120 s"; }
    sleep 0.5
  done
  log "kube-proxy serves Service $api_svc_ip $((SECONDS - t0)) s after kubelet start"
  # What controller-manager makes for every namespace: the default ServiceAccount and kube-root-ca.crt.
  until "${k[@]}" get serviceaccount/default configmap/kube-root-ca.crt -n default >/dev/null 2>&1; do
    [ $((SECONDS - t0)) -lt 120 ] || die "controller-manager made no default ServiceAccount / kube-root-ca.crt in 120 s"
    sleep 0.5
  done
}

# The runtime's daemon: its PID file is DIR/<name>.pid, its log DIR/logs/<name>.log.
runtime_daemon() { if [ "$runtime" = crio ]; then echo crio; else echo containerd; fi; }

# yes when pods kubelet gives oom_score_adj -997 (system-node-critical and
# system-cluster-critical priority, Guaranteed QoS) can start: containerd clamps the score to its
# own (restrict_oom_score_adj); CRI-O passes it to runc, which may lower it only with
# CAP_SYS_RESOURCE (proc(5), /proc/pid/oom_score_adj). Probed by trying, in a child shell.
critical_pods() {
  if [ "$runtime" = containerd ] || sh -c 'echo -997 >/proc/self/oom_score_adj' 2>/dev/null; then echo yes; else echo no; fi
}

# What charts/aether needs to know of this node beyond the images, as --set values separated by
# spaces: CRI-O's socket (agent.criSocket; its default is containerd's), and no priority class for
# the node pods where critical pods cannot start.
chart_sets() {
  local sets=()
  [ "$runtime" = containerd ] || sets+=("agent.criSocket=$cri_sock")
  [ "$critical" = yes ] || sets+=("daemonset.priorityClassName=")
  echo "${sets[*]}"
}

write_env() {
  local d=$1
  cat >"$d/env" <<ENV
export KUBECONFIG=$d/cp/kubeconfig
export AETHER_NODE_NAME=$node
export AETHER_NODE_IP=$node_ip
export AETHER_IP_FAMILY=$family
export AETHER_NODE_IP6=$(has6 && echo "$ip6")
export AETHER_RUNTIME=$runtime
export AETHER_CRI_SOCK=$cri_sock
$([ "$runtime" = containerd ] && echo "export AETHER_CONTAINERD_SOCK=$containerd_sock")
export AETHER_CRITICAL_PODS=$critical
export AETHER_CHART_SETS="$(chart_sets)"
export AETHER_KUBELET_ROOT=$kubelet_root
export AETHER_NETNS_DIR=/run/netns
ENV
  cat "$d/cp/env" >>"$d/env"
}

up() {
  local d=$1
  preflight
  mkdir -p "$d"
  d=$(cd "$d" && pwd)
  [ ! -e "$d/cp" ] || die "$d/cp exists: run node.sh down $d first"
  mkdir -p "$d/logs"
  [ "$runtime" = crio ] || use_containerd "$d"
  echo "$runtime" >"$d/runtime"
  remember_host "$d"
  [ "$runtime" != crio ] || crio_remember_ns "$d"
  echo "$d" >"$owner_mark"
  # From here on, any failure tears down what was started (node_dir: the trap runs outside `up`).
  node_dir=$d
  trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed (exit $rc): tearing down"; down "$node_dir"; fi' EXIT
  trap 'exit 130' INT TERM
  network_up "$d"
  if [ "$runtime" = crio ]; then crio_up "$d"; else containerd_up "$d"; fi
  control_plane_up "$d"
  kubelet_up "$d"
  critical=$(critical_pods)
  AETHER_TOOLS_DIR=$tools AETHER_DNS_IP=$dns_ip AETHER_DNS_PRIORITY_CLASS=$([ "$critical" = yes ] && echo system-cluster-critical) \
    "$here/dns.sh" up "$d/cp/kubeconfig" 1 >&2 || die "cluster DNS (dns.sh up) failed"
  write_env "$d"
  trap - EXIT INT TERM
  log "up: . $d/env  (kubectl: $tools/bin/kubectl)"
}

# ---------------------------------------------------------------------------------------------
# down

down() {
  local d=$1
  [ -d "$d" ] || { log "nothing to tear down in $d"; return 0; }
  d=$(cd "$d" && pwd)
  [ ! -f "$d/containerd.bin" ] || use_containerd "$d"
  runtime=$(cat "$d/runtime" 2>/dev/null || echo containerd)
  local sock=$containerd_sock k=("$tools/bin/kubectl" --kubeconfig "$d/cp/kubeconfig")
  set +e
  # 1. Pods first, so kubelet itself stops containers and unmounts volumes. DaemonSets and
  #    Deployments would recreate them: controller-manager stops first.
  stop_pid "$d/kube-controller-manager.pid"
  stop_pid "$d/kube-scheduler.pid"
  if alive "$d/kubelet.pid" && alive "$d/cp/apiserver.pid"; then
    if "${k[@]}" delete pods --all -A --grace-period=2 --timeout=60s >/dev/null 2>&1; then log "deleted all pods"
    else log "pod deletion incomplete (continuing)"; fi
  fi
  stop_pid "$d/kubelet.pid"
  stop_pid "$d/kube-proxy.pid"
  # 2. Containers left, then containerd and the shims serving this socket (or CRI-O, its
  #    conmons and its pinned namespaces).
  [ "$runtime" != crio ] || crio_down "$d"
  if alive "$d/containerd.pid"; then
    local t c
    for t in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -a "$sock" -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1; sleep 0.2
      ctr -a "$sock" -n k8s.io tasks rm -f "$t" >/dev/null 2>&1
    done
    for c in $(ctr -a "$sock" -n k8s.io containers ls -q 2>/dev/null); do ctr -a "$sock" -n k8s.io containers rm "$c" >/dev/null 2>&1; done
  fi
  stop_pid "$d/containerd.pid"
  local pid
  if [ -f "$d/containerd.sock.ours" ]; then   # only the shims of the containerd this node started
    for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    rm -f "$sock" "$sock.ttrpc" "$d/containerd.sock.ours"
  fi
  # 3. Control plane.
  [ -f "$d/cp/apiserver.pid" ] && AETHER_TOOLS_DIR=$tools "$here/controlplane.sh" stop "$d/cp" 2>/dev/null
  # 4. Mounts under the kubelet root and DIR (deepest first), network namespaces made since `up`.
  local m
  for m in $(findmnt -rn -o TARGET | grep -E "^($kubelet_root|$d)(/|$)" | sort -r); do umount "$m" 2>/dev/null || umount -l "$m"; done
  if [ -f "$d/netns-before.txt" ]; then
    for m in $(ls -1 /run/netns 2>/dev/null | grep -vxFf "$d/netns-before.txt"); do
      umount "/run/netns/$m" 2>/dev/null || umount -l "/run/netns/$m" 2>/dev/null; rm -f "/run/netns/$m"
    done
  fi
  if [ -f "$d/netns-mount.created" ]; then umount /run/netns 2>/dev/null || umount -l /run/netns; rm -f "$d/netns-mount.created"; fi
  # Pins the agent left (it removes them when Envoy goes), then the shared bind mount itself.
  for m in $(findmnt -rn -o TARGET | grep -E "^/run/aether-pins/" | sort -r); do umount "$m" 2>/dev/null || umount -l "$m"; done
  if [ -f "$d/pins-mount.created" ]; then umount /run/aether-pins 2>/dev/null || umount -l /run/aether-pins; rm -f "$d/pins-mount.created"; fi
  log "mounts left under $kubelet_root and $d: $(findmnt -rn -o TARGET | grep -cE "^($kubelet_root|$d)(/|$)")"
  # 5. Network: bridge and the pods' veths on it (their routes go with them), guard chain, chains
  #    kubelet/kube-proxy added.
  if [ -f "$d/bridge.created" ]; then remove_bridge "$bridge"; rm -f "$d/bridge.created"; fi
  restore_iptables "$d"
  # 6. Sysctls.
  restore_sysctls "$d"
  # 7. Empty cgroups kubelet (kubepods) and runc (k8s.io) made in the v1 hierarchies.
  remove_empty_cgroups kubepods
  remove_empty_cgroups k8s.io
  [ "$runtime" != crio ] || crio_cgroups_down "$d"
  # 8. Host dirs that did not exist before `up`, and this node's state.
  local p
  if [ -f "$d/created-dirs.txt" ]; then
    while read -r p; do [ -n "$p" ] && ! mountpoint -q "$p" && rm -rf "$p"; done <"$d/created-dirs.txt"
  fi
  rm -rf "$d/containerd/root" "$d/containerd/state" "$d/crio" "$d/cni/ipam" "$d/cp"
  [ "$(cat "$owner_mark" 2>/dev/null)" != "$d" ] || rm -f "$owner_mark"
  set -e
  log "down: $d"
}

cmd=${1:-}; dir=${2:-}
case $cmd in
  up) [ -n "$dir" ] || die "usage: $0 up DIR"; up "$dir" ;;
  down) [ -n "$dir" ] || die "usage: $0 down DIR"; down "$dir" ;;
  env) [ -n "$dir" ] || die "usage: $0 env DIR"; cat "$dir/env" ;;
  *) sed -n '2,59p' "$0" >&2; exit 2 ;;
esac
