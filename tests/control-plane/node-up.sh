#!/usr/bin/env bash
# Starts a real node for the local control plane (starting the control plane first if needed):
# Debian's containerd and runc, a CNI bridge, kube-scheduler and a kubelet built from the same
# Kubernetes module, and the images of images.sh imported. Safe to call twice: a Ready node is
# reused. Needs root (network links, iptables, mounts, cgroups). node-down.sh (also run by
# down.sh) undoes everything it does.
#
# Network (SPEC §7): every address stays on this machine; a ValidatingAdmissionPolicy refuses pods
# of images not built here, so nothing is ever pulled. The node IP is on a port-less bridge of
# ours; pods sit on another bridge with one route (the 198.18.0.0/15 range, no default route, no
# masquerade) and a resolv.conf naming the node IP, where nothing listens; an iptables rule drops
# anything from the pods that would leave by another interface; a blackhole route keeps host
# traffic to unused addresses of the range local. Pods reach the apiserver (bound to 127.0.0.1)
# through the `kubernetes` Service IP, DNAT'd to 127.0.0.1:$API_PORT on the pod bridge.
set -euo pipefail
source "$(dirname "$0")/common.sh"
log() { echo "[node] $*" >&2; }
fail() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "the node needs root (network links, iptables, mounts, cgroups); run as root"
for tool in containerd containerd-shim-runc-v2 runc ctr iptables ip6tables ip nsenter mount; do
  command -v "$tool" >/dev/null || fail "$tool is missing: run scripts/prereqs.sh (Debian containerd, runc, containernetworking-plugins, iptables)"
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] ||
  fail "the CNI plugins are missing in /usr/lib/cni: run scripts/prereqs.sh (containernetworking-plugins)"

eval "$("$CP_HERE/up.sh")"
bin=$(readlink "$TESTENV_DIR/bin")
kubectl() { "$bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=10s "$@"; }

node_ready() {
  [ "$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
if pid_alive containerd && pid_alive kubelet && pid_alive kube-scheduler && node_ready; then
  log "already running: node $NODE_NAME Ready"
  "$CP_HERE/images.sh"
  exit 0
fi

# One node per machine (the kubelet keeps fixed host paths such as /var/lib/kubelet/device-plugins):
# the pod bridge names the test environment that owns it. A node whose processes all died with a
# run that was killed (a reboot, a stopped machine) is left over, not running: it is cleaned up
# with its own records; a running one is never touched.
owner=$(node_owner)
if [ -n "$owner" ] && [ "$owner" != "$TESTENV_DIR" ]; then
  if (TESTENV_DIR=$owner; pid_alive containerd || pid_alive kubelet || pid_alive kube-scheduler); then
    fail "another local node runs on $POD_BRIDGE (test environment $owner); stop it with its node-down.sh first"
  fi
  log "a node of $owner was left over by a run that was killed (none of its processes runs): cleaning it up"
  TESTENV_DIR=$owner "$CP_HERE/node-down.sh" || fail "could not clean up the left-over node of $owner"
  [ -z "$(node_owner)" ] || fail "the left-over node of $owner still holds $POD_BRIDGE after its cleanup"
fi
# Anything half-started from an earlier run goes first.
"$CP_HERE/node-down.sh" >/dev/null 2>&1 || true
mkdir -p "$NODE_DIR" "$LOGS"

# --- What the kubelet and containerd change outside their folders, recorded for node-down.sh. ---
# Sysctls the kubelet sets (protectKernelDefaults is false) and host paths that exist before.
for s in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do
  echo "$s=$(sysctl -n "$s")"
done > "$NODE_DIR/sysctls.before"
for p in /var/lib/kubelet /var/log/containers /var/log/pods /var/lib/cni /run/containerd /opt/containerd; do
  [ -e "$p" ] && echo "$p"
done > "$NODE_DIR/paths.before" || true
for table in filter nat mangle; do
  for cmd in iptables ip6tables; do
    "$cmd" -t "$table" -S 2>/dev/null | sed -n "s/^-N \(KUBE-.*\)/$cmd $table \1/p"
  done
done > "$NODE_DIR/chains.before"

# --- Network ---------------------------------------------------------------------------------
log "network: node IP $NODE_IP on $NODE_LINK, pods $POD_CIDR on $POD_BRIDGE, services $SERVICE_CIDR"
ip link add "$NODE_LINK" type bridge
ip addr add "$NODE_IP/32" dev "$NODE_LINK"
ip link set "$NODE_LINK" up
ip link add "$POD_BRIDGE" type bridge
ip link set "$POD_BRIDGE" alias "$TESTENV_DIR"
ip addr add "$POD_GATEWAY/${POD_CIDR#*/}" dev "$POD_BRIDGE"
ip link set "$POD_BRIDGE" up
ip route add blackhole "$NODE_RANGE"
sysctl -qw "net.ipv4.conf.$POD_BRIDGE.route_localnet=1" # for the DNAT to 127.0.0.1; goes with the bridge
iptables -I FORWARD 1 -s "$POD_CIDR" ! -o "$POD_BRIDGE" -m comment --comment "$NODE_RULE_TAG-guard" -j DROP
iptables -t nat -A PREROUTING -s "$POD_CIDR" -d "$SERVICE_APISERVER_IP/32" -p tcp --dport 443 \
  -m comment --comment "$NODE_RULE_TAG-apiserver" -j DNAT --to-destination "127.0.0.1:$API_PORT"

mkdir -p "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/ipam"
cat > "$NODE_DIR/cni/net.d/10-projection-node.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "projection-node",
  "plugins": [{
    "type": "bridge", "bridge": "$POD_BRIDGE",
    "isGateway": false, "isDefaultGateway": false, "ipMasq": false, "hairpinMode": true,
    "ipam": {
      "type": "host-local", "dataDir": "$NODE_DIR/cni/ipam",
      "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
      "routes": [{"dst": "$NODE_RANGE"}]
    }
  }]
}
JSON
# Never empty: containerd would then copy the host's resolver (a private address) into pods.
echo "nameserver $NODE_IP" > "$NODE_DIR/resolv.conf"

# --- containerd ------------------------------------------------------------------------------
# The image store of the last node is reused only if node-down.sh left it clean; it is not clean
# again until the next node-down.sh says so.
[ -f "$NODE_IMAGE_STORE/clean" ] || rm -rf "$NODE_IMAGE_STORE"
rm -f "$NODE_IMAGE_STORE/clean"
mkdir -p "$NODE_IMAGE_STORE"
cat > "$NODE_DIR/containerd.toml" <<TOML
version = 2
root = "$NODE_IMAGE_STORE"
state = "$NODE_DIR/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$NODE_DIR/containerd.sock"
[ttrpc]
  address = "$NODE_DIR/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This VM lacks CAP_SYS_RESOURCE: without it every sandbox fails ("can't get final child's PID").
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$NODE_DIR/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni/net.d"
    max_conf_num = 1
TOML

# What does not come up is left for node-down.sh (run by the next node-up.sh or by down.sh).
wait_for() { wait_until "$@" || exit 1; }

log "starting containerd ($(containerd --version | cut -d' ' -f3))"
start_recorded containerd containerd --config "$NODE_DIR/containerd.toml"
wait_for 30 containerd "$LOGS/containerd.log" eval "node_ctr version >/dev/null 2>&1"
"$CP_HERE/images.sh"

# --- Nothing is ever pulled --------------------------------------------------------------------
# A pod naming any other image (a test mirroring a Deployment of "nginx", say) would make containerd
# try a registry off this machine: the apiserver refuses such pods before they are scheduled.
kubectl apply -f - >/dev/null <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: $NODE_RULE_TAG-local-images}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - {apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pods]}
  validations:
    - expression: >-
        object.spec.containers.all(c, c.image.startsWith('$LOCAL_IMAGE_PREFIX/')) &&
        (!has(object.spec.initContainers) || object.spec.initContainers.all(c, c.image.startsWith('$LOCAL_IMAGE_PREFIX/')))
      message: "the local node runs only images built here ($LOCAL_IMAGE_PREFIX/...): nothing can be pulled"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: $NODE_RULE_TAG-local-images}
spec:
  policyName: $NODE_RULE_TAG-local-images
  validationActions: [Deny]
YAML
policy_in_force() { # (kubectl fails on the refusal: its message is checked, not its status)
  local answer
  answer=$(kubectl run image-policy-probe --image=not-built-here --restart=Never -n default --dry-run=server 2>&1 || true)
  grep -q "nothing can be pulled" <<< "$answer"
}
wait_for 30 "the local-images policy" "$LOGS/kube-apiserver.log" policy_in_force

# --- kube-scheduler and kubelet ----------------------------------------------------------------
log "starting kube-scheduler"
start_recorded kube-scheduler "$bin/kube-scheduler" --kubeconfig="$KUBECONFIG_FILE" \
  --authentication-kubeconfig="$KUBECONFIG_FILE" --authorization-kubeconfig="$KUBECONFIG_FILE" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259 --v=1

cat > "$NODE_DIR/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This VM runs cgroup v1, which the kubelet refuses unless told otherwise; PID 1 is not systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$NODE_DIR/containerd.sock
imageServiceEndpoint: unix://$NODE_DIR/containerd.sock
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
resolvConf: $NODE_DIR/resolv.conf
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
podLogsDir: $NODE_DIR/pod-logs
# Mounted Secrets follow their object within seconds (a renewed certificate reaches the pod).
syncFrequency: 5s
# Images cannot be pulled again here: never garbage-collect them.
imageGCHighThresholdPercent: 100
# Evict only when the machine is truly out of room, in absolute terms: this disk may be a share of a
# pool whose free space is a small fraction of its size; 1% of it (2.5 GB of 252 GB) can be crossed
# while the tests build, and DiskPressure would evict cert-manager and taint the node for the rest.
evictionHard: {memory.available: "100Mi", nodefs.available: "256Mi", nodefs.inodesFree: "5000", imagefs.available: "256Mi"}
serializeImagePulls: false
YAML
log "starting kubelet (node $NODE_NAME at $NODE_IP)"
start_recorded kubelet "$bin/kubelet" --config="$NODE_DIR/kubelet.yaml" --kubeconfig="$KUBECONFIG_FILE" \
  --root-dir="$NODE_DIR/kubelet" --cert-dir="$NODE_DIR/kubelet-pki" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1
wait_for 60 "node $NODE_NAME" "$LOGS/kubelet.log" node_ready
log "node $NODE_NAME Ready; logs in $LOGS (containerd, kubelet, kube-scheduler)"
