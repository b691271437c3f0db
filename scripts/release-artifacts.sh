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
#       (tests/harness/images.sh list; build them first) to REGISTRY/<name>:VERSION-<arch>, the
#       architecture the tarball's config names (amd64, arm64), after checking that each carries
#       org.opencontainers.image.version=VERSION and was built at HEAD
#       (org.opencontainers.image.revision). Appends "<reference>@<digest>" per image to
#       DIST/pushed.txt. Each architecture's images are built and pushed on a machine of it.
#   scripts/release-artifacts.sh index REGISTRY DIST VERSION ARCH...
#       For each of the two images, the multi-platform index REGISTRY/<name>:VERSION of
#       <name>:VERSION-<arch> for every ARCH (crane index append; each manifest's platform is its
#       config's, checked to be linux/ARCH). Appends "<reference>@<digest>" per index to
#       DIST/pushed.txt.
#   scripts/release-artifacts.sh plugin DIST VERSION OS ARCH BINARY
#       DIST/kubectl-aether_vVERSION_OS_ARCH.tar.gz: BINARY (a kubectl-aether built for OS/ARCH,
#       e.g. linux amd64) as kubectl-aether, and LICENSE.
#   scripts/release-artifacts.sh krew DIST VERSION
#       DIST/aether.yaml: krew/aether.yaml.tmpl with one platform per plugin archive in DIST (its
#       URL on the GitHub release of vVERSION, its sha256).
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
  local registry=$1 dist=$2 version=$3 ref tar name labelled digest revision arch got_version got_revision
  revision=$(git -C "$repo" rev-parse HEAD)
  mkdir -p "$dist"
  while IFS=$'\t' read -r ref tar; do
    name=${ref##*/}; name=${name%%:*}
    case $name in aether-controller | aether-agent) ;; *) continue ;; esac
    [ -f "$tar" ] || die "$tar missing: build the images first (make images)"
    # The tarball's own config (mkimage.py inspect): the version and revision labels it would be
    # published with.
    labelled=$(python3 "$repo/tests/harness/mkimage.py" inspect "$tar" | python3 -c '
import json, sys
image = json.load(sys.stdin)
labels = image["config"].get("Labels") or {}
print(labels.get("org.opencontainers.image.version", ""), labels.get("org.opencontainers.image.revision", ""),
      image["architecture"])')
    read -r got_version got_revision arch <<<"$labelled"
    [ "$got_version" = "$version" ] || die "$tar is labelled version '$got_version', not $version"
    [ "$got_revision" = "$revision" ] || die "$tar was built at $got_revision, not at HEAD ($revision): rebuild it (make images)"
    "$CRANE" push "${insecure[@]}" "$tar" "$registry/$name:$version-$arch" >/dev/null
    digest=$("$CRANE" digest "${insecure[@]}" "$registry/$name:$version-$arch")
    [[ $digest == sha256:* ]] || die "crane digest $registry/$name:$version-$arch: $digest"
    echo "$registry/$name:$version-$arch@$digest" >>"$dist/pushed.txt"
    log "image $name:$version-$arch -> $registry/$name@$digest"
  done < <("$repo/tests/harness/images.sh" list)
}

index() {
  local registry=$1 dist=$2 version=$3 name arch platform digest
  shift 3
  [ $# -gt 0 ] || die "index: name at least one architecture"
  for name in aether-controller aether-agent; do
    local manifests=()
    for arch in "$@"; do
      platform=$("$CRANE" config "${insecure[@]}" "$registry/$name:$version-$arch" |
        python3 -c 'import json, sys; c = json.load(sys.stdin); print(c.get("os", ""), c.get("architecture", ""))') \
        || die "no $registry/$name:$version-$arch: push it first (images, on a linux/$arch machine)"
      [ "$platform" = "linux $arch" ] || die "$registry/$name:$version-$arch is for '$platform', not linux $arch"
      manifests+=(-m "$registry/$name:$version-$arch")
    done
    "$CRANE" index append "${insecure[@]}" "${manifests[@]}" -t "$registry/$name:$version" >/dev/null
    digest=$("$CRANE" digest "${insecure[@]}" "$registry/$name:$version")
    [[ $digest == sha256:* ]] || die "crane digest $registry/$name:$version: $digest"
    echo "$registry/$name:$version@$digest" >>"$dist/pushed.txt"
    log "index $name:$version ($*) -> $registry/$name@$digest"
  done
}

plugin() {
  local dist=$1 version=$2 os=$3 arch=$4 binary=$5 stage
  [ -x "$binary" ] || die "$binary: not an executable"
  mkdir -p "$dist"
  stage=$(mktemp -d)
  cp "$binary" "$stage/kubectl-aether"
  cp "$repo/LICENSE" "$stage/LICENSE"
  tar -C "$stage" --owner=0 --group=0 --numeric-owner --mtime='1970-01-01' -czf \
    "$dist/kubectl-aether_v${version}_${os}_${arch}.tar.gz" kubectl-aether LICENSE
  rm -rf "$stage"
  log "plugin $os/$arch -> $dist/kubectl-aether_v${version}_${os}_${arch}.tar.gz"
}

krew() {
  local dist=$1 version=$2 archive os_arch os arch platforms="" sha
  for archive in "$dist"/kubectl-aether_v"$version"_*.tar.gz; do
    [ -f "$archive" ] || die "no kubectl-aether_v${version}_<os>_<arch>.tar.gz in $dist (run plugin first)"
    os_arch=${archive##*/kubectl-aether_v"$version"_}; os_arch=${os_arch%.tar.gz}
    os=${os_arch%%_*}; arch=${os_arch#*_}
    sha=$(sha256sum "$archive" | cut -d' ' -f1)
    platforms+="  - selector:
      matchLabels: {os: $os, arch: $arch}
    uri: https://github.com/aether-mesh/aether/releases/download/v$version/${archive##*/}
    sha256: $sha
    bin: kubectl-aether
    files:
      - {from: kubectl-aether, to: .}
      - {from: LICENSE, to: .}
"
  done
  python3 - "$repo/krew/aether.yaml.tmpl" "$version" "$platforms" >"$dist/aether.yaml" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines(keepends=True)
while lines and lines[0].startswith("#"):  # the template's own comment
    lines.pop(0)
version, platforms = sys.argv[2], sys.argv[3].rstrip("\n")
print(f"# kubectl-aether {version}: rendered from krew/aether.yaml.tmpl by scripts/release-artifacts.sh krew")
print("".join(lines).replace("@VERSION@", version).replace("@PLATFORMS@", platforms), end="")
EOF
  log "krew manifest $dist/aether.yaml ($(grep -c 'selector:' "$dist/aether.yaml") platforms)"
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
  index) [ $# -ge 5 ] || die "usage: $0 index REGISTRY DIST VERSION ARCH..."; index "$2" "$3" "$4" "${@:5}" ;;
  plugin) [ $# = 6 ] || die "usage: $0 plugin DIST VERSION OS ARCH BINARY"; plugin "$2" "$3" "$4" "$5" "$6" ;;
  krew) [ $# = 3 ] || die "usage: $0 krew DIST VERSION"; krew "$2" "$3" ;;
  checksums) [ $# = 2 ] || die "usage: $0 checksums DIST"; checksums "$2" ;;
  *) die "usage: $0 charts REGISTRY DIST | images REGISTRY DIST VERSION | index REGISTRY DIST VERSION ARCH... | plugin DIST VERSION OS ARCH BINARY | krew DIST VERSION | checksums DIST" ;;
esac
