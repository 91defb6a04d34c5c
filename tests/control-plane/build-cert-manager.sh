#!/usr/bin/env bash
# Builds (or reuses) the real cert-manager for the local node: its controller, cainjector, webhook
# and startupapicheck binaries and its Helm chart, at CERT_MANAGER_VERSION (versions.env).
#
# The chart and the library code come from the Go module github.com/cert-manager/cert-manager. The
# four `main` packages are separate modules the Go proxy does not serve, so their upstream sources
# are read from CERT_MANAGER_SOURCES (default: ../shared/third_party/cert-manager/<version> next to
# the repository; its README says why and how). Prints the cache folder (bin/, chart/) on stdout's
# last line; a second run rebuilds nothing.
#
#   build-cert-manager.sh             build what is missing, print the folder
#   build-cert-manager.sh --if-built  print the folder if an earlier run built it, else nothing
#                                     (images.sh: the demo, which runs no cert-manager, never waits
#                                     for this build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.env"
# No DWARF from the compiler, as in build.sh.
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-gcflags=all=-dwarf=false
log() { echo "[cert-manager build] $*" >&2; }

sources=${CERT_MANAGER_SOURCES:-$(cd "$here/../.." && pwd)/../shared/third_party/cert-manager/$CERT_MANAGER_VERSION}
commands=(controller cainjector webhook startupapicheck)
for c in "${commands[@]}"; do
  [ -f "$sources/cmd/$c/go.mod" ] && continue
  [ "${1:-}" = --if-built ] && exit 0
  log "no sources of cert-manager's $c at $sources/cmd/$c (set CERT_MANAGER_SOURCES)"; exit 1
done
key=$( (cd "$sources" && find cmd -type f | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-12)
cache_root=${PROJECTION_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projection-testenv}
out="$cache_root/cert-manager-${CERT_MANAGER_VERSION}-$key"
if [ "${1:-}" = --if-built ]; then
  [ -f "$out/done" ] && echo "$out"
  exit 0
fi

if [ ! -f "$out/done" ]; then
  start=$(date +%s)
  rm -rf "$out" && mkdir -p "$out/bin"
  module_dir=$(cd "$(mktemp -d)" && go mod download -json "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$module_dir/deploy/charts/cert-manager" ] || { log "the module has no deploy/charts/cert-manager"; exit 1; }
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  for c in "${commands[@]}"; do
    log "building $c (the controller takes minutes on a cold cache)"
    cp -r "$sources/cmd/$c" "$scratch/$c" && chmod -R u+w "$scratch/$c"
    (cd "$scratch/$c" &&
      go mod edit -replace "github.com/cert-manager/cert-manager=$module_dir" &&
      go build -trimpath -buildvcs=false \
        -ldflags "-s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$CERT_MANAGER_VERSION" \
        -o "$out/bin/$c" .)
  done
  # The chart as its release packaging makes it: Chart.template.yaml with the version filled in.
  cp -r "$module_dir/deploy/charts/cert-manager" "$out/chart" && chmod -R u+w "$out/chart"
  sed -e "s/{{IS_PRERELEASE}}/false/" -e "s/^version: .*/version: $CERT_MANAGER_VERSION/" \
    -e "s/^appVersion: .*/appVersion: $CERT_MANAGER_VERSION/" \
    "$out/chart/Chart.template.yaml" > "$out/chart/Chart.yaml"
  rm -f "$out/chart/Chart.template.yaml" "$out/chart/README.template.md"
  touch "$out/done"
  log "built in $(( $(date +%s) - start ))s into $out"
fi
echo "$out"
