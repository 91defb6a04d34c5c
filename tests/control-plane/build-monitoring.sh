#!/usr/bin/env bash
# Builds (or reuses) what only the monitoring tests use (tests/e2e/alerts.rs,
# tests/e2e/prometheus_operator.rs): promtool and the Prometheus server, prometheus-operator and its
# config reloader, cached by version like the cluster binaries, and linked into build.sh's bin
# folder (images.sh then makes their images). scripts/test.sh runs it; the demo does not need it.
# Prints the bin directory on stdout's last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.env"
# No DWARF from the compiler, as in build.sh.
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-gcflags=all=-dwarf=false
bin=$("$here/build.sh" | tail -n 1)
cache_root=${PROJECTION_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projection-testenv}

log() { echo "[control-plane build] $*" >&2; }

# promtool and the Prometheus server, for the chart's alerts and dashboard (tests/e2e/alerts.rs):
# one go install of both commands of the module, keyed by its version and the service discoveries
# built in. The server runs without its web UI's assets (not in the module); its API is all the tests
# use. Of Prometheus's service discoveries only Kubernetes' is built (the one prometheus-operator's
# configuration uses; the alert tests scrape static targets): its build tags leave out the cloud
# providers' SDKs, 171 s instead of 410 s from an empty Go build cache on this 2-core machine.
prometheus_sd_tags=remove_all_sd,enable_kubernetes_sd
prometheus_bin="$cache_root/prometheus-${PROMETHEUS_VERSION}-kubernetes-sd"
if [ ! -x "$prometheus_bin/promtool" ] || [ ! -x "$prometheus_bin/prometheus" ]; then
  log "installing promtool and prometheus ${PROMETHEUS_VERSION} (cold: about 3 minutes on 2 cores)"
  start=$(date +%s)
  rm -rf "$prometheus_bin.tmp" && mkdir -p "$prometheus_bin.tmp"
  (cd "$here" && GOBIN="$prometheus_bin.tmp" go install -trimpath -tags "$prometheus_sd_tags" \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
      "github.com/prometheus/prometheus/cmd/promtool@${PROMETHEUS_VERSION}" \
      "github.com/prometheus/prometheus/cmd/prometheus@${PROMETHEUS_VERSION}")
  rm -rf "$prometheus_bin" && mv "$prometheus_bin.tmp" "$prometheus_bin"
  log "promtool and prometheus installed in $(( $(date +%s) - start ))s"
fi
ln -sf "$prometheus_bin/promtool" "$bin/promtool"
ln -sf "$prometheus_bin/prometheus" "$bin/prometheus"

# prometheus-operator and its config reloader, to run the chart's ServiceMonitor and PrometheusRule
# the way kube-prometheus-stack users do (tests/e2e/prometheus_operator.rs). `go install …@version`
# is refused: the operator's go.mod replaces its pkg/apis/monitoring and pkg/client modules by local
# folders. Both are published modules at the same version, so our wrapper module
# (prometheus-operator/go.mod, go.sum) requires the three and builds the two commands as its tools.
# Keyed by the version and the wrapper's go.mod and go.sum.
po_dir="$here/prometheus-operator"
grep -q "github.com/prometheus-operator/prometheus-operator ${PROMETHEUS_OPERATOR_VERSION}\( \|$\)" "$po_dir/go.mod" || {
  log "$po_dir/go.mod does not require prometheus-operator ${PROMETHEUS_OPERATOR_VERSION} (versions.env): update it with go get -tool"
  exit 1
}
po_key=$(cat "$po_dir/go.mod" "$po_dir/go.sum" | sha256sum | cut -c1-12)
po_bin="$cache_root/prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}-${po_key}"
if [ ! -x "$po_bin/operator" ] || [ ! -x "$po_bin/prometheus-config-reloader" ]; then
  log "building prometheus-operator and prometheus-config-reloader ${PROMETHEUS_OPERATOR_VERSION} (cold: minutes on 2 cores)"
  start=$(date +%s)
  rm -rf "$po_bin.tmp" && mkdir -p "$po_bin.tmp"
  # The version stamp also names the reloader image the operator defaults to; the tests pass theirs.
  (cd "$po_dir" && go build -mod=readonly -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}" \
      -o "$po_bin.tmp/" \
      github.com/prometheus-operator/prometheus-operator/cmd/operator \
      github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader)
  rm -rf "$po_bin" && mv "$po_bin.tmp" "$po_bin"
  log "prometheus-operator built in $(( $(date +%s) - start ))s"
fi
ln -sf "$po_bin/operator" "$bin/prometheus-operator"
ln -sf "$po_bin/prometheus-config-reloader" "$bin/prometheus-config-reloader"

echo "$bin"
