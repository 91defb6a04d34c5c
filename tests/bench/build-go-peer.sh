#!/usr/bin/env bash
# Builds (or reuses) the Go operator's manager, the benchmark peer of tests/examples/bench/
# (`--peer`). Its Go module is refused by the Go module proxy, so its upstream sources are read from
# PROJECTION_GO_SOURCES (default: ../shared/third_party/projection-go/v0.3.2 next to the repository;
# its README says why); its dependencies come from the Go module proxy. Nothing of it enters the
# project's crates. Prints the manager's path on stdout's last line; a second run rebuilds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
log() { echo "[go peer build] $*" >&2; }

sources=${PROJECTION_GO_SOURCES:-$(cd "$here/../.." && pwd)/../shared/third_party/projection-go/v0.3.2}
[ -f "$sources/go.mod" ] && [ -d "$sources/cmd" ] || {
  log "no sources of the Go operator at $sources (set PROJECTION_GO_SOURCES)"; exit 1; }
key=$( (cd "$sources" && find . -type f | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-12)
cache_root=${PROJECTION_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projection-testenv}
out="$cache_root/projection-go-$key"

if [ ! -f "$out/done" ]; then
  start=$(date +%s)
  rm -rf "$out" && mkdir -p "$out"
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cp -r "$sources/." "$scratch/" && chmod -R u+w "$scratch"
  log "building the manager (about 90 s on a cold Go cache)"
  (cd "$scratch" && go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$out/manager" ./cmd)
  cp -r "$sources/config/crd/bases" "$out/crds"
  touch "$out/done"
  log "built in $(( $(date +%s) - start ))s into $out"
fi
echo "$out/manager"
