//! The webhook against the real control plane, registered by URL with a CA bundle, driven with
//! kubectl as a user would. Each test runs its own webhook process and registration (one at a
//! time: webhook configurations are cluster-wide), and deletes the registration when it ends, also
//! on panic.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::PostParams};
use projection_tests::{
    ClusterScopedGuard, ServiceProcess, TestNamespace, client, control_plane_bin, exclusive, free_port,
    http_get, install_crds, kubeconfig_path, kubectl, kubectl_ok, kubectl_stdin, metric_value, repo_root,
    testenv_dir, wait_for,
};
use serde_json::{Value, json};
use std::{
    path::{Path, PathBuf},
    process::Output,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

/// The validation fixtures' case, shared with `shared`'s own fixture test.
#[path = "../../shared/tests/common/validation_case.rs"]
mod validation_case;
use validation_case::Case;

const TIMEOUT: Duration = Duration::from_secs(20);

/// Serving certificates laid out like a kubelet-mounted Secret: `tls.crt` and `tls.key` are links
/// into `..data`, itself a link to a versioned directory that a rotation replaces atomically.
struct MountedCerts {
    dir: PathBuf,
    /// Where `certs/generate.sh` keeps the CA and issues new pairs.
    issuer: PathBuf,
    version: u32,
}

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

impl MountedCerts {
    fn new() -> Self {
        let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = testenv_dir().join(format!("webhook-certs-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("cert folder");
        let mut certs = Self {
            issuer: dir.join("issuer"),
            dir,
            version: 0,
        };
        certs.rotate();
        for file in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(file), certs.dir.join(file)).expect("link");
        }
        certs
    }

    /// Issues a new serving certificate and swaps `..data` to it in one rename, as the kubelet does.
    fn rotate(&mut self) {
        self.issue();
        self.version += 1;
        let versioned = format!("..v{}", self.version);
        std::fs::create_dir_all(self.dir.join(&versioned)).expect("version folder");
        for file in ["tls.crt", "tls.key"] {
            std::fs::copy(self.issuer.join(file), self.dir.join(&versioned).join(file)).expect("copy");
        }
        let staging = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&staging);
        std::os::unix::fs::symlink(&versioned, &staging).expect("link");
        std::fs::rename(&staging, self.dir.join("..data")).expect("atomic swap");
    }

    /// Issues a new pair in the issuer folder only.
    fn issue(&self) {
        let status = std::process::Command::new(repo_root().join("certs/generate.sh"))
            .arg(&self.issuer)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("certs/generate.sh runs");
        assert!(status.success(), "certs/generate.sh failed");
    }

    fn ca(&self) -> PathBuf {
        self.issuer.join("ca.crt")
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }
}

impl Drop for MountedCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The webhook configurations of one test; deleted on drop, so a failed test never leaves a
/// `failurePolicy: Fail` webhook pointing at a dead port.
struct Registration {
    name: String,
}

impl Registration {
    /// Registers through `scripts/register-webhook.sh`, the same script the demo uses.
    fn apply(port: u16, ca: &Path) -> Self {
        let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
        let registration = Self {
            name: format!("projection-webhook-test-{}-{n}", std::process::id()),
        };
        let path = format!(
            "{}:{}",
            control_plane_bin().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = std::process::Command::new(repo_root().join("scripts/register-webhook.sh"))
            .arg(port.to_string())
            .arg(ca)
            .arg(&registration.name)
            .env("KUBECONFIG", kubeconfig_path())
            .env("PATH", path)
            .output()
            .expect("scripts/register-webhook.sh runs");
        assert!(
            out.status.success(),
            "registering: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        registration
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = kubectl(&[
            "delete",
            "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            &self.name,
            "--ignore-not-found",
        ]);
    }
}

/// A running, registered webhook. Fields drop in order: the registration goes before the process.
struct Webhook {
    _registration: Registration,
    process: ServiceProcess,
    certs: MountedCerts,
    port: u16,
}

/// The CA of the client certificate the control plane's apiserver presents to webhooks (its
/// admission configuration, written by `tests/control-plane/up.sh`): with it, the webhook knows
/// its caller is the apiserver and runs every check.
fn apiserver_client_ca() -> PathBuf {
    let path = testenv_dir().join("pki/webhook-client-ca.crt");
    assert!(
        path.exists(),
        "{} is missing: this control plane was started before up.sh gave the apiserver a client \
         certificate for webhooks; restart it (tests/control-plane/down.sh, then up.sh)",
        path.display()
    );
    path
}

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_projection-webhook"))
}

impl Webhook {
    async fn start(extra: &[&str]) -> Self {
        let certs = MountedCerts::new();
        let port = free_port();
        let bind = format!("127.0.0.1:{port}");
        let (cert, key) = (certs.cert(), certs.key());
        let client_ca = apiserver_client_ca();
        let mut args = vec![
            "--client-ca-file",
            client_ca.to_str().expect("utf-8 path"),
            "--bind-address",
            &bind,
            "--tls-cert-file",
            cert.to_str().expect("utf-8 path"),
            "--tls-key-file",
            key.to_str().expect("utf-8 path"),
            "--shutdown-delay",
            "0s",
            "--tls-reload-interval",
            "200ms",
        ];
        args.extend_from_slice(extra);
        let mut process = ServiceProcess::start(binary(), &args);
        process.wait_ready().await;
        let registration = Registration::apply(port, &certs.ca());
        // The apiserver picks configurations up through an informer: wait until both answer.
        wait_for("the webhook configurations to take effect", TIMEOUT, || async {
            let probe = manifest(
                "Projection",
                "registration-probe",
                Some("default"),
                json!({"source": {"kind": "bad", "namespace": "a", "name": "b"}}),
            );
            let out = kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &probe);
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            stderr
                .contains("admission webhook \"mutate.projection.sh\" denied the request")
                .then_some(())
                .ok_or(stderr)
        })
        .await;
        Self {
            _registration: registration,
            process,
            certs,
            port,
        }
    }
}

/// The exclusive right to register a webhook (configurations are cluster-wide), a client, and the
/// CRDs.
async fn serial_cluster() -> (tokio::sync::MutexGuard<'static, ()>, kube::Client) {
    let serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    (serial, client)
}

fn manifest(kind: &str, name: &str, namespace: Option<&str>, spec: Value) -> String {
    let mut metadata = json!({"name": name});
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    json!({"apiVersion": "projection.sh/v1", "kind": kind, "metadata": metadata, "spec": spec}).to_string()
}

fn apply(manifest: &str) -> Output {
    kubectl_stdin(&["apply", "-f", "-"], manifest)
}

fn apply_as(user: &str, manifest: &str) -> Output {
    kubectl_stdin(&["apply", "--as", user, "-f", "-"], manifest)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn assert_denied(out: &Output, expected: &str) {
    let err = stderr(out);
    assert!(
        !out.status.success(),
        "expected a denial containing {expected:?}; kubectl succeeded:\n{err}"
    );
    assert!(err.contains("denied the request"), "not a webhook denial:\n{err}");
    assert!(err.contains(expected), "expected {expected:?} in:\n{err}");
}

#[track_caller]
fn assert_admitted(out: &Output) -> String {
    let err = stderr(out);
    assert!(out.status.success(), "expected admission; kubectl failed:\n{err}");
    err
}

async fn configmap(namespace: &str, name: &str, projectable: Option<&str>) {
    let mut annotations = serde_json::Map::new();
    if let Some(value) = projectable {
        annotations.insert("projection.sh/projectable".into(), json!(value));
    }
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "data": {"k": "v"}
    }))
    .expect("configmap");
    Api::<ConfigMap>::namespaced(client().await, namespace)
        .create(&PostParams::default(), &cm)
        .await
        .expect("create configmap");
}

/// The validation fixtures of `shared`, with their namespace `tenant` replaced by `namespace`.
fn fixture_cases(file: &str, namespace: &str) -> Vec<Case> {
    let path = repo_root().join("shared/tests/fixtures/validation").join(file);
    let value: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("YAML");
    let text = serde_json::to_string(&value)
        .expect("JSON")
        .replace("tenant", namespace);
    serde_json::from_str(&text).expect("cases")
}

#[tokio::test]
async fn bad_specs_are_rejected_at_kubectl_apply_with_their_messages_and_good_ones_admitted() {
    let (_serial, client) = serial_cluster().await;
    let ns = TestNamespace::create(&client, "webhook-table").await;
    let webhook = Webhook::start(&["--source-mode", "permissive"]).await;

    let bad = fixture_cases("bad.yaml", ns.name());
    assert!(bad.len() >= 30);
    for (i, case) in bad.iter().enumerate() {
        let name = format!("bad-{}-{i}", std::process::id());
        let namespace = (case.kind == "Projection").then_some(ns.name());
        let out = apply(&manifest(&case.kind, &name, namespace, case.spec.clone()));
        for error in &case.errors {
            assert!(
                !out.status.success() && stderr(&out).contains(error),
                "{}: expected {error:?} in:\n{}",
                case.description,
                stderr(&out)
            );
        }
    }

    let mut guards = Vec::new();
    for (i, case) in fixture_cases("good.yaml", ns.name()).iter().enumerate() {
        let name = format!("good-{}-{i}", std::process::id());
        let namespace = (case.kind == "Projection").then_some(ns.name());
        if case.kind == "ClusterProjection" {
            guards.push(ClusterScopedGuard::new("clusterprojections", &name));
        }
        let out = apply(&manifest(&case.kind, &name, namespace, case.spec.clone()));
        assert!(out.status.success(), "{}: {}", case.description, stderr(&out));
    }

    let metrics = webhook.process.metrics();
    let denied = metric_value(
        &metrics,
        r#"projection_webhook_requests_total{endpoint="mutate",resource="projections",operation="CREATE",verdict="denied"}"#,
    );
    assert!(
        denied.is_some_and(|n| n >= 20.0),
        "denials counted: {denied:?}\n{metrics}"
    );
    assert!(
        metrics.contains("projection_webhook_request_duration_seconds_bucket{"),
        "{metrics}"
    );
}

#[tokio::test]
async fn unknown_kinds_are_admitted_with_a_warning_and_cluster_scoped_kinds_denied() {
    let (_serial, client) = serial_cluster().await;
    let ns = TestNamespace::create(&client, "webhook-kinds").await;
    let _webhook = Webhook::start(&[]).await;

    let unknown = apply(&manifest(
        "Projection",
        "widget",
        Some(ns.name()),
        json!({"source": {"group": "example.com", "kind": "Widget", "namespace": "platform", "name": "w"}}),
    ));
    let warning = assert_admitted(&unknown);
    assert!(
        warning.contains("Warning: source kind example.com/*/Widget is not served by this cluster (yet)"),
        "kubectl prints the warning:\n{warning}"
    );

    let namespace = apply(&manifest(
        "Projection",
        "namespace",
        Some(ns.name()),
        json!({"source": {"kind": "Namespace", "namespace": "platform", "name": "w"}}),
    ));
    assert_denied(
        &namespace,
        "*/Namespace is cluster-scoped; projection only mirrors namespaced resources",
    );

    let missing = apply(&manifest(
        "Projection",
        "missing",
        Some(ns.name()),
        json!({"source": {"kind": "ConfigMap", "namespace": ns.name(), "name": "not-there"}, "destination": {"name": "x"}}),
    ));
    assert!(
        assert_admitted(&missing).contains("Warning: source ConfigMap"),
        "missing source warns"
    );
}

#[tokio::test]
async fn vetoed_and_not_opted_in_sources_are_denied_in_allowlist_mode() {
    let (_serial, client) = serial_cluster().await;
    let src = TestNamespace::create(&client, "webhook-veto-src").await;
    let dst = TestNamespace::create(&client, "webhook-veto-dst").await;
    configmap(src.name(), "vetoed", Some("false")).await;
    configmap(src.name(), "plain", None).await;
    configmap(src.name(), "open", Some("true")).await;
    let _webhook = Webhook::start(&[]).await;
    let projection = |source: &str| {
        manifest(
            "Projection",
            source,
            Some(dst.name()),
            json!({"source": {"kind": "ConfigMap", "namespace": src.name(), "name": source}}),
        )
    };

    assert_denied(
        &apply(&projection("vetoed")),
        &format!(
            r#"source {}/vetoed has projection.sh/projectable="false"; owner has opted out of projection"#,
            src.name()
        ),
    );
    assert_denied(
        &apply(&projection("plain")),
        &format!(
            r#"source-mode=allowlist requires annotation projection.sh/projectable="true" on source {0}/plain; its owner can opt in with: kubectl annotate configmaps/plain -n {0} projection.sh/projectable=true"#,
            src.name()
        ),
    );
    assert_admitted(&apply(&projection("open")));
}

#[tokio::test]
async fn an_opt_in_is_honoured_at_once_and_an_opt_out_once_the_kept_read_expires() {
    const CACHE_TTL: Duration = Duration::from_secs(3);
    let (_serial, client) = serial_cluster().await;
    let src = TestNamespace::create(&client, "webhook-optin-src").await;
    let dst = TestNamespace::create(&client, "webhook-optin-dst").await;
    configmap(src.name(), "settings", None).await;
    let webhook = Webhook::start(&["--source-metadata-cache-ttl", "3s"]).await;
    let projection = manifest(
        "Projection",
        "settings",
        Some(dst.name()),
        json!({"source": {"kind": "ConfigMap", "namespace": src.name(), "name": "settings"}}),
    );
    // A server-side dry run is a CREATE every time, so every attempt is checked.
    let try_create = || kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &projection);
    let annotate = |change: &str| {
        kubectl_ok(&[
            "annotate",
            "configmap",
            "settings",
            "-n",
            src.name(),
            change,
            "--overwrite",
        ]);
    };
    let not_opted_in = format!(
        r#"source-mode=allowlist requires annotation projection.sh/projectable="true" on source {}/settings"#,
        src.name()
    );

    // A denial is never kept: the owner's opt-in counts from the very next request, as does a
    // removal of an opt-in that was never read as allowing.
    assert_denied(&try_create(), &not_opted_in);
    annotate("projection.sh/projectable=true");
    assert_admitted(&try_create());
    assert_admitted(&try_create());
    annotate("projection.sh/projectable-");
    let opted_out = Instant::now();
    // The read that allowed may be reused until it expires (the controller would refuse to copy
    // meanwhile); then the source is read again and the request denied.
    let denial = wait_until_denied(
        "the projection to be denied once the kept read expires",
        CACHE_TTL + Duration::from_secs(10),
        &try_create,
    )
    .await;
    assert!(denial.contains(&not_opted_in), "{denial}");
    eprintln!("denied again {:?} after the opt-out", opted_out.elapsed());
    assert_denied(&try_create(), &not_opted_in);
    annotate("projection.sh/projectable=true");
    assert_admitted(&try_create());

    let metrics = webhook.process.metrics();
    let lookups = |result| cache_lookups(&metrics, "source_metadata", result);
    assert!(
        lookups("hit") >= 1.0,
        "the allowing read was kept and reused:\n{metrics}"
    );
    assert!(
        lookups("miss") >= 4.0,
        "every denial and every first allow was read from the apiserver:\n{metrics}"
    );
}

/// The count of `projection_webhook_<cache>_cache_lookups_total{result}` in `metrics` (0 if absent).
fn cache_lookups(metrics: &str, cache: &str, result: &str) -> f64 {
    metric_value(
        metrics,
        &format!(r#"projection_webhook_{cache}_cache_lookups_total{{result="{result}"}}"#),
    )
    .unwrap_or(0.0)
}

/// A Role with `rules` and its RoleBinding to `user`, both called `name`, as one kubectl list.
fn role_for(user: &str, namespace: &str, name: &str, rules: Value) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
    ]})
    .to_string()
}

/// Waits until `attempt` is admitted: RBAC changes reach the apiserver's authorizer through its
/// informer, a moment after they are written.
async fn wait_until_admitted(what: &str, attempt: impl Fn() -> Output) {
    let attempt = &attempt;
    wait_for(what, TIMEOUT, || async move {
        let out = attempt();
        out.status.success().then_some(()).ok_or_else(|| stderr(&out))
    })
    .await;
}

/// Waits until the webhook denies `attempt`, for at most `timeout`; returns kubectl's error output.
async fn wait_until_denied(what: &str, timeout: Duration, attempt: impl Fn() -> Output) -> String {
    let attempt = &attempt;
    wait_for(what, timeout, || async move {
        let out = attempt();
        let err = stderr(&out);
        (!out.status.success() && err.contains("denied the request"))
            .then_some(err.clone())
            .ok_or(err)
    })
    .await
}

/// What a user needs to write Projections in `namespace`.
fn projection_editor(user: &str, namespace: &str) -> String {
    role_for(
        user,
        namespace,
        "projection-editor",
        json!([{"apiGroups": ["projection.sh"], "resources": ["projections"], "verbs": ["get", "list", "create", "update", "patch"]}]),
    )
}

#[tokio::test]
async fn a_user_who_cannot_read_the_source_cannot_project_it_until_granted() {
    let (_serial, client) = serial_cluster().await;
    let src = TestNamespace::create(&client, "webhook-deputy-src").await;
    let tenant = TestNamespace::create(&client, "webhook-deputy-tenant").await;
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db-password", "namespace": src.name(), "annotations": {"projection.sh/projectable": "true"}},
        "stringData": {"password": "hunter2"}
    });
    assert_admitted(&apply(&secret.to_string()));
    let user = format!("alice-{}", std::process::id());
    assert_admitted(&apply(&projection_editor(&user, tenant.name())));
    // Grants are kept for an hour, far longer than this test waits for the grant below: the
    // denial must not have been kept.
    let _webhook = Webhook::start(&["--access-review-cache-ttl", "1h"]).await;
    let projection = manifest(
        "Projection",
        "stolen",
        Some(tenant.name()),
        json!({"source": {"kind": "Secret", "namespace": src.name(), "name": "db-password"}}),
    );

    assert_denied(
        &apply_as(&user, &projection),
        &format!(
            "{user} may not get secrets {}/db-password; a projection would expose the source through its copy",
            src.name()
        ),
    );

    assert_admitted(&apply(&role_for(
        &user,
        src.name(),
        "read-db-password",
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["db-password"], "verbs": ["get"]}]),
    )));
    wait_until_admitted(
        "the projection to be admitted once alice may read the source",
        || apply_as(&user, &projection),
    )
    .await;
}

#[tokio::test]
async fn a_revoked_read_access_is_refused_again_once_the_kept_grant_expires() {
    const CACHE_TTL: Duration = Duration::from_secs(5);
    let (_serial, client) = serial_cluster().await;
    let src = TestNamespace::create(&client, "webhook-revoke-src").await;
    let tenant = TestNamespace::create(&client, "webhook-revoke-tenant").await;
    configmap(src.name(), "settings", Some("true")).await;
    let user = format!("bob-{}", std::process::id());
    assert_admitted(&apply(&projection_editor(&user, tenant.name())));
    assert_admitted(&apply(&role_for(
        &user,
        src.name(),
        "read-settings",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["get"]}]),
    )));
    let webhook = Webhook::start(&["--access-review-cache-ttl", "5s"]).await;
    let projection = manifest(
        "Projection",
        "settings",
        Some(tenant.name()),
        json!({"source": {"kind": "ConfigMap", "namespace": src.name(), "name": "settings"}}),
    );
    // A server-side dry run is a CREATE every time, so every attempt is checked.
    let try_create = || {
        kubectl_stdin(
            &["apply", "--dry-run=server", "--as", &user, "-f", "-"],
            &projection,
        )
    };
    wait_until_admitted("bob's projection to be admitted", &try_create).await;

    kubectl_ok(&["delete", "rolebinding", "read-settings", "-n", src.name()]);
    let revoked = Instant::now();
    // The kept grant may still admit it until it expires; then the SubjectAccessReview is asked
    // again and refuses (the RBAC informer's own delay included in the margin).
    let denial = wait_until_denied(
        "bob's projection to be denied once the kept grant expires",
        CACHE_TTL + Duration::from_secs(10),
        &try_create,
    )
    .await;
    assert!(
        denial.contains(&format!("{user} may not get configmaps {}/settings", src.name())),
        "{denial}"
    );
    let metrics = webhook.process.metrics();
    let lookups = |result| cache_lookups(&metrics, "access_review", result);
    assert!(
        lookups("miss") >= 2.0,
        "asked at least before and after the revocation:\n{metrics}"
    );
    assert!(lookups("hit") >= 1.0, "the grant was kept and reused:\n{metrics}");
    eprintln!("denied again {:?} after the revocation", revoked.elapsed());
}

#[tokio::test]
async fn tenant_mode_denies_cluster_projections_but_not_projections() {
    let (_serial, client) = serial_cluster().await;
    let ns = TestNamespace::create(&client, "webhook-tenant").await;
    configmap(ns.name(), "settings", Some("true")).await;
    let _webhook = Webhook::start(&["--tenant-mode"]).await;
    let name = format!("tenant-{}", std::process::id());
    let _guard = ClusterScopedGuard::new("clusterprojections", &name);

    assert_denied(
        &apply(&manifest(
            "ClusterProjection",
            &name,
            None,
            json!({"source": {"kind": "ConfigMap", "namespace": ns.name(), "name": "settings"}, "destination": {"namespaces": ["a"]}}),
        )),
        "tenant mode: ClusterProjections cannot be created or changed here; use a Projection in your own namespace",
    );
    assert_admitted(&apply(&manifest(
        "Projection",
        "ok",
        Some(ns.name()),
        json!({"source": {"kind": "ConfigMap", "namespace": ns.name(), "name": "settings"}, "destination": {"name": "copy"}}),
    )));
}

#[tokio::test]
async fn the_destination_name_defaults_to_the_source_name_on_the_stored_object() {
    let (_serial, client) = serial_cluster().await;
    let src = TestNamespace::create(&client, "webhook-default-src").await;
    let dst = TestNamespace::create(&client, "webhook-default-dst").await;
    configmap(src.name(), "settings", Some("true")).await;
    let _webhook = Webhook::start(&[]).await;

    assert_admitted(&apply(&manifest(
        "Projection",
        "defaulted",
        Some(dst.name()),
        json!({"source": {"kind": "ConfigMap", "namespace": src.name(), "name": "settings"}}),
    )));
    let stored = kubectl_ok(&["get", "projection", "defaulted", "-n", dst.name(), "-o", "json"]);
    let stored: Value = serde_json::from_str(&stored).expect("JSON");
    assert_eq!(stored["spec"]["destination"], json!({"name": "settings"}));
    assert_eq!(
        stored["spec"]["source"],
        json!({"kind": "ConfigMap", "namespace": src.name(), "name": "settings"}),
        "nothing else changed"
    );
}

/// The certificate the webhook presents to a new TLS handshake.
async fn served_certificate(port: u16, ca: &Path) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA") {
        roots.add(cert.expect("CA cert")).expect("CA added");
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let tls = connector
        .connect(name, tcp)
        .await
        .expect("handshake with a certificate the CA signed");
    tls.get_ref().1.peer_certificates().expect("a certificate")[0].to_vec()
}

fn certificate_der(path: &Path) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::from_pem_file(path).expect("certificate").to_vec()
}

#[tokio::test]
async fn a_rotated_certificate_is_served_to_new_handshakes_without_a_restart() {
    let (_serial, client) = serial_cluster().await;
    let ns = TestNamespace::create(&client, "webhook-rotation").await;
    let mut webhook = Webhook::start(&["--source-mode", "permissive"]).await;
    let pid = webhook.process.pid();
    let first = certificate_der(&webhook.certs.cert());
    assert_eq!(served_certificate(webhook.port, &webhook.certs.ca()).await, first);

    webhook.certs.rotate();
    let second = certificate_der(&webhook.certs.cert());
    assert_ne!(first, second, "a new certificate was issued");
    let deadline = Instant::now() + TIMEOUT;
    while served_certificate(webhook.port, &webhook.certs.ca()).await != second {
        assert!(Instant::now() < deadline, "the new certificate was never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(webhook.process.pid(), pid);
    assert!(webhook.process.is_running(), "no restart");

    // A half-written rotation (a new key next to the current certificate) is refused; the current
    // pair keeps serving.
    webhook.certs.issue();
    let data = webhook.certs.dir.join("..data");
    std::fs::copy(webhook.certs.issuer.join("tls.key"), data.join("tls.key")).expect("copy");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        served_certificate(webhook.port, &webhook.certs.ca()).await,
        second
    );
    let metrics = webhook.process.metrics();
    let not_after = webhook::certs::cert_facts(&second)
        .expect("certificate")
        .not_after
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    assert_eq!(
        metric_value(
            &metrics,
            "projection_webhook_certificate_expiry_timestamp_seconds"
        ),
        Some(not_after),
        "the expiry of the certificate served from the files:\n{metrics}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            r#"projection_webhook_certificate_reloads_total{result="success"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        metric_value(
            &metrics,
            r#"projection_webhook_certificate_reloads_total{result="key"}"#
        )
        .is_some(),
        "{metrics}"
    );

    // The apiserver, on its connections, still gets answers.
    assert_denied(
        &apply(&manifest(
            "Projection",
            "after-rotation",
            Some(ns.name()),
            json!({"source": {"kind": "configmap", "namespace": "a", "name": "b"}}),
        )),
        "spec.source.kind: must match",
    );
}

#[tokio::test]
async fn sigterm_turns_readiness_off_then_exits_cleanly() {
    let certs = MountedCerts::new();
    let (cert, key) = (certs.cert(), certs.key());
    let bind = format!("127.0.0.1:{}", free_port());
    let mut process = ServiceProcess::start(
        binary(),
        &[
            "--bind-address",
            &bind,
            "--tls-cert-file",
            cert.to_str().expect("utf-8"),
            "--tls-key-file",
            key.to_str().expect("utf-8"),
            "--shutdown-delay",
            "2s",
        ],
    );
    process.wait_ready().await;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &process.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let port = process.http_port;
    wait_for(
        "readiness to turn off after SIGTERM",
        Duration::from_secs(2),
        || async move {
            match http_get(port, "/readyz") {
                Some((503, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(process.is_running(), "keeps serving during the shutdown delay");
    let exit = process.terminate().expect("exits");
    assert!(exit.success(), "exit status {exit}");
}

/// `spec.keys` against a readable source (SPEC §10): a spec whose copy would be an invalid Secret is
/// refused at `kubectl apply` with the controller's own message; `allowTypeChange` admits it; a
/// source with none of the selected keys is admitted with a warning (the controller reports it).
#[tokio::test]
async fn a_spec_whose_copy_would_be_an_invalid_secret_is_denied_at_kubectl_apply() {
    let (_serial, client) = serial_cluster().await;
    let src = TestNamespace::create(&client, "webhook-keys-src").await;
    let dst = TestNamespace::create(&client, "webhook-keys-dst").await;
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "web-tls", "namespace": src.name(),
                     "annotations": {"projection.sh/projectable": "true"}},
        "type": "kubernetes.io/tls",
        "data": {"ca.crt": "Q0E=", "tls.crt": "Q1JU", "tls.key": "S0VZ"}
    }))
    .expect("secret");
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), src.name())
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret created");
    let _webhook = Webhook::start(&[]).await;
    let projection = |keys: Value| {
        manifest(
            "Projection",
            "ca",
            Some(dst.name()),
            json!({"source": {"kind": "Secret", "namespace": src.name(), "name": "web-tls"}, "keys": keys}),
        )
    };

    let refused = format!(
        "spec.keys: a Secret of type kubernetes.io/tls needs the keys tls.crt and tls.key (missing: \
         tls.crt, tls.key) after spec.keys; set spec.keys.allowTypeChange: true to copy it as type \
         Opaque, or keep those keys (source Secret {}/web-tls)",
        src.name()
    );
    let out = apply(&projection(json!({"include": ["ca.crt"]})));
    assert_denied(&out, &refused);
    println!("kubectl apply said:\n{}", stderr(&out));
    assert_admitted(&apply(&projection(
        json!({"include": ["ca.crt"], "allowTypeChange": true}),
    )));
    // A change of the keys alone is checked again.
    assert_denied(
        &apply(&projection(json!({"include": ["ca.crt", "tls.crt"]}))),
        &refused.replace("(missing: tls.crt, tls.key)", "(missing: tls.key)"),
    );
    let warned = assert_admitted(&apply(&projection(json!({"include": ["none-*"]}))));
    assert!(
        warned.contains("Warning: spec.keys: the source has none of the selected keys (it has 3)"),
        "{warned}"
    );
}

/// The set-up of the tests of the index of the other CRs: the cluster to itself, two namespaces
/// (`a` holding the projectable ConfigMap `cfg`) and a webhook in permissive mode.
struct ClaimsWorld {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    a: TestNamespace,
    b: TestNamespace,
    webhook: Webhook,
}

async fn claims_world(prefix: &str) -> ClaimsWorld {
    let (serial, client) = serial_cluster().await;
    let a = TestNamespace::create(&client, &format!("{prefix}-a")).await;
    let b = TestNamespace::create(&client, &format!("{prefix}-b")).await;
    let webhook = Webhook::start(&["--source-mode", "permissive"]).await;
    configmap(a.name(), "cfg", Some("true")).await;
    ClaimsWorld {
        _serial: serial,
        a,
        b,
        webhook,
    }
}

/// The source `namespace/cfg`.
fn cfg_in(namespace: &str) -> Value {
    json!({"kind": "ConfigMap", "namespace": namespace, "name": "cfg"})
}

#[tokio::test]
async fn an_overlap_is_warned_of_and_a_loop_is_denied_with_its_chain() {
    let world = claims_world("webhook-claims").await;
    let (a, b, webhook) = (world.a.name(), world.b.name(), &world.webhook);
    let source = cfg_in;

    // b/first copies a/cfg to b/cfg.
    assert_admitted(&apply(&manifest(
        "Projection",
        "first",
        Some(b),
        json!({"source": source(a)}),
    )));
    // Another Projection writing b/cfg: admitted, with a warning naming the first, once the
    // webhook's index has seen the first (a dry run until then changes nothing).
    let overlapping = manifest(
        "Projection",
        "second",
        Some(b),
        json!({"source": {"kind": "ConfigMap", "namespace": a, "name": "other"}, "destination": {"name": "cfg"}}),
    );
    let expected =
        format!("Warning: destination ConfigMap {b}/cfg is already claimed by Projection {b}/first");
    wait_for("the overlap warned of", TIMEOUT, || async {
        let out = kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &overlapping);
        let err = stderr(&out);
        (out.status.success() && err.contains(&expected))
            .then_some(())
            .ok_or(err)
    })
    .await;
    let err = assert_admitted(&apply(&overlapping));
    assert!(err.contains(&expected), "{err}");

    // a/back would copy b/cfg (first's copy) back onto a/cfg (first's source): denied.
    let out = apply(&manifest(
        "Projection",
        "back",
        Some(a),
        json!({"source": source(b)}),
    ));
    assert_denied(
        &out,
        &format!(
            "this spec closes a loop of copies, each one the source of the next: Projection {a}/back copies \
             ConfigMap {b}/cfg to ConfigMap {a}/cfg, then Projection {b}/first copies ConfigMap {a}/cfg to \
             ConfigMap {b}/cfg"
        ),
    );
    // A ClusterProjection listing a's namespace for a copy of b/cfg closes the same loop.
    let name = format!("{a}-back");
    let _guard = ClusterScopedGuard::new("clusterprojections", &name);
    let out = apply(&manifest(
        "ClusterProjection",
        &name,
        None,
        json!({"source": source(b), "destination": {"namespaces": [a]}}),
    ));
    assert_denied(
        &out,
        &format!("ClusterProjection {name} copies ConfigMap {b}/cfg to ConfigMap {a}/cfg"),
    );
    // Someone who may write Projections in a but not read b/cfg learns nothing of the other CRs:
    // the access check answers first.
    let stranger = format!("stranger-{a}");
    kubectl_ok(&[
        "-n",
        a,
        "create",
        "role",
        "projections",
        "--verb=*",
        "--resource=projections.projection.sh",
    ]);
    kubectl_ok(&[
        "-n",
        a,
        "create",
        "rolebinding",
        "stranger",
        "--role=projections",
        &format!("--user={stranger}"),
    ]);
    let loop_back = manifest("Projection", "back", Some(a), json!({"source": source(b)}));
    let out = kubectl_stdin(&[&format!("--as={stranger}"), "apply", "-f", "-"], &loop_back);
    assert_denied(&out, &format!("{stranger} may not get configmaps {b}/cfg"));
    assert!(!stderr(&out).contains(&format!("{b}/first")), "{}", stderr(&out));
    let metrics = webhook.process.metrics();
    assert!(metrics.contains("projection_webhook_requests_total"), "{metrics}");
}

#[tokio::test]
async fn a_loop_through_a_kubeconfig_that_reaches_this_cluster_is_denied_once_its_identity_is_recorded() {
    let world = claims_world("webhook-self").await;
    let (a, b) = (world.a.name(), world.b.name());
    let source = cfg_in;

    // b/out copies a/cfg through the kubeconfig of Secret b/same-cluster: to b/cfg over there.
    assert_admitted(&apply(&manifest(
        "Projection",
        "out",
        Some(b),
        json!({"source": source(a), "destination": {"kubeConfig": {"secretRef": {"name": "same-cluster"}}}}),
    )));
    // a/back copies b/cfg here back onto a/cfg. While nothing says where that Secret leads, b/cfg
    // here is not out's copy: admitted (a dry run changes nothing).
    let back = manifest("Projection", "back", Some(a), json!({"source": source(b)}));
    let dry_run = || kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &back);
    wait_for("out in the webhook's index", TIMEOUT, || async {
        let overlapping = manifest(
            "Projection",
            "probe",
            Some(b),
            json!({"source": {"kind": "ConfigMap", "namespace": a, "name": "other"},
                   "destination": {"name": "cfg", "kubeConfig": {"secretRef": {"name": "same-cluster"}}}}),
        );
        let out = kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &overlapping);
        stderr(&out)
            .contains(&format!("is already claimed by Projection {b}/out"))
            .then_some(())
            .ok_or_else(|| stderr(&out))
    })
    .await;
    assert_admitted(&dry_run());

    // The controller records the identity of the cluster the copies went to when the credentials
    // may read it: here, this very cluster's (its kube-system UID). Recorded as the controller does,
    // through the status subresource.
    let this_cluster = kubectl_ok(&[
        "get",
        "namespace",
        "kube-system",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let status = json!({"status": {"writtenDestination": {
        "version": "v1", "kind": "ConfigMap", "name": "cfg",
        "cluster": "server-000000000000", "clusterIdentity": this_cluster.trim()}}});
    kubectl_ok(&[
        "-n",
        b,
        "patch",
        "projection",
        "out",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    let denial = wait_until_denied("the loop through the Secret denied", TIMEOUT, dry_run).await;
    assert!(
        denial.contains(&format!(
            "this spec closes a loop of copies, each one the source of the next: Projection {a}/back \
             copies ConfigMap {b}/cfg to ConfigMap {a}/cfg, then Projection {b}/out copies ConfigMap \
             {a}/cfg to ConfigMap {b}/cfg"
        )),
        "{denial}"
    );
    // Another Projection through the same Secret, not reconciled yet, lands where out recorded:
    // writing b/cfg here, it overlaps out.
    let again = manifest(
        "Projection",
        "again",
        Some(b),
        json!({"source": {"kind": "ConfigMap", "namespace": a, "name": "other"},
               "destination": {"name": "cfg", "kubeConfig": {"secretRef": {"name": "same-cluster"}}}}),
    );
    let err = assert_admitted(&kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &again));
    assert!(
        err.contains(&format!(
            "Warning: destination ConfigMap {b}/cfg is already claimed by Projection {b}/out"
        )),
        "{err}"
    );
}
