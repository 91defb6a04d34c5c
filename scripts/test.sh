#!/usr/bin/env bash
# Runs the whole test suite: unit tests and the integration tests against the real local control
# plane and its node (our images and the real cert-manager as pods). Starts the control plane and
# the node if they are not running (and stops them again afterwards, unless KEEP_CONTROL_PLANE=1);
# reuses what is already up. The node needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh
export PATH=$PATH:/usr/local/go/bin

source tests/control-plane/common.sh
stop_planes=0
if ! { pid_alive kube-apiserver && pid_alive kube-controller-manager; }; then
  [ "${KEEP_CONTROL_PLANE:-0}" = 1 ] || stop_planes=1
fi
tools="$TESTENV_DIR/tools"
tools_pid=""
# Stops what this script started (the background build below, by PID, with its children; the
# control planes unless they were already up or KEEP_CONTROL_PLANE=1), however it ends.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
cleanup() {
  if [ -n "$tools_pid" ] && kill -0 "$tools_pid" 2>/dev/null; then kill_tree "$tools_pid"; fi
  rm -f "$tools.building"
  if [ "$stop_planes" = 1 ]; then tests/control-plane/remote.sh down; tests/control-plane/down.sh; fi
}
trap cleanup EXIT
tests/control-plane/up.sh >/dev/null
# The second control plane the cross-cluster tests write into (no node; a few seconds once built),
# with the apiserver's sharded list and watch on.
eval "$(tests/control-plane/remote.sh up)"
# Tests run controllers and webhooks of their own; the demo's would act on their objects too.
stop_demo_services
# The node, with the images built here imported and cert-manager installed by its own chart.
tests/control-plane/cert-manager.sh

# What only some tests use: Helm 4 and kstatus (the GitOps tests), promtool, Prometheus and
# prometheus-operator (the monitoring tests, their images imported into the node), each cached by
# version. Cold they take minutes, so they are built in the background at the lowest priority while
# the workspace compiles and the other tests run (which mostly wait on the cluster: about a fifth
# of the 2 cores busy, measured); the tests that use them wait for them
# (projection_tests::wait_for_tools reads tools.building, which holds the build's PID, and
# tools.failed). Cached, all of it takes a few seconds.
rm -f "$tools.failed" "$tools.log"
(
  if nice -n 19 tests/control-plane/build-gitops.sh >/dev/null &&
    nice -n 19 tests/control-plane/build-monitoring.sh >/dev/null && tests/control-plane/images.sh; then
    rm -f "$tools.building"
  else
    touch "$tools.failed"
    rm -f "$tools.building"
    exit 1
  fi
) > "$tools.log" 2>&1 &
tools_pid=$!
echo "$tools_pid" > "$tools.building"

cargo test --workspace --locked --no-fail-fast "$@"
if ! wait "$tools_pid"; then
  tools_pid=""
  echo "building the tools some tests use failed:" >&2
  cat "$tools.log" >&2
  exit 1
fi
tools_pid=""
grep -h "installed in\|built in" "$tools.log" >&2 || true
# The replicas with shards again, on the second control plane: there the apiserver filters their CR
# watches by shardSelector (on the first it ignores the parameter and each replica filters itself).
if [ $# -eq 0 ]; then
  PROJECTION_TEST_KUBECONFIG=$REMOTE_KUBECONFIG cargo test --locked -p controller --test sharding
fi
