#!/usr/bin/env bash
# Prints, in a few dozen lines, the state of the local control plane and node that a failed run
# needs explained: the node's conditions and taints, every pod that is not running and ready (with
# its containers' states), the latest Warning events, and the kubelet's latest errors. .ci/run calls
# it when a step fails, before everything is stopped. Reads only; never fails.
set -uo pipefail
source "$(dirname "$0")/common.sh"
[ -x "$TESTENV_DIR/bin/kubectl" ] && pid_alive kube-apiserver || { echo "[diagnose] no control plane running"; exit 0; }
k() { "$TESTENV_DIR/bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=10s "$@" 2>&1; }
echo "[diagnose] $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg), $(free -m | awk '/Mem/{print $7}') MiB available, disk $(df -h "$TESTENV_DIR" | awk 'NR==2{print $4}') free"
echo "[diagnose] nodes:"
k get nodes -o jsonpath='{range .items[*]}  {.metadata.name}: {range .status.conditions[*]}{.type}={.status}({.reason}, since {.lastTransitionTime}) {end}taints={.spec.taints}{"\n"}{end}'
echo "[diagnose] pods not running and ready:"
k get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} phase={.status.phase} node={.spec.nodeName} created={.metadata.creationTimestamp} deleting={.metadata.deletionTimestamp} {range .status.containerStatuses[*]}[{.name} ready={.ready} restarts={.restartCount} state={.state} last={.lastState.terminated.reason}]{end}{"\n"}{end}' |
  grep -v ' phase=Running .*ready=true' | grep -v ' phase=Succeeded ' | head -n 20 | sed 's/^/  /'
echo "[diagnose] latest Warning events:"
k get events -A --field-selector type=Warning --sort-by=.metadata.creationTimestamp -o custom-columns='AT:.metadata.creationTimestamp,NS:.metadata.namespace,OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message' |
  tail -n 15 | cut -c1-220 | sed 's/^/  /'
if [ -f "$LOGS/kubelet.log" ]; then
  echo "[diagnose] the kubelet's latest errors ($LOGS/kubelet.log):"
  grep '^E' "$LOGS/kubelet.log" | tail -n 10 | cut -c1-220 | sed 's/^/  /'
fi
exit 0
