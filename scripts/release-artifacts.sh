#!/usr/bin/env bash
# The release's publishing steps, shared by the release workflow (.github/workflows/release.yaml,
# against ghcr.io) and `make release-rehearsal` (scripts/release-rehearsal.sh, against a registry
# started on loopback for the run), so that what the workflow does is what the rehearsal ran
# (docs/release.md).
#
#   scripts/release-artifacts.sh charts REGISTRY DIST
#       helm lint --strict both charts, helm package them into DIST, and helm push each to
#       oci://REGISTRY/charts. Appends "<reference>@<digest>" per chart to DIST/pushed.txt.
#   scripts/release-artifacts.sh images REGISTRY DIST VERSION
#       crane push of the aether-controller and aether-agent image tarballs
#       (tests/harness/images.sh list; build them first) to REGISTRY/<name>:VERSION, after checking
#       that each carries org.opencontainers.image.version=VERSION. Appends
#       "<reference>@<digest>" per image to DIST/pushed.txt.
#   scripts/release-artifacts.sh checksums DIST
#       DIST/SHA256SUMS: the sha256 of every other file in DIST (sha256sum -c reads it).
#
# Env: HELM, CRANE   the helm and crane to run (defaults: the tools dir's, else PATH's)
#      PLAIN_HTTP=1  the registry speaks HTTP without TLS (the rehearsal's loopback registry)
#      AETHER_TOOLS_DIR  build-tools.sh's folder (default: <repo>/.cache/tools)
# Logging in to the registry is the caller's (the workflow: helm registry login).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
tool() { if [ -x "$tools/bin/$1" ]; then echo "$tools/bin/$1"; else command -v "$1" || echo "$1"; fi; }
HELM=${HELM:-$(tool helm)}
CRANE=${CRANE:-$(tool crane)}
plain=()
insecure=()
if [ "${PLAIN_HTTP:-0}" = 1 ]; then plain=(--plain-http); insecure=(--insecure); fi

log() { printf '[release] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

charts() {
  local registry=$1 dist=$2 tgz out digest name version
  mkdir -p "$dist"
  "$HELM" lint --strict "$repo/charts/aether-crds" "$repo/charts/aether" >&2
  "$HELM" package "$repo/charts/aether-crds" "$repo/charts/aether" --destination "$dist" >&2
  for tgz in "$dist"/aether-crds-*.tgz "$dist"/aether-[0-9]*.tgz; do
    [ -f "$tgz" ] || die "helm package left no $tgz"
    out=$("$HELM" push "$tgz" "oci://$registry/charts" "${plain[@]}" 2>&1) || die "helm push $tgz: $out"
    digest=$(sed -n 's/^Digest: *//p' <<<"$out")
    [[ $digest == sha256:* ]] || die "helm push $tgz printed no digest: $out"
    name=$("$HELM" show chart "$tgz" | sed -n 's/^name: *//p')
    version=$("$HELM" show chart "$tgz" | sed -n 's/^version: *//p')
    echo "$registry/charts/$name:$version@$digest" >>"$dist/pushed.txt"
    log "chart $name $version -> oci://$registry/charts/$name@$digest"
  done
}

images() {
  local registry=$1 dist=$2 version=$3 ref tar name labelled digest
  mkdir -p "$dist"
  while IFS=$'\t' read -r ref tar; do
    name=${ref##*/}; name=${name%%:*}
    case $name in aether-controller | aether-agent) ;; *) continue ;; esac
    [ -f "$tar" ] || die "$tar missing: build the images first (make images)"
    # The tarball's own config: the version label the image would be published with.
    labelled=$(python3 - "$tar" <<'EOF'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    manifest = json.load(t.extractfile("manifest.json"))
    config = json.load(t.extractfile(manifest[0]["Config"]))
print((config.get("config", {}).get("Labels") or {}).get("org.opencontainers.image.version", ""))
EOF
    )
    [ "$labelled" = "$version" ] || die "$tar is labelled version '$labelled', not $version"
    "$CRANE" push "${insecure[@]}" "$tar" "$registry/$name:$version" >/dev/null
    digest=$("$CRANE" digest "${insecure[@]}" "$registry/$name:$version")
    [[ $digest == sha256:* ]] || die "crane digest $registry/$name:$version: $digest"
    echo "$registry/$name:$version@$digest" >>"$dist/pushed.txt"
    log "image $name:$version -> $registry/$name@$digest"
  done < <("$repo/tests/harness/images.sh" list)
}

checksums() {
  local dist=$1
  local sums
  sums=$(cd "$dist" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort | xargs -r sha256sum)
  printf '%s\n' "$sums" >"$dist/SHA256SUMS"
  log "$(wc -l <"$dist/SHA256SUMS") files in $dist/SHA256SUMS"
}

case ${1:-} in
  charts) [ $# = 3 ] || die "usage: $0 charts REGISTRY DIST"; charts "$2" "$3" ;;
  images) [ $# = 4 ] || die "usage: $0 images REGISTRY DIST VERSION"; images "$2" "$3" "$4" ;;
  checksums) [ $# = 2 ] || die "usage: $0 checksums DIST"; checksums "$2" ;;
  *) die "usage: $0 charts REGISTRY DIST | images REGISTRY DIST VERSION | checksums DIST" ;;
esac
