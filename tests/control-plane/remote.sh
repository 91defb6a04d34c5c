#!/usr/bin/env bash
# The second local control plane the cross-cluster tests write into (`spec.destination.kubeConfig`):
# `remote.sh up` starts it (etcd, kube-apiserver, kube-controller-manager on loopback, in
# $REPO/.testenv-remote, ports 17443, 13379 and 13380 unless REMOTE_API_PORT, REMOTE_ETCD_PORT and
# REMOTE_ETCD_PEER_PORT say otherwise), `remote.sh down` stops it. It has no node: only objects
# are written there. Prints `export REMOTE_KUBECONFIG=...` when up.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export TESTENV_DIR=${REMOTE_TESTENV_DIR:-$repo/.testenv-remote}
export API_PORT=${REMOTE_API_PORT:-17443}
export ETCD_PORT=${REMOTE_ETCD_PORT:-13379}
export ETCD_PEER_PORT=${REMOTE_ETCD_PEER_PORT:-13380}
# Sharded list and watch (KEP-5866, alpha, off by default) on here, off on the first control plane:
# tests/e2e/sharding.rs checks both (REMOTE_APISERVER_FEATURE_GATES replaces it).
export APISERVER_FEATURE_GATES=${REMOTE_APISERVER_FEATURE_GATES:-ShardedListAndWatch=true}
case "${1:-}" in
  up)
    "$here/up.sh" >/dev/null
    echo "export REMOTE_KUBECONFIG=$TESTENV_DIR/admin.kubeconfig"
    ;;
  down) "$here/down.sh" ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
