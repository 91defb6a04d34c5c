#!/usr/bin/env bash
# Builds (or reuses) the local cluster binaries from our wrapper module: kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, etcd, kubectl and the node's pause program;
# helm, promtool, prometheus and prometheus-operator by go install or go build.
# Prints the bin directory on stdout's last line. The cache lives outside the
# repository, keyed by versions and by the content of go.mod/go.sum/mains, so a
# second run does not rebuild.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.env"
# The binaries are linked without DWARF (-ldflags "-s -w"), so the compiler is not asked to make it
# (GOFLAGS; the same in every script that builds Go tools here, so they share the standard library).
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-gcflags=all=-dwarf=false

# The Kubernetes binaries are keyed by what goes into them; helm by its version alone.
key=$(cat "$here/go.mod" "$here/go.sum" "$here"/cmd/*/main.go | sha256sum | cut -c1-12)
cache_root=${PROJECTION_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projection-testenv}
bin="$cache_root/${K8S_VERSION}-${key}/bin"
helm_bin="$cache_root/helm-${HELM_VERSION}"
mkdir -p "$bin" "$helm_bin"

log() { echo "[control-plane build] $*" >&2; }

need_k8s=0
for b in kube-apiserver kube-controller-manager etcd kubectl kube-scheduler kubelet pause; do
  [ -x "$bin/$b" ] || need_k8s=1
done
if [ "$need_k8s" = 1 ]; then
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  v="-X k8s.io/component-base/version"; c="-X k8s.io/client-go/pkg/version"
  ldflags="-s -w"
  # The same stamps upstream's hack/lib/version.sh sets, so kubectl version and
  # Helm kubeVersion constraints see the real version. A fixed buildDate keeps
  # rebuilds cache hits.
  for kv in gitVersion=$K8S_VERSION gitMajor=1 gitMinor=$minor gitTreeState=clean buildDate=2026-01-01T00:00:00Z; do
    ldflags="$ldflags $v.$kv $c.$kv"
  done
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, etcd, kubectl, pause ${K8S_VERSION} into $bin (cold: tens of minutes on 2 cores)"
  start=$(date +%s)
  tmp="$bin.tmp"; rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$here" && go build -mod=readonly -trimpath -buildvcs=false -tags notest,grpcnotrace \
      -ldflags "$ldflags" -o "$tmp/" ./cmd/...)
  mv "$tmp"/* "$bin/" && rmdir "$tmp"
  log "built in $(( $(date +%s) - start ))s"
fi

if [ ! -x "$helm_bin/helm" ]; then
  log "installing helm ${HELM_VERSION}"
  start=$(date +%s)
  # Stamped like upstream's release builds so `helm version` reports the full version.
  (cd "$here" && GOBIN="$helm_bin" go install -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
      "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}")
  log "helm installed in $(( $(date +%s) - start ))s"
fi
ln -sf "$helm_bin/helm" "$bin/helm"

# CRDs of projects the chart integrates with, taken from their Go modules (plain YAML there) and
# linked into the bin folder for the chart tests.
# module_crds MODULE VERSION FOLDER GLOB LINK
module_crds() {
  local module=$1 version=$2 folder=$3 glob=$4 link=$5
  local dest="$cache_root/${link}-${version}"
  if [ -z "$(ls "$dest" 2>/dev/null)" ]; then
    log "fetching the CRDs of $module $version from its Go module"
    local dir
    dir=$(cd "$(mktemp -d)" && go mod download -json "$module@$version" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$dir/$folder" ] || { log "$module $version has no $folder"; exit 1; }
    rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
    cp "$dir/$folder"/$glob "$dest.tmp/"
    rm -rf "$dest" && mv "$dest.tmp" "$dest"
  fi
  ln -sfn "$dest" "$bin/$link"
}
module_crds github.com/cert-manager/cert-manager "$CERT_MANAGER_VERSION" deploy/crds 'cert-manager.io_*.yaml' cert-manager-crds
module_crds github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION" \
  example/prometheus-operator-crd monitoring.coreos.com_servicemonitors.yaml prometheus-operator-crds
module_crds github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION" \
  example/prometheus-operator-crd monitoring.coreos.com_prometheusrules.yaml prometheus-rule-crd
# All of them (Prometheus, Alertmanager, ...), for the real operator.
module_crds github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION" \
  example/prometheus-operator-crd 'monitoring.coreos.com_*.yaml' prometheus-operator-all-crds

"$bin/kube-apiserver" --version >&2
echo "$bin"
