#!/usr/bin/env bash
# Starts a real local control plane on 127.0.0.1: etcd, kube-apiserver (TLS, client-certificate
# admin, RBAC, service-account signing) and kube-controller-manager. Builds the binaries first if
# they are not cached. Safe to call twice: a healthy running control plane is reused.
# On success prints `export KUBECONFIG=...` and writes the same into $TESTENV_DIR/env.
set -euo pipefail
source "$(dirname "$0")/common.sh"

bin=$("$CP_HERE/build.sh" | tail -n 1)

api_ready() {
  curl -fsS --max-time 3 --cacert "$PKI/ca.crt" "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1
}

# The admin's certificate is in system:masters, which the apiserver lets nobody impersonate; like
# kubeadm's admin since v1.29 (group kubeadm:cluster-admins), its user is also bound to cluster-admin
# by RBAC, so a controller that writes copies as their author (impersonated without system:masters)
# may write what the admin authored.
bind_admin() {
  "$bin/kubectl" --kubeconfig="$KUBECONFIG_FILE" apply -f - >/dev/null <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: projection-testenv-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: projection-testenv-admin}]
YAML
}

if pid_alive kube-apiserver && pid_alive etcd && pid_alive kube-controller-manager && api_ready \
   && [ "$(readlink "$TESTENV_DIR/bin")" = "$bin" ]; then
  bind_admin
  cp_log "already running (logs in $LOGS)"
  echo "export KUBECONFIG=$KUBECONFIG_FILE"
  exit 0
fi

# Anything half-started from an earlier run goes first.
"$CP_HERE/down.sh" >/dev/null 2>&1 || true
for port in "$API_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT"; do
  if port_busy "$port"; then
    cp_log "port $port on 127.0.0.1 is taken by another process; free it or set API_PORT/ETCD_PORT/ETCD_PEER_PORT"
    exit 1
  fi
done

rm -rf "$TESTENV_DIR/etcd" "$PKI"
mkdir -p "$LOGS" "$PKI" "$TESTENV_DIR/etcd"

# --- PKI: one CA signs the apiserver serving cert and the admin client cert; another the --------
# apiserver's client certificate for webhooks. ---------------------------------------------------
ossl() { openssl "$@" 2>>"$LOGS/pki.log"; }
ossl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=projection-testenv-ca" \
  -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
issue() { # issue NAME SUBJECT EXTENSIONS...
  local name=$1 subject=$2; shift 2
  ossl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$PKI/$name.key" -out "$PKI/$name.csr"
  printf '%s\n' "$@" > "$PKI/$name.ext"
  ossl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -out "$PKI/$name.crt" -extfile "$PKI/$name.ext"
}
issue apiserver "/CN=kube-apiserver" \
  "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:$SERVICE_APISERVER_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
  "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth"
issue admin "/O=system:masters/CN=projection-testenv-admin" \
  "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth"
# The apiserver's client certificate for admission webhooks ("Authenticate apiservers"): issued by
# a CA of its own, so a webhook that trusts it (projection-webhook --client-ca-file
# $PKI/webhook-client-ca.crt) accepts the apiserver and nobody else that holds a certificate of the
# cluster CA.
ossl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=projection-testenv-webhook-client-ca" \
  -keyout "$PKI/webhook-client-ca.key" -out "$PKI/webhook-client-ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
ossl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver-webhook-client" \
  -keyout "$PKI/webhook-client.key" -out "$PKI/webhook-client.csr"
printf '%s\n' "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth" > "$PKI/webhook-client.ext"
ossl x509 -req -in "$PKI/webhook-client.csr" -CA "$PKI/webhook-client-ca.crt" -CAkey "$PKI/webhook-client-ca.key" \
  -CAcreateserial -days 3650 -out "$PKI/webhook-client.crt" -extfile "$PKI/webhook-client.ext"
# The kubeconfig of the admission configuration: the user "*" applies to every webhook the
# apiserver calls (by Service or by URL).
cat > "$PKI/webhook-client.kubeconfig" <<WKCFG
apiVersion: v1
kind: Config
users:
- name: '*'
  user:
    client-certificate: $PKI/webhook-client.crt
    client-key: $PKI/webhook-client.key
WKCFG
cat > "$PKI/admission-config.yaml" <<ACFG
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $PKI/webhook-client.kubeconfig
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $PKI/webhook-client.kubeconfig
ACFG
ossl genrsa -out "$PKI/sa.key" 2048
ossl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"

b64() { base64 -w0 "$1"; }
cat > "$KUBECONFIG_FILE" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: projection-testenv
  cluster:
    server: https://127.0.0.1:${API_PORT}
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(b64 "$PKI/admin.crt")
    client-key-data: $(b64 "$PKI/admin.key")
contexts:
- name: projection-testenv
  context: {cluster: projection-testenv, user: admin}
current-context: projection-testenv
KCFG
chmod 600 "$KUBECONFIG_FILE"

# A component that does not come up stops what started, so the next run begins clean.
wait_for() { wait_until "$@" || { "$CP_HERE/down.sh" >/dev/null 2>&1 || true; exit 1; }; }

# --- etcd ---------------------------------------------------------------------------------------
cp_log "starting etcd on 127.0.0.1:$ETCD_PORT"
start_recorded etcd "$bin/etcd" --name=default --data-dir="$TESTENV_DIR/etcd" --unsafe-no-fsync=true \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="default=http://127.0.0.1:$ETCD_PEER_PORT" --log-level=warn
wait_for 60 etcd "$LOGS/etcd.log" curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" -o /dev/null

# --- kube-apiserver ----------------------------------------------------------------------------
# --advertise-address=127.0.0.1 stops the apiserver from advertising a non-loopback interface, and
# --endpoint-reconciler-type=none stops it from writing a loopback Endpoints (refused by validation).
# --enable-aggregator-routing makes the apiserver call webhook Services at an EndpointSlice address
# rather than the ClusterIP (no kube-proxy here): it reaches webhook pods at their pod IPs on the
# node's bridge. The Service range and the node's addresses are in common.sh (the network rule of
# SPEC §7); the kubelet (node-up.sh) is reached at its node IP for logs and exec, authenticated by
# the admin certificate.
# APISERVER_FEATURE_GATES (e.g. WatchList=false) starts it with those gates, to test the
# controller against a cluster configured so; a running control plane is reused whatever its gates.
gates=()
if [ -n "${APISERVER_FEATURE_GATES:-}" ]; then gates=(--feature-gates="$APISERVER_FEATURE_GATES"); fi
cp_log "starting kube-apiserver on https://127.0.0.1:$API_PORT ${gates[*]}"
start_recorded kube-apiserver "$bin/kube-apiserver" "${gates[@]}" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port="$API_PORT" \
  --advertise-address=127.0.0.1 --endpoint-reconciler-type=none --enable-aggregator-routing=true \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --cert-dir="$TESTENV_DIR/apiserver-certs" \
  --client-ca-file="$PKI/ca.crt" \
  --admission-control-config-file="$PKI/admission-config.yaml" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --kubelet-preferred-address-types=InternalIP \
  --kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key" \
  --authorization-mode=RBAC \
  --allow-privileged=true \
  --profiling=false --v=1
wait_for 180 kube-apiserver "$LOGS/kube-apiserver.log" api_ready

# --- kube-controller-manager -------------------------------------------------------------------
cp_log "starting kube-controller-manager"
start_recorded kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig="$KUBECONFIG_FILE" \
  --authentication-kubeconfig="$KUBECONFIG_FILE" --authorization-kubeconfig="$KUBECONFIG_FILE" \
  --leader-elect=false \
  --bind-address=127.0.0.1 --secure-port=0 \
  --service-account-private-key-file="$PKI/sa.key" \
  --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --controllers='*' --v=1
# The default ServiceAccount proves the controllers run (namespace deletion, GC, aggregation).
wait_for 120 "kube-controller-manager (default ServiceAccount)" "$LOGS/kube-controller-manager.log" \
  "$bin/kubectl" --kubeconfig="$KUBECONFIG_FILE" get serviceaccount default -n default -o name --request-timeout=3s >/dev/null 2>&1

bind_admin
ln -sfn "$bin" "$TESTENV_DIR/bin"
cat > "$TESTENV_DIR/env" <<ENV
export KUBECONFIG=$KUBECONFIG_FILE
export PATH=$bin:\$PATH
ENV
cp_log "ready: $("$bin/kubectl" --kubeconfig="$KUBECONFIG_FILE" version 2>/dev/null | tail -n 1); logs in $LOGS"
echo "export KUBECONFIG=$KUBECONFIG_FILE"
