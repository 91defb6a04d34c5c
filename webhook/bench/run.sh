#!/usr/bin/env bash
# Admission latency and throughput of projection-webhook on loopback, for a valid Projection review
# of an existing, opted-in source: once without and once with the SubjectAccessReview.
#
#   webhook/bench/run.sh [DURATION] [CONNECTIONS] [THREADS]     # defaults: 20s 16 2
#
# Needs the local control plane (tests/control-plane/up.sh) and wrk (apt-get install -y wrk). Builds
# the release binary, starts it directly (no registration: wrk posts the AdmissionReview itself, as
# the apiserver would) and prints wrk's summary with p50/p90/p99.
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-20s} connections=${2:-16} threads=${3:-2}
export KUBECONFIG=${KUBECONFIG:-$PWD/.testenv/admin.kubeconfig} PATH="$PWD/.testenv/bin:$PATH"
work=$(mktemp -d) pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; kubectl delete namespace bench-platform --wait=false >/dev/null 2>&1; rm -rf "$work"' EXIT
cargo build --release -q -p webhook --bin projection-webhook
certs/generate.sh "$work/certs" >/dev/null
kubectl create namespace bench-platform --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: bench-platform, annotations: {projection.sh/projectable: "true"}}
data: {k: v}
YAML
# The admin of the local control plane, as the apiserver reports it in userInfo.
sed -e 's/"username": "alice"/"username": "projection-testenv-admin"/; s/"tenants"/"system:masters"/' \
  -e 's/"namespace": "platform"/"namespace": "bench-platform"/; s/"name": "shared-settings"/"name": "settings"/' \
  webhook/tests/fixtures/projection-create.json > "$work/review.json"
grep -q bench-platform "$work/review.json"

port=19443
run() {
  local label=$1; shift
  target/release/projection-webhook --bind-address 127.0.0.1:$port --tls-cert-file "$work/certs/tls.crt" \
    --tls-key-file "$work/certs/tls.key" --health-probe-bind-address 127.0.0.1:19081 --shutdown-delay 0s \
    "$@" 2>"$work/webhook.log" &
  pid=$!
  for _ in $(seq 100); do curl -fsS http://127.0.0.1:19081/readyz >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS -k https://127.0.0.1:$port/validate -d @"$work/review.json" | grep -q '"allowed":true' \
    || { echo "the review was not admitted:"; curl -sk https://127.0.0.1:$port/validate -d @"$work/review.json"; exit 1; }
  echo "== $label ($duration, $connections connections, $threads threads)"
  REVIEW_FILE="$work/review.json" wrk -t"$threads" -c"$connections" -d"$duration" -s webhook/bench/review.lua \
    "https://127.0.0.1:$port/validate" | grep -E '^(requests|p[0-9]+) '
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}
run "without SubjectAccessReview" --check-source-access=false
run "with SubjectAccessReview"
