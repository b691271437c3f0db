#!/usr/bin/env bash
# Several real Kubernetes nodes on this machine: what `AETHER_NODES=N node.sh up DIR` runs for
# N >= 2 (node.sh hands over to this script; call it through node.sh).
#
# One control plane on the host (controlplane.sh's etcd + kube-apiserver, kube-controller-manager,
# kube-scheduler, CoreDNS from dns.sh) and N nodes. Node i (aether-node-1 ...) is a set of
# namespaces held by one `unshare` process (its PID in DIR/nodes/<name>/holder.pid):
#   - its own network namespace: eth0 with the node IP 10.244.64.(10+i)/24 on the host bridge
#     `aethern0` (the host is 10.244.64.1, where kube-apiserver listens), a CNI bridge cni0 with
#     the pod CIDR 10.244.(64+i).0/24, routes to every other node's pod CIDR through that node's
#     IP, and its own kube-proxy and iptables;
#   - its own mount namespace (propagation: private from the host, shared inside): a tmpfs on
#     /run and DIR/nodes/<name>/{varlib,varlog} bound on /var/lib and /var/log, so the kubelet's
#     and the chart's host paths (/var/lib/kubelet, /run/aether, /run/aether-pins, /run/netns,
#     /run/containerd/containerd.sock, /var/lib/aether) are node-private, and a machine id of its
#     own on /etc/machine-id;
#   - its own UTS namespace (hostname = node name);
#   - containerd, kubelet (cgroupRoot /<name>, so no kubelet takes another's pods for orphans)
#     and kube-proxy, all started with `nsenter` into those namespaces (never `ip netns exec`,
#     which makes a new mount namespace per call).
# The host reaches pods through routes to each pod CIDR, and kube-apiserver calls webhooks at
# their endpoints' pod IPs (--enable-aggregator-routing): the host runs no kube-proxy, so it cannot
# reach a ClusterIP (pods and nodes can).
#
# AETHER_IP_FAMILY=dual (ipv4, the default, as above; ipv6 is refused: node.sh's single node has
# it): IPv4 stays primary and everything above gets an IPv6 twin: the host fd00:10:244:64::1/64 on
# aethern0 (added `nodad`), node i's eth0 fd00:10:244:64::(10+i)/64 (nodad; its default route via
# the host's), its pods fd00:10:244:(64+i)::/64 (a second host-local range on cni0; routes to every
# other node's through that node's IPv6, and from the host), IPv6 forwarding on and duplicate
# address detection off for new links inside each node's netns (a fresh netns starts with
# forwarding=0 and accept_dad=1), Services 10.96.0.0/16 and fd00:10:96::/112, kubelet
# --node-ip v4,v6, kube-proxy in dual-stack mode (clusterCIDR and nodePortAddresses per family,
# ip6tables in each node's netns), and the guard chain in ip6tables too. The host's IPv6 sysctls
# are not touched (preflight only checks net.ipv6.conf.all.disable_ipv6=0).
#
# containerd is the one node-lib.sh's use_containerd picks (AETHER_CONTAINERD: 2, the default,
# for the containerd 2.x and runc `make tools` built; 1 for Debian's 1.6), the same on every node.
#
# From the host, node i's files are under /proc/<holder pid>/root (its containerd socket:
# /proc/<pid>/root/run/containerd/containerd.sock) and commands run in it with
# `nsenter -t <pid> -m -n -u CMD` (DIR/env has each node's PID).
#
# What `up` changes on the host, and `down` restores on every exit path: the bridge and its
# veths (aeth-node<i>) (their routes go with them), a guard chain AETHER-NODES in FORWARD (node-to-node traffic
# stays on the bridge; pod traffic leaving by another interface is dropped; for dual the same chain
# in ip6tables), the global sysctls the
# kubelets set (vm.*, kernel.*: saved in DIR/sysctl-before.txt), and cgroups /sys/fs/cgroup/*/<name>.
# `down` stops what `up` started: the control plane by its PIDs, and each node by its PIDs, then
# whatever is left in that node's own mount namespace or cgroup (its shims and containers: every
# process there descends from what `up` started); the namespaces go with their last process.
#
# Usage (through node.sh): [AETHER_IP_FAMILY=dual] AETHER_NODES=N node.sh up DIR | node.sh down DIR. N is 2..8.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/tests/harness
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
bridge=aethern0 host_ip=10.244.64.1 cluster_cidr=10.244.64.0/18 svc_cidr=10.96.0.0/16
guard=AETHER-NODES
# IPv6 (AETHER_IP_FAMILY=dual only): the same layout under fd00:10:244::/48.
family=${AETHER_IP_FAMILY:-ipv4}
host_ip6=fd00:10:244:64::1 cluster_cidr6=fd00:10:244::/48 svc_cidr6=fd00:10:96::/112
has6() { [ "$family" = dual ]; }
# multinode.sh changes no host path: the nodes' paths live in their own mount namespaces.
HOST_DIRS=()

log() { printf '[nodes %4ss] %s\n' "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=tests/harness/pids.sh
. "$here/pids.sh"
# shellcheck source=tests/harness/node-lib.sh
. "$here/node-lib.sh"

name_of() { echo "aether-node-$1"; }
ip_of() { echo "10.244.64.$((10 + $1))"; }
cidr_of() { echo "10.244.$((64 + $1)).0/24"; }
ip6_of() { echo "fd00:10:244:64::$((10 + $1))"; }
cidr6_of() { echo "fd00:10:244:$((64 + $1))::/64"; }
# What the control plane, kubelet and kube-proxy are given (IPv4 first: the primary family).
svc_cidrs() { if has6; then echo "$svc_cidr,$svc_cidr6"; else echo "$svc_cidr"; fi; }
# The host end of node I's veth (an interface name has at most 15 bytes).
veth_of() { echo "aeth-node$1"; }
# in_node PID CMD...: CMD in node PID's network, mount and UTS namespaces. A daemon is started
# with `nsenter ... &` written out, not with this function: `in_node ... &` would fork a subshell,
# and $! would be its PID, not the daemon's.
in_node() { local h=$1; shift; nsenter -t "$h" -m -n -u -- "$@"; }

# ---------------------------------------------------------------------------------------------
# up

preflight() {
  [ "$(id -u)" = 0 ] || die "needs root: it creates namespaces, a bridge, iptables chains and cgroups (run as root)"
  [[ $nodes =~ ^[2-8]$ ]] || die "AETHER_NODES=$nodes: several nodes means 2 to 8 (1 is node.sh's single node)"
  case $family in
    ipv4) ;;
    dual) [ "$(cat /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null)" = 0 ] \
            || die "AETHER_IP_FAMILY=dual needs IPv6: net.ipv6.conf.all.disable_ipv6 is not 0 (or the kernel has no IPv6)" ;;
    ipv6) die "AETHER_IP_FAMILY=ipv6: several nodes take ipv4 or dual; an IPv6-only cluster is node.sh's single node (AETHER_NODES=1)" ;;
    *) die "AETHER_IP_FAMILY=$family: use ipv4 or dual (ipv6: one node only)" ;;
  esac
  "$repo/scripts/install-deps.sh" node || die "could not install the node's packages (scripts/install-deps.sh node)"
  local p
  for p in containerd ctr runc iptables ip unshare nsenter; do command -v "$p" >/dev/null || die "$p not found after scripts/install-deps.sh node"; done
  ! has6 || command -v ip6tables >/dev/null || die "ip6tables not found after scripts/install-deps.sh node (AETHER_IP_FAMILY=dual)"
  [ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge missing (package containernetworking-plugins)"
  for p in kube-apiserver etcd kubectl kubelet kube-controller-manager kube-scheduler kube-proxy coredns; do
    [ -x "$tools/bin/$p" ] || die "$tools/bin/$p missing: run tests/harness/build-tools.sh (make tools)"
  done
  local free_mib
  free_mib=$(df -Pm "$1" | awk 'NR == 2 {print $4}')
  log "free disk for the nodes' /var/lib (under $1): ${free_mib} MiB"
  [ "$free_mib" -ge $((1024 * nodes)) ] || die "only ${free_mib} MiB free under $1: need 1024 MiB per node"
  ip link show "$bridge" >/dev/null 2>&1 && die "bridge $bridge exists: a cluster already runs (node.sh down DIR)"
  local i
  for i in $(seq 1 "$nodes"); do
    for p in /sys/fs/cgroup/*/"$(name_of "$i")"; do [ ! -e "$p" ] || die "$p exists: a node was not torn down (node.sh down DIR)"; done
  done
  return 0
}

network_up() {
  local d=$1
  # Fixed MACs for the host bridge and each node's cni0 (made below, before the CNI plugin, which
  # then uses it): a bridge without one takes its lowest port MAC, which changes as ports come and
  # go (node.sh's network_up says what that did).
  ip link add "$bridge" address 02:ae:00:00:00:02 type bridge
  echo "$bridge" >"$d/bridge.created"
  ip addr add "$host_ip/24" dev "$bridge"
  ip link set "$bridge" up
  iptables -N "$guard"
  iptables -A "$guard" -i "$bridge" -o "$bridge" -j ACCEPT
  iptables -A "$guard" -s "$cluster_cidr" ! -o "$bridge" -j DROP
  iptables -I FORWARD 1 -j "$guard"
  if has6; then
    ip -6 addr add "$host_ip6/64" dev "$bridge" nodad
    ip6tables -N "$guard"
    ip6tables -A "$guard" -i "$bridge" -o "$bridge" -j ACCEPT
    ip6tables -A "$guard" -s "$cluster_cidr6" ! -o "$bridge" -j DROP
    ip6tables -I FORWARD 1 -j "$guard"
  fi
}

# node_up DIR I: node I's namespaces, network and mounts, then containerd with the images.
node_up() {
  local d=$1 i=$2 name ip cidr nd h j
  name=$(name_of "$i") ip=$(ip_of "$i") cidr=$(cidr_of "$i") nd=$d/nodes/$(name_of "$i")
  mkdir -p "$nd/logs" "$nd/varlib" "$nd/varlog" "$nd/cni/net.d" "$nd/cni/ipam" "$nd/containerd"
  unshare --mount --net --uts --propagation private sleep infinity </dev/null >/dev/null 2>&1 &
  h=$!
  echo "$h" >"$nd/holder.pid"
  # unshare makes the namespaces, then execs sleep in place (same PID).
  for _ in $(seq 1 50); do [ "$(readlink "/proc/$h/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] && break; sleep 0.1; done
  [ "$(readlink "/proc/$h/ns/net")" != "$(readlink /proc/self/ns/net)" ] || die "$name: unshare made no namespaces"
  ip link add "$(veth_of "$i")" type veth peer name eth0 netns "$h"
  ip link set "$(veth_of "$i")" master "$bridge" up
  # Cgroups for kubelet's cgroupRoot in every v1 hierarchy (cpuset's need cpus and mems to hold tasks).
  local c
  for c in /sys/fs/cgroup/*/; do
    [ "$c" = /sys/fs/cgroup/unified/ ] && continue
    mkdir "$c$name"
    if [ -f "$c/cpuset.cpus" ]; then cat "$c/cpuset.cpus" >"$c$name/cpuset.cpus"; cat "$c/cpuset.mems" >"$c$name/cpuset.mems"; fi
  done
  od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$nd/machine-id"; echo >>"$nd/machine-id"
  local routes=""
  for j in $(seq 1 "$nodes"); do [ "$j" = "$i" ] || routes+="ip route add $(cidr_of "$j") via $(ip_of "$j"); "; done
  # dual: IPv6 on (a fresh netns may inherit disable_ipv6 from the host's default), forwarding on,
  # no duplicate address detection for eth0 (nodad) nor for links made later (cni0, pod veths), so
  # addresses are usable at once; then eth0's IPv6 and the IPv6 routes.
  local v6=""
  if has6; then
    v6="echo 0 >/proc/sys/net/ipv6/conf/all/disable_ipv6; echo 0 >/proc/sys/net/ipv6/conf/default/disable_ipv6
    echo 0 >/proc/sys/net/ipv6/conf/eth0/disable_ipv6; echo 0 >/proc/sys/net/ipv6/conf/lo/disable_ipv6
    echo 0 >/proc/sys/net/ipv6/conf/default/accept_dad
    echo 1 >/proc/sys/net/ipv6/conf/all/forwarding
    [ ! -e /proc/sys/net/bridge/bridge-nf-call-ip6tables ] || echo 1 >/proc/sys/net/bridge/bridge-nf-call-ip6tables
    ip -6 addr add $(ip6_of "$i")/64 dev eth0 nodad
    ip -6 route add default via $host_ip6
    "
    for j in $(seq 1 "$nodes"); do [ "$j" = "$i" ] || v6+="ip -6 route add $(cidr6_of "$j") via $(ip6_of "$j"); "; done
  fi
  in_node "$h" bash -euc "
    hostname $name
    ip link set lo up
    ip addr add $ip/24 dev eth0
    ip link set eth0 up
    ip route add default via $host_ip
    $routes
    echo 1 >/proc/sys/net/ipv4/ip_forward
    [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
    $v6
    mount -t tmpfs -o mode=0755,size=256m tmpfs /run
    mount --bind $nd/varlib /var/lib
    mount --bind $nd/varlog /var/log
    [ ! -e /etc/machine-id ] || mount --bind $nd/machine-id /etc/machine-id
    mount --make-rshared /
    mkdir -p /run/netns /run/containerd /var/lib/kubelet
    ip link add cni0 address 02:ae:00:00:01:$(printf %02x "$i") type bridge
  " || die "$name: setting up its namespaces failed"
  ip route add "$cidr" via "$ip" dev "$bridge"
  # One host-local range per family (the bridge plugin gives each pod one address from each).
  local ranges="[{\"subnet\": \"$cidr\", \"gateway\": \"${cidr%.0/24}.1\"}]" routes='{"dst": "0.0.0.0/0"}' cidr6
  if has6; then
    cidr6=$(cidr6_of "$i")
    ip -6 route add "$cidr6" via "$(ip6_of "$i")" dev "$bridge"
    ranges+=", [{\"subnet\": \"$cidr6\", \"gateway\": \"${cidr6%::/64}::1\"}]" routes+=', {"dst": "::/0"}'
  fi
  cat >"$nd/cni/net.d/10-aether.conflist" <<CNI
{"cniVersion": "1.0.0", "name": "$name", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$nd/cni/ipam", "ranges": [$ranges],
            "routes": [$routes]}},
  {"type": "loopback"}]}
CNI
  containerd_config "$nd" /run/containerd/containerd.sock
  nsenter -t "$h" -m -n -u -- containerd --config "$nd/containerd/config.toml" >"$nd/logs/containerd.log" 2>&1 &
  echo $! >"$nd/containerd.pid"
  local sock=/proc/$h/root/run/containerd/containerd.sock
  for _ in $(seq 1 100); do ctr -a "$sock" version >/dev/null 2>&1 && break; sleep 0.2; done
  ctr -a "$sock" version >/dev/null 2>&1 || { tail -n 20 "$nd/logs/containerd.log" >&2; die "$name: containerd did not start"; }
  "$here/images.sh" import "$sock" >"$nd/logs/images.log" 2>&1 \
    || { tail -n 20 "$nd/logs/images.log" >&2; die "$name: importing the images failed"; }
  log "$name: namespaces (holder pid $h), node IP $ip$(has6 && echo ",$(ip6_of "$i")"), pods $cidr$(has6 && echo ",$(cidr6_of "$i")"), containerd up, images imported"
}

kubelet_up() {
  local d=$1 i=$2 name ip nd h
  name=$(name_of "$i") ip=$(ip_of "$i") nd=$d/nodes/$(name_of "$i")
  h=$(cat "$nd/holder.pid")
  client_cert "$d" "kubelet-$name" "system:node:$name" system:nodes
  kubeconfig "$d" "kubelet-$name"
  cat >"$nd/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$name             # its own: a kubelet kills pods it finds under its root as orphans
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $d/cp/pki/ca.crt}
authorization: {mode: Webhook}
resolvConf: ""                 # pods get the cluster DNS only (this machine has no upstream)
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
rotateCertificates: false
failSwapOn: false
evictionHard: {memory.available: 100Mi, nodefs.available: 256Mi, imagefs.available: 256Mi}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
  nsenter -t "$h" -m -n -u -- "$tools/bin/kubelet" --config "$nd/kubelet.yaml" --kubeconfig "$d/kubelet-$name.kubeconfig" \
    --root-dir /var/lib/kubelet --hostname-override "$name" --node-ip "$ip$(has6 && echo ",$(ip6_of "$i")")" --v 1 >"$nd/logs/kubelet.log" 2>&1 &
  echo $! >"$nd/kubelet.pid"
  cat >"$nd/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $d/kube-proxy.kubeconfig}
mode: iptables
hostnameOverride: $name
clusterCIDR: $cluster_cidr$(has6 && echo ",$cluster_cidr6")
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$ip/32"$(has6 && echo ", \"$(ip6_of "$i")/128\"")]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0}
YAML
  nsenter -t "$h" -m -n -u -- "$tools/bin/kube-proxy" --config "$nd/kube-proxy.yaml" --v 1 >"$nd/logs/kube-proxy.log" 2>&1 &
  echo $! >"$nd/kube-proxy.pid"
}

# wait_ready DIR I T0: node I Ready and its kube-proxy serving the `kubernetes` Service.
wait_ready() {
  local d=$1 i=$2 t0=$3 name nd h p
  name=$(name_of "$i") nd=$d/nodes/$(name_of "$i")
  h=$(cat "$nd/holder.pid")
  local k=("$tools/bin/kubectl" --kubeconfig "$d/cp/kubeconfig")
  until [ "$("${k[@]}" get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] \
    && in_node "$h" iptables -w -t nat -S KUBE-SERVICES 2>/dev/null | grep -q -- '-d 10.96.0.1/32'; do
    for p in kubelet kube-proxy containerd; do
      alive "$nd/$p.pid" || { tail -n 30 "$nd/logs/$p.log" >&2; die "$name: $p exited (log: $nd/logs/$p.log)"; }
    done
    [ $((SECONDS - t0)) -lt 180 ] || { tail -n 30 "$nd/logs/kubelet.log" >&2; die "$name not Ready (or its kube-proxy without Service 10.96.0.1) after 180 s"; }
    sleep 0.5
  done
  log "$name Ready, its kube-proxy serves 10.96.0.1 ($((SECONDS - t0)) s after its kubelet started)"
}

write_env() {
  local d=$1 i nd
  {
    echo "export AETHER_NODES=$nodes"
    echo "export AETHER_IP_FAMILY=$family"
    for i in $(seq 1 "$nodes"); do
      nd=$d/nodes/$(name_of "$i")
      echo "export AETHER_NODE_${i}_NAME=$(name_of "$i")"
      echo "export AETHER_NODE_${i}_IP=$(ip_of "$i")"
      echo "export AETHER_NODE_${i}_PID=$(cat "$nd/holder.pid")"
      echo "export AETHER_NODE_${i}_CONTAINERD_SOCK=/proc/$(cat "$nd/holder.pid")/root/run/containerd/containerd.sock"
      echo "export AETHER_NODE_${i}_POD_CIDR=$(cidr_of "$i")"
      echo "export AETHER_NODE_${i}_IP6=$(has6 && ip6_of "$i")"
      echo "export AETHER_NODE_${i}_POD_CIDR6=$(has6 && cidr6_of "$i")"
    done
    cat "$d/cp/env"
  } >"$d/env"
}

up() {
  local d=$1 i
  mkdir -p "$d"
  d=$(cd "$d" && pwd)
  preflight "$d"
  [ ! -e "$d/cp" ] || die "$d/cp exists: run node.sh down $d first"
  mkdir -p "$d/logs" "$d/nodes"
  echo "$nodes" >"$d/nodes/count"
  use_containerd "$d"
  remember_host "$d"
  node_dir=$d
  trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed (exit $rc): tearing down"; down "$node_dir"; fi' EXIT
  trap 'exit 130' INT TERM
  network_up "$d"
  AETHER_IMAGES_NO_CARGO=1 "$here/images.sh" build >&2
  for i in $(seq 1 "$nodes"); do node_up "$d" "$i"; done
  AETHER_TOOLS_DIR=$tools AETHER_APISERVER_ADDRESS=$host_ip AETHER_APISERVER_ENDPOINT_ROUTING=1 AETHER_APISERVER_RESTRICTED=1 \
    AETHER_SERVICE_CIDR=$(svc_cidrs) "$here/controlplane.sh" start "$d/cp" 2>>"$d/logs/controlplane.log" \
    || { tail -n 20 "$d/logs/controlplane.log" >&2; die "control plane did not start"; }
  controllers_up "$d" "$(svc_cidrs)"
  client_cert "$d" kube-proxy system:kube-proxy system:node-proxier
  kubeconfig "$d" kube-proxy
  log "control plane up: kube-apiserver https://$host_ip, controller-manager, scheduler"
  local t0=$SECONDS
  for i in $(seq 1 "$nodes"); do kubelet_up "$d" "$i"; done
  for i in $(seq 1 "$nodes"); do wait_ready "$d" "$i" "$t0"; done
  AETHER_TOOLS_DIR=$tools "$here/dns.sh" up "$d/cp/kubeconfig" 2 >&2 || die "cluster DNS did not come up"
  write_env "$d"
  trap - EXIT INT TERM
  log "up: $nodes nodes ($family); . $d/env  (kubectl: $tools/bin/kubectl)"
}

# ---------------------------------------------------------------------------------------------
# down

# kill_node_leftovers NAME HOLDER-PID: KILL every process in the node's cgroups or its mount
# namespace (all descend from what `up` started there), the holder last.
kill_node_leftovers() {
  local name=$1 h=$2 mnt p f
  for f in /sys/fs/cgroup/*/"$name"; do
    [ -d "$f" ] || continue
    find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u | while read -r p; do kill -KILL "$p" 2>/dev/null; done
  if [ -n "$h" ] && kill -0 "$h" 2>/dev/null; then
    mnt=$(readlink "/proc/$h/ns/mnt")
    if [ -n "$mnt" ] && [ "$mnt" != "$(readlink /proc/self/ns/mnt)" ]; then
      for p in /proc/[0-9]*; do
        [ "${p#/proc/}" = "$h" ] && continue
        [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$mnt" ] && kill -KILL "${p#/proc/}" 2>/dev/null
      done
    fi
    kill -KILL "$h" 2>/dev/null
  fi
  return 0
}

down() {
  local d=$1
  [ -d "$d" ] || { log "nothing to tear down in $d"; return 0; }
  d=$(cd "$d" && pwd)
  [ ! -f "$d/containerd.bin" ] || use_containerd "$d"
  local k=("$tools/bin/kubectl" --kubeconfig "$d/cp/kubeconfig") nd name h t c
  set +e
  # 1. Pods first, so each kubelet stops its containers and unmounts volumes.
  stop_pid "$d/kube-controller-manager.pid"
  stop_pid "$d/kube-scheduler.pid"
  if alive "$d/cp/apiserver.pid" && ls "$d"/nodes/*/kubelet.pid >/dev/null 2>&1; then
    if "${k[@]}" delete pods --all -A --grace-period=2 --timeout=60s >/dev/null 2>&1; then log "deleted all pods"
    else log "pod deletion incomplete (continuing)"; fi
  fi
  # 2. Each node: its daemons by PID, containers left, then what is left in its namespaces.
  for nd in "$d"/nodes/*/; do
    [ -f "$nd/holder.pid" ] || continue
    name=$(basename "$nd") h=$(cat "$nd/holder.pid")
    stop_pid "$nd/kubelet.pid"
    stop_pid "$nd/kube-proxy.pid"
    if alive "$nd/containerd.pid"; then
      local sock=/proc/$h/root/run/containerd/containerd.sock
      for t in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
        ctr -a "$sock" -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1
      done
      stop_pid "$nd/containerd.pid"
    fi
    kill_node_leftovers "$name" "$h"
    for _ in $(seq 1 50); do kill -0 "$h" 2>/dev/null || break; sleep 0.1; done
    rm -f "$nd/holder.pid"
  done
  # 3. Control plane.
  [ -f "$d/cp/apiserver.pid" ] && AETHER_TOOLS_DIR=$tools "$here/controlplane.sh" stop "$d/cp" 2>/dev/null
  # 4. Cgroups (empty now), network, guard chain, sysctls.
  for nd in "$d"/nodes/*/; do
    name=$(basename "$nd")
    remove_empty_cgroups "$name"   # waits while a killed process is still leaving it
    ip link del "$(veth_of "${name##*-}")" 2>/dev/null
  done
  if [ -f "$d/bridge.created" ]; then remove_bridge "$bridge"; rm -f "$d/bridge.created"; fi
  restore_iptables "$d"
  restore_sysctls "$d"
  # 5. This cluster's state.
  rm -rf "$d/cp" "$d"/nodes/*/varlib "$d"/nodes/*/varlog "$d"/nodes/*/containerd/root "$d"/nodes/*/containerd/state "$d"/nodes/*/cni/ipam
  set -e
  log "down: $d"
}

nodes=${AETHER_NODES:-2}
cmd=${1:-}; dir=${2:-}
case $cmd in
  up) [ -n "$dir" ] || die "usage: AETHER_NODES=N node.sh up DIR"; up "$dir" ;;
  down) [ -n "$dir" ] || die "usage: node.sh down DIR"; down "$dir" ;;
  *) sed -n '2,52p' "$0" >&2; exit 2 ;;
esac
