#!/usr/bin/env bash
# Installs the real cert-manager on the local node the way its users do: its own Helm chart (from
# its Go module, see build-cert-manager.sh) with `helm install --wait --wait-for-jobs`, its CRDs
# included, running the images images.sh built here. Starts the node first if needed. Safe to call
# twice: a deployed release is kept.
#
#   cert-manager.sh             install (or keep) the release "cert-manager" in namespace cert-manager
#   cert-manager.sh --uninstall remove it (its CRDs stay, as with every helm uninstall)
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$CP_HERE/versions.env"
log() { echo "[cert-manager] $*" >&2; }

bin=$(readlink "$TESTENV_DIR/bin" 2>/dev/null || true)
helm() {
  HELM_CACHE_HOME="$TESTENV_DIR/helm/cache" HELM_CONFIG_HOME="$TESTENV_DIR/helm/config" \
    HELM_DATA_HOME="$TESTENV_DIR/helm/data" "$bin/helm" --kubeconfig "$KUBECONFIG_FILE" "$@"
}
if [ "${1:-}" = --uninstall ]; then
  [ -n "$bin" ] && helm uninstall cert-manager -n cert-manager --wait --ignore-not-found
  exit 0
fi

# Built first, so that the node's images.sh finds its binaries and imports their images.
chart="$("$CP_HERE/build-cert-manager.sh" | tail -n 1)/chart"
"$CP_HERE/node-up.sh"
bin=$(readlink "$TESTENV_DIR/bin")
if [ "$(helm status cert-manager -n cert-manager -o json 2>/dev/null | sed -n 's/.*"status":"\([a-z-]*\)".*/\1/p' | head -n 1)" = deployed ]; then
  log "already installed"
  exit 0
fi
values=()
for c in controller webhook cainjector startupapicheck; do
  prefix=$c.; [ "$c" = controller ] && prefix=""
  values+=(--set "${prefix}image.repository=$LOCAL_IMAGE_PREFIX/cert-manager-$c"
    --set "${prefix}image.tag=$CERT_MANAGER_VERSION" --set "${prefix}image.pullPolicy=Never")
done
start=$(date +%s)
helm uninstall cert-manager -n cert-manager --wait --ignore-not-found >/dev/null 2>&1 || true
# Its webhook is asked whether it is ready every second from the start (the chart's default waits
# 5 s, then asks every 5 s): here it serves within a second or two, and everything after waits on it.
# Unready only after 15 failures in a row, the chart's 15 s (a loaded machine may stall a probe).
helm install cert-manager "$chart" -n cert-manager --create-namespace --set crds.enabled=true \
  "${values[@]}" --set webhook.readinessProbe.initialDelaySeconds=0 --set webhook.readinessProbe.periodSeconds=1 \
  --set webhook.readinessProbe.failureThreshold=15 --wait --wait-for-jobs --timeout 5m >/dev/null
log "cert-manager $CERT_MANAGER_VERSION installed in $(( $(date +%s) - start ))s"
