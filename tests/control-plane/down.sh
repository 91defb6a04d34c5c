#!/usr/bin/env bash
# Stops the local node (node-down.sh, when one was started here) and the local control plane by
# its recorded PIDs (controller-manager, apiserver, then etcd).
# Safe to call twice and when nothing runs. Logs stay in $TESTENV_DIR/logs.
set -uo pipefail
source "$(dirname "$0")/common.sh"

stop_demo_services
"$CP_HERE/node-down.sh"
stop_process kube-controller-manager
stop_process kube-apiserver
stop_process etcd
exit 0
