#!/usr/bin/env bash
# The main job, as a platform engineer's first day: a local cluster with a real node, the images
# built here, `helm install --wait` of our chart with its defaults (the webhook issues its own
# certificate: no other tool needed), then the examples applied and what users see (mirrors,
# conditions, events, a rejected spec). With CERT_MANAGER=1 the real cert-manager is built and
# installed first and issues the webhook's certificate instead (the chart's cert-manager mode; its
# build adds 6 to 10 minutes the first time). Everything keeps running afterwards so you can look
# around; `tests/control-plane/down.sh` stops it all and cleans up. Needs root (the node's network,
# mounts and cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin

source tests/control-plane/common.sh
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# Our services and the plugin compile while the Kubernetes binaries' Go build runs (minutes each on a
# new machine, and neither keeps both cores busy throughout); the node's images.sh runs the same
# build (common.sh) and finds it fresh. Both start before the prerequisites, whose Debian packages
# (the node's containerd, runc and CNI plugins; half a minute on a new machine) only the node needs:
# a missing toolchain stops the demo there with prereqs.sh's message, and the builds with it.
build_log=$(mktemp)
trap 'kill $(jobs -pr) 2>/dev/null || true; rm -f "$build_log"' EXIT
"${OUR_SERVICES_BUILD[@]}" > "$build_log" 2>&1 &
build=$!
tests/control-plane/build.sh > /dev/null &
go_build=$!
scripts/prereqs.sh

say "Local cluster: kube-apiserver, etcd, kube-controller-manager, kube-scheduler and a kubelet node (containerd)"
wait "$go_build" || { echo "the build of the Kubernetes binaries failed (above)"; exit 1; }
eval "$(tests/control-plane/up.sh)"
export PATH="$TESTENV_DIR/bin:$PATH"
echo "waiting for the build of our services ($build_log)"
wait "$build" || { cat "$build_log"; echo "the build of our services failed (above)"; exit 1; }
tests/control-plane/node-up.sh
kubectl get nodes -o wide

cert_values=()
if [ "${CERT_MANAGER:-0}" = 1 ]; then
  say "cert-manager, built from its Go module and installed with its own chart"
  tests/control-plane/cert-manager.sh
  kubectl get pods -n cert-manager
  cert_values=(--set webhook.certificate.mode=cert-manager)
  say "helm install --wait of charts/projection with cert-manager issuing the webhook certificate"
else
  say "helm install --wait of charts/projection: the webhook issues its own certificate (the chart's default)"
fi
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
# An install of the other certificate mode is replaced, not upgraded in place (the webhook's
# Secret changes hands between the two modes).
mode=$(helm get values projection -n projection-system -a -o json 2>/dev/null |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["webhook"]["certificate"]["mode"])' 2>/dev/null || true)
wanted=self-managed; [ "${CERT_MANAGER:-0}" = 1 ] && wanted=cert-manager
if [ -n "$mode" ] && [ "$mode" != "$wanted" ]; then
  helm uninstall projection -n projection-system --wait >/dev/null
fi
helm upgrade --install projection charts/projection -n projection-system --create-namespace --wait --timeout 3m \
  "${cert_values[@]}" \
  --set-file webhook.clientAuth.caBundle="$TESTENV_DIR/pki/webhook-client-ca.crt" \
  --set-json 'supportedKinds=[{"apiGroup":"","resources":["configmaps","secrets"]},{"apiGroup":"apps","resources":["deployments"]}]' \
  --set controller.image.repository=local.test/projection-controller --set controller.image.tag=dev \
  --set controller.image.pullPolicy=Never \
  --set webhook.image.repository=local.test/projection-webhook --set webhook.image.tag=dev \
  --set webhook.image.pullPolicy=Never | sed -n '1,/^NOTES:/p'
kubectl get pods -A -o wide
if [ "${CERT_MANAGER:-0}" = 1 ]; then
  kubectl get certificate -n projection-system
  who="cert-manager's cainjector"
else
  kubectl get secrets -n projection-system --field-selector type=kubernetes.io/tls
  who="the webhook"
fi
echo "caBundle set by $who: $(kubectl get validatingwebhookconfiguration projection-webhook \
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
# Built at the start with the services: nothing to compile.
"${OUR_SERVICES_BUILD[@]}" --quiet
# Where cargo put it: target/ unless CARGO_TARGET_DIR (or a cargo config) says otherwise.
target_dir=$(cargo metadata --locked --no-deps --format-version 1 |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export PATH="$target_dir/debug:$PATH"
kubectl projection why configmap/platform-settings -n team-a

say "Done"
echo "The cluster, its node and projection keep running. Use them with:"
echo "  export KUBECONFIG=$KUBECONFIG PATH=$TESTENV_DIR/bin:$target_dir/debug:\$PATH"
echo "  kubectl projection status -A    # every Projection and ClusterProjection, one line each"
echo "Stop everything and clean up with: tests/control-plane/down.sh"
