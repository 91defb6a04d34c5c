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
if ! { pid_alive kube-apiserver && pid_alive kube-controller-manager; }; then
  if [ "${KEEP_CONTROL_PLANE:-0}" != 1 ]; then
    trap 'tests/control-plane/remote.sh down; tests/control-plane/down.sh' EXIT
  fi
fi
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

# The sharding suite's three-replica test spreads 300 Projections here, where the apiserver ignores
# shardSelector (each replica filters itself), and its 3,000 on the second control plane below.
PROJECTION_SHARD_TEST_CRS=${PROJECTION_SHARD_TEST_CRS:-300} cargo test --workspace --locked --no-fail-fast "$@"
# The replicas with shards again, on the second control plane: there the apiserver filters their CR
# watches by shardSelector (on the first it ignores the parameter and each replica filters itself).
if [ $# -eq 0 ]; then
  PROJECTION_TEST_KUBECONFIG=$REMOTE_KUBECONFIG cargo test --locked -p controller --test sharding
fi
