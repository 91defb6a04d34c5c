#!/usr/bin/env bash
# Checks, and installs where it can, what building and testing need on a fresh machine:
# Debian packages (openssl, curl, iproute2 for ss, ca-certificates, lua5.4; for the local node: containerd,
# runc, containernetworking-plugins, iptables), the Rust toolchain with rustfmt and clippy, and a Go
# toolchain new enough for Kubernetes v1.36 (go 1.26). No service is started or enabled: the node
# scripts run containerd themselves.
set -euo pipefail

log() { echo "[prereqs] $*" >&2; }

missing=()
command -v openssl >/dev/null || missing+=(openssl)
command -v curl >/dev/null || missing+=(curl)
command -v ss >/dev/null || missing+=(iproute2)
command -v git >/dev/null || missing+=(git)
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
command -v nsenter >/dev/null || missing+=(util-linux)
# The Argo CD health script of docs/observability.md runs under Lua in the tests (Argo CD embeds Lua 5.x).
command -v lua5.4 >/dev/null || missing+=(lua5.4)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  log "cargo not found: install Rust with rustup (stable, 1.89 or newer)"; exit 1
fi
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    log "adding the $component component"
    rustup component add "$component"
  fi
done

if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
  export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null; then
  log "go not found: the local control plane is built from Go modules and needs Go 1.26 or newer"; exit 1
fi
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if [ "$go_minor" -lt 26 ]; then
  log "$(go env GOVERSION) is too old: Kubernetes v1.36 needs Go 1.26 or newer"; exit 1
fi
