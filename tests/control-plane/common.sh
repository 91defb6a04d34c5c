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
