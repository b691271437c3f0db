#!/usr/bin/env bash
# Builds the real Kubernetes binaries the tests and the demo run against, from the Go module proxy,
# into a git-ignored cache: kube-apiserver, kubectl and, for the real node, kubelet,
# kube-controller-manager, kube-scheduler and kube-proxy (all k8s.io/kubernetes/cmd/<name>), etcd
# (go.etcd.io/etcd/server/v3), helm (helm.sh/helm/v3) and coredns (the real node's cluster DNS:
# tests/harness/coredns/main.go, a CoreDNS with only the plugins the test cluster uses, built
# against github.com/coredns/coredns). Each binary is built once per pinned version; later runs
# only check that it is there. On request only (not in the default set): actionlint
# (github.com/rhysd/actionlint, `make lint`'s check of .github/workflows), helm4 (helm.sh/helm/v4,
# into <tools>/bin/helm4, beside the Helm 3 `helm`: the chart tests run against it with
# AETHER_HELM=<tools>/bin/helm4, see CONTRIBUTING.md), crane (github.com/google/go-containerregistry:
# pushes image tarballs and serves a registry for `make release-rehearsal`). The real node's runtime,
# which `make tools` asks for: containerd2 (containerd, ctr and containerd-shim-runc-v2 of
# github.com/containerd/containerd/v2, built with the release's tags, into
# <tools>/containerd-<version>/bin, linked as <tools>/containerd2) and runc
# (github.com/opencontainers/runc with cgo and seccomp, the version kind runs beside containerd
# 2.3, into <tools>/runc-<version>/bin, linked as <tools>/runc; its C build needs
# `scripts/install-deps.sh runtime`, which it runs): node.sh puts both folders first on PATH
# (node-lib.sh use_containerd). On request only, a second runtime: crio (CRI-O of
# github.com/cri-o/cri-o with cgo and the tags below, stamped as its Makefile does, with its
# copyimg, which loads a docker-archive tar into CRI-O's image storage without a registry, and
# pinns, C built statically from the module's pinns/src with the flags of pinns/Makefile; into
# <tools>/crio-<version>/bin, linked as <tools>/crio; needs `scripts/install-deps.sh crio`, which
# it runs and which also installs Debian's conmon, CRI-O's container monitor). Built, not yet run
# by any suite.
#
# Usage: tests/harness/build-tools.sh [NAME ...]   (default: all nine, not actionlint, helm4, crane, containerd2, runc or crio)
# Env:   AETHER_TOOLS_DIR  cache folder (default: <repo>/.cache/tools)
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
HELM_VERSION=${HELM_VERSION:-v3.21.4}
HELM4_VERSION=${HELM4_VERSION:-v4.3.2}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}
CRANE_VERSION=${CRANE_VERSION:-v0.22.1}
# containerd's long-term-support line (RELEASES.md: 2.3 supported to 2028-04).
CONTAINERD2_VERSION=${CONTAINERD2_VERSION:-v2.3.7}
RUNC_VERSION=${RUNC_VERSION:-v1.4.3}
# CRI-O's minor follows Kubernetes'; v1.36.3 is the newest the Go module proxy serves (it refuses
# v1.37.x), one minor behind KUBE_VERSION.
CRIO_VERSION=${CRIO_VERSION:-v1.36.3}

repo=$(cd "$(dirname "$0")/../.." && pwd)
tools=${AETHER_TOOLS_DIR:-$repo/.cache/tools}
mkdir -p "$tools/bin" "$tools/src"
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0

log() { printf '[build-tools] %s\n' "$*" >&2; }

# new_module DIR: a scratch Go module in DIR (kept so the next build reuses its go.sum).
new_module() {
  mkdir -p "$1"
  if [ ! -f "$1/go.mod" ]; then
    (cd "$1" && go mod init "aether.local/tools/$(basename "$1")" >/dev/null 2>&1)
  fi
}

# build NAME VERSION-TAG MODULE-DIR PACKAGE [EXTRA-LDFLAGS]
build() {
  local name=$1 tag=$2 dir=$3 pkg=$4 ldextra=${5:-}
  local out="$tools/bin/$name-$tag"
  if [ -x "$out" ]; then
    ln -sf "$name-$tag" "$tools/bin/$name"
    return 0
  fi
  log "building $name $tag (first time only; this takes minutes) ..."
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldextra" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  ln -sf "$name-$tag" "$tools/bin/$name"
  log "built $name in $((SECONDS - start))s -> $out"
}

kube_module() {
  local dir="$tools/src/kubernetes-$KUBE_VERSION"
  new_module "$dir"
  if ! grep -q "k8s.io/kubernetes $KUBE_VERSION" "$dir/go.mod" 2>/dev/null; then
    # k8s.io/kubernetes requires its staging modules at v0.0.0; point each at the matching v0.X.Y.
    local modfile staging=${KUBE_VERSION/v1./v0.}
    modfile=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    local mods
    mods=$(awk '/^\tk8s.io\/[a-z0-9-]+ v0\.0\.0$/ {print $1}' "$modfile")
    [ -n "$mods" ] || { log "found no staging modules in $modfile"; exit 1; }
    local args=()
    for m in $mods; do args+=("-replace=$m=$m@$staging"); done
    (cd "$dir" && go mod edit "${args[@]}" && go get "k8s.io/kubernetes@$KUBE_VERSION" >&2)
  fi
  echo "$dir"
}

# Stamp the version the way Kubernetes' own build does, so /version and `kubectl version` report
# it instead of v0.0.0-master.
kube_version_ldflags() {
  local v=${KUBE_VERSION#v} f=""
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    f+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$f"
}

want=("$@")
kube_cmds=(kube-apiserver kubectl kubelet kube-controller-manager kube-scheduler kube-proxy)
[ ${#want[@]} -gt 0 ] || want=("${kube_cmds[@]}" etcd helm coredns)
for t in "${want[@]}"; do
  case $t in
    kube-apiserver|kubectl|kubelet|kube-controller-manager|kube-scheduler|kube-proxy)
      [ -x "$tools/bin/$t-$KUBE_VERSION" ] && { ln -sf "$t-$KUBE_VERSION" "$tools/bin/$t"; continue; }
      build "$t" "$KUBE_VERSION" "$(kube_module)" "k8s.io/kubernetes/cmd/$t" "$(kube_version_ldflags)" ;;
    etcd)
      d="$tools/src/etcd-$ETCD_VERSION"; new_module "$d"
      [ -x "$tools/bin/etcd-$ETCD_VERSION" ] || (cd "$d" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2)
      build etcd "$ETCD_VERSION" "$d" go.etcd.io/etcd/server/v3 ;;
    helm)
      # Stamped as Helm's own release build stamps it (the LDFLAGS of its Makefile): the version
      # `helm version` prints, and the Kubernetes version `helm template` and `helm lint` assume
      # without a cluster: the client-go minor Helm is built with (unstamped it is 1.20, which
      # the charts' `kubeVersion: ">=1.25.0-0"` refuses). "-stamped" keeps it apart from an
      # unstamped build of the same version.
      d="$tools/src/helm-$HELM_VERSION"; new_module "$d"
      if [ ! -x "$tools/bin/helm-$HELM_VERSION-stamped" ]; then
        (cd "$d" && go get "helm.sh/helm/v3@$HELM_VERSION" >&2)
        client_go=$(cd "$d" && go list -m -f '{{.Version}}' k8s.io/client-go)  # v0.<minor>.<patch>
        k8s_minor=$(echo "$client_go" | cut -d. -f2)
        [[ $k8s_minor =~ ^[0-9]+$ ]] || { log "helm: cannot read the client-go minor from '$client_go'"; exit 1; }
        helm_ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
        for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
          helm_ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$k8s_minor"
        done
      fi
      build helm "$HELM_VERSION-stamped" "$d" helm.sh/helm/v3/cmd/helm "${helm_ldflags:-}" ;;
    helm4)
      # Helm 4 stamps only its version (the LDFLAGS of its Makefile; it defaults to "v4.<minor>").
      # The Kubernetes version `helm template` and `helm lint` assume has no -X variable any more
      # (v3's chartutil/lint/rules k8sVersionMajor/Minor are gone): v4's
      # pkg/chart/common/capabilities.go reads the client-go version from the binary's build info
      # at run time (v0.<minor>.x -> v1.<minor>.0), so a plain `go build` gets it right.
      d="$tools/src/helm4-$HELM4_VERSION"; new_module "$d"
      [ -x "$tools/bin/helm4-$HELM4_VERSION-stamped" ] || (cd "$d" && go get "helm.sh/helm/v4@$HELM4_VERSION" >&2)
      build helm4 "$HELM4_VERSION-stamped" "$d" helm.sh/helm/v4/cmd/helm \
        "-X helm.sh/helm/v4/internal/version.version=$HELM4_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean" ;;
    coredns)
      # The main package is the repository's own (tests/harness/coredns/main.go), copied into the
      # scratch module, which then requires CoreDNS at the pinned version. Like the others, the
      # binary is keyed by the version only: after editing main.go, delete bin/coredns-<version>.
      d="$tools/src/coredns-$COREDNS_VERSION"; new_module "$d"
      if [ ! -x "$tools/bin/coredns-$COREDNS_VERSION" ]; then
        cp "$repo/tests/harness/coredns/main.go" "$d/main.go"
        (cd "$d" && go get "github.com/coredns/coredns@$COREDNS_VERSION" >&2)
      fi
      build coredns "$COREDNS_VERSION" "$d" . ;;
    actionlint)
      d="$tools/src/actionlint-$ACTIONLINT_VERSION"; new_module "$d"
      [ -x "$tools/bin/actionlint-$ACTIONLINT_VERSION" ] || (cd "$d" && go get "github.com/rhysd/actionlint@$ACTIONLINT_VERSION" >&2)
      build actionlint "$ACTIONLINT_VERSION" "$d" github.com/rhysd/actionlint/cmd/actionlint \
        "-X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION" ;;
    crane)
      d="$tools/src/crane-$CRANE_VERSION"; new_module "$d"
      [ -x "$tools/bin/crane-$CRANE_VERSION" ] || (cd "$d" && go get "github.com/google/go-containerregistry@$CRANE_VERSION" >&2)
      build crane "$CRANE_VERSION" "$d" github.com/google/go-containerregistry/cmd/crane ;;
    containerd2)
      # Tags and flags of containerd's own Makefile and BUILDING.md: no cgo snapshotters (btrfs
      # is the only cgo one), the shim without gRPC; the version stamped as its release build does.
      out="$tools/containerd-$CONTAINERD2_VERSION/bin"
      if [ ! -x "$out/containerd-shim-runc-v2" ]; then
        d="$tools/src/containerd-$CONTAINERD2_VERSION"; new_module "$d"
        p=github.com/containerd/containerd/v2
        (cd "$d" && go get "$p@$CONTAINERD2_VERSION" >&2)
        log "building containerd $CONTAINERD2_VERSION (first time only; this takes minutes) ..."
        start=$SECONDS
        mkdir -p "$out.tmp"
        (cd "$d" && go build -trimpath -tags 'no_btrfs no_devmapper no_zfs' -ldflags "-s -w -X $p/version.Version=$CONTAINERD2_VERSION" \
          -o "$out.tmp/" "$p/cmd/containerd" "$p/cmd/ctr")
        (cd "$d" && go build -trimpath -tags no_grpc -ldflags "-s -w -X $p/version.Version=$CONTAINERD2_VERSION" \
          -o "$out.tmp/" "$p/cmd/containerd-shim-runc-v2")
        rm -rf "$out" && mv "$out.tmp" "$out"
        log "built containerd $CONTAINERD2_VERSION in $((SECONDS - start))s -> $out"
      fi
      ln -sfn "containerd-$CONTAINERD2_VERSION" "$tools/containerd2" ;;
    runc)
      out="$tools/runc-$RUNC_VERSION/bin"
      if [ ! -x "$out/runc" ]; then
        "$repo/scripts/install-deps.sh" runtime >&2
        d="$tools/src/runc-$RUNC_VERSION"; new_module "$d"
        (cd "$d" && go get "github.com/opencontainers/runc@$RUNC_VERSION" >&2)
        log "building runc $RUNC_VERSION (first time only; a minute or two) ..."
        start=$SECONDS
        mkdir -p "$out"
        # cgo: runc's nsenter is C; the seccomp tag links libseccomp (runc's Makefile default).
        (cd "$d" && CGO_ENABLED=1 go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
          -o "$out/runc.tmp" github.com/opencontainers/runc)
        mv "$out/runc.tmp" "$out/runc"
        log "built runc $RUNC_VERSION in $((SECONDS - start))s -> $out/runc"
      fi
      ln -sfn "runc-$RUNC_VERSION" "$tools/runc" ;;
    crio)
      out="$tools/crio-$CRIO_VERSION/bin"
      if [ ! -x "$out/crio" ] || [ ! -x "$out/copyimg" ] || [ ! -x "$out/pinns" ]; then
        "$repo/scripts/install-deps.sh" crio >&2
        d="$tools/src/crio-$CRIO_VERSION"; new_module "$d"
        p=github.com/cri-o/cri-o
        (cd "$d" && go get "$p@$CRIO_VERSION" >&2)
        # The module's folder, its commit and its commit time (the Go proxy's record of the tag;
        # only a query with @version reports the commit, as Origin.Hash).
        info=$(cd "$d" && go list -m -json "$p@$CRIO_VERSION")
        src=$(printf '%s\n' "$info" | sed -n 's/^\t"Dir": "\(.*\)",*$/\1/p')
        commit=$(printf '%s\n' "$info" | sed -n 's/^\t\t"Hash": "\([0-9a-f]*\)",*$/\1/p')
        date=$(printf '%s\n' "$info" | sed -n 's/^\t"Time": "\(.*\)",*$/\1/p')
        [ -d "$src/pinns/src" ] || { log "crio: no pinns/src in the module folder '$src'"; exit 1; }
        [ -n "$commit" ] || log "crio: the module proxy names no commit for $CRIO_VERSION; \`crio version\` will say unknown"
        log "building CRI-O $CRIO_VERSION, copyimg and pinns (first time only; this takes minutes) ..."
        start=$SECONDS
        rm -rf "$out.tmp" && mkdir -p "$out.tmp"
        # The tags CRI-O's Makefile (BUILDTAGS, hack/*_tag.sh) picks on a machine like ours:
        # signatures checked in Go (containers_image_openpgp, so no gpgme), no btrfs driver (its
        # headers are not installed; btrfs is go.podman.io/storage's only cgo driver) and seccomp
        # (go.podman.io/common/pkg/seccomp; links libseccomp: without it RuntimeDefault pods run
        # unconfined). Its obsolete tags (containers_image_ostree_stub, btrfs_noversion) match no
        # file any more. The version is a constant of internal/version; the Makefile stamps only
        # the build date and the commit, which `crio version` prints (-buildvcs=false here, so
        # the stamped commit is what it shows); the date is the commit's, so rebuilds are alike.
        crio_ldflags="-s -w -X $p/internal/version.buildDate=$date -X $p/internal/version.buildCommit=$commit"
        (cd "$d" && CGO_ENABLED=1 go build -trimpath -tags 'containers_image_openpgp exclude_graphdriver_btrfs seccomp' \
          -ldflags "$crio_ldflags" -o "$out.tmp/" "$p/cmd/crio" "$p/test/copyimg")
        # pinns/Makefile: CFLAGS -std=c99 -Os -Wall -Werror -Wextra -static, each object with -O3
        # added (the later -O wins), then `strip -s`. One cc call keeps objects out of the
        # read-only module folder.
        cc -std=c99 -Os -Wall -Werror -Wextra -static -O3 -o "$out.tmp/pinns" "$src"/pinns/src/*.c
        strip -s "$out.tmp/pinns"
        rm -rf "$out" && mv "$out.tmp" "$out"
        log "built CRI-O $CRIO_VERSION in $((SECONDS - start))s -> $out"
      fi
      # Running them (not done by any suite yet): as root, copyimg, like CRI-O's own pulls, writes
      # a blob-info cache to /var/lib/containers/cache whatever --root says (go.podman.io/image
      # blobinfocache; no flag moves it), so keep a host clean with
      # `unshare --mount --propagation private sh -c 'mount -t tmpfs tmpfs /var/lib && exec copyimg ...'`.
      ln -sfn "crio-$CRIO_VERSION" "$tools/crio" ;;
    *) log "unknown tool '$t' (known: ${kube_cmds[*]} etcd helm helm4 coredns actionlint crane containerd2 runc crio)"; exit 2 ;;
  esac
done
