#!/usr/bin/env bash
# Stops the local control plane by its recorded PIDs (controller-manager, apiserver, then etcd).
# Safe to call twice and when nothing runs. Logs stay in $TESTENV_DIR/logs.
set -uo pipefail
source "$(dirname "$0")/common.sh"

stop() {
  local name=$1 f="$TESTENV_DIR/$1.pid" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
    cp_log "stopped $name (pid $pid)"
  fi
  rm -f "$f"
}

# The demo webhook's registration goes first: with failurePolicy Fail it would block Projection writes.
if [ -f "$TESTENV_DIR/projection-webhook.pid" ] && [ -x "$TESTENV_DIR/bin/kubectl" ]; then
  "$TESTENV_DIR/bin/kubectl" --kubeconfig "$TESTENV_DIR/admin.kubeconfig" --request-timeout=5s delete \
    mutatingwebhookconfiguration,validatingwebhookconfiguration projection-webhook-demo --ignore-not-found >/dev/null 2>&1
fi
stop projection-webhook      # started by scripts/demo.sh
stop projection-controller   # started by scripts/demo.sh
stop kube-controller-manager
stop kube-apiserver
stop etcd
exit 0
