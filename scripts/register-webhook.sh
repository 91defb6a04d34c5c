#!/usr/bin/env bash
# Registers (or, with --delete, removes) the webhook configurations for a projection-webhook
# listening on this host, from webhook/manifests/local-webhook-configurations.yaml.
#
#   scripts/register-webhook.sh PORT CA_FILE [NAME]
#   scripts/register-webhook.sh --delete [NAME]
#
# NAME defaults to projection-webhook-local. Uses kubectl and KUBECONFIG from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --delete ]; then
  name=${2:-projection-webhook-local}
  kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$name" --ignore-not-found
  exit 0
fi
port=${1:?usage: register-webhook.sh PORT CA_FILE [NAME]}
ca_file=${2:?usage: register-webhook.sh PORT CA_FILE [NAME]}
name=${3:-projection-webhook-local}
ca_bundle=$(base64 -w0 < "$ca_file")
sed -e "s|NAME|$name|; s|URL_BASE|https://127.0.0.1:$port|; s|CA_BUNDLE|$ca_bundle|" \
  webhook/manifests/local-webhook-configurations.yaml | kubectl apply -f -
