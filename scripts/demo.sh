#!/usr/bin/env bash
# The main job: brings up the local control plane, installs the CRDs, applies examples/ and shows
# what the cluster holds. The control plane keeps running afterwards so you can look around;
# `tests/control-plane/down.sh` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh
export PATH=$PATH:/usr/local/go/bin

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "Local control plane (kube-apiserver, etcd, kube-controller-manager built from upstream modules)"
eval "$(tests/control-plane/up.sh)"
export PATH="$PWD/.testenv/bin:$PATH"
kubectl version

say "CRDs generated from the Rust types (charts/projection/crds)"
kubectl apply --server-side --force-conflicts -f charts/projection/crds/
kubectl wait --for=condition=Established crd/projections.projection.sh crd/clusterprojections.projection.sh --timeout=60s

say "Applying examples/"
kubectl apply --server-side -f examples/

say "What the cluster shows"
kubectl get configmap shared-settings -n platform-config --show-labels
kubectl get projections -A
kubectl get clusterprojections -o wide

say "Done"
echo "No controller runs yet (see docs/development.md): the Projections above are accepted and stored,"
echo "and their copies appear once projection-controller is started against this cluster."
echo "The control plane is still running. Use it with:"
echo "  export KUBECONFIG=$KUBECONFIG PATH=$PWD/.testenv/bin:\$PATH"
echo "Stop it with: tests/control-plane/down.sh"
