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

say "Building and starting projection-controller"
cargo build --locked -q -p controller --bin projection-controller
source tests/control-plane/common.sh
stop_process projection-controller
nohup target/debug/projection-controller --metrics-bind-address 127.0.0.1:18080 \
  --health-probe-bind-address 127.0.0.1:18081 > "$LOGS/projection-controller.log" 2>&1 &
echo $! > "$TESTENV_DIR/projection-controller.pid"
for _ in $(seq 100); do curl -fsS http://127.0.0.1:18081/readyz >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS http://127.0.0.1:18081/readyz >/dev/null || { echo "controller not ready; see $LOGS/projection-controller.log"; exit 1; }
echo "running (pid $(cat "$TESTENV_DIR/projection-controller.pid")), logs in $LOGS/projection-controller.log"

say "Applying examples/"
kubectl apply --server-side --force-conflicts -f examples/
kubectl wait --for=condition=Ready projection/shared-settings -n team-a --timeout=30s

say "The source (platform-config/shared-settings)"
kubectl get configmap shared-settings -n platform-config -o jsonpath='{.data}{"\n"}'

say "The Projection"
kubectl get projections -A
kubectl get projection shared-settings -n team-a \
  -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}'

say "The copy (team-a/platform-settings)"
kubectl get configmap platform-settings -n team-a --show-labels
kubectl get configmap platform-settings -n team-a -o jsonpath='{.data}{"\n"}'

say "Editing the source: log-level=debug"
kubectl patch configmap shared-settings -n platform-config --type merge -p '{"data":{"log-level":"debug"}}'
for _ in $(seq 50); do
  [ "$(kubectl get configmap platform-settings -n team-a -o jsonpath='{.data.log-level}')" = debug ] && break
  sleep 0.1
done
echo "copy now: $(kubectl get configmap platform-settings -n team-a -o jsonpath='{.data}')"
kubectl get events -n team-a --field-selector involvedObject.name=shared-settings --sort-by=.lastTimestamp | tail -n 3

say "ClusterProjections: by list (team-a, team-b) and by selector (tier=production)"
kubectl create namespace team-b >/dev/null 2>&1 || true   # listed before it existed: written once created
for _ in $(seq 50); do
  [ "$(kubectl get clusterprojection shared-settings-to-teams -o jsonpath='{.status.namespacesWritten}')" = 2 ] && break
  sleep 0.1
done
kubectl get clusterprojections -o wide
kubectl get configmaps -A -l projection.sh/owned-by-cluster-projection-uid

# --- admission webhook (issue 5) -------------------------------------------------------------
say "Building and starting projection-webhook (certificates from certs/generate.sh)"
cargo build --locked -q -p webhook --bin projection-webhook
certs/generate.sh "$TESTENV_DIR/webhook-certs" >/dev/null
stop_process projection-webhook
nohup target/debug/projection-webhook --bind-address 127.0.0.1:19443 \
  --tls-cert-file "$TESTENV_DIR/webhook-certs/tls.crt" --tls-key-file "$TESTENV_DIR/webhook-certs/tls.key" \
  --metrics-bind-address 127.0.0.1:19080 --health-probe-bind-address 127.0.0.1:19080 \
  > "$LOGS/projection-webhook.log" 2>&1 &
echo $! > "$TESTENV_DIR/projection-webhook.pid"
for _ in $(seq 100); do curl -fsS http://127.0.0.1:19080/readyz >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS http://127.0.0.1:19080/readyz >/dev/null || { echo "webhook not ready; see $LOGS/projection-webhook.log"; exit 1; }
scripts/register-webhook.sh 19443 "$TESTENV_DIR/webhook-certs/ca.crt" projection-webhook-demo
echo "running (pid $(cat "$TESTENV_DIR/projection-webhook.pid")), logs in $LOGS/projection-webhook.log"

say "A bad spec is rejected at kubectl apply"
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
# --- end of admission webhook -------------------------------------------------------------------

say "The Helm chart (charts/projection): lint, and what it installs (docs/getting-started.md)"
helm lint --strict charts/projection | tail -n 1
helm template projection charts/projection -n projection-system |
  awk '/^kind:/ {kind=$2} /^  name:/ && kind {print kind "/" $2; kind=""}' | sort

say "Done"
echo "The control plane and the controller keep running. Use them with:"
echo "  export KUBECONFIG=$KUBECONFIG PATH=$PWD/.testenv/bin:\$PATH"
echo "Stop them all with: tests/control-plane/down.sh"
