# Sourced by node.sh (one node) and multinode.sh (several): the parts both kinds of cluster share.
# Needs $tools (the Go-built binaries' folder), $here (tests/harness) and the functions log and die.
#
#   use_containerd DIR           puts the containerd AETHER_CONTAINERD names first on PATH (and
#                                records it in DIR for `down`)
#   remember_host DIR            what `down` restores: host dirs that do not exist yet (HOST_DIRS),
#                                sysctls (SYSCTLS), iptables chains, /run/netns entries
#   client_cert DIR NAME CN ORG  a client certificate from the control plane's CA (DIR/cp/pki)
#   kubeconfig DIR NAME          DIR/NAME.kubeconfig with the client certificate NAME
#   start NAME DIR ARGS...       a binary from the tools dir in the background, its PID in
#                                DIR/NAME.pid and its output in DIR/logs/NAME.log
#   containerd_config DIR SOCK   DIR/containerd/config.toml: root and state under DIR/containerd,
#                                the gRPC socket SOCK, CNI configs from DIR/cni/net.d; config
#                                version 2 for containerd 1.x, version 3 for 2.x
#   controllers_up DIR SVC_CIDR  kube-controller-manager and kube-scheduler against DIR/cp
#   restore_iptables DIR         removes the chains made since remember_host, and the jumps into
#                                them from chains that existed before
#   restore_sysctls DIR          writes back every sysctl remember_host saw with another value now
#   remove_empty_cgroups NAME    rmdir (deepest first) of /sys/fs/cgroup/*/NAME: only empty
#                                cgroups go, a cgroup that still holds a process stays; tries for
#                                up to 5 s while one is left (a killed process leaves its cgroup
#                                only once the kernel has reaped it)
#   remove_bridge NAME           deletes the bridge NAME and the veths still attached to it (the
#                                kernel deletes a pod's host-side veth only when it frees the pod's
#                                network namespace, asynchronously, after `down` returns)

# Sysctls kubelet (vm/kernel), kube-proxy (conntrack, route_localnet) and the harness (forwarding;
# IPv6's for a dual-stack node: all/ before default/, as writing all/ also sets default/) may
# change. vm/* and kernel/* are global even when kubelet runs in its own network namespace.
SYSCTLS=(net/ipv4/ip_forward net/ipv4/conf/all/route_localnet net/bridge/bridge-nf-call-iptables
  net/bridge/bridge-nf-call-ip6tables net/netfilter/nf_conntrack_max
  net/netfilter/nf_conntrack_tcp_timeout_established net/netfilter/nf_conntrack_tcp_timeout_close_wait
  vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys
  kernel/keys/root_maxbytes net/ipv6/conf/all/forwarding net/ipv6/conf/default/forwarding)

# The containerd a node runs (its daemon, shim, ctr and runc, all found on PATH): by default
# (AETHER_CONTAINERD unset or 2) the containerd 2.x and runc that `build-tools.sh containerd2 runc`
# built (`make tools`); AETHER_CONTAINERD=1 keeps Debian's packages (containerd 1.6, runc 1.1).
# `up` records the PATH entries in DIR/containerd.bin; `down` (which may run without the
# variable) reads them back.
use_containerd() {
  local d=$1 bin="" b
  if [ -f "$d/containerd.bin" ]; then
    bin=$(cat "$d/containerd.bin")
  else
    case ${AETHER_CONTAINERD:-2} in
      1) ;;
      2) for b in containerd2/bin/containerd runc/bin/runc; do
           [ -x "$tools/$b" ] || die "AETHER_CONTAINERD=2: $tools/$b missing: run tests/harness/build-tools.sh containerd2 runc (make tools)"
         done
         bin=$(readlink -f "$tools/containerd2/bin"):$(readlink -f "$tools/runc/bin") ;;
      *) die "AETHER_CONTAINERD=$AETHER_CONTAINERD: use 2 (containerd 2.x, the default) or 1 (Debian's containerd 1.6)" ;;
    esac
    mkdir -p "$d" && echo "$bin" >"$d/containerd.bin"
  fi
  [ -z "$bin" ] || export PATH="$bin:$PATH"
  return 0
}

remember_host() {
  local d=$1 k p ipt t
  : >"$d/created-dirs.txt"
  for p in "${HOST_DIRS[@]}"; do [ -e "$p" ] || echo "$p" >>"$d/created-dirs.txt"; done
  : >"$d/sysctl-before.txt"
  for k in "${SYSCTLS[@]}"; do [ -e "/proc/sys/$k" ] && echo "$k $(cat "/proc/sys/$k")" >>"$d/sysctl-before.txt"; done
  for ipt in iptables ip6tables; do
    command -v $ipt >/dev/null || continue
    for t in filter nat mangle raw; do $ipt -t $t -S 2>/dev/null | awk -v t=$t '/^-N /{print t, $2}'; done >"$d/$ipt-chains-before.txt"
  done
  ls -1 /run/netns 2>/dev/null >"$d/netns-before.txt" || : >"$d/netns-before.txt"
}

client_cert() {
  local pki=$1/cp/pki
  openssl req -newkey rsa:2048 -nodes -subj "/O=$4/CN=$3" -keyout "$pki/$2.key" -out "$pki/$2.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$pki/$2.ext"
  openssl x509 -req -in "$pki/$2.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
    -extfile "$pki/$2.ext" -out "$pki/$2.crt" 2>/dev/null
}

kubeconfig() {
  local server
  server=$(sed -n 's/^ *server: //p' "$1/cp/kubeconfig")
  cat >"$1/$2.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: aether-node, cluster: {server: "$server", certificate-authority: "$1/cp/pki/ca.crt"}}]
users: [{name: $2, user: {client-certificate: "$1/cp/pki/$2.crt", client-key: "$1/cp/pki/$2.key"}}]
contexts: [{name: aether-node, context: {cluster: aether-node, user: $2}}]
current-context: aether-node
KC
}

start() {
  local name=$1 d=$2; shift 2
  "$tools/bin/$name" "$@" >"$d/logs/$name.log" 2>&1 &
  echo $! >"$d/$name.pid"
}

containerd_config() {
  local d=$1 sock=$2 version
  mkdir -p "$d/containerd"
  version=$(containerd --version | awk '{print $3}')
  log "$(command -v containerd): containerd $version; $(command -v runc): $(runc --version 2>/dev/null | sed -n 1p)"
  case $version in
    v2.*|2.*) containerd_config_v3 "$d" "$sock"; return ;;
  esac
  cat >"$d/containerd/config.toml" <<TOML
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/aether/pause:dev"
  # Pod netns at /run/netns/cni-*, where the chart's proxy mounts them (not under the state dir).
  netns_mounts_under_state_dir = false
  # Root here lacks CAP_SYS_RESOURCE: runc may not lower oom_score_adj (kubelet asks -998).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni/net.d"
  # Registry hosts (containerd's docs/hosts.md): none by default; make release-rehearsal adds
  # its loopback registry's hosts.toml here.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$d/containerd/certs.d"
TOML
}

# The same settings in containerd 2.x's version 3 (docs/cri/config.md of containerd: the CRI
# plugin split into images and runtime plugins; `sandbox_image` became pinned_images.sandbox).
containerd_config_v3() {
  local d=$1 sock=$2
  cat >"$d/containerd/config.toml" <<TOML
version = 3
root = "$d/containerd/root"
state = "$d/containerd/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/aether/pause:dev"
  # Registry hosts (containerd's docs/hosts.md): none by default; make release-rehearsal adds
  # its loopback registry's hosts.toml here.
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$d/containerd/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  # Pod netns at /run/netns/cni-*, where the chart's proxy mounts them (not under the state dir).
  netns_mounts_under_state_dir = false
  # Root here lacks CAP_SYS_RESOURCE: runc may not lower oom_score_adj (kubelet asks -998).
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$d/cni/net.d"
TOML
}

controllers_up() {
  local d=$1 svc_cidr=$2
  client_cert "$d" controller-manager system:kube-controller-manager system:kube-controller-manager
  client_cert "$d" scheduler system:kube-scheduler system:kube-scheduler
  kubeconfig "$d" controller-manager
  kubeconfig "$d" scheduler
  start kube-controller-manager "$d" --kubeconfig "$d/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$d/controller-manager.kubeconfig" --authorization-kubeconfig "$d/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" --cert-dir "$d/kcm-certs" \
    --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file "$d/cp/pki/sa.key" --root-ca-file "$d/cp/pki/ca.crt" \
    --cluster-signing-cert-file "$d/cp/pki/ca.crt" --cluster-signing-key-file "$d/cp/pki/ca.key" \
    --service-cluster-ip-range "$svc_cidr" --allocate-node-cidrs=false --v 1
  start kube-scheduler "$d" --kubeconfig "$d/scheduler.kubeconfig" \
    --authentication-kubeconfig "$d/scheduler.kubeconfig" --authorization-kubeconfig "$d/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" --leader-elect=false --v 1
}

restore_iptables() {
  local d=$1 ipt tbl ch rule
  for ipt in iptables ip6tables; do
    command -v $ipt >/dev/null && [ -f "$d/$ipt-chains-before.txt" ] || continue
    for tbl in filter nat mangle raw; do
      local new
      new=$($ipt -t $tbl -S 2>/dev/null | awk '/^-N /{print $2}' | while read -r ch; do
        grep -qxF "$tbl $ch" "$d/$ipt-chains-before.txt" || echo "$ch"; done)
      [ -n "$new" ] || continue
      # Jumps into new chains from chains that existed before (builtin ones included).
      $ipt -t $tbl -S 2>/dev/null | grep '^-A ' | while read -r rule; do
        local target
        target=$(sed -n 's/.* -j \([^ ]*\).*/\1/p' <<<"$rule")
        if grep -qxF "$target" <<<"$new"; then
          local from
          from=$(awk '{print $2}' <<<"$rule")
          grep -qxF "$from" <<<"$new" || eval "$ipt -t $tbl -D ${rule#-A }" 2>/dev/null
        fi
      done
      for ch in $new; do $ipt -t $tbl -F "$ch" 2>/dev/null; done
      for ch in $new; do $ipt -t $tbl -X "$ch" 2>/dev/null; done
    done
  done
}

restore_sysctls() {
  local d=$1 k v
  [ -f "$d/sysctl-before.txt" ] || return 0
  while read -r k v; do [ "$(cat "/proc/sys/$k" 2>/dev/null)" = "$v" ] || echo "$v" >"/proc/sys/$k"; done <"$d/sysctl-before.txt"
}

remove_empty_cgroups() {
  local h try left
  for try in $(seq 10); do
    left=0
    for h in /sys/fs/cgroup/*/; do
      [ -d "$h$1" ] || continue
      find "$h$1" -depth -type d -exec rmdir {} \; 2>/dev/null
      [ ! -d "$h$1" ] || left=1
    done
    [ "$left" = 1 ] || return 0
    sleep 0.5
  done
  log "cgroups left (a process still in them): $(ls -d /sys/fs/cgroup/*/"$1" 2>/dev/null | tr '\n' ' ')"
  return 0
}

remove_bridge() {
  local ports p
  ip link show "$1" >/dev/null 2>&1 || return 0
  ports=$(ip -o link show master "$1" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1)
  ip link del "$1" 2>/dev/null
  for p in $ports; do ip link del "$p" 2>/dev/null; done
  return 0
}
