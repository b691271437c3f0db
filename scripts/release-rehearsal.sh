#!/usr/bin/env bash
# `make release-rehearsal`: the release workflow's publishing steps (scripts/release-artifacts.sh)
# against an OCI registry started on loopback for the run (`crane registry serve`, blobs in a temp
# dir), then everything pulled back and checked: each chart pulled with `helm pull oci://` is
# byte-for-byte the packaged one, each image's digest and OCI labels in the registry are the
# pushed tarball's, and SHA256SUMS verifies. The registry is stopped (by its PID) and its dir
# removed on every exit path. Prints one line per check and a summary; exit 0 when all pass.
#
# Then, as root, the README's Quickstart from the pulled artefacts: `scripts/demo.sh` with
# AETHER_DEMO_REGISTRY set brings up the real node, whose containerd pulls the controller and agent
# images from the registry (and the proxy pod's initContainer copies the launcher out of the
# pulled agent image), installs both charts with `helm install oci://...`, and runs the demo's
# every check (the webhook, a UDS-only pod served over its socket, a policy switch, metrics,
# uninstall), plus that each of those containers' imageID is the registry's.
#
# It also builds kubectl-aether (release) for this machine's platform: its archive runs and the
# rendered krew manifest (krew/aether.yaml.tmpl) names it with its sha256.
#
# Needs the release images (`make images`) and builds helm and crane (build-tools.sh) if missing;
# the install also needs `make tools`. Not rehearsed yet (docs/release.md): signatures (cosign
# cannot be built here), an SBOM, other architectures than the host's.
#
# Env: AETHER_REHEARSAL_DIR  where DIST and the registry's blobs go (default: a new temp dir,
#                            removed at exit; a given one is kept)
#      AETHER_REHEARSAL_INSTALL=0  skip the install on the real node (it runs when root)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
log() { printf '[rehearsal] %s\n' "$*" >&2; }

"$repo/tests/harness/build-tools.sh" helm crane
export HELM=$tools/bin/helm CRANE=$tools/bin/crane PLAIN_HTTP=1
version=$(python3 -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["version"])' "$repo/Cargo.toml")

if [ -n "${AETHER_REHEARSAL_DIR:-}" ]; then
  work=$AETHER_REHEARSAL_DIR; keep=1; mkdir -p "$work"
else
  work=$(mktemp -d /tmp/aether-rehearsal-XXXXXX); keep=0
fi
registry_pid=""
cleanup() {
  if [ -n "$registry_pid" ]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  [ "$keep" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
dist=$work/dist pulled=$work/pulled
rm -rf "$dist" "$pulled" "$work/blobs"
mkdir -p "$dist" "$pulled" "$work/blobs"

# A free loopback port, then the registry on it (its log in the work dir).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
registry=127.0.0.1:$port
"$CRANE" registry serve --address "$registry" --disk "$work/blobs" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do
  curl -fsS "http://$registry/v2/" >/dev/null 2>&1 && break
  kill -0 "$registry_pid" 2>/dev/null || { cat "$work/registry.log" >&2; log "the registry exited"; exit 1; }
  sleep 0.1
done
log "registry at $registry (PID $registry_pid), version $version"

"$repo/scripts/release-artifacts.sh" charts "$registry" "$dist"
"$repo/scripts/release-artifacts.sh" images "$registry" "$dist" "$version"
case $(uname -m) in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
# The multi-platform index of each image, as the workflow's index job makes it (there of amd64 and
# arm64; here of this machine's architecture only).
"$repo/scripts/release-artifacts.sh" index "$registry" "$dist" "$version" "$arch"
# The kubectl plugin for this machine's platform, and its krew manifest.
(cd "$repo" && cargo build -q --locked --release -p kubectl-aether)
"$repo/scripts/release-artifacts.sh" plugin "$dist" "$version" linux "$arch" "${CARGO_TARGET_DIR:-$repo/target}/release/kubectl-aether"
"$repo/scripts/release-artifacts.sh" krew "$dist" "$version"
"$repo/scripts/release-artifacts.sh" checksums "$dist"

failed=0
check() { # check DESCRIPTION COMMAND...: PASS or FAIL with the command's output
  local what=$1 out; shift
  if out=$("$@" 2>&1); then echo "PASS $what"; else echo "FAIL $what: $out"; failed=$((failed + 1)); fi
}
chart_pulled() { # chart_pulled NAME CHART_VERSION
  "$HELM" pull "oci://$registry/charts/$1" --version "$2" --plain-http --destination "$pulled" >/dev/null &&
    cmp "$dist/$1-$2.tgz" "$pulled/$1-$2.tgz"
}
image_as_pushed() { # image_as_pushed REF@DIGEST: the tag resolves to the digest; the labels
  local ref=${1%@*} digest=${1#*@} got config
  got=$("$CRANE" digest --insecure "$ref") || return 1
  [ "$got" = "$digest" ] || { echo "tag $ref is $got, pushed $digest"; return 1; }
  config=$("$CRANE" config --insecure "$ref@$digest") || return 1
  python3 - "$config" "$version" "$(git -C "$repo" rev-parse HEAD)" <<'EOF'
import json, sys
labels = json.loads(sys.argv[1])["config"].get("Labels") or {}
want = {"org.opencontainers.image.version": sys.argv[2], "org.opencontainers.image.revision": sys.argv[3],
        "org.opencontainers.image.licenses": "Apache-2.0"}
bad = {k: (labels.get(k), v) for k, v in want.items() if labels.get(k) != v}
if bad or "org.opencontainers.image.source" not in labels:
    sys.exit(f"labels (got, want): {bad}, source {labels.get('org.opencontainers.image.source')!r}")
EOF
}

index_as_pushed() { # index_as_pushed REF@DIGEST: the tag resolves to the digest; its one manifest
  # is this architecture's pushed image
  local ref=${1%@*} digest=${1#*@} got manifest image
  got=$("$CRANE" digest --insecure "$ref") || return 1
  [ "$got" = "$digest" ] || { echo "tag $ref is $got, pushed $digest"; return 1; }
  image=$(grep -F "$ref-$arch@" "$dist/pushed.txt") || { echo "no $ref-$arch in pushed.txt"; return 1; }
  manifest=$("$CRANE" manifest --insecure "$ref@$digest") || return 1
  python3 - "$manifest" "${image#*@}" "$arch" <<'EOF'
import json, sys
m = json.loads(sys.argv[1])
entries = [(e["digest"], e.get("platform", {})) for e in m.get("manifests", [])]
want = [(sys.argv[2], {"architecture": sys.argv[3], "os": "linux"})]
if entries != want:
    sys.exit(f"index entries (digest, platform): {entries}, want {want}")
EOF
}

while read -r pushed; do
  case $pushed in
    */charts/*)
      name=${pushed#*/charts/}; name=${name%%:*}
      chart_version=${pushed#*/charts/"$name":}; chart_version=${chart_version%%@*}
      check "chart $name $chart_version pulled from oci://$registry/charts is the packaged one" chart_pulled "$name" "$chart_version" ;;
    *:"$version"@*) check "index ${pushed%@*} holds the linux/$arch image" index_as_pushed "$pushed" ;;
    *) check "image ${pushed%@*} is the pushed tarball's (digest, OCI labels)" image_as_pushed "$pushed" ;;
  esac
done <"$dist/pushed.txt"
plugin_runs() { # the archive's binary prints the release's version; the krew manifest names it
  local archive=$dist/kubectl-aether_v${version}_linux_$arch.tar.gz out
  mkdir -p "$work/plugin" && tar -C "$work/plugin" -xzf "$archive" || return 1
  out=$("$work/plugin/kubectl-aether" --version) || return 1
  [[ $out == *"$version"* ]] || { echo "--version printed: $out"; return 1; }
  # The manifest as krew reads it: the version, and this platform's entry with the archive's sha256.
  grep -qx "  version: v$version" "$dist/aether.yaml" || { echo "no 'version: v$version' in aether.yaml"; return 1; }
  grep -A2 "matchLabels: {os: linux, arch: $arch}" "$dist/aether.yaml" |
    grep -qx "    sha256: $(sha256sum "$archive" | cut -d' ' -f1)" || { echo "aether.yaml: no linux/$arch entry with the archive's sha256"; return 1; }
}
check "kubectl-aether linux/$arch from its archive prints $version; the krew manifest has its sha256" plugin_runs
check "SHA256SUMS verifies every artefact" bash -c "cd '$dist' && sha256sum --quiet -c SHA256SUMS"
charts=$(grep -c /charts/ "$dist/pushed.txt" || true)
images=$(grep -vc /charts/ "$dist/pushed.txt" || true)
[ "$charts" = 2 ] || { echo "FAIL 2 charts pushed: $charts"; failed=$((failed + 1)); }
# Two images of this architecture and their two indexes.
[ "$images" = 4 ] || { echo "FAIL 4 images and indexes pushed: $images"; failed=$((failed + 1)); }
if [ "$failed" != 0 ]; then
  log "release rehearsal: $failed checks failed"
  exit 1
fi
log "release rehearsal: $charts charts, 2 images and their indexes pushed, pulled back and checked"
if [ "${AETHER_REHEARSAL_INSTALL:-1}" = 0 ]; then
  log "the install on the real node skipped (AETHER_REHEARSAL_INSTALL=0)"
elif [ "$(id -u)" != 0 ]; then
  log "the install on the real node skipped: it needs root (sudo make release-rehearsal)"
else
  log "the Quickstart from the registry on the real node (scripts/demo.sh, AETHER_DEMO_REGISTRY=$registry)"
  AETHER_DEMO_REGISTRY=$registry "$repo/scripts/demo.sh"
  log "release rehearsal: the Quickstart ran from the charts and images pulled from $registry"
fi
