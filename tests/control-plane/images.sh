#!/usr/bin/env bash
# Builds (or reuses) the images the local node runs and imports them into its containerd:
#   local.test/projection-controller:dev, local.test/projection-webhook:dev  (ours)
#   local.test/cert-manager-{controller,cainjector,webhook,startupapicheck}:<version> (once
#     build-cert-manager.sh has built cert-manager)
#   local.test/pause:local (the pod sandbox)
#   local.test/prometheus:<release>, local.test/prometheus-config-reloader:<version> (the Prometheus
#     that the real prometheus-operator runs in tests/e2e/prometheus_operator.rs)
# No registry is reachable here and no container engine runs: each image is an OCI layout written
# by oci-image.sh, the final stage of Dockerfile.controller / Dockerfile.webhook reproduced (the
# binary on an otherwise empty filesystem, USER, ENTRYPOINT, EXPOSE; tests/e2e/chart.rs keeps the
# table below and the Dockerfiles in agreement).
#
#   images.sh          build what is missing, then import everything into the running node
#   images.sh build    build only (no node needed); prints the folders of the image tars
#
# Our images hold the binaries cargo already builds here, not a release build of their own: the
# debug builds the tests run as processes (dependencies at opt-level 1, profile.dev in Cargo.toml),
# their debug info stripped, dynamically linked against this machine's glibc, whose loader and
# libraries (what `ldd` lists) the image carries beside them. A static release build of every
# dependency cost 10 to 15 minutes of the 2 cores on a new machine, and 3 to 5 more after each change
# of our sources. The published images are the Dockerfiles' (static musl release binaries on
# scratch), built where a container engine runs, not here. Which build:
#   PROJECTION_IMAGE_BINARIES=tests  the binaries `cargo test --workspace --no-run` builds (.ci/run
#                                    and scripts/test.sh: that compile makes them anyway)
#   (unset)                          `cargo build` of the two services and the kubectl plugin (the
#                                    demo: one build for its images and its plugin)
#   PROJECTION_IMAGE_PROFILE=release the same in release (benchmarks of pods at scale, docs/scale.md)
# The tars are cached under $CACHE_ROOT, keyed by a hash of what goes into them, so unchanged
# binaries are never packed again.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$CP_HERE/versions.env"
log() { echo "[images] $*" >&2; }

# Our images: name, user, exposed ports (EXPOSE), entrypoint; the binary has the image's name.
OUR_IMAGES=(
  "projection-controller 65532:65532 8080,8081 /projection-controller"
  "projection-webhook 65532:65532 9443,8080,8081 /projection-webhook"
)

# our_binaries: builds (or finds fresh) the services' binaries and prints their paths, the
# controller's then the webhook's.
our_binaries() {
  local build=("${OUR_SERVICES_BUILD[@]}")
  if [ "${PROJECTION_IMAGE_BINARIES:-}" = tests ]; then
    build=(cargo test --workspace --locked --no-run)
  elif [ "${PROJECTION_IMAGE_PROFILE:-dev}" = release ]; then
    build+=(--release)
  fi
  log "building our services (${build[*]}; fresh unless the sources changed)"
  (cd "$REPO_ROOT" && "${build[@]}" --message-format=json-render-diagnostics) | python3 -c '
import json, sys
found = {}
for line in sys.stdin:
    if line.startswith("{"):
        m = json.loads(line)
        if m.get("reason") == "compiler-artifact" and "bin" in m["target"]["kind"] and not m["profile"]["test"]:
            found[m["target"]["name"]] = m["executable"]
for name in ("projection-controller", "projection-webhook"):
    if name not in found:
        sys.exit("the build made no binary " + name)
    print(found[name])
'
}

# image_libraries BINARY: the dynamic loader and shared libraries BINARY needs, resolved (the image
# has no ld.so.cache: the loader finds them in its default folders, where they are put).
image_libraries() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
}

build_ours() {
  local binaries key out spec name user ports entrypoint binary files lib
  mapfile -t binaries < <(our_binaries)
  [ "${#binaries[@]}" = 2 ] || { log "could not build our services"; exit 1; }
  # Not local: the trap runs when the subshell of the command substitution that calls build_ours
  # exits, after the function returned.
  staged=$(mktemp -d)
  trap 'rm -rf "$staged"' EXIT
  # Debug info is most of a debug binary's size; function names stay for backtraces.
  for binary in "${binaries[@]}"; do
    objcopy --strip-debug "$binary" "$staged/$(basename "$binary")"
  done
  key=$( (cd "$staged" && sha256sum ./* &&
    for binary in "${binaries[@]}"; do image_libraries "$binary"; done | sort -u | xargs sha256sum &&
    cat "$CP_HERE/images.sh" "$CP_HERE/oci-image.sh") | sha256sum | cut -c1-12)
  out="$CACHE_ROOT/images/projection-$key"
  if [ ! -f "$out/done" ]; then
    rm -rf "$out" && mkdir -p "$out"
    for spec in "${OUR_IMAGES[@]}"; do
      read -r name user ports entrypoint <<< "$spec"
      files=("$staged/$name:$entrypoint")
      while read -r lib; do
        # The loader by the path the binary names, every library where the loader looks for it.
        files+=("$(readlink -f "$lib"):$lib")
      done < <(image_libraries "$staged/$name")
      "$CP_HERE/oci-image.sh" "$out/$name.tar" "$LOCAL_IMAGE_PREFIX/$name:$OUR_IMAGE_TAG" "$user" \
        "$entrypoint" "${ports//,/ }" "${files[@]}"
    done
    touch "$out/done"
    log "our images packed in $out"
    # Each change of our sources leaves a folder of tens of MB: the four newest stay (other
    # worktrees of the same machine may still import theirs).
    ls -dt "$CACHE_ROOT"/images/projection-* | tail -n +5 | xargs -r rm -rf
  fi
  echo "$out"
}
# cert-manager's images, once build-cert-manager.sh has built its binaries (cert-manager.sh runs it
# first): nothing before, so a node without cert-manager (the demo) never waits for that build.
build_cert_manager() {
  local built out c
  built=$("$CP_HERE/build-cert-manager.sh" --if-built)
  [ -n "$built" ] || return 0
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
folders=("$pause_images" "$our_images")
[ -n "$cert_manager_images" ] && folders+=("$cert_manager_images")
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
