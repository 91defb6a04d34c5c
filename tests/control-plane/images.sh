#!/usr/bin/env bash
# Builds (or reuses) the images the local node runs and imports them into its containerd:
#   local.test/projection-controller:dev, local.test/projection-webhook:dev  (ours)
#   local.test/cert-manager-{controller,cainjector,webhook,startupapicheck}:<version>
#   local.test/pause:local (the pod sandbox)
#   local.test/prometheus:<release>, local.test/prometheus-config-reloader:<version> (the Prometheus
#     that the real prometheus-operator runs in tests/e2e/prometheus_operator.rs)
# No registry is reachable here and no container engine runs: each image is an OCI layout written
# by oci-image.sh, the final stage of Dockerfile.controller / Dockerfile.webhook reproduced (one
# static binary on an empty filesystem, USER, ENTRYPOINT, EXPOSE; tests/e2e/chart.rs keeps the
# table below and the Dockerfiles in agreement).
#
#   images.sh          build what is missing, then import everything into the running node
#   images.sh build    build only (no node needed); prints the folders of the image tars
#
# Our binaries are linked statically against glibc (`-C target-feature=+crt-static`, target
# x86_64-unknown-linux-gnu): the musl target of the Dockerfiles may not be installable here. The
# tars are cached under $CACHE_ROOT, keyed by a hash of everything that goes into them, so an
# unchanged tree is never rebuilt.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$CP_HERE/versions.env"
log() { echo "[images] $*" >&2; }

# Our images: name, user, exposed ports (EXPOSE), entrypoint; the binary has the image's name.
OUR_IMAGES=(
  "projection-controller 65532:65532 8080,8081 /projection-controller"
  "projection-webhook 65532:65532 9443,8080,8081 /projection-webhook"
)

build_ours() {
  local key out
  # The crates' tests/ folders (integration tests, fixtures) are in no image: a change to a test
  # alone keeps the images.
  key=$( (cd "$REPO_ROOT" && rustc -V && cat Cargo.lock Cargo.toml Dockerfile.* &&
    find shared runtime controller webhook -type f -not -path '*/target/*' -not -path '*/tests/*' |
      LC_ALL=C sort | xargs cat &&
    cat "$CP_HERE/images.sh" "$CP_HERE/oci-image.sh") | sha256sum | cut -c1-12)
  out="$CACHE_ROOT/images/projection-$key"
  if [ ! -f "$out/done" ]; then
    local start; start=$(date +%s)
    log "building static release binaries of our services (minutes on 2 cores)"
    # Plain rustc, whatever wrapper the caller lints with (clippy-driver, in .ci/run, is made for
    # linting and may leave some of rustc's optimizations out): the images are built as released.
    (cd "$REPO_ROOT" && unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS &&
      RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked \
      --target x86_64-unknown-linux-gnu --bin projection-controller --bin projection-webhook)
    rm -rf "$out" && mkdir -p "$out"
    local spec name user ports entrypoint binary
    for spec in "${OUR_IMAGES[@]}"; do
      read -r name user ports entrypoint <<< "$spec"
      binary="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/x86_64-unknown-linux-gnu/release/$name"
      ldd "$binary" 2>&1 | grep -Eq 'statically linked|not a dynamic executable' ||
        { log "$binary is not statically linked"; exit 1; }
      "$CP_HERE/oci-image.sh" "$out/$name.tar" "$LOCAL_IMAGE_PREFIX/$name:$OUR_IMAGE_TAG" "$user" \
        "$entrypoint" "${ports//,/ }" "$binary:$entrypoint"
    done
    touch "$out/done"
    log "our images built in $(( $(date +%s) - start ))s"
    # Each change of our sources leaves a folder of about 33 MB: the four newest stay (other
    # worktrees of the same machine may still import theirs).
    ls -dt "$CACHE_ROOT"/images/projection-* | tail -n +5 | xargs -r rm -rf
  fi
  echo "$out"
}

build_cert_manager() {
  local built out c
  built=$("$CP_HERE/build-cert-manager.sh" | tail -n 1)
  out="$built/images"
  if [ ! -f "$out/done" ]; then
    mkdir -p "$out"
    # As upstream's images: a numeric non-root user (the chart sets runAsNonRoot without an id).
    for c in controller cainjector webhook startupapicheck; do
      "$CP_HERE/oci-image.sh" "$out/cert-manager-$c.tar" \
        "$LOCAL_IMAGE_PREFIX/cert-manager-$c:$CERT_MANAGER_VERSION" 1000 "/app/cmd/$c/$c" "" \
        "$built/bin/$c:/app/cmd/$c/$c"
    done
    touch "$out/done"
  fi
  echo "$out"
}

build_pause() {
  local bin out
  bin=$("$CP_HERE/build.sh" | tail -n 1)
  out="$(dirname "$bin")/images"
  if [ ! -f "$out/pause.tar" ]; then
    "$CP_HERE/oci-image.sh" "$out/pause.tar" "$PAUSE_IMAGE" 65535:65535 /pause "" "$bin/pause:/pause"
  fi
  echo "$out"
}

# Prometheus (the server build-monitoring.sh built from the Prometheus Go module; the image is tagged with the
# Prometheus release that module version is, e.g. v0.316.0 is 3.16.0) and prometheus-operator's
# config reloader, laid out as upstream's images are: entrypoints /bin/prometheus and
# /bin/prometheus-config-reloader (the operator gives the reloader that command and Prometheus only
# arguments), user nobody. Keyed by the binaries they hold (their cache folders name version and hash).
# Nothing (no folder printed) until build-monitoring.sh has built them: only the monitoring tests
# run these images, and the demo does not wait for their build.
build_prometheus() {
  local bin key out release
  bin=$("$CP_HERE/build.sh" | tail -n 1)
  if [ ! -x "$bin/prometheus" ] || [ ! -x "$bin/prometheus-config-reloader" ]; then
    return 0
  fi
  key=$( (readlink -f "$bin/prometheus" "$bin/prometheus-config-reloader" && cat "$CP_HERE/oci-image.sh") |
    sha256sum | cut -c1-12)
  out="$CACHE_ROOT/images/prometheus-$key"
  if [ ! -f "$out/done" ]; then
    release=$(prometheus_release)
    rm -rf "$out" && mkdir -p "$out"
    "$CP_HERE/oci-image.sh" "$out/prometheus.tar" "$LOCAL_IMAGE_PREFIX/prometheus:$release" 65534:65534 \
      /bin/prometheus "9090" "$bin/prometheus:/bin/prometheus"
    "$CP_HERE/oci-image.sh" "$out/prometheus-config-reloader.tar" \
      "$LOCAL_IMAGE_PREFIX/prometheus-config-reloader:$PROMETHEUS_OPERATOR_VERSION" 65534:65534 \
      /bin/prometheus-config-reloader "8080" "$bin/prometheus-config-reloader:/bin/prometheus-config-reloader"
    touch "$out/done"
  fi
  echo "$out"
}

# One assignment each: a failed build stops the script here (an array of substitutions would not).
pause_images=$(build_pause)
cert_manager_images=$(build_cert_manager)
our_images=$(build_ours)
prometheus_images=$(build_prometheus)
folders=("$pause_images" "$cert_manager_images" "$our_images")
[ -n "$prometheus_images" ] && folders+=("$prometheus_images")
if [ "${1:-}" = build ]; then
  printf '%s\n' "${folders[@]}"
  exit 0
fi
[ -S "$NODE_DIR/containerd.sock" ] || { log "the node's containerd is not running: start it with tests/control-plane/node-up.sh"; exit 1; }
# An image already in the node under its name with the same manifest (node-down.sh keeps the image
# store, node-up.sh and cert-manager.sh both call this) is not imported again: seconds per image.
present=$(node_ctr images ls 2>/dev/null | awk 'NR > 1 {print $1 " " $3}')
for folder in "${folders[@]}"; do
  for tar in "$folder"/*.tar; do
    wanted=$(tar -xOf "$tar" index.json |
      sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*"io.containerd.image.name":"\([^"]*\)".*/\2 \1/p')
    [ -n "$wanted" ] && grep -qxF "$wanted" <<< "$present" && continue
    node_ctr images import "$tar" >/dev/null ||
      { log "ctr could not import $tar"; exit 1; }
  done
done
log "imported: $(node_ctr images ls -q | grep "^$LOCAL_IMAGE_PREFIX/" | tr '\n' ' ')"
