//! The self-managed certificate mode against the real control plane: two webhook processes share
//! one Secret, set the caBundle of webhook configurations the test creates with none, and the
//! apiserver then trusts them (a bad Projection is denied through `kubectl apply`).
//!
//! The configurations are registered by URL (`https://127.0.0.1:<port>`; the certificate carries
//! 127.0.0.1 through `--extra-san`), cover `projections` only, in the test's namespace only
//! (namespaceSelector), and are deleted when the test ends, also on panic.

use k8s_openapi::api::{
    admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
    core::v1::Secret,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use projection_tests::{
    ClusterScopedGuard, ServiceProcess, TestNamespace, client, client_from, exclusive, free_port, http_get,
    install_crds, kubeconfig_path, kubectl, kubectl_stdin, metric_value, patch_webhook_configuration,
    service_account_kubeconfig, wait_for,
};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use std::{
    path::Path,
    process::Output,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const SECRET: &str = "projection-webhook-tls";
const SERVICE: &str = "projection-webhook";
const MANAGED_BY: (&str, &str) = ("projection.sh/managed-by", "projection-webhook");

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_projection-webhook"))
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// One test's namespace, webhook configurations and webhook processes. Fields drop in order: the
/// configurations go first, then the processes, then the namespace.
struct Fixture {
    _configurations: [ClusterScopedGuard; 2],
    replicas: Vec<Replica>,
    ns: TestNamespace,
    client: Client,
    validating: String,
    mutating: String,
}

struct Replica {
    process: ServiceProcess,
    port: u16,
}

impl Fixture {
    /// A namespace, and a Validating- and a MutatingWebhookConfiguration with one entry per
    /// replica (`ports`), by URL and without caBundle. The replicas are not started yet.
    async fn new(prefix: &str, replicas: usize) -> (Self, Vec<u16>) {
        let client = client().await;
        install_crds(&client).await;
        let ns = TestNamespace::create(&client, prefix).await;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("selfcert-{}-{n}", std::process::id());
        let (validating, mutating) = (format!("{name}-validating"), format!("{name}-mutating"));
        let configurations = [
            ClusterScopedGuard::new("validatingwebhookconfigurations", &validating),
            ClusterScopedGuard::new("mutatingwebhookconfigurations", &mutating),
        ];
        let ports: Vec<u16> = (0..replicas).map(|_| free_port()).collect();
        let entries = |path: &str| -> Vec<Value> {
            ports
                .iter()
                .enumerate()
                .map(|(i, port)| {
                    json!({
                        "name": format!("{path}-{i}.self-managed.projection.sh"),
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "timeoutSeconds": 5,
                        "clientConfig": {"url": format!("https://127.0.0.1:{port}/{path}")},
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name()}},
                        "rules": [{
                            "apiGroups": ["projection.sh"], "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"], "resources": ["projections"],
                            "scope": "Namespaced"
                        }]
                    })
                })
                .collect()
        };
        let labels = json!({"app.kubernetes.io/name": "projection-webhook-test"});
        let v: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": validating, "labels": labels},
            "webhooks": entries("validate"),
        }))
        .expect("validating configuration");
        let m: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": mutating, "labels": labels},
            "webhooks": entries("mutate"),
        }))
        .expect("mutating configuration");
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &v)
            .await
            .expect("create validating configuration");
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &m)
            .await
            .expect("create mutating configuration");
        let fixture = Self {
            _configurations: configurations,
            replicas: Vec::new(),
            ns,
            client,
            validating,
            mutating,
        };
        (fixture, ports)
    }

    /// Starts a replica in self-managed mode on `port` (not waiting for it to be ready).
    fn start(&mut self, port: u16, extra: &[&str]) {
        self.start_as(port, extra, &kubeconfig_path());
    }

    /// Like [`Self::start`], with the identity of `kubeconfig`.
    fn start_as(&mut self, port: u16, extra: &[&str], kubeconfig: &Path) {
        let bind = format!("127.0.0.1:{port}");
        let mut args = vec![
            "--bind-address",
            &bind,
            "--self-managed-certificate-secret",
            SECRET,
            "--namespace",
            self.ns.name(),
            "--service-name",
            SERVICE,
            "--validating-webhook-configuration",
            &self.validating,
            "--mutating-webhook-configuration",
            &self.mutating,
            "--extra-san",
            "127.0.0.1",
            "--source-mode",
            "permissive",
            "--shutdown-delay",
            "0s",
        ];
        args.extend_from_slice(extra);
        let process = ServiceProcess::start_as(binary(), &args, kubeconfig, &[]);
        self.replicas.push(Replica { process, port });
    }

    async fn wait_all_ready(&mut self) {
        for replica in &mut self.replicas {
            replica.process.wait_ready().await;
        }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), self.ns.name())
    }

    async fn secret(&self) -> Secret {
        self.secrets().get(SECRET).await.expect("the Secret exists")
    }

    /// `kubectl apply` of a Projection with an invalid kind (the webhook denies it).
    fn apply_bad_projection(&self, name: &str) -> Output {
        kubectl_stdin(
            &["apply", "-f", "-"],
            &json!({
                "apiVersion": "projection.sh/v1", "kind": "Projection",
                "metadata": {"name": name, "namespace": self.ns.name()},
                "spec": {"source": {"kind": "bad", "namespace": "a", "name": "b"}}
            })
            .to_string(),
        )
    }

    /// Waits until the apiserver calls the webhook (and so trusts its certificate).
    async fn wait_admission_works(&self) {
        wait_for("the apiserver to trust the webhook", TIMEOUT, || async {
            let out = self.apply_bad_projection("probe");
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            (err.contains("self-managed.projection.sh\" denied the request")
                && err.contains("spec.source.kind: must match"))
            .then_some(())
            .ok_or(err)
        })
        .await;
    }

    /// The caBundles of every entry of both configurations.
    async fn bundles(&self) -> Vec<Option<Vec<u8>>> {
        let v = Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .get(&self.validating)
            .await
            .expect("validating configuration");
        let m = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .get(&self.mutating)
            .await
            .expect("mutating configuration");
        let mut bundles: Vec<Option<Vec<u8>>> = v
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0))
            .collect();
        bundles.extend(
            m.webhooks
                .unwrap_or_default()
                .into_iter()
                .map(|w| w.client_config.ca_bundle.map(|b| b.0)),
        );
        bundles
    }

    /// Waits until every entry of both configurations holds `ca_crt` as caBundle.
    async fn wait_bundles(&self, ca_crt: &[u8]) {
        let expected = self.replicas.len().max(1) * 2;
        wait_for("the caBundle on every webhook entry", TIMEOUT, || async {
            let bundles = self.bundles().await;
            (bundles.len() == expected && bundles.iter().all(|b| b.as_deref() == Some(ca_crt)))
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "{} entries, set: {:?}",
                        bundles.len(),
                        bundles
                            .iter()
                            .map(|b| b.as_deref() == Some(ca_crt))
                            .collect::<Vec<_>>()
                    )
                })
        })
        .await;
    }
}

fn data(secret: &Secret, key: &str) -> Vec<u8> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.clone())
        .unwrap_or_default()
}

fn first_der(pem: &[u8]) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem)
        .next()
        .expect("a certificate")
        .expect("PEM")
        .to_vec()
}

/// The certificate a new TLS handshake with 127.0.0.1:`port` gets, verified against `ca_pem`.
async fn served_certificate(port: u16, ca_pem: &[u8]) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
    Ok(tls.get_ref().1.peer_certificates().ok_or("no certificate")?[0].to_vec())
}

/// Waits until every replica serves the certificate of `tls_crt`, trusted through `ca_crt`.
async fn wait_served(replicas: &[Replica], tls_crt: &[u8], ca_crt: &[u8]) {
    let expected = first_der(tls_crt);
    for replica in replicas {
        wait_for(
            &format!(
                "the replica on port {} to serve the Secret's certificate",
                replica.port
            ),
            TIMEOUT,
            || async {
                let served = served_certificate(replica.port, ca_crt).await?;
                (served == expected)
                    .then_some(())
                    .ok_or_else(|| "another certificate".to_owned())
            },
        )
        .await;
    }
}

fn sum_metric(replicas: &[Replica], sample: &str) -> f64 {
    replicas
        .iter()
        .map(|r| metric_value(&r.process.metrics(), sample).unwrap_or(0.0))
        .sum()
}

#[tokio::test]
async fn two_replicas_share_one_secret_and_the_apiserver_trusts_the_bundle_they_publish() {
    let _serial = exclusive().await;
    let (mut fixture, ports) = Fixture::new("selfcert-pair", 2).await;
    for port in &ports {
        fixture.start(*port, &[]);
    }
    fixture.wait_all_ready().await;

    // One Secret, ours, created once.
    let secret = fixture.secret().await;
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY.0))
            .map(String::as_str),
        Some(MANAGED_BY.1)
    );
    let keys: Vec<&str> = secret
        .data
        .as_ref()
        .expect("data")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["ca.crt", "ca.key", "tls.crt", "tls.key"]);
    let labelled = fixture
        .secrets()
        .list(&ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)))
        .await
        .expect("list");
    assert_eq!(labelled.items.len(), 1);
    assert_eq!(
        sum_metric(
            &fixture.replicas,
            r#"projection_webhook_self_managed_writes_total{target="secret_create",result="success"}"#
        ),
        1.0,
        "exactly one replica created the Secret"
    );

    // Both serve the Secret's certificate, which the Secret's CA verifies for 127.0.0.1.
    let (tls_crt, ca_crt) = (data(&secret, "tls.crt"), data(&secret, "ca.crt"));
    wait_served(&fixture.replicas, &tls_crt, &ca_crt).await;

    // The caBundle is on every entry of both configurations, and the apiserver trusts it.
    fixture.wait_bundles(&ca_crt).await;
    let managers: Vec<String> = Api::<MutatingWebhookConfiguration>::all(fixture.client.clone())
        .get(&fixture.mutating)
        .await
        .expect("mutating configuration")
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert!(managers.iter().any(|m| m == "projection-webhook"), "{managers:?}");
    fixture.wait_admission_works().await;
    let out = fixture.apply_bad_projection("bad");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("denied the request"),
        "{err}"
    );

    // The expiry metric is the served certificate's.
    let metrics = fixture.replicas[0].process.metrics();
    let expiry = metric_value(
        &metrics,
        "projection_webhook_certificate_expiry_timestamp_seconds",
    )
    .expect("gauge");
    let leaf = webhook::certs::cert_facts(&first_der(&tls_crt)).expect("certificate");
    let not_after = leaf
        .not_after
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    assert!((expiry - not_after).abs() < 1.0, "{expiry} vs {not_after}");
    // A year by default, for the Service's names and the extra one.
    assert!(
        leaf.names
            .dns
            .contains(&format!("{SERVICE}.{}.svc.cluster.local", fixture.ns.name()))
    );
    assert!(leaf.names.ips.contains(&std::net::Ipv4Addr::LOCALHOST.into()));

    // Reset (as a `helm upgrade` re-rendering the configuration would): patched back, and nothing
    // but the caBundle changed.
    let before = kubectl(&[
        "get",
        "validatingwebhookconfiguration",
        &fixture.validating,
        "-o",
        "json",
    ]);
    let before: Value = serde_json::from_slice(&before.stdout).expect("JSON");
    let reset = kubectl(&[
        "patch",
        "validatingwebhookconfiguration",
        &fixture.validating,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/webhooks/0/clientConfig/caBundle"},{"op":"replace","path":"/webhooks/1/clientConfig/caBundle","value":""}]"#,
    ]);
    assert!(
        reset.status.success(),
        "{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    fixture.wait_bundles(&ca_crt).await;
    let after = kubectl(&[
        "get",
        "validatingwebhookconfiguration",
        &fixture.validating,
        "-o",
        "json",
    ]);
    let after: Value = serde_json::from_slice(&after.stdout).expect("JSON");
    assert_eq!(after["metadata"]["labels"], before["metadata"]["labels"]);
    assert_eq!(
        after["webhooks"], before["webhooks"],
        "only the caBundle was touched"
    );
    fixture.wait_admission_works().await;

    // Still the one Secret, unchanged.
    assert_eq!(data(&fixture.secret().await, "tls.crt"), tls_crt);
}

#[tokio::test]
async fn a_certificate_near_expiry_is_renewed_without_a_restart_and_admission_keeps_working() {
    let _serial = exclusive().await;
    let (mut fixture, ports) = Fixture::new("selfcert-renew", 2).await;
    for port in &ports {
        fixture.start(
            *port,
            &[
                "--certificate-validity",
                "30s",
                "--certificate-renew-before",
                "20s",
            ],
        );
    }
    fixture.wait_all_ready().await;
    let pids: Vec<u32> = fixture.replicas.iter().map(|r| r.process.pid()).collect();
    let first = fixture.secret().await;
    let (first_crt, ca_crt) = (data(&first, "tls.crt"), data(&first, "ca.crt"));
    wait_served(&fixture.replicas, &first_crt, &ca_crt).await;
    fixture.wait_bundles(&ca_crt).await;
    fixture.wait_admission_works().await;

    // Renewed 10 s after issue (20 s before the end of a 30 s validity).
    let renewed = wait_for("the serving certificate to be renewed", TIMEOUT, || async {
        let secret = fixture.secret().await;
        let crt = data(&secret, "tls.crt");
        (crt != first_crt)
            .then_some(secret)
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(data(&renewed, "ca.crt"), ca_crt, "the CA stays");
    wait_served(&fixture.replicas, &data(&renewed, "tls.crt"), &ca_crt).await;
    let out = fixture.apply_bad_projection("after-renewal");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("self-managed.projection.sh\" denied the request"),
        "{err}"
    );
    for (replica, pid) in fixture.replicas.iter_mut().zip(pids) {
        assert_eq!(replica.process.pid(), pid);
        assert!(replica.process.is_running(), "no restart");
    }
    assert!(
        sum_metric(
            &fixture.replicas,
            r#"projection_webhook_certificates_issued_total{certificate="serving",reason="expiring"}"#
        ) >= 1.0
    );
    let labelled = fixture
        .secrets()
        .list(&ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)))
        .await
        .expect("list");
    assert_eq!(labelled.items.len(), 1, "still one Secret");
}

#[tokio::test]
async fn a_ca_rotation_keeps_both_cas_in_the_bundle_and_admission_never_fails() {
    let _serial = exclusive().await;
    let (mut fixture, ports) = Fixture::new("selfcert-ca", 2).await;
    // The CA is renewed 20 s before the end of its 40 s; the serving pair moves to it 3 s later.
    for port in &ports {
        fixture.start(
            *port,
            &[
                "--ca-validity",
                "40s",
                "--certificate-validity",
                "300s",
                "--certificate-renew-before",
                "20s",
                "--ca-publish-delay",
                "3s",
            ],
        );
    }
    fixture.wait_all_ready().await;
    let first = fixture.secret().await;
    let old_ca = first_der(&data(&first, "ca.crt"));
    fixture.wait_bundles(&data(&first, "ca.crt")).await;
    fixture.wait_admission_works().await;

    // Until the serving pair comes from a new CA, every admission goes through.
    let mut n = 0;
    let moved = wait_for(
        "the serving pair to move to a new CA",
        Duration::from_secs(40),
        || {
            n += 1;
            let name = format!("during-{n}");
            let (fixture, old_ca) = (&fixture, &old_ca);
            async move {
                let out = fixture.apply_bad_projection(&name);
                let err = String::from_utf8_lossy(&out.stderr).into_owned();
                assert!(
                    err.contains("self-managed.projection.sh\" denied the request"),
                    "admission failed during the CA rotation: {err}"
                );
                let secret = fixture.secret().await;
                let cas: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&data(&secret, "ca.crt"))
                    .map(|c| c.expect("PEM").to_vec())
                    .collect();
                let leaf = first_der(&data(&secret, "tls.crt"));
                let moved = cas.len() == 2 && cas[1] == *old_ca && webhook::certs::issued_by(&leaf, &cas[0]);
                moved
                    .then_some(secret)
                    .ok_or_else(|| format!("{} CAs", cas.len()))
            }
        },
    )
    .await;
    let bundle = data(&moved, "ca.crt");
    fixture.wait_bundles(&bundle).await;
    wait_served(&fixture.replicas, &data(&moved, "tls.crt"), &bundle).await;
    fixture.wait_admission_works().await;
    assert!(
        sum_metric(
            &fixture.replicas,
            r#"projection_webhook_certificates_issued_total{certificate="ca",reason="expiring"}"#
        ) >= 1.0
    );
}

#[tokio::test]
async fn a_secret_that_is_not_ours_is_left_untouched_and_the_webhook_stays_unready() {
    let _serial = exclusive().await;
    let (mut fixture, ports) = Fixture::new("selfcert-foreign", 1).await;
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": SECRET, "labels": {"app": "someone-else"}},
        "type": "Opaque",
        "stringData": {"tls.crt": "not ours", "note": "hands off"}
    }))
    .expect("secret");
    let created = fixture
        .secrets()
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create the foreign Secret");
    fixture.start(ports[0], &[]);
    let replica = &fixture.replicas[0];
    let (port, log) = (replica.process.http_port, replica.process.log.clone());

    wait_for("the refusal in the log", TIMEOUT, || async {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        log.contains("refusing to overwrite it").then_some(()).ok_or(log)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        http_get(port, "/readyz").map(|(code, _)| code),
        Some(503),
        "not ready"
    );
    let after = fixture.secret().await;
    assert_eq!(
        after.metadata.resource_version, created.metadata.resource_version,
        "untouched"
    );
    assert_eq!(after.data, created.data);
    assert!(
        fixture.bundles().await.iter().all(Option::is_none),
        "no caBundle published"
    );

    // Once the owner removes it, the webhook creates its own and turns ready.
    fixture
        .secrets()
        .delete(SECRET, &Default::default())
        .await
        .expect("delete");
    fixture.wait_all_ready().await;
    let ours = fixture.secret().await;
    assert_eq!(
        ours.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY.0))
            .map(String::as_str),
        Some(MANAGED_BY.1)
    );
    fixture.wait_bundles(&data(&ours, "ca.crt")).await;
}

#[tokio::test]
async fn the_mode_needs_no_more_than_the_documented_rbac() {
    let _serial = exclusive().await;
    let (mut fixture, ports) = Fixture::new("selfcert-rbac", 2).await;
    let ns = fixture.ns.name().to_owned();
    let role = format!("{ns}-webhook");
    let _cluster_rbac = [
        ClusterScopedGuard::new("clusterrolebindings", &role),
        ClusterScopedGuard::new("clusterroles", &role),
    ];
    let subject = json!([{"kind": "ServiceAccount", "name": "projection-webhook", "namespace": ns}]);
    // Exactly the verbs the mode uses (docs/webhook.md), narrowed to the names it touches.
    let rbac = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "projection-webhook", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "projection-webhook", "namespace": ns},
         "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET],
             "verbs": ["get", "list", "watch", "update"]}
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "projection-webhook", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "projection-webhook"},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [
            {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
             "resourceNames": [fixture.validating], "verbs": ["list", "watch", "patch"]},
            {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
             "resourceNames": [fixture.mutating], "verbs": ["list", "watch", "patch"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
            {"apiGroups": ["projection.sh"], "resources": ["projections", "clusterprojections"],
             "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": subject},
    ]});
    let applied = kubectl_stdin(&["apply", "-f", "-"], &rbac.to_string());
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let kubeconfig = service_account_kubeconfig(&ns, "projection-webhook");
    // The chart's policy holding that ServiceAccount to the caBundle, so the whole run shows the
    // mode works under it; loaded once it refuses a dry-run change of the rules.
    let _policy = ConfigurationPolicy::apply(&ns, "projection-webhook");
    let thief = client_from(&kubeconfig).await;
    let validating = "validatingwebhookconfigurations";
    let name = fixture.validating.clone();
    // The validating configuration's webhooks as they are, with `change` made to the first.
    let webhooks_with = |change: &dyn Fn(&mut Value)| {
        let current: Value =
            serde_json::from_slice(&kubectl(&["get", validating, &name, "-o", "json"]).stdout).expect("JSON");
        let mut webhooks = current["webhooks"].clone();
        change(&mut webhooks[0]);
        json!({"webhooks": webhooks})
    };
    let widen = |w: &mut Value| w["rules"][0]["resources"] = json!(["*"]);
    let refused = "may change only webhooks[*].clientConfig.caBundle";
    let probe = webhooks_with(&widen);
    wait_for("the configuration policy loaded", TIMEOUT, || async {
        match patch_webhook_configuration(&thief, validating, &name, &probe, true).await {
            Err(message) if message.contains(refused) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Two replicas (a create race, an update race) renewing every 10 s.
    for port in &ports {
        fixture.start_as(
            *port,
            &[
                "--certificate-validity",
                "30s",
                "--certificate-renew-before",
                "20s",
            ],
            &kubeconfig,
        );
    }
    fixture.wait_all_ready().await;
    let first = fixture.secret().await;
    let ca_crt = data(&first, "ca.crt");
    fixture.wait_bundles(&ca_crt).await;
    fixture.wait_admission_works().await;
    let reset = kubectl(&[
        "patch",
        "mutatingwebhookconfiguration",
        &fixture.mutating,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/webhooks/1/clientConfig/caBundle"}]"#,
    ]);
    assert!(
        reset.status.success(),
        "{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    fixture.wait_bundles(&ca_crt).await;
    wait_for("a renewal written under that RBAC", TIMEOUT, || async {
        let crt = data(&fixture.secret().await, "tls.crt");
        (crt != data(&first, "tls.crt"))
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    for replica in &fixture.replicas {
        let log = std::fs::read_to_string(&replica.process.log).unwrap_or_default();
        assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    }

    // With the webhook's own token, as a thief would use it: the rules (every write of the kind
    // sent to the webhook), the entry's address, its failure policy or the configuration's labels
    // cannot change...
    let other_url = |w: &mut Value| w["clientConfig"]["url"] = json!("https://127.0.0.1:1/validate");
    let fail_open = |w: &mut Value| w["failurePolicy"] = json!("Ignore");
    for (what, patch) in [
        ("a wider rule", webhooks_with(&widen)),
        ("another address", webhooks_with(&other_url)),
        ("failing open", webhooks_with(&fail_open)),
        ("a label", json!({"metadata": {"labels": {"extra": "x"}}})),
    ] {
        match patch_webhook_configuration(&thief, validating, &name, &patch, false).await {
            Err(message) => {
                assert!(message.contains(refused), "{what}: {message}");
                assert!(
                    message.contains(&format!("system:serviceaccount:{ns}:projection-webhook")),
                    "{what}: the denial names the account: {message}"
                );
            }
            Ok(()) => panic!("{what} was admitted"),
        }
    }
    // ... while the caBundle can (here: replaced by something else), and the webhook puts its own
    // back.
    let other = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b"not our CA");
    let bundle = |w: &mut Value| w["clientConfig"]["caBundle"] = json!(other);
    patch_webhook_configuration(&thief, validating, &name, &webhooks_with(&bundle), false)
        .await
        .unwrap_or_else(|message| panic!("a caBundle change by the webhook's account: {message}"));
    fixture.wait_bundles(&ca_crt).await;
    fixture.wait_admission_works().await;
    let _ = std::fs::remove_file(kubeconfig);
}

/// The chart's ValidatingAdmissionPolicy that lets the webhook's ServiceAccount `namespace/account`
/// change only the caBundle of webhook configurations, applied alone under a name of its own;
/// deleted when dropped.
struct ConfigurationPolicy {
    _guards: [ClusterScopedGuard; 2],
}

impl ConfigurationPolicy {
    fn apply(namespace: &str, account: &str) -> Self {
        let release = format!("projection-cfg-{}", std::process::id());
        let rendered = projection_tests::chart::helm_ok(&[
            "template",
            &release,
            &projection_tests::chart::chart_dir().to_string_lossy(),
            "--namespace",
            namespace,
            "--set",
            &format!("webhook.serviceAccount.name={account}"),
            "--show-only",
            "templates/webhook-configuration-policy.yaml",
        ]);
        let name = format!("{release}-webhook-configurations");
        let guards = [
            ClusterScopedGuard::new("validatingadmissionpolicies", &name),
            ClusterScopedGuard::new("validatingadmissionpolicybindings", &name),
        ];
        let applied = kubectl_stdin(&["apply", "-f", "-"], &rendered);
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
        Self { _guards: guards }
    }
}

#[test]
fn self_managed_mode_without_a_namespace_refuses_to_start_naming_the_flag() {
    let out = std::process::Command::new(binary())
        .args([
            "--self-managed-certificate-secret",
            SECRET,
            "--service-name",
            SERVICE,
            "--validating-webhook-configuration",
            "v",
        ])
        .env_remove("POD_NAMESPACE")
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--namespace (or the POD_NAMESPACE environment variable) is required with --self-managed-certificate-secret"),
        "{err}"
    );
}
