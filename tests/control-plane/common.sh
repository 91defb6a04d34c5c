# Shared settings of the local control plane scripts (sourced, not run).
# Everything lives in one folder, $TESTENV_DIR (default: <repo>/.testenv):
#   admin.kubeconfig, pki/, logs/, etcd/, *.pid, env, bin -> the cached binaries
CP_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$CP_HERE/../.." && pwd)
TESTENV_DIR=${TESTENV_DIR:-$REPO_ROOT/.testenv}
API_PORT=${API_PORT:-16443}
ETCD_PORT=${ETCD_PORT:-12379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-12380}
KUBECONFIG_FILE=$TESTENV_DIR/admin.kubeconfig
PKI=$TESTENV_DIR/pki
LOGS=$TESTENV_DIR/logs

cp_log() { echo "[control-plane] $*" >&2; }

# pid_alive NAME: the process recorded in NAME.pid is still running.
pid_alive() {
  local f="$TESTENV_DIR/$1.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

# port_busy PORT: something listens on 127.0.0.1:PORT.
port_busy() { ss -Hltn "sport = :$1" | grep -q .; }

# stop_process NAME: stops the process recorded in NAME.pid (TERM, then KILL after 10 s).
stop_process() {
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

# stop_demo_services: stops what scripts/demo.sh left running. The demo webhook's registration goes
# first: with failurePolicy Fail it would block Projection writes once its server is gone.
stop_demo_services() {
  if [ -f "$TESTENV_DIR/projection-webhook.pid" ] && [ -x "$TESTENV_DIR/bin/kubectl" ]; then
    "$TESTENV_DIR/bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=5s delete \
      mutatingwebhookconfiguration,validatingwebhookconfiguration projection-webhook-demo --ignore-not-found >/dev/null 2>&1
  fi
  stop_process projection-webhook
  stop_process projection-controller
}
