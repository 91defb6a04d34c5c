#!/usr/bin/env bash
# Creates a local CA (once) and issues a fresh webhook serving certificate signed by it.
#
#   certs/generate.sh [OUT_DIR]          # default: certs/out (git-ignored)
#
# Writes OUT_DIR/ca.crt, ca.key (kept and reused on later runs), tls.crt and tls.key (new on every
# run: running it again is a rotation). The serving certificate is valid for 127.0.0.1, localhost and
# the in-cluster Service names of $WEBHOOK_SERVICE in $WEBHOOK_NAMESPACE (defaults:
# projection-webhook, projection-system). Keys are ECDSA P-256. Validity: $CERT_DAYS (default 30)
# days for the serving certificate, 3650 for the CA. New files replace old ones atomically, so a
# running webhook never reads half a pair.
set -euo pipefail
out=${1:-"$(dirname "$0")/out"}
service=${WEBHOOK_SERVICE:-projection-webhook}
namespace=${WEBHOOK_NAMESPACE:-projection-system}
days=${CERT_DAYS:-30}
mkdir -p "$out"
umask 077
work=$(mktemp -d "$out/.gen.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ ! -s "$out/ca.crt" ] || [ ! -s "$out/ca.key" ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$work/ca.key"
  openssl req -x509 -new -key "$work/ca.key" -sha256 -days 3650 -subj "/CN=projection-webhook-local-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$work/ca.crt" 2>/dev/null
  mv "$work/ca.key" "$out/ca.key"
  mv "$work/ca.crt" "$out/ca.crt"
fi

openssl ecparam -name prime256v1 -genkey -noout -out "$work/tls.key"
openssl req -new -key "$work/tls.key" -subj "/CN=$service.$namespace.svc" -out "$work/tls.csr" 2>/dev/null
cat > "$work/ext.cnf" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:$service,DNS:$service.$namespace,DNS:$service.$namespace.svc,DNS:$service.$namespace.svc.cluster.local
EXT
openssl x509 -req -in "$work/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days "$days" -sha256 -extfile "$work/ext.cnf" -out "$work/tls.crt" 2>/dev/null
rm -f "$out/ca.srl"
chmod 644 "$work/tls.crt" "$out/ca.crt"
# Key first: a webhook polling in between sees a mismatched pair, refuses it and keeps the old one.
mv "$work/tls.key" "$out/tls.key"
mv "$work/tls.crt" "$out/tls.crt"
echo "$out"
