#!/usr/bin/env bash
# The side-by-side tables of docs/scale.md in one command: builds (or reuses) the release controller,
# the benchmark harness and the Go operator's manager, then runs each profile against both, one
# after the other on the local control plane (started if needed), and collects every table into one
# Markdown file, whose path it prints last. Each profile is one `bench --peer` run: its own
# figures, ratios and JSON (target/bench/<profile>-<run>.json), as docs/scale.md describes.
#
#   tests/bench/side-by-side.sh                      # every profile (hours on 2 cores)
#   PROFILES="projections-1000 selector-1000" tests/bench/side-by-side.sh
#
# PROFILES: profile names, each optionally with harness flags after a colon and commas
# (`selector-1000:--fan-out,5000`); SAMPLES (20) and IDLE_SECONDS (20) for every run. A profile
# that fails is reported in the file and the others still run; the exit status says whether all
# passed. The control plane's ports and folder follow tests/control-plane (API_PORT, TESTENV_DIR).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/go/bin
PROFILES=${PROFILES:-"projections-100 projections-1000 projections-10000 selector-50 selector-1000 selector-1000:--fan-out,5000 list-10 list-100 crowded mixed"}
SAMPLES=${SAMPLES:-20}
IDLE_SECONDS=${IDLE_SECONDS:-20}
log() { echo "[side-by-side] $*" >&2; }

tests/control-plane/up.sh >/dev/null
peer=$(tests/bench/build-go-peer.sh | tail -1)
log "building the release controller and the harness"
cargo build --release --locked -q -p controller --bin projection-controller -p projection-tests --example bench

mkdir -p target/bench
out=target/bench/side-by-side-$(date -u +%Y%m%dT%H%M%SZ).md
{
  echo "# Side by side: ours and the Go operator, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) cores;" \
    "--samples $SAMPLES --idle-seconds $IDLE_SECONDS; peer $peer."
} > "$out"
failed=0
for entry in $PROFILES; do
  profile=${entry%%:*}
  extra=()
  if [ "$entry" != "$profile" ]; then IFS=',' read -r -a extra <<< "${entry#*:}"; fi
  log "profile $profile ${extra[*]}"
  echo >> "$out"
  if ! target/release/examples/bench --profile "$profile" "${extra[@]}" --samples "$SAMPLES" \
      --idle-seconds "$IDLE_SECONDS" --start-controller target/release/projection-controller \
      --peer "$peer" >> "$out"; then
    echo "**$profile ${extra[*]}: the run failed** (its output above)" >> "$out"
    failed=1
  fi
done
log "tables in $out"
echo "$out"
exit "$failed"
