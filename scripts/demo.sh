#!/usr/bin/env bash
# The main job, as a platform engineer's first day: a local cluster with a real node, the images
# built here, the real cert-manager, `helm install --wait` of our chart in cert-manager mode, then
# the examples applied and what users see (mirrors, conditions, events, a rejected spec).
# Everything keeps running afterwards so you can look around; `tests/control-plane/down.sh` stops
# it all and cleans up. Needs root (the node's network, mounts and cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh
export PATH=$PATH:/usr/local/go/bin

source tests/control-plane/common.sh
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "Local cluster: kube-apiserver, etcd, kube-controller-manager, kube-scheduler and a kubelet node (containerd)"
eval "$(tests/control-plane/up.sh)"
export PATH="$TESTENV_DIR/bin:$PATH"
tests/control-plane/node-up.sh
kubectl get nodes -o wide

say "cert-manager, built from its Go module and installed with its own chart"
tests/control-plane/cert-manager.sh
kubectl get pods -n cert-manager

say "helm install --wait of charts/projection with cert-manager issuing the webhook certificate"
export HELM_CACHE_HOME="$TESTENV_DIR/helm/cache" HELM_CONFIG_HOME="$TESTENV_DIR/helm/config" HELM_DATA_HOME="$TESTENV_DIR/helm/data"
# The chart installs and upgrades the CRDs. CRDs already in the cluster but not the release's (applied
# by the tests, or by a chart before 0.2.0, which kept them in crds/) are handed to it first, the
# one-time step of docs/getting-started.md.
for crd in projections.projection.sh clusterprojections.projection.sh; do
  if kubectl get crd "$crd" >/dev/null 2>&1; then
    kubectl label crd "$crd" app.kubernetes.io/managed-by=Helm --overwrite >/dev/null
    kubectl annotate crd "$crd" meta.helm.sh/release-name=projection \
      meta.helm.sh/release-namespace=projection-system --overwrite >/dev/null
  fi
done
helm upgrade --install projection charts/projection -n projection-system --create-namespace --wait --timeout 3m \
  --set webhook.certificate.mode=cert-manager \
  --set-file webhook.clientAuth.caBundle="$TESTENV_DIR/pki/webhook-client-ca.crt" \
  --set-json 'supportedKinds=[{"apiGroup":"","resources":["configmaps","secrets"]},{"apiGroup":"apps","resources":["deployments"]}]' \
  --set controller.image.repository=local.test/projection-controller --set controller.image.tag=dev \
  --set controller.image.pullPolicy=Never \
  --set webhook.image.repository=local.test/projection-webhook --set webhook.image.tag=dev \
  --set webhook.image.pullPolicy=Never | sed -n '1,/^NOTES:/p'
kubectl get pods -A -o wide
kubectl get certificate -n projection-system
echo "caBundle injected by cainjector: $(kubectl get validatingwebhookconfiguration projection-webhook \
  -o jsonpath='{.webhooks[0].clientConfig.caBundle}' | wc -c) bytes"

say "Applying examples/"
kubectl apply -f examples/
kubectl wait --for=condition=Ready projection/shared-settings -n team-a --timeout=60s

say "The source (platform-config/shared-settings)"
kubectl get configmap shared-settings -n platform-config -o jsonpath='{.data}{"\n"}'

say "The Projection and its conditions"
kubectl get projections -A
kubectl get projection shared-settings -n team-a \
  -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}'

say "The copy (team-a/platform-settings)"
kubectl get configmap platform-settings -n team-a --show-labels
kubectl get configmap platform-settings -n team-a -o jsonpath='{.data}{"\n"}'

say "Editing the source: log-level=debug"
kubectl patch configmap shared-settings -n platform-config --type merge -p '{"data":{"log-level":"debug"}}'
for _ in $(seq 100); do
  [ "$(kubectl get configmap platform-settings -n team-a -o jsonpath='{.data.log-level}')" = debug ] && break
  sleep 0.1
done
echo "copy now: $(kubectl get configmap platform-settings -n team-a -o jsonpath='{.data}')"

say "Events, as kubectl describe shows them"
kubectl describe projection shared-settings -n team-a | sed -n '/^Events:/,$p'

say "ClusterProjections: by list (team-a, team-b) and by selector (tier=production)"
kubectl create namespace team-b >/dev/null 2>&1 || true   # listed before it existed: written once created
for _ in $(seq 100); do
  [ "$(kubectl get clusterprojection shared-settings-to-teams -o jsonpath='{.status.namespacesWritten}')" = 2 ] && break
  sleep 0.1
done
kubectl get clusterprojections -o wide
kubectl get configmaps -A -l projection.sh/owned-by-cluster-projection-uid

say "A bad spec is rejected at kubectl apply, by the webhook pods"
bad_spec='apiVersion: projection.sh/v1
kind: Projection
metadata: {name: broken, namespace: team-a}
spec:
  source: {kind: configmap, namespace: platform-config, name: shared_settings}
  overlay: {labels: {projection.sh/owned-by-projection: me}}'
echo "$bad_spec"
echo "$bad_spec" | kubectl apply -f - || true

say "A source that has not opted in is rejected, with how to opt in"
kubectl create configmap private-settings -n platform-config --from-literal=k=v --dry-run=client -o yaml | kubectl apply -f -
cat <<'YAML' | kubectl apply -f - || true
apiVersion: projection.sh/v1
kind: Projection
metadata: {name: private, namespace: team-a}
spec:
  source: {kind: ConfigMap, namespace: platform-config, name: private-settings}
YAML

say "Why is the copy what it is? kubectl projection, the plugin (built from plugin/)"
cargo build --quiet --locked -p kubectl-projection
export PATH="$PWD/target/debug:$PATH"
kubectl projection why configmap/platform-settings -n team-a

say "Done"
echo "The cluster, its node, cert-manager and projection keep running. Use them with:"
echo "  export KUBECONFIG=$KUBECONFIG PATH=$TESTENV_DIR/bin:$PWD/target/debug:\$PATH"
echo "  kubectl projection status -A    # every Projection and ClusterProjection, one line each"
echo "Stop everything and clean up with: tests/control-plane/down.sh"
