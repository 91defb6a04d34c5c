#!/usr/bin/env bash
# Stops the local node of node-up.sh and undoes everything it and the kubelet did: containers,
# mounts, network namespaces, the two bridges, the blackhole route, our iptables rules and the
# kubelet's chains, the sysctls the kubelet changed, the kubepods cgroups, the host paths that were
# not there before, and the node's folder. Stops only the processes it recorded (and the shims of
# its own containerd). Safe to call twice and when no node runs; the control plane keeps running
# (down.sh stops both). Logs stay in $TESTENV_DIR/logs.
set -uo pipefail
source "$(dirname "$0")/common.sh"
log() { echo "[node] $*" >&2; }

owner=$(node_owner)
if [ -n "$owner" ] && [ "$owner" != "$TESTENV_DIR" ]; then
  log "the node on this machine belongs to $owner, not to $TESTENV_DIR: left alone"
  exit 0
fi
if [ ! -d "$NODE_DIR" ] && [ -z "$owner" ]; then
  exit 0
fi
[ "$(id -u)" = 0 ] || { log "stopping the node needs root"; exit 1; }

# The Node object and the image policy go first, while the apiserver runs, so no later control
# plane sees a stale node.
if [ -x "$TESTENV_DIR/bin/kubectl" ] && pid_alive kube-apiserver; then
  "$TESTENV_DIR/bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=5s \
    delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1
  "$TESTENV_DIR/bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=5s delete \
    validatingadmissionpolicybinding,validatingadmissionpolicy "$NODE_RULE_TAG-local-images" --ignore-not-found >/dev/null 2>&1
fi
stop_process kubelet
stop_process kube-scheduler

# Containers: killed through containerd, then the shims of this containerd (found by its socket).
if pid_alive containerd; then
  for task in $(node_ctr tasks ls -q 2>/dev/null); do
    node_ctr tasks kill -s SIGKILL "$task" >/dev/null 2>&1
  done
  for _ in $(seq 50); do [ -z "$(node_ctr tasks ls -q 2>/dev/null)" ] && break; sleep 0.2; done
  for task in $(node_ctr tasks ls -q 2>/dev/null); do node_ctr tasks delete -f "$task" >/dev/null 2>&1; done
  for c in $(node_ctr containers ls -q 2>/dev/null); do node_ctr containers delete "$c" >/dev/null 2>&1; done
  # No container left: the image store may serve the next node (see NODE_IMAGE_STORE).
  node_ctr version >/dev/null 2>&1 && [ -z "$(node_ctr containers ls -q 2>/dev/null)" ] && store_clean=1
fi
stop_process containerd
for pid in $(pgrep -f -- "-address $NODE_DIR/containerd.sock" 2>/dev/null); do
  kill -KILL "$pid" 2>/dev/null && log "stopped a shim of the node's containerd (pid $pid)"
done

# Mounts under the node's folder and the image store (container root filesystems, volumes, network
# namespaces, the kubelet's bind mount of its root), deepest first.
for _ in 1 2 3; do
  mounts=$(awk -v d="$NODE_DIR/" -v s="$NODE_IMAGE_STORE/" \
    'index($5, d) == 1 || $5 == substr(d, 1, length(d) - 1) || index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  [ -z "$mounts" ] && break
  for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
done

# Network: pod links left on the bridge, the bridges, the route, our rules (each tagged).
for link in $(ip -o link show master "$POD_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
  ip link del "$link" 2>/dev/null
done
ip link del "$POD_BRIDGE" 2>/dev/null
ip link del "$NODE_LINK" 2>/dev/null
ip route del blackhole "$NODE_RANGE" 2>/dev/null
for table in filter nat; do
  iptables -t "$table" -S 2>/dev/null | grep -- "--comment $NODE_RULE_TAG-" | sed 's/^-A /-D /' |
    while read -r rule; do eval "iptables -t $table $rule"; done
done

# The kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...) that were not there before. Without
# the record (a node folder deleted by hand) nothing proves a chain is ours: they stay.
chains_before=$(cat "$NODE_DIR/chains.before" 2>/dev/null)
[ -f "$NODE_DIR/chains.before" ] && for cmd in iptables ip6tables; do
  for table in filter nat mangle; do
    for chain in $("$cmd" -t "$table" -S 2>/dev/null | sed -n 's/^-N \(KUBE-.*\)/\1/p'); do
      grep -qx "$cmd $table $chain" <<< "$chains_before" && continue
      "$cmd" -t "$table" -S 2>/dev/null | grep -- "-j $chain\$" | sed 's/^-A /-D /' |
        while read -r rule; do eval "$cmd -t $table $rule"; done
      "$cmd" -t "$table" -F "$chain" 2>/dev/null
    done
    for chain in $("$cmd" -t "$table" -S 2>/dev/null | sed -n 's/^-N \(KUBE-.*\)/\1/p'); do
      grep -qx "$cmd $table $chain" <<< "$chains_before" || "$cmd" -t "$table" -X "$chain" 2>/dev/null
    done
  done
done

# Sysctls as they were before the kubelet started.
if [ -f "$NODE_DIR/sysctls.before" ]; then
  while IFS='=' read -r key value; do
    [ "$(sysctl -n "$key" 2>/dev/null)" = "$value" ] || sysctl -qw "$key=$value"
  done < "$NODE_DIR/sysctls.before"
fi

# The kubelet's cgroups (cgroupfs driver: kubepods in every v1 hierarchy), deepest first.
for hierarchy in /sys/fs/cgroup/*/; do
  [ -d "$hierarchy/kubepods" ] && find "$hierarchy/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null
done
[ -d /sys/fs/cgroup/kubepods ] && find /sys/fs/cgroup/kubepods -depth -type d -exec rmdir {} + 2>/dev/null

# Host paths the kubelet, libcni and the shims create on their own, unless they existed before (and
# only with the record of what existed).
[ -f "$NODE_DIR/paths.before" ] && for p in /var/lib/kubelet /var/log/containers /var/log/pods /var/lib/cni /run/containerd /opt/containerd; do
  grep -qx "$p" "$NODE_DIR/paths.before" 2>/dev/null || rm -rf "$p"
done

rm -rf "$NODE_DIR"
if [ "${store_clean:-0}" = 1 ] && [ -d "$NODE_IMAGE_STORE" ]; then
  touch "$NODE_IMAGE_STORE/clean"
  log "node stopped and cleaned up (its images kept in $NODE_IMAGE_STORE)"
else
  rm -rf "$NODE_IMAGE_STORE"
  log "node stopped and cleaned up"
fi
exit 0
