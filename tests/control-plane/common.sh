# Shared settings of the local control plane scripts (sourced, not run).
# Everything lives in one folder, $TESTENV_DIR (default: <repo>/.testenv):
#   admin.kubeconfig, pki/, logs/, etcd/, *.pid, env, bin -> the cached binaries
# A failure inside a command substitution stops the script too (bash leaves errexit off there).
shopt -s inherit_errexit
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

# pid_alive NAME: the process recorded in NAME.pid still runs and is ours: its command line names
# $TESTENV_DIR (every process these scripts start has a path in it). After a reboot or on a copy of
# the machine the recorded PID may belong to anything else, which must be neither trusted nor killed.
pid_alive() {
  local f="$TESTENV_DIR/$1.pid" pid cmdline
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"$TESTENV_DIR/"* ]]
}

# port_busy PORT: something listens on 127.0.0.1:PORT.
port_busy() { ss -Hltn "sport = :$1" | grep -q .; }

# start_recorded NAME COMMAND...: runs COMMAND in the background, records its PID in NAME.pid and
# logs to $LOGS/NAME.log (stop_process stops it).
start_recorded() {
  local name=$1; shift
  nohup "$@" > "$LOGS/$name.log" 2>&1 &
  echo $! > "$TESTENV_DIR/$name.pid"
}

# wait_until SECONDS DESCRIPTION LOGFILE COMMAND...: polls COMMAND every 0.2 s; after SECONDS prints
# the last lines of LOGFILE and fails.
wait_until() {
  local secs=$1 what=$2 logf=$3; shift 3
  for _ in $(seq "$((secs * 5))"); do
    if "$@"; then return 0; fi
    sleep 0.2
  done
  echo "$what not ready after ${secs}s; last lines of $logf:" >&2
  tail -n 30 "$logf" >&2
  return 1
}

# stop_process NAME: stops the process recorded in NAME.pid (TERM, then KILL after 10 s).
stop_process() {
  local name=$1 f="$TESTENV_DIR/$1.pid" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_alive "$name"; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
    cp_log "stopped $name (pid $pid)"
  fi
  rm -f "$f"
}

# stop_demo_services: stops what scripts/demo.sh left running (its Helm release; host processes of
# earlier versions of the demo). The demo webhook's registration goes first: with failurePolicy
# Fail it would block Projection writes once its server is gone.
stop_demo_services() {
  if [ -x "$TESTENV_DIR/bin/helm" ] && [ -f "$KUBECONFIG_FILE" ] && pid_alive kube-apiserver; then
    HELM_CACHE_HOME="$TESTENV_DIR/helm/cache" HELM_CONFIG_HOME="$TESTENV_DIR/helm/config" \
      HELM_DATA_HOME="$TESTENV_DIR/helm/data" "$TESTENV_DIR/bin/helm" --kubeconfig "$KUBECONFIG_FILE" \
      uninstall projection -n projection-system --wait --ignore-not-found >/dev/null 2>&1 || true
  fi
  if [ -f "$TESTENV_DIR/projection-webhook.pid" ] && [ -x "$TESTENV_DIR/bin/kubectl" ]; then
    "$TESTENV_DIR/bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=5s delete \
      mutatingwebhookconfiguration,validatingwebhookconfiguration projection-webhook-demo --ignore-not-found >/dev/null 2>&1
  fi
  stop_process projection-webhook
  stop_process projection-controller
}

# --- The node (node-up.sh, node-down.sh) and its network, by the rule of SPEC §7: every address
# stays on this machine, in 198.18.0.0/15 (neither public nor 10/8, 172.16/12, 192.168/16), and
# nothing is routed off it. One node per machine: the kubelet keeps a few fixed host paths.
NODE_DIR=$TESTENV_DIR/node
# containerd's root (image content, unpacked snapshots, image records), outside the node's folder:
# node-down.sh keeps it when it deleted every container (it then writes `clean` in it), so the next
# node starts with the images already unpacked; anything else starts empty.
NODE_IMAGE_STORE=$TESTENV_DIR/node-image-store
NODE_NAME=projection-node
# The node IP, on a port-less bridge of our own (this kernel has no `dummy` link type).
NODE_IP=198.19.255.1
NODE_LINK=prjnode0
# Pods: one bridge, no default route, no masquerade.
POD_CIDR=198.18.0.0/16
POD_GATEWAY=198.18.0.1
POD_BRIDGE=prjbr0
# The whole range: pods' only route, and a blackhole for host traffic to unused addresses in it.
NODE_RANGE=198.18.0.0/15
# Services (kube-apiserver --service-cluster-ip-range), not containing the node IP; the first
# address is the `kubernetes` Service, DNAT'd to the apiserver on 127.0.0.1 for pods.
SERVICE_CIDR=198.19.0.0/17
SERVICE_APISERVER_IP=198.19.0.1
# Comment on every iptables rule of ours, so cleanup finds exactly them.
NODE_RULE_TAG=projection-node
# Images built here and imported into the node (no registry is reachable; pull policy Never).
LOCAL_IMAGE_PREFIX=local.test
PAUSE_IMAGE=$LOCAL_IMAGE_PREFIX/pause:local
OUR_IMAGE_TAG=dev
# The one build of our services outside the tests (images.sh without PROJECTION_IMAGE_BINARIES, the
# demo): the same packages each time, so the same features and nothing compiled twice; the kubectl
# plugin comes with it.
OUR_SERVICES_BUILD=(cargo build --locked --bin projection-controller --bin projection-webhook --bin kubectl-projection)
# Our crates with line tables only in the scripts' debug builds (the demo's, the test command's,
# CI's), as the dependencies always are (Cargo.toml): backtraces keep file and line, and the
# compile and the links of the big binaries are shorter; a build by hand keeps the full debug info.
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
export CARGO_PROFILE_TEST_DEBUG=${CARGO_PROFILE_TEST_DEBUG:-line-tables-only}
CACHE_ROOT=${PROJECTION_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projection-testenv}

# node_owner: the test environment whose node holds this machine (named on the pod bridge), if any;
# nothing, and success, when there is no bridge (callers run with errexit and pipefail).
node_owner() { { ip -o link show "$POD_BRIDGE" 2>/dev/null || true; } | sed -n 's/.* alias \(.*\)$/\1/p'; }

# ctr against the node's containerd, in the CRI's namespace.
node_ctr() { ctr --address "$NODE_DIR/containerd.sock" -n k8s.io "$@"; }

# prometheus_release: the Prometheus release of the module version PROMETHEUS_VERSION (versions.env):
# its v0.3xx.y module versions are the 3.xx.y releases (v0.316.0 is 3.16.0), as its VERSION file says.
prometheus_release() {
  local minor=${PROMETHEUS_VERSION#v0.3} patch
  patch=${minor#*.}; minor=${minor%%.*}
  echo "v3.$((10#$minor)).$patch"
}
