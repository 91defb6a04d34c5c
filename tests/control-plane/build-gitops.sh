#!/usr/bin/env bash
# Builds (or reuses) what only the GitOps health tests use (controller/tests/gitops.rs): the kstatus
# library users' tools run (sigs.k8s.io/cli-utils, through the small program in tests/kstatus) and
# Helm 4 (whose --wait computes kstatus), both from the Go module proxy, cached like the cluster
# binaries and linked into build.sh's bin folder as `kstatus` and `helm4`. scripts/test.sh runs it.
# Prints the bin directory on stdout's last line.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$CP_HERE/versions.env"
# No DWARF from the compiler, as in build.sh.
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-gcflags=all=-dwarf=false
bin=$("$CP_HERE/build.sh" | tail -n 1)
log() { echo "[control-plane build] $*" >&2; }

# The kstatus program: keyed by its module (go.mod pins cli-utils) and source.
kstatus_dir="$CP_HERE/../kstatus"
key=$(cat "$kstatus_dir/go.mod" "$kstatus_dir/go.sum" "$kstatus_dir/main.go" | sha256sum | cut -c1-12)
kstatus_bin="$CACHE_ROOT/kstatus-$key"
if [ ! -x "$kstatus_bin/kstatus" ]; then
  log "building the kstatus program (sigs.k8s.io/cli-utils, tests/kstatus/go.mod)"
  start=$(date +%s)
  rm -rf "$kstatus_bin.tmp" && mkdir -p "$kstatus_bin.tmp"
  (cd "$kstatus_dir" && go build -mod=readonly -trimpath -buildvcs=false -ldflags "-s -w" \
    -o "$kstatus_bin.tmp/kstatus" .)
  rm -rf "$kstatus_bin" && mv "$kstatus_bin.tmp" "$kstatus_bin"
  log "kstatus built in $(( $(date +%s) - start ))s"
fi
ln -sf "$kstatus_bin/kstatus" "$bin/kstatus"

# Helm 4, keyed by its version alone (go install of a tagged module).
helm4_bin="$CACHE_ROOT/helm-${HELM4_VERSION}"
if [ ! -x "$helm4_bin/helm" ]; then
  log "installing helm ${HELM4_VERSION} (cold: 3 to 6 minutes on 2 cores)"
  start=$(date +%s)
  rm -rf "$helm4_bin.tmp" && mkdir -p "$helm4_bin.tmp"
  (cd "$CP_HERE" && GOBIN="$helm4_bin.tmp" go install -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=${HELM4_VERSION}" \
      "helm.sh/helm/v4/cmd/helm@${HELM4_VERSION}")
  rm -rf "$helm4_bin" && mv "$helm4_bin.tmp" "$helm4_bin"
  log "helm ${HELM4_VERSION} installed in $(( $(date +%s) - start ))s"
fi
ln -sf "$helm4_bin/helm" "$bin/helm4"

echo "$bin"
