# Sourced by node.sh for AETHER_RUNTIME=crio: a node whose container runtime is CRI-O (the one
# `tests/harness/build-tools.sh crio` builds: crio, copyimg, pinns) with the runc of `make tools`
# and Debian's conmon (scripts/install-deps.sh crio). Needs $tools, $here, log and die.
#
#   crio_preflight               the binaries are there (CRI-O built if missing), the socket is free
#   crio_up DIR                  DIR/crio/crio.conf, CRI-O started (its PID in DIR/crio.pid, its
#                                log in DIR/logs/crio.log), every image of images.sh loaded
#   crio_cgroups_up DIR          mounts the hugetlb cgroup (v1) when the kernel has it unmounted
#   crio_cgroups_down DIR        unmounts it again (after the node's cgroups are removed)
#   crio_remember_ns DIR         the pinned IPC/UTS/... namespaces that exist before `up`
#   crio_down DIR                the containers runc still runs for this CRI-O, CRI-O, its conmons,
#                                and the namespaces pinns pinned since `up` (node.sh's `down`
#                                then unmounts CRI-O's storage under DIR and removes DIR/crio)
#
# Where CRI-O keeps things (docs/crio.conf.5.md of CRI-O): image and container storage, its run
# state, container exit files and pod logs all under DIR/crio (removed by `down`); only its socket
# (/run/crio/crio.sock, the path the chart's agent.criSocket names for CRI-O) and the pod
# namespaces are on the host: pinns pins them under namespaces_dir (/run here, so the network
# namespace is /run/netns/<uuid>, the dir the chart's proxy mounts; its IPC and UTS ones go to
# /run/ipcns and /run/utsns, which `down` unmounts and removes when `up` made them).

crio_sock=/run/crio/crio.sock
# Host paths CRI-O may create when they are missing (node.sh's HOST_DIRS: `down` removes the
# ones `up` found missing).
CRIO_HOST_DIRS=(/run/crio /run/ipcns /run/utsns /run/userns /run/pidns /var/lib/crio /var/log/crio
  /var/lib/containers /etc/crio)
# The pinned namespace kinds besides the network one (node.sh handles /run/netns).
CRIO_NS_DIRS=(/run/ipcns /run/utsns /run/userns /run/pidns)

crio_bin() { readlink -f "$tools/crio/bin"; }

crio_preflight() {
  local b
  # Built once into the tools dir, like `make tools` (minutes the first time).
  [ -x "$tools/crio/bin/crio" ] || AETHER_TOOLS_DIR=$tools "$here/build-tools.sh" crio >&2 \
    || die "AETHER_RUNTIME=crio: tests/harness/build-tools.sh crio failed"
  for b in crio/bin/crio crio/bin/copyimg crio/bin/pinns runc/bin/runc; do
    [ -x "$tools/$b" ] || die "AETHER_RUNTIME=crio: $tools/$b missing: run tests/harness/build-tools.sh crio runc"
  done
  command -v conmon >/dev/null || die "AETHER_RUNTIME=crio: conmon not found: run scripts/install-deps.sh crio"
  [ ! -e "$crio_sock" ] || die "$crio_sock exists: another CRI-O runs on this host"
}

# yes when this process's capability bounding set lacks a capability the kernel has (this
# machine's sandbox drops CAP_SYS_RESOURCE): CRI-O's privileged containers ask for every one.
caps_incomplete() {
  local last mask
  last=$(cat /proc/sys/kernel/cap_last_cap)
  mask=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
  [ $(( mask & ((1 << (last + 1)) - 1) )) -ne $(( (1 << (last + 1)) - 1 )) ]
}

# The runc CRI-O runs: the one `make tools` built, through runc-caps.py where the bounding set
# is incomplete (its header says why; on a usual node runc runs directly).
crio_runc() {
  local d=$1 real
  real=$(readlink -f "$tools/runc/bin/runc")
  if caps_incomplete; then
    log "runc through $d/crio/bin/runc: this host's capability bounding set lacks some the kernel has (tests/harness/runc-caps.py)"
    mkdir -p "$d/crio/bin"
    printf '#!/bin/sh\nRUNC_CAPS_REAL=%s exec %s %s "$@"\n' "$real" "$(python3 -c 'import sys; print(sys.executable)')" "$here/runc-caps.py" >"$d/crio/bin/runc"
    chmod 0755 "$d/crio/bin/runc"
    echo "$d/crio/bin/runc"
  else
    echo "$real"
  fi
}

crio_config() {
  local d=$1 c=$1/crio runc
  mkdir -p "$c/crio.conf.d" "$c/exits" "$c/attach" "$c/pod-logs"
  runc=$(crio_runc "$d")
  # Images come only from copyimg: accept them without a signature (CRI-O never pulls here).
  echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$c/policy.json"
  cat >"$c/crio.conf" <<TOML
[crio]
root = "$c/storage"
runroot = "$c/run"
storage_driver = "overlay"
log_dir = "$c/pod-logs"
version_file = "$c/run/version"
version_file_persist = "$c/version"
clean_shutdown_file = "$c/clean.shutdown"
[crio.api]
listen = "$crio_sock"
[crio.runtime]
default_runtime = "runc"
# kubelet's cgroupDriver (node.sh): cgroupfs, this host has no systemd.
cgroup_manager = "cgroupfs"
pinns_path = "$(crio_bin)/pinns"
namespaces_dir = "/run"
container_exits_dir = "$c/exits"
container_attach_socket_dir = "$c/attach"
irqbalance_config_file = ""
[crio.runtime.runtimes.runc]
runtime_path = "$runc"
runtime_root = "$c/runc"
monitor_path = "$(command -v conmon)"
monitor_cgroup = "pod"
[crio.image]
pause_image = "localhost/aether/pause:dev"
# The pause image's own entrypoint (aether-pause), not CRI-O's default /pause.
pause_command = ""
signature_policy = "$c/policy.json"
[crio.network]
network_dir = "$d/cni/net.d"
plugin_dirs = ["/usr/lib/cni"]
TOML
}

# copyimg IMAGE-REF TAR: loads a docker-archive tarball into CRI-O's storage, as CRI-O's own
# tests do (test/helpers.bash). copyimg keeps a blob-info cache under /var/lib/containers/cache
# whatever its --root; it runs in a mount namespace of its own with a tmpfs there, so the host
# keeps nothing of it.
crio_copyimg() {
  local d=$1 ref=$2 tar=$3
  unshare -m --propagation private sh -c 'mount -t tmpfs aether-copyimg /var/lib && exec "$@"' copyimg \
    "$(crio_bin)/copyimg" --root "$d/crio/storage" --runroot "$d/crio/run" --storage-driver overlay \
    --signature-policy "$d/crio/policy.json" --image-name "$ref" --import-from "docker-archive:$tar"
}

# CRI-O asks runc for hugetlb limits whenever the kernel lists the hugetlb controller
# (/proc/cgroups), mounted or not (internal/config/node of CRI-O), and kubelet sends one per
# hugepage size; runc then fails every container ("cannot set hugetlb limit"). A cgroup v1 host
# whose init mounts every controller (systemd does) has it; this one does not, so `up` mounts it
# for the node's life (containerd never sets those limits: its disable_hugetlb_controller).
crio_cgroups_up() {
  local d=$1 h=/sys/fs/cgroup/hugetlb
  [ -d /sys/fs/cgroup/memory ] || return 0   # cgroup v2: nothing to mount
  awk '$1 == "hugetlb" && $4 == 1 {f = 1} END {exit !f}' /proc/cgroups || return 0
  mountpoint -q "$h" && return 0
  if [ ! -e "$h" ]; then mkdir "$h"; echo "$h" >"$d/hugetlb-dir.created"; fi
  mount -t cgroup -o hugetlb cgroup "$h" || die "could not mount the hugetlb cgroup at $h (CRI-O sets hugetlb limits)"
  echo "$h" >"$d/hugetlb-mount.created"
  log "mounted the hugetlb cgroup hierarchy at $h (until down)"
}

# After the node's cgroups are gone (node.sh's remove_empty_cgroups).
crio_cgroups_down() {
  local d=$1 h
  if [ -f "$d/hugetlb-mount.created" ]; then
    h=$(cat "$d/hugetlb-mount.created")
    umount "$h" 2>/dev/null || umount -l "$h"; rm -f "$d/hugetlb-mount.created"
  fi
  if [ -f "$d/hugetlb-dir.created" ]; then rmdir "$(cat "$d/hugetlb-dir.created")" 2>/dev/null; rm -f "$d/hugetlb-dir.created"; fi
  return 0
}

crio_up() {
  local d=$1 i
  crio_cgroups_up "$d"
  case $d in /var/lib/*) die "AETHER_RUNTIME=crio: DIR $d is under /var/lib, which the image import hides" ;; esac
  crio_config "$d"
  log "$(crio_bin)/crio: $("$(crio_bin)/crio" --version 2>/dev/null | sed -n 1p); runc: $("$tools/runc/bin/runc" --version | sed -n 1p); conmon: $(conmon --version | sed -n 1p)"
  # Images first: CRI-O checks at start that the pause image is in its storage.
  AETHER_IMAGES_NO_CARGO=1 "$here/images.sh" build >&2
  local ref tar
  while IFS=$'\t' read -r ref tar; do
    crio_copyimg "$d" "$ref" "$tar" >>"$d/logs/copyimg.log" 2>&1 || { tail -n 20 "$d/logs/copyimg.log" >&2; die "copyimg of $ref ($tar) failed"; }
  done < <("$here/images.sh" list)
  log "images loaded into CRI-O's storage (copyimg)"
  "$(crio_bin)/crio" --config "$d/crio/crio.conf" --config-dir "$d/crio/crio.conf.d" >"$d/logs/crio.log" 2>&1 &
  echo $! >"$d/crio.pid"
  # CRI-O's inspect endpoint answers on the CRI socket once it serves (server/inspect.go).
  for i in $(seq 1 150); do
    curl -fsS --unix-socket "$crio_sock" http://localhost/info >/dev/null 2>&1 && break
    kill -0 "$(cat "$d/crio.pid")" 2>/dev/null || { tail -n 20 "$d/logs/crio.log" >&2; die "crio exited (log: $d/logs/crio.log)"; }
    [ "$i" -lt 150 ] || { tail -n 20 "$d/logs/crio.log" >&2; die "CRI-O did not answer on $crio_sock in 30 s"; }
    sleep 0.2
  done
  log "CRI-O up (pid $(cat "$d/crio.pid"), $crio_sock)"
}

crio_down() {
  local d=$1 c pid m ns runc=("$tools/runc/bin/runc" --root "$d/crio/runc")
  # Containers kubelet did not stop, by the runc state dir this CRI-O gave runc.
  if [ -d "$d/crio/runc" ]; then
    for c in $("${runc[@]}" list -q 2>/dev/null); do
      "${runc[@]}" kill "$c" KILL >/dev/null 2>&1
      "${runc[@]}" delete -f "$c" >/dev/null 2>&1
    done
  fi
  stop_pid "$d/crio.pid"
  # conmon outlives CRI-O by design; only the ones writing to this node's exit dir.
  for pid in $(pgrep -f -- "--exit-dir $d/crio/exits" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  for ns in "${CRIO_NS_DIRS[@]}"; do
    [ -f "$d/crio-ns-before.txt" ] && [ -d "$ns" ] || continue
    for m in $(ls -1 "$ns" 2>/dev/null); do
      grep -qxF "$ns/$m" "$d/crio-ns-before.txt" && continue
      umount "$ns/$m" 2>/dev/null || umount -l "$ns/$m" 2>/dev/null; rm -f "$ns/$m"
    done
  done
  rm -f "$crio_sock"
}

# What crio_down may remove from the namespace dirs: only entries made after this.
crio_remember_ns() {
  local ns
  for ns in "${CRIO_NS_DIRS[@]}"; do ls -1d "$ns"/* 2>/dev/null; done >"$1/crio-ns-before.txt" || true
}
