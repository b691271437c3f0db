#!/usr/bin/env bash
# Builds the OCI images the real-node tests run, from the workspace's own binaries, as
# `docker save` (docker-archive) tarballs: no registry, no Docker engine (tests/harness/mkimage.py
# writes them). Each image is one deterministic layer: the binaries, the shared libraries ldd names
# for them, /tmp, /etc/passwd + /etc/group (root, nonroot 65532) and empty /proc /sys /dev.
# Profile (AETHER_IMAGE_PROFILE): `debug` (the default: what the test suites build anyway) or
# `release` (`make images`: `cargo build --release`, binaries from $CARGO_TARGET_DIR/release).
# The images of aether's own binaries carry the OCI annotation keys as image config labels
# (org.opencontainers.image.title, description, version = workspace.package.version of Cargo.toml,
# revision = git HEAD, source, licenses, created = HEAD's commit time, so that a rebuild of the
# same commit gives the same tarball).
#
#   <prefix>/aether-controller:<tag>  aether-controller + aether-webhook-certs; binaries' paths,
#                                     USER, ENTRYPOINT, CMD, EXPOSE from controller/Dockerfile
#   <prefix>/aether-agent:<tag>       aether-agent + aether-proxy-launcher; the same from agent-reconciler/Dockerfile.
#                                     The launcher is linked statically (`+crt-static`, its own
#                                     cargo build into <target dir>/static, checked with
#                                     `readelf -d`: no NEEDED, no interpreter), as the Dockerfile
#                                     builds it: it runs in whatever Envoy image the chart's
#                                     initContainer copies it into
#   <prefix>/envoy:<tag>              the PyPI Envoy (install-envoy.sh) at /usr/local/bin/envoy with
#                                     only the libraries Envoy itself loads (none of the launcher's)
#   <prefix>/uds-echo:<tag>           the test workload (tests/src/bin/uds-echo.rs)
#   <prefix>/pause:<tag>              the pod sandbox image (tests/src/bin/aether-pause.rs)
#   <prefix>/coredns:<tag>            the cluster DNS (dns.sh): the tools dir's CoreDNS
#                                     (build-tools.sh coredns, built here if missing; a static Go
#                                     binary, so no libraries) at /usr/local/bin/coredns
#
# Usage:
#   tests/harness/images.sh build         cargo build the binaries (the profile's), then (re)build every tarball
#                                         whose inputs changed; prints REF  TAR  SIZE per image
#   tests/harness/images.sh launcher      cargo build (the profile's) only the statically linked launcher
#                                         (`make build` runs it: the node harnesses build images with
#                                         AETHER_IMAGES_NO_CARGO=1)
#   tests/harness/images.sh import SOCK   `ctr -a SOCK -n k8s.io images import` every tarball
#                                         (run `build` first); idempotent
#   tests/harness/images.sh list          prints REF<TAB>TAR per image (builds nothing)
# Env: AETHER_IMAGES_DIR    where the tarballs go (default: <repo>/.cache/images)
#      AETHER_IMAGE_PREFIX  repository prefix (default: localhost/aether)
#      AETHER_IMAGE_TAG     tag (default: dev)
#      AETHER_IMAGE_PROFILE debug (default) or release: the cargo profile of the binaries
#      CARGO_TARGET_DIR     cargo's target dir (default: <repo>/target); binaries from its debug/
#                           or release/ folder (the profile's)
#      AETHER_TOOLS_DIR     build-tools.sh's folder, for CoreDNS (default: <repo>/.cache/tools)
#      AETHER_IMAGES_NO_CARGO=1  skip the cargo build (the binaries must already be there)
#      AETHER_IMAGES_ONLY   build only these images (names, space-separated), e.g.
#                           "aether-controller aether-agent": the release workflow's images, which
#                           need neither Envoy nor the Go-built tools
#      CARGO, PYTHON        the cargo and python3 to run (defaults: cargo, python3)
# Concurrent builds into one folder take turns (flock on <folder>/.lock).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${AETHER_IMAGES_DIR:-$repo/.cache/images}
prefix=${AETHER_IMAGE_PREFIX:-localhost/aether}
tag=${AETHER_IMAGE_TAG:-dev}
profile=${AETHER_IMAGE_PROFILE:-debug}
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
CARGO=${CARGO:-cargo}
PYTHON=${PYTHON:-python3}
mkimage=("$PYTHON" "$repo/tests/harness/mkimage.py")

log() { printf '[images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case $profile in
  debug | release) ;;
  *) die "AETHER_IMAGE_PROFILE=$profile: expected debug or release" ;;
esac
bin_dir=${CARGO_TARGET_DIR:-$repo/target}/$profile
# The statically linked launcher: a build of its own (other RUSTFLAGS, so another target dir, and
# --target so that the flags leave build scripts and proc macros alone).
host_triple=$(cd "$repo" && rustc -vV | sed -n 's/^host: //p')
static_dir=${CARGO_TARGET_DIR:-$repo/target}/static
static_launcher=$static_dir/$host_triple/$profile/aether-proxy-launcher

# The six images: short name (the tarball is <name>.tar).
names=(aether-controller aether-agent envoy uds-echo pause coredns)
for n in ${AETHER_IMAGES_ONLY:-}; do
  [[ " ${names[*]} " == *" $n "* ]] || { printf '[images] error: AETHER_IMAGES_ONLY names %s, not one of: %s\n' "$n" "${names[*]}" >&2; exit 1; }
done
# want NAME: whether this run builds image NAME (AETHER_IMAGES_ONLY, else all).
want() { [ -z "${AETHER_IMAGES_ONLY:-}" ] || [[ " $AETHER_IMAGES_ONLY " == *" $1 "* ]]; }

list() {
  local n
  for n in "${names[@]}"; do
    printf '%s/%s:%s\t%s/%s.tar\n' "$prefix" "$n" "$tag" "$out" "$n"
  done
}

# human SIZE-IN-BYTES: the size in MiB with one decimal.
human() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# The OCI labels of an image of aether's binaries, as mkimage.py flags, one word a line: --created
# and --label flags. Usage: labels TITLE DESCRIPTION.
# Version from Cargo.toml, revision and created from git (HEAD and its commit time, UTC); without
# a git checkout (an unpacked source archive) revision is left out and created is the epoch.
labels() {
  local version revision="" created="1970-01-01T00:00:00Z"
  version=$("$PYTHON" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["version"])' \
    "$repo/Cargo.toml") || die "no workspace.package.version in $repo/Cargo.toml"
  if revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null); then
    created=$(TZ=UTC0 git -C "$repo" log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD)
  else
    revision=""
  fi
  local flags=(
    --created "$created"
    --label "org.opencontainers.image.title=$1"
    --label "org.opencontainers.image.description=$2"
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.source=https://github.com/aether-mesh/aether"
    --label "org.opencontainers.image.licenses=Apache-2.0"
    --label "org.opencontainers.image.created=$created"
  )
  [ -z "$revision" ] || flags+=(--label "org.opencontainers.image.revision=$revision")
  printf '%s\n' "${flags[@]}"
}

# launcher: cargo build (the profile's) of the statically linked aether-proxy-launcher.
launcher() {
  log "cargo build ($profile) of the statically linked aether-proxy-launcher ..."
  local release_flag=()
  [ "$profile" = debug ] || release_flag=(--release)
  (cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static" "$CARGO" build -q --locked "${release_flag[@]}" \
    --target "$host_triple" --target-dir "$static_dir" -p aether-proxy-launcher --bin aether-proxy-launcher)
}
build() {
  if [ "${AETHER_IMAGES_NO_CARGO:-}" != 1 ]; then
    if [ "$profile" = release ]; then
      # Only the images' binaries: the tests crate's other binaries (the bench) are not shipped.
      log "cargo build --release of the image binaries ..."
      local bins=(-p aether-controller -p aether-webhook-certs -p aether-agent-reconciler -p aether-proxy-launcher
        --bin aether-controller --bin aether-webhook-certs --bin aether-agent --bin aether-proxy-launcher)
      if want uds-echo || want pause; then bins+=(-p aether-tests --bin uds-echo --bin aether-pause); fi
      (cd "$repo" && "$CARGO" build -q --locked --release "${bins[@]}")
    else
      log "cargo build (debug) of the image binaries ..."
      (cd "$repo" && "$CARGO" build -q -p aether-controller -p aether-webhook-certs \
        -p aether-agent-reconciler -p aether-proxy-launcher -p aether-tests --bins)
    fi
  fi
  [ "${AETHER_IMAGES_NO_CARGO:-}" = 1 ] || launcher
  [ -f "$static_launcher" ] || die "$static_launcher missing: make build (or tests/harness/images.sh launcher) first"
  command -v readelf >/dev/null || die "readelf (Debian binutils) is needed to check that the launcher is static"
  local needed
  needed=$(readelf -d "$static_launcher" | grep -E '\(NEEDED\)' || true)
  [ -z "$needed" ] || die "$static_launcher loads shared libraries, which an Envoy image may lack: $needed"
  [ -z "$(readelf -l "$static_launcher" | grep INTERP || true)" ] \
    || die "$static_launcher names an ELF interpreter: not statically linked"
  local -a controller_labels agent_labels echo_labels pause_labels
  mapfile -t controller_labels < <(labels aether-controller \
    "aether's admission webhook for EndpointPolicy (config.aether.io/v1) and the chart's webhook certificate job (aether-webhook-certs)")
  mapfile -t agent_labels < <(labels aether-agent \
    "aether's node agent (xDS over a Unix socket to the node's Envoy) and the Envoy launcher (aether-proxy-launcher)")
  mapfile -t echo_labels < <(labels uds-echo "aether's test workload: an echo server on a Unix socket or TCP")
  mapfile -t pause_labels < <(labels aether-pause "aether's pod sandbox (pause) image for its test node")
  [ ${#controller_labels[@]} -ge 14 ] || die "could not work out the image labels (Cargo.toml, git)"
  local envoy
  if want envoy; then envoy=$("$repo/tests/harness/install-envoy.sh"); fi
  if want coredns; then
    # CoreDNS: built from its Go module the first time (minutes); later runs only check it is there.
    AETHER_TOOLS_DIR=$tools "$repo/tests/harness/build-tools.sh" coredns \
      || die "could not build CoreDNS (tests/harness/build-tools.sh coredns)"
    [ -x "$tools/bin/coredns" ] || die "$tools/bin/coredns missing after build-tools.sh coredns"
  fi
  mkdir -p "$out"
  # One build at a time per folder (a tarball and its .inputs stamp must come from the same run).
  exec 9>"$out/.lock"
  flock -n 9 || { log "waiting for another images.sh build in $out ..."; flock 9; }
  local nonroot='65532:65532' lines=()
  want aether-controller && lines+=("$("${mkimage[@]}" build --ref "$prefix/aether-controller:$tag" --out "$out/aether-controller.tar" \
    --dockerfile "$repo/controller/Dockerfile" --bin-dir "$bin_dir" "${controller_labels[@]}")")
  want aether-agent && lines+=("$("${mkimage[@]}" build --ref "$prefix/aether-agent:$tag" --out "$out/aether-agent.tar" \
    --dockerfile "$repo/agent-reconciler/Dockerfile" --bin-dir "$bin_dir" \
    --add "$static_launcher:/usr/local/bin/aether-proxy-launcher" "${agent_labels[@]}")")
  # The chart runs Envoy as root (proxy.securityContext.runAsUser: 0) under the launcher that an
  # initContainer copies from the agent image. The launcher is static, so this image carries only
  # what Envoy loads, as an upstream Envoy image has nothing of the launcher's either.
  want envoy && lines+=("$("${mkimage[@]}" build --ref "$prefix/envoy:$tag" --out "$out/envoy.tar" \
    --add "$envoy:/usr/local/bin/envoy" --entrypoint '["/usr/local/bin/envoy"]' \
    --cmd '["--config-path","/etc/envoy/envoy.yaml"]' --user 0:0)")
  want uds-echo && lines+=("$("${mkimage[@]}" build --ref "$prefix/uds-echo:$tag" --out "$out/uds-echo.tar" \
    --add "$bin_dir/uds-echo:/usr/local/bin/uds-echo" --entrypoint '["/usr/local/bin/uds-echo"]' \
    --user "$nonroot" "${echo_labels[@]}")")
  want pause && lines+=("$("${mkimage[@]}" build --ref "$prefix/pause:$tag" --out "$out/pause.tar" \
    --add "$bin_dir/aether-pause:/usr/local/bin/aether-pause" \
    --entrypoint '["/usr/local/bin/aether-pause"]' --user "$nonroot" "${pause_labels[@]}")")
  # Root (0:0): CoreDNS binds port 53, below 1024, and the image has no file capabilities.
  want coredns && lines+=("$("${mkimage[@]}" build --ref "$prefix/coredns:$tag" --out "$out/coredns.tar" \
    --add "$tools/bin/coredns:/usr/local/bin/coredns" --entrypoint '["/usr/local/bin/coredns"]' \
    --user 0:0)")
  local line ref tar size state
  for line in "${lines[@]}"; do
    IFS=$'\t' read -r ref tar size state <<<"$line"
    printf '%-38s %-50s %10s  (%s)\n' "$ref" "$tar" "$(human "$size")" "$state"
  done
}

import() {
  local sock=$1 ref tar
  [ -S "$sock" ] || die "$sock is not a socket: is containerd running?"
  command -v ctr >/dev/null || die "ctr not found: apt-get install containerd"
  while IFS=$'\t' read -r ref tar; do
    [ -f "$tar" ] || die "$tar missing: run tests/harness/images.sh build first"
    log "importing $ref"
    # Re-importing the same tarball re-tags the same digest: a no-op for containerd.
    ctr -a "$sock" -n k8s.io images import "$tar" >&2 \
      || die "ctr images import $tar into $sock failed"
    # Not `grep -q`: it exits at the first match, ctr dies of SIGPIPE and pipefail fails the check.
    ctr -a "$sock" -n k8s.io images ls -q | grep -Fx "$ref" >/dev/null \
      || die "$tar imported, but containerd at $sock lists no image $ref"
  done < <(list)
}

case "${1:-}" in
  build) build ;;
  launcher) launcher ;;
  import)
    [ $# -eq 2 ] || die "usage: images.sh import CONTAINERD-SOCKET"
    import "$2"
    ;;
  list) list ;;
  *) die "usage: images.sh build | launcher | import CONTAINERD-SOCKET | list" ;;
esac
