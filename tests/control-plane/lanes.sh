#!/usr/bin/env bash
# The extra control planes scripts/test.sh runs its test lanes on, side by side with the first
# (which has the node) and the second (remote.sh): no node on them, a few seconds each to start
# once the binaries are built. Each lane has clusters of its own, because the tests of one binary
# run controllers and webhooks that act on every CR of their cluster and some tests change
# cluster-wide objects (CRDs, webhook configurations).
#
#   name           folder                   apiserver etcd  peer   ShardedListAndWatch
#   lane-b         .testenv-lane-b          18443     14379 14380  off  the controller, plugin and unit tests
#   lane-b-remote  .testenv-lane-b-remote   18543     14479 14480  on   their second cluster (REMOTE_TESTENV_DIR)
#   lane-c         .testenv-lane-c          18643     14579 14580  on   the webhook tests and the 3,000-CR sharding run
#
# `lanes.sh up` starts them (in parallel; a running one is reused), `lanes.sh down` stops them,
# `lanes.sh dir NAME` prints a lane's folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

lanes=(
  "lane-b 18443 14379 14380 -"
  "lane-b-remote 18543 14479 14480 ShardedListAndWatch=true"
  "lane-c 18643 14579 14580 ShardedListAndWatch=true"
)

# in_lane NAME COMMAND...: runs COMMAND with the lane's folder, ports and feature gates.
in_lane() {
  local want=$1 name api etcd peer gates; shift
  for lane in "${lanes[@]}"; do
    read -r name api etcd peer gates <<<"$lane"
    [ "$name" = "$want" ] || continue
    [ "$gates" = - ] && gates=
    TESTENV_DIR=$repo/.testenv-$name API_PORT=$api ETCD_PORT=$etcd ETCD_PEER_PORT=$peer \
      APISERVER_FEATURE_GATES=$gates "$@"
    return
  done
  echo "unknown lane $want" >&2
  return 2
}

case "${1:-}" in
  up)
    pids=()
    for lane in "${lanes[@]}"; do
      read -r name _ <<<"$lane"
      in_lane "$name" "$here/up.sh" >/dev/null &
      pids+=($!)
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    exit "$failed"
    ;;
  down)
    for lane in "${lanes[@]}"; do
      read -r name _ <<<"$lane"
      in_lane "$name" "$here/down.sh"
    done
    ;;
  dir) echo "$repo/.testenv-${2:?lane name}" ;;
  *) echo "usage: $0 up|down|dir NAME" >&2; exit 2 ;;
esac
