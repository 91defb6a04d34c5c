#!/usr/bin/env bash
# Admission latency and throughput of projection-webhook on loopback, for a valid Projection review
# of an existing, opted-in source: without the SubjectAccessReview (--check-source-access=false,
# which also skips the source read: validation and discovery only), with it asked every time
# (--access-review-cache-ttl=0), and with it and its cache of grants (the default). The last two
# keep the default cache of source metadata reads (--source-metadata-cache-ttl=5s).
#
#   webhook/bench/run.sh [DURATION] [CONNECTIONS] [THREADS] [RATE]    # defaults: 20s 16 2 0
#
# RATE 0 sends as fast as the connections allow; RATE N paces the load: each connection pauses
# CONNECTIONS*1000/N ms before each request, so the rate reached is somewhat below N (the latency
# adds to the pause); wrk prints the rate reached (550 gave about 480/s here). Needs the local control plane (tests/control-plane/up.sh) and wrk (apt-get install -y
# wrk). Builds the release binary, starts it directly (no registration: wrk posts the
# AdmissionReview itself, as the apiserver would) and prints wrk's summary with p50/p90/p99 as the
# client saw them, then the server-side figures from the webhook's own latency histogram (body
# read to answer written, TLS excluded; bucket bounds, so "≤").
# WEBHOOK_BIN=path runs that binary instead of building this tree's (to compare two builds in one
# sitting, e.g. main's and a branch's).
# Since issue 30 the webhook believes a review's user only from a client that presents the
# apiserver's client certificate (--client-ca-file), and wrk cannot present one: with wrk (the
# default), the webhook is started without that flag and skips the SubjectAccessReview and the
# source read, so the three runs measure the same path (validation only).
# AUTHENTICATED=1 measures the path the apiserver takes: the load comes from the workspace's
# webhook-load (tests/src/bin/webhook-load.rs: HTTP/2 over TLS, one review in flight per
# connection, the same printed lines), which presents the local control plane's admission client
# certificate ($TESTENV_DIR/pki/webhook-client.crt), and the webhook is started with
# --client-ca-file $TESTENV_DIR/pki/webhook-client-ca.crt when it has that flag (a webhook older
# than issue 30 does not ask for a certificate and believes every caller, so it runs the same
# checks). RATE is not applied there.
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-20s} connections=${2:-16} threads=${3:-2} rate=${4:-0}
testenv=${TESTENV_DIR:-$PWD/.testenv}
export KUBECONFIG=${KUBECONFIG:-$testenv/admin.kubeconfig} PATH="$testenv/bin:$PATH"
pause_ms=0 pacing=unpaced
if [ "$rate" -gt 0 ]; then pause_ms=$((connections * 1000 / rate)) pacing="$pause_ms ms pause per request"; fi
work=$(mktemp -d) pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; kubectl delete namespace bench-platform --wait=false >/dev/null 2>&1; rm -rf "$work"' EXIT
binary=${WEBHOOK_BIN:-target/release/projection-webhook}
[ -n "${WEBHOOK_BIN:-}" ] || cargo build --release -q -p webhook --bin projection-webhook
authenticated=${AUTHENTICATED:-0} client_auth=()
if [ "$authenticated" = 1 ]; then
  load=${LOAD_BIN:-target/release/webhook-load}
  [ -n "${LOAD_BIN:-}" ] || cargo build --release -q -p projection-tests --bin webhook-load
  [ -s "$testenv/pki/webhook-client.crt" ] || { echo "no $testenv/pki/webhook-client.crt: start tests/control-plane/up.sh"; exit 1; }
  if "$binary" --help | grep -q -- --client-ca-file; then
    client_auth=(--client-ca-file "$testenv/pki/webhook-client-ca.crt")
  fi
fi
certs/generate.sh "$work/certs" >/dev/null
# An earlier run's namespace may still be terminating (deleted without waiting): its source would
# vanish during this run.
kubectl wait --for=delete namespace/bench-platform --timeout=120s >/dev/null 2>&1 || true
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
# Server-side p50/p90/p99 (the upper bound of the histogram bucket each falls in), the share
# answered within 2 and 4 ms, and the hits and misses of the SubjectAccessReview cache and of the
# source metadata cache.
server_side() {
  curl -fsS http://127.0.0.1:19081/metrics | awk '
    /^projection_webhook_request_duration_seconds_bucket\{/ && /endpoint="validate"/ && /verdict="allowed"/ {
      match($0, /le="[^"]+"/); le = substr($0, RSTART + 4, RLENGTH - 5)
      n++; bound[n] = le; count[n] = $NF
    }
    /^projection_webhook_access_review_cache_lookups_total/ { match($0, /result="[a-z]+"/); cache = cache " " substr($0, RSTART + 8, RLENGTH - 9) " " $NF }
    /^projection_webhook_source_metadata_cache_lookups_total/ { match($0, /result="[a-z]+"/); sources = sources " " substr($0, RSTART + 8, RLENGTH - 9) " " $NF }
    END {
      total = count[n]
      if (total == 0) { print "server-side: no requests counted"; exit }
      split("50 90 99", ps, " ")
      line = "server-side"
      for (i = 1; i <= 3; i++) {
        for (k = 1; k <= n; k++) if (count[k] >= total * ps[i] / 100) break
        line = line sprintf(" p%s <= %s ms,", ps[i], bound[k] == "+Inf" ? "inf" : bound[k] * 1000)
      }
      for (k = 1; k <= n; k++) {
        if (bound[k] == "0.002") w2 = count[k] / total
        if (bound[k] == "0.004") w4 = count[k] / total
      }
      printf "%s within 2 ms %.2f%%, within 4 ms %.2f%% of %d\n", line, 100 * w2, 100 * w4, total
      if (cache != "") print "access review cache:" cache
      if (sources != "") print "source metadata cache:" sources
    }'
}
run() {
  local label=$1; shift
  "$binary" --bind-address 127.0.0.1:$port --tls-cert-file "$work/certs/tls.crt" \
    --tls-key-file "$work/certs/tls.key" --health-probe-bind-address 127.0.0.1:19081 \
    --metrics-bind-address 127.0.0.1:19081 --shutdown-delay 0s ${client_auth[@]+"${client_auth[@]}"} "$@" 2>"$work/webhook.log" &
  pid=$!
  for _ in $(seq 100); do curl -fsS http://127.0.0.1:19081/readyz >/dev/null 2>&1 && break; sleep 0.1; done
  # Admitted without a warning: the source exists and is opted in (a missing source is admitted
  # with a warning and would measure another path).
  local cert=()
  [ "$authenticated" = 1 ] && cert=(--cert "$testenv/pki/webhook-client.crt" --key "$testenv/pki/webhook-client.key")
  curl -fsS -k ${cert[@]+"${cert[@]}"} https://127.0.0.1:$port/validate -d @"$work/review.json" | grep '"allowed":true' | grep -vq warnings \
    || { echo "the review was not admitted without warnings:"; curl -sk ${cert[@]+"${cert[@]}"} https://127.0.0.1:$port/validate -d @"$work/review.json"; exit 1; }
  if [ "$authenticated" = 1 ]; then
    echo "== $label ($duration, $connections HTTP/2 connections, authenticated with the apiserver's client certificate)"
    "$load" --address 127.0.0.1:$port --ca-file "$work/certs/ca.crt" ${cert[@]+"${cert[@]}"} \
      --body "$work/review.json" --connections "$connections" --duration "$duration" | grep -E '^(requests|p[0-9]+) '
  else
    echo "== $label ($duration, $connections connections, $threads threads, $pacing)"
    REVIEW_FILE="$work/review.json" PAUSE_MS=$pause_ms wrk -t"$threads" -c"$connections" -d"$duration" \
      -s webhook/bench/review.lua "https://127.0.0.1:$port/validate" | grep -E '^(requests|p[0-9]+) '
  fi
  server_side
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}
run "without SubjectAccessReview (nor source read)" --check-source-access=false
run "with SubjectAccessReview, asked every time" --access-review-cache-ttl=0
run "with SubjectAccessReview and its cache of grants (the default)"
