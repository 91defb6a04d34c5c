#!/usr/bin/env bash
# Writes a one-layer container image as an OCI image layout in a tar, with no container engine:
# what `ctr images import` reads. The layer holds exactly the given files (like a `FROM scratch`
# image with COPY lines); the config carries the user, entrypoint and exposed ports.
#
#   oci-image.sh OUT.tar REF USER ENTRYPOINT "PORTS" SRC:DEST...
#
# REF is the image name containerd records (e.g. local.test/pause:local), USER as in a Dockerfile's
# USER (e.g. 65532:65532), ENTRYPOINT one absolute path, PORTS space-separated (e.g. "8080 8081",
# or "" for none). The output is reproducible: same inputs, same bytes, same digest.
set -euo pipefail
[ $# -ge 6 ] || { echo "usage: $0 OUT.tar REF USER ENTRYPOINT PORTS SRC:DEST..." >&2; exit 2; }
out=$1 ref=$2 user=$3 entrypoint=$4 ports=$5
shift 5

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs" "$work/layout/blobs/sha256"
for pair in "$@"; do
  src=${pair%%:*} dest=${pair#*:}
  install -D -m 0755 "$src" "$work/rootfs/$dest"
done
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -cf "$work/layer.tar" .

# blob FILE MEDIA-TYPE: stores FILE as a blob and prints its descriptor.
blob() {
  local digest size
  digest=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  cp "$1" "$work/layout/blobs/sha256/$digest"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$digest" "$size"
}

layer=$(blob "$work/layer.tar" application/vnd.oci.image.layer.v1.tar)
layer_digest=$(sha256sum "$work/layer.tar" | cut -d' ' -f1) # uncompressed: the diff_id
exposed=""
for p in $ports; do exposed="$exposed${exposed:+,}\"$p/tcp\":{}"; done
printf '{"architecture":"amd64","os":"linux","config":{"User":"%s","ExposedPorts":{%s},"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":["%s"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$user" "$exposed" "$entrypoint" "$layer_digest" > "$work/config.json"
config=$(blob "$work/config.json" application/vnd.oci.image.config.v1+json)
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
  "$config" "$layer" > "$work/manifest.json"
manifest=$(blob "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)
printf '{"schemaVersion":2,"manifests":[%s]}' \
  "${manifest%\}},\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$ref\",\"org.opencontainers.image.ref.name\":\"${ref##*:}\"}}" \
  > "$work/layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' > "$work/layout/oci-layout"
mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/layout" -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"
