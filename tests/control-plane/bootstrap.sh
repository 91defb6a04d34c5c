#!/usr/bin/env bash
# Regenerates go.mod/go.sum for a Kubernetes version. Run by hand when bumping
# K8S_VERSION; CI and build.sh only ever use the committed go.mod and go.sum.
set -euo pipefail
cd "$(dirname "$0")"
source ./versions.env
STAGING="v0.${K8S_VERSION#v1.}"
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
rm -f go.mod go.sum
go mod init projection.sh/tests/control-plane
gomod=$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$gomod"); do
  go mod edit -replace="${m}=${m}@${STAGING}"
done
go mod edit -require="k8s.io/kubernetes@${K8S_VERSION}"
go mod edit -go="$(sed -n 's/^go //p' "$gomod")"
gd=$(sed -n 's/^godebug //p' "$gomod" || true)
if [ -n "$gd" ]; then go mod edit -godebug="$gd"; fi
go mod tidy
grep -c '=> k8s.io' go.mod
