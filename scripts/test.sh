#!/usr/bin/env bash
# Runs the whole test suite: unit tests and the integration tests against the real local control
# plane and its node (our images and the real cert-manager as pods), then the benchmark's smoke
# profile and the short fault-injection profile. Starts the control planes and the node if they
# are not running (and stops them again afterwards, unless KEEP_CONTROL_PLANE=1); reuses what is
# already up. The node needs root.
#
# The test binaries run in three lanes side by side, each on control planes of its own (most tests
# wait on the cluster, not on the cores): lane A on the first control plane, the one with the node
# (tests/e2e: the chart, prometheus-operator, then the alerts C does not run); lane B on
# tests/control-plane/lanes.sh's lane-b (the controller, plugin and unit tests, then the benchmark
# and faults); lane C on lane-c (the 2,000-CR sharding run with the apiserver's shardSelector, then
# the webhook tests, then the alerts A does not run). Each lane's output is printed whole when all
# are done, then one line per test binary.
#
# With arguments (a test name filter, cargo test options) it runs `cargo test --workspace` with
# them on the first control plane instead, one binary after the other, as before the lanes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh
export PATH=$PATH:/usr/local/go/bin

source tests/control-plane/common.sh
# The node's images hold the services' binaries of the test compile below (images.sh): no build of
# their own.
export PROJECTION_IMAGE_BINARIES=tests
# Each control plane it starts is stopped again on exit, and only those: after the demo, its cluster
# stays up as the demo left it, while the second control plane and the lanes' go.
running() { TESTENV_DIR=$1 pid_alive kube-apiserver; }
stop_on_exit=()
if [ "${KEEP_CONTROL_PLANE:-0}" != 1 ]; then
  running "$(tests/control-plane/lanes.sh dir lane-b)" || stop_on_exit+=("tests/control-plane/lanes.sh down")
  running "${REMOTE_TESTENV_DIR:-$PWD/.testenv-remote}" || stop_on_exit+=("tests/control-plane/remote.sh down")
  { pid_alive kube-apiserver && pid_alive kube-controller-manager; } || stop_on_exit+=(tests/control-plane/down.sh)
fi
trap 'for command in "${stop_on_exit[@]}"; do $command || true; done' EXIT
tests/control-plane/up.sh >/dev/null
# The second control plane the cross-cluster tests write into (no node; a few seconds once built),
# with the apiserver's sharded list and watch on.
eval "$(tests/control-plane/remote.sh up)"
# Tests run controllers and webhooks of their own; the demo's would act on their objects too.
stop_demo_services
# What only the monitoring tests use (promtool, Prometheus, prometheus-operator; cached by version),
# before the node so that their images are imported with the others.
tests/control-plane/build-monitoring.sh >/dev/null
# What only the GitOps health tests use (the kstatus library and Helm 4; cached by version).
tests/control-plane/build-gitops.sh >/dev/null
# The node, with the images built here imported and cert-manager installed by its own chart.
tests/control-plane/cert-manager.sh

if [ $# -gt 0 ]; then
  PROJECTION_SHARD_TEST_CRS=${PROJECTION_SHARD_TEST_CRS:-300} cargo test --workspace --locked --no-fail-fast "$@"
  exit
fi

tests/control-plane/lanes.sh up
out=$TESTENV_DIR/logs/lanes
rm -rf "$out"
mkdir -p "$out"

# Every test binary, built once: "<package folder> <kind> <target> <executable>" per line.
cargo test --workspace --locked --no-run --message-format=json-render-diagnostics | python3 -c '
import json, os, sys
root = os.getcwd()
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        folder = os.path.relpath(os.path.dirname(m["manifest_path"]), root)
        print(folder, m["target"]["kind"][0], m["target"]["name"], m["executable"])
' > "$out/binaries"
target_dir=$(cargo metadata --locked --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')

# run LANE FOLDER [TARGET [ENV=VALUE...] [-- ARG...]]: runs the package's test binaries (only
# TARGET's when given, else all but those named in SKIP), as cargo test does (from the package's
# folder), with the lane's environment and the ENV and ARGs given (libtest's test name filters,
# --skip); appends their output to the lane's log and one result line per binary to the results.
run() {
  local lane=$1 folder=$2 target=${3:-} f kind name exe started status found=0 vars=() args=()
  shift $(($# < 3 ? $# : 3))
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  if [ $# -gt 0 ]; then shift; args=("$@"); fi
  while read -r f kind name exe; do
    [ "$f" = "$folder" ] || continue
    if [ -n "$target" ]; then [ "$name" = "$target" ] || continue
    elif [[ " ${SKIP:-} " == *" $folder/$name "* ]]; then continue; fi
    found=1
    started=$(date +%s)
    echo "     Running $folder $kind $name ($exe ${args[*]})" >> "$out/$lane.log"
    if (cd "$folder" && env "${vars[@]}" "$exe" "${args[@]}") >> "$out/$lane.log" 2>&1; then
      status=ok
    else
      status=FAILED
    fi
    echo "[lane $lane] $folder/$name${args[*]:+ (${args[*]})}: $status in $(($(date +%s) - started)) s" |
      tee -a "$out/results"
  done < "$out/binaries"
  if [ "$found" = 0 ]; then
    echo "[lane $lane] $folder/${target:-*}: FAILED: no such test binary" | tee -a "$out/results"
  fi
}

# step LANE DESCRIPTION COMMAND...: one more step of a lane that is not a test binary.
step() {
  local lane=$1 what=$2 started status; shift 2
  started=$(date +%s)
  echo "     Running $what" >> "$out/$lane.log"
  if "$@" >> "$out/$lane.log" 2>&1; then status=ok; else status=FAILED; fi
  echo "[lane $lane] $what: $status in $(($(date +%s) - started)) s" | tee -a "$out/results"
}

# The alert tests (no node needed) are split between lanes C and A by name: those that match one of
# ALERTS_IN_C run at the end of C, every other one in A, after the tests that need the node.
ALERTS_IN_C=(webhook_ reconcile_errors no_leader)
skip_alerts_in_c=()
for filter in "${ALERTS_IN_C[@]}"; do skip_alerts_in_c+=(--skip "$filter"); done

lane_a() {
  SKIP=tests/alerts run A tests
  run A tests alerts -- "${skip_alerts_in_c[@]}"
}

# The sharding suite's three-replica test spreads 300 Projections here, where the apiserver ignores
# shardSelector (each replica filters itself), and its 2,000 in lane C, where the apiserver filters
# the replicas' CR watches by it. The suites with timed tests (remote's fence, sharding) run last,
# once lane C's 2,000 are done with the cores (projection_tests::cores_timed waits for that).
lane_b() {
  export TESTENV_DIR REMOTE_TESTENV_DIR
  TESTENV_DIR=$(tests/control-plane/lanes.sh dir lane-b)
  REMOTE_TESTENV_DIR=$(tests/control-plane/lanes.sh dir lane-b-remote)
  unset PROJECTION_TEST_KUBECONFIG
  for folder in shared codegen runtime plugin; do run B "$folder"; done
  SKIP="controller/remote controller/sharding" run B controller
  run B controller remote
  run B controller sharding PROJECTION_SHARD_TEST_CRS=300
  step B "benchmark smoke profile (black-box harness against the controller)" \
    "$target_dir/debug/examples/bench" --profile smoke --samples 5 --idle-seconds 10 \
    --start-controller "$target_dir/debug/projection-controller"
  step B "fault injection, short profile (controller kills mid fan-out, one kube-apiserver restart, a black-holed path, the leader killed)" \
    "$target_dir/debug/examples/faults" --controller "$target_dir/debug/projection-controller" \
    --profile short --seed 1 --black-hole-controller-arg=--api-read-timeout=20s
}

lane_c() {
  export TESTENV_DIR
  TESTENV_DIR=$(tests/control-plane/lanes.sh dir lane-c)
  unset PROJECTION_TEST_KUBECONFIG
  run C controller sharding PROJECTION_SHARD_TEST_CRS=2000
  run C webhook
  run C tests alerts -- "${ALERTS_IN_C[@]}"
}

started=$(date +%s)
lane_a & a=$!
lane_b & b=$!
lane_c & c=$!
wait "$a" "$b" "$c" || true
for lane in A B C; do
  echo "===== lane $lane ====="
  cat "$out/$lane.log"
done
echo "===== results ($(($(date +%s) - started)) s for the three lanes) ====="
sort "$out/results"
if grep -q ": FAILED" "$out/results"; then
  echo "failed: $(grep -c ": FAILED" "$out/results") of $(wc -l < "$out/results")"
  exit 1
fi
