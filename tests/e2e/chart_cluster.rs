//! The chart on the local control plane. No kubelet runs pods here, so the Deployments never start:
//! instead the controller and the webhook run as local processes that authenticate with tokens of
//! the chart's ServiceAccounts and take the args the chart renders for them, and an EndpointSlice
//! routes the chart's webhook Service to the local webhook. The apiserver then calls it exactly as
//! it would call the pods: through the Service, checking the certificate against the caBundle.
//!
//! Every test here installs a release whose webhook configurations fail closed for all Projection
//! writes, so they run one at a time (`exclusive`).

use projection_tests::{
    ServiceProcess, TestNamespace,
    chart::{
        Release, Rendered, StandInCertManager, args_of, can, can_named, exists, helm_ok, host_address,
        render, route_service_to, self_signed, write_tls_secret,
    },
    client, control_plane_bin, exclusive, free_port, install_crds, kubectl, kubectl_ok, kubectl_stdin,
    service_account_kubeconfig, testenv_dir, wait_crd_established, wait_for, wait_for_event,
};
use serde_json::{Value, json};
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// (user, verb, API group, resource, namespace, expected answer).
type ServiceAccess<'a> = (&'a str, &'a str, &'a str, &'a str, Option<&'a str>, bool);

const TIMEOUT: Duration = Duration::from_secs(30);

/// A binary of the workspace, built next to this test (`cargo test --workspace` builds them).
fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace` (or the whole suite with scripts/test.sh)",
        path.display()
    );
    path
}

fn rendered(release: &Release, values: &[(&str, Value)]) -> Rendered {
    render(&release.name, &release.namespace, values).expect("the installed values render")
}

/// The args the chart gives a Deployment's container, with the listening addresses moved to free
/// local ports (`ServiceProcess` adds the probe and metrics ones) and certificate files replaced.
fn local_args(deployment: &Value, replace: &[(&str, String)]) -> Vec<String> {
    args_of(deployment)
        .into_iter()
        .filter(|a| {
            !a.starts_with("--metrics-bind-address=") && !a.starts_with("--health-probe-bind-address=")
        })
        .map(|a| {
            replace
                .iter()
                .find(|(flag, _)| a.starts_with(&format!("{flag}=")))
                .map_or(a.clone(), |(flag, value)| format!("{flag}={value}"))
        })
        .collect()
}

fn service_account_of(deployment: &Value) -> String {
    deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the pod names its ServiceAccount")
        .to_owned()
}

/// Starts a component's Deployment as a local process authenticated as its ServiceAccount.
async fn start_as_pod(
    binary: &str,
    deployment: &Value,
    namespace: &str,
    replace: &[(&str, String)],
) -> ServiceProcess {
    let kubeconfig = service_account_kubeconfig(namespace, &service_account_of(deployment));
    let args = local_args(deployment, replace);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut process = ServiceProcess::start_as(
        &workspace_binary(binary),
        &args,
        &kubeconfig,
        &[("POD_NAMESPACE", namespace)],
    );
    process.wait_ready().await;
    process
}

fn apply(yaml: &str) -> std::process::Output {
    kubectl_stdin(&["apply", "-f", "-"], yaml)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn webhook_ca_bundles(name: &str) -> Vec<String> {
    ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"]
        .iter()
        .map(|kind| {
            kubectl_ok(&[
                "get",
                kind,
                name,
                "-o",
                "jsonpath={.webhooks[0].clientConfig.caBundle}",
            ])
        })
        .collect()
}

/// A bad spec, refused by the webhook (not by the CRD schema): the source names a cluster-scoped
/// kind.
fn projection_of_a_namespace(namespace: &str) -> String {
    format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: bad, namespace: {namespace}}}\n\
         spec:\n  source: {{version: v1, kind: Namespace, namespace: default, name: default}}\n"
    )
}

/// Proves that the apiserver reaches the webhook through the chart's Service and trusts its
/// certificate: a spec only the webhook refuses is refused with the webhook's message.
async fn assert_webhook_answers_through_the_service(namespace: &str) {
    wait_for(
        "the webhook to refuse a cluster-scoped source",
        TIMEOUT,
        || async {
            let out = apply(&projection_of_a_namespace(namespace));
            let err = stderr(&out);
            if !out.status.success() && err.contains("denied the request") && err.contains("cluster-scoped") {
                Ok(())
            } else {
                Err(format!("exit {}: {err}", out.status))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn install_upgrade_uninstall_in_every_certificate_mode() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    install_integration_crds(&client).await;
    for mode in ["self-managed", "provided", "cert-manager"] {
        let ns = TestNamespace::create(&client, &format!("chart-{mode}")).await;
        let release_name = format!("projection-{mode}");
        // The optional objects too, so the apiserver (and the ServiceMonitor CRD) validate them.
        let mut values = vec![
            ("webhook.certificate.mode", json!(mode)),
            ("metrics.serviceMonitor.enabled", json!(true)),
            ("networkPolicy.enabled", json!(true)),
        ];
        if mode == "provided" {
            // The user's own Secret and CA, made before the install.
            let service = format!("{release_name}-webhook");
            let dns = vec![format!("{service}.{}.svc", ns.name())];
            let (cert, key) = self_signed(&testenv_dir().join(format!("provided-{}", ns.name())), &dns);
            write_tls_secret(ns.name(), "my-webhook-tls", &cert, &key, &cert);
            values.push(("webhook.certificate.provided.secretName", json!("my-webhook-tls")));
            values.push(("webhook.certificate.provided.caBundle", json!(cert)));
        }
        let release = Release::install(&release_name, ns.name(), &values);
        let r = rendered(&release, &values);
        // Everything rendered was created.
        for object in &r.0 {
            let kind = object["kind"].as_str().expect("kind");
            let name = object["metadata"]["name"].as_str().expect("name");
            let namespace = object["metadata"]["namespace"].as_str();
            assert!(
                exists(kind, name, namespace),
                "{mode}: {kind} {name} was not created"
            );
        }
        match mode {
            "cert-manager" => {
                // cert-manager's own schema accepted them.
                assert!(exists(
                    "issuer",
                    &format!("{release_name}-webhook-selfsigned"),
                    Some(ns.name())
                ));
                assert!(exists(
                    "certificate",
                    &format!("{release_name}-webhook"),
                    Some(ns.name())
                ));
            }
            "provided" => {
                let bundles = webhook_ca_bundles(&format!("{release_name}-webhook"));
                assert!(bundles.iter().all(|b| !b.is_empty()), "{bundles:?}");
            }
            _ => {}
        }

        // An upgrade changes what it should (and nothing breaks on the way).
        let mut upgraded = values.clone();
        upgraded.push(("webhook.tenantMode", json!(true)));
        upgraded.push(("sourceMode", json!("permissive")));
        release.upgrade(&upgraded);
        let args = kubectl_ok(&[
            "get",
            "deployment",
            &format!("{release_name}-webhook"),
            "-n",
            ns.name(),
            "-o",
            "jsonpath={.spec.template.spec.containers[0].args}",
        ]);
        assert!(args.contains("\"--tenant-mode\""), "{args}");
        assert!(args.contains("--source-mode=permissive"), "{args}");

        release.uninstall();
        for object in &r.0 {
            let kind = object["kind"].as_str().expect("kind");
            let name = object["metadata"]["name"].as_str().expect("name");
            let namespace = object["metadata"]["namespace"].as_str();
            assert!(
                !exists(kind, name, namespace),
                "{mode}: {kind} {name} is left after uninstall"
            );
        }
        // Not ours: the user's Secret survives the uninstall. The CRDs stay too (Helm never deletes crds/).
        if mode == "provided" {
            assert!(exists("secret", "my-webhook-tls", Some(ns.name())));
        }
        assert!(exists("crd", "projections.projection.sh", None));
        ns.delete_and_wait(&client).await;
    }
}

/// The CRDs of cert-manager and of prometheus-operator's ServiceMonitor (from their Go modules,
/// cached by `tests/control-plane/build.sh`), so the apiserver validates what the chart renders for
/// them.
async fn install_integration_crds(client: &kube::Client) {
    for folder in ["cert-manager-crds", "prometheus-operator-crds"] {
        // The trailing slash makes kubectl follow the link to the folder (the cache keeps the files).
        let dir = format!("{}/", control_plane_bin().join(folder).display());
        kubectl_ok(&["apply", "--server-side", "--force-conflicts", "-f", &dir]);
    }
    for crd in [
        "certificates.cert-manager.io",
        "issuers.cert-manager.io",
        "servicemonitors.monitoring.coreos.com",
    ] {
        wait_crd_established(client, crd).await;
    }
}

#[tokio::test]
async fn services_run_as_the_chart_service_accounts_with_narrowed_kinds() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let system = TestNamespace::create(&client, "chart-sa").await;
    let values = vec![
        (
            "supportedKinds",
            json!([{"apiGroup": "", "resources": ["configmaps"]}]),
        ),
        ("controller.leaderElection.leaseDuration", json!("6s")),
    ];
    let release = Release::install("projection-sa", system.name(), &values);
    let r = rendered(&release, &values);
    let webhook_deployment = r.get("Deployment", "projection-sa-webhook");
    let controller_deployment = r.get("Deployment", "projection-sa-controller");

    // The webhook, self-managed: it creates its certificate and sets its own caBundle.
    let port = free_port();
    let mut webhook = start_as_pod(
        "projection-webhook",
        webhook_deployment,
        system.name(),
        &[("--bind-address", format!("0.0.0.0:{port}"))],
    )
    .await;
    route_service_to(
        system.name(),
        "projection-sa-webhook",
        "https",
        &host_address(),
        port,
    );
    wait_for("the webhook to set both caBundles", TIMEOUT, || async {
        let bundles = webhook_ca_bundles("projection-sa-webhook");
        if bundles.iter().all(|b| !b.is_empty()) && bundles[0] == bundles[1] {
            Ok(())
        } else {
            Err(format!("{bundles:?}"))
        }
    })
    .await;
    let mut controller =
        start_as_pod("projection-controller", controller_deployment, system.name(), &[]).await;

    let source = TestNamespace::create(&client, "chart-sa-source").await;
    let team = TestNamespace::create(&client, "chart-sa-team").await;
    assert_webhook_answers_through_the_service(team.name()).await;

    // NOTES.txt's first Projection, as printed, with the namespaces of this test.
    kubectl_ok(&[
        "-n",
        source.name(),
        "create",
        "configmap",
        "app-settings",
        "--from-literal=color=blue",
    ]);
    kubectl_ok(&[
        "-n",
        source.name(),
        "annotate",
        "configmap",
        "app-settings",
        "projection.sh/projectable=true",
    ]);
    let notes = helm_ok(&["get", "notes", &release.name, "-n", system.name()]);
    let first = first_projection_of(&notes)
        .replace("namespace: default", &format!("namespace: {}", source.name()))
        .replace("namespace: team-a", &format!("namespace: {}", team.name()));
    let out = apply(&first);
    assert!(
        out.status.success(),
        "NOTES' Projection was refused: {}",
        stderr(&out)
    );
    wait_for_copy_color(team.name(), "blue").await;
    let ready = kubectl_ok(&[
        "-n",
        team.name(),
        "get",
        "projection",
        "app-settings",
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
    ]);
    assert_eq!(ready, "True");
    // Events and the Lease: what a narrowed supportedKinds must not break.
    wait_for_event(&client, team.name(), "app-settings", "Projected").await;
    let holder = kubectl_ok(&[
        "-n",
        system.name(),
        "get",
        "lease",
        "projection-controller-leader",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(
        !holder.is_empty(),
        "the controller holds the Lease in the release namespace"
    );

    // An edit of the source reaches the copy.
    kubectl_ok(&[
        "-n",
        source.name(),
        "patch",
        "configmap",
        "app-settings",
        "-p",
        r#"{"data":{"color":"green"}}"#,
    ]);
    wait_for_copy_color(team.name(), "green").await;

    // A ClusterProjection fans out to labelled namespaces.
    let tier = format!("chart-sa-{}", std::process::id());
    let prod_a = TestNamespace::create(&client, "chart-sa-prod-a").await;
    let prod_b = TestNamespace::create(&client, "chart-sa-prod-b").await;
    for ns in [&prod_a, &prod_b] {
        kubectl_ok(&["label", "namespace", ns.name(), &format!("tier={tier}")]);
    }
    let cluster_projection = format!(
        "apiVersion: projection.sh/v1\nkind: ClusterProjection\nmetadata: {{name: {tier}}}\nspec:\n  \
         source: {{kind: ConfigMap, namespace: {src}, name: app-settings}}\n  \
         destination: {{namespaceSelector: {{matchLabels: {{tier: {tier}}}}}}}\n",
        src = source.name()
    );
    let out = apply(&cluster_projection);
    assert!(out.status.success(), "{}", stderr(&out));
    for ns in [&prod_a, &prod_b] {
        wait_for("the fan-out copy", TIMEOUT, || async {
            let out = kubectl(&["-n", ns.name(), "get", "configmap", "app-settings", "-o", "name"]);
            if out.status.success() {
                Ok(())
            } else {
                Err(stderr(&out))
            }
        })
        .await;
    }

    // Outside supportedKinds: a Secret. Neither service may read it, and the user hears why at once.
    kubectl_ok(&[
        "-n",
        source.name(),
        "create",
        "secret",
        "generic",
        "token",
        "--from-literal=t=x",
    ]);
    let out = apply(&format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: token, namespace: {}}}\n\
         spec:\n  source: {{version: v1, kind: Secret, namespace: {}, name: token}}\n",
        team.name(),
        source.name()
    ));
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "a Secret outside supportedKinds was admitted"
    );
    assert!(err.contains("secrets") && err.contains("forbidden"), "{err}");

    // Deleting the Projection removes its copy (the finalizer runs as the ServiceAccount).
    kubectl_ok(&[
        "-n",
        team.name(),
        "delete",
        "projection",
        "app-settings",
        "--wait=true",
        "--timeout=30s",
    ]);
    assert!(!exists("configmap", "app-settings", Some(team.name())));
    kubectl_ok(&[
        "delete",
        "clusterprojection",
        &tier,
        "--wait=true",
        "--timeout=30s",
    ]);
    for ns in [&prod_a, &prod_b] {
        assert!(
            !exists("configmap", "app-settings", Some(ns.name())),
            "fan-out copies are removed"
        );
    }

    // Nothing failed for want of a permission.
    let controller_log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    assert!(
        !controller_log.contains("is forbidden"),
        "controller log:\n{controller_log}"
    );
    let metrics = controller.metrics();
    assert!(metrics.contains("projection_"), "the controller serves metrics");

    for ns in [team, prod_a, prod_b, source] {
        ns.delete_and_wait(&client).await;
    }
    controller.terminate();
    // The webhook goes last with its registration: with failurePolicy Fail it guards every write.
    release.uninstall();
    webhook.terminate();
    system.delete_and_wait(&client).await;
}

/// Waits until the copy `app-settings` in `namespace` has `data.color` = `color`.
async fn wait_for_copy_color(namespace: &str, color: &str) {
    wait_for(
        &format!("the copy of app-settings with color {color}"),
        TIMEOUT,
        || async {
            let out = kubectl(&[
                "-n",
                namespace,
                "get",
                "configmap",
                "app-settings",
                "-o",
                "jsonpath={.data.color}",
            ]);
            let seen = String::from_utf8_lossy(&out.stdout);
            if seen == color {
                Ok(())
            } else {
                Err(format!("color {seen:?}: {}", stderr(&out)))
            }
        },
    )
    .await;
}

/// The YAML document NOTES.txt tells the user to save: from `apiVersion:` to the next blank line.
fn first_projection_of(notes: &str) -> String {
    let start = notes
        .find("apiVersion: projection.sh/v1")
        .unwrap_or_else(|| panic!("NOTES.txt shows no Projection:\n{notes}"));
    let rest = &notes[start..];
    let end = rest.find("\n\n").unwrap_or(rest.len());
    format!("{}\n", &rest[..end])
}

#[tokio::test]
async fn cert_manager_mode_serves_the_issued_certificate_through_the_service() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    install_integration_crds(&client).await;
    let system = TestNamespace::create(&client, "chart-cm").await;
    let values = vec![("webhook.certificate.mode", json!("cert-manager"))];
    let release = Release::install("projection-cm", system.name(), &values);
    let r = rendered(&release, &values);
    let webhook_deployment = r.get("Deployment", "projection-cm-webhook");

    // The stand-in issues the Certificate and injects its CA where the annotation points.
    let work = testenv_dir().join(format!("cert-manager-{}", system.name()));
    let issued = StandInCertManager::issue(system.name(), "projection-cm-webhook", &work);
    assert_eq!(
        issued.injected,
        [
            "validatingwebhookconfigurations/projection-cm-webhook",
            "mutatingwebhookconfigurations/projection-cm-webhook"
        ],
        "the chart's inject-ca-from annotations name the chart's Certificate"
    );
    let volume_secret = &webhook_deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"];
    assert_eq!(
        *volume_secret, issued.secret_name,
        "the pods mount the issued Secret"
    );

    // The webhook serves the Secret's files, as the kubelet would mount them.
    let mount = work.join("mount");
    std::fs::create_dir_all(&mount).expect("mount folder");
    std::fs::write(mount.join("tls.crt"), &issued.cert_pem).expect("write");
    std::fs::write(mount.join("tls.key"), &issued.key_pem).expect("write");
    let port = free_port();
    let mut webhook = start_as_pod(
        "projection-webhook",
        webhook_deployment,
        system.name(),
        &[
            ("--bind-address", format!("0.0.0.0:{port}")),
            (
                "--tls-cert-file",
                mount.join("tls.crt").to_string_lossy().into_owned(),
            ),
            (
                "--tls-key-file",
                mount.join("tls.key").to_string_lossy().into_owned(),
            ),
        ],
    )
    .await;
    route_service_to(
        system.name(),
        "projection-cm-webhook",
        "https",
        &host_address(),
        port,
    );
    let team = TestNamespace::create(&client, "chart-cm-team").await;
    assert_webhook_answers_through_the_service(team.name()).await;
    // A good spec is admitted (with the webhook's warning that the source is not there yet).
    let out = apply(&format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: good, namespace: {0}}}\n\
         spec:\n  source: {{version: v1, kind: ConfigMap, namespace: {1}, name: not-yet}}\n",
        team.name(),
        system.name()
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("does not exist (yet)"), "{}", stderr(&out));
    // No controller runs: remove the Projection's finalizer-free object directly.
    kubectl_ok(&["-n", team.name(), "delete", "projection", "good", "--wait=false"]);

    release.uninstall();
    webhook.terminate();
    for ns in [team, system] {
        ns.delete_and_wait(&client).await;
    }
}

#[tokio::test]
async fn rbac_matrix_through_subject_access_reviews() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let system = TestNamespace::create(&client, "chart-rbac").await;
    let values = vec![(
        "supportedKinds",
        json!([{"apiGroup": "", "resources": ["configmaps"]}]),
    )];
    let release = Release::install("projection-rbac", system.name(), &values);
    let (a_ns, b_ns) = (
        TestNamespace::create(&client, "chart-rbac-a").await,
        TestNamespace::create(&client, "chart-rbac-b").await,
    );
    let (a, b, sys) = (a_ns.name(), b_ns.name(), system.name());
    let run = std::process::id();
    let (editor, viewer, admin, platform) = (
        format!("editor-{run}"),
        format!("viewer-{run}"),
        format!("admin-{run}"),
        format!("platform-{run}"),
    );
    kubectl_ok(&[
        "-n",
        a,
        "create",
        "rolebinding",
        "editor",
        "--clusterrole=edit",
        &format!("--user={editor}"),
    ]);
    kubectl_ok(&[
        "-n",
        a,
        "create",
        "rolebinding",
        "viewer",
        "--clusterrole=view",
        &format!("--user={viewer}"),
    ]);
    kubectl_ok(&[
        "-n",
        a,
        "create",
        "rolebinding",
        "admin",
        "--clusterrole=admin",
        &format!("--user={admin}"),
    ]);
    let binding = format!("projection-rbac-platform-{run}");
    let _binding = projection_tests::ClusterScopedGuard::new("clusterrolebinding", &binding);
    kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &binding,
        "--clusterrole=projection-rbac-clusterprojections-admin",
        &format!("--user={platform}"),
    ]);
    let users = ["system:authenticated"];
    // The aggregation controller (kube-controller-manager) folds the roles into edit/view/admin.
    wait_for("the Projection roles to be aggregated", TIMEOUT, || async {
        let all = [&editor, &viewer, &admin]
            .iter()
            .all(|u| can(u, &users, "list", "projection.sh", "projections", Some(a)));
        if all { Ok(()) } else { Err("not yet".to_owned()) }
    })
    .await;

    let p = "projection.sh";
    #[rustfmt::skip]
    let people: Vec<(&str, &str, &str, Option<&str>, bool)> = vec![
        // A namespace editor manages Projections in their namespace, and nowhere else.
        (&editor, "create", "projections", Some(a), true),
        (&editor, "update", "projections", Some(a), true),
        (&editor, "delete", "projections", Some(a), true),
        (&editor, "deletecollection", "projections", Some(a), true),
        (&editor, "get", "projections/status", Some(a), true),
        (&editor, "update", "projections/status", Some(a), false),
        (&editor, "create", "projections", Some(b), false),
        (&editor, "list", "projections", None, false),
        (&editor, "create", "clusterprojections", None, false),
        (&editor, "list", "clusterprojections", None, false),
        // A namespace admin likewise.
        (&admin, "create", "projections", Some(a), true),
        (&admin, "create", "projections", Some(b), false),
        (&admin, "create", "clusterprojections", None, false),
        // A viewer only reads.
        (&viewer, "get", "projections", Some(a), true),
        (&viewer, "watch", "projections", Some(a), true),
        (&viewer, "get", "projections/status", Some(a), true),
        (&viewer, "create", "projections", Some(a), false),
        (&viewer, "delete", "projections", Some(a), false),
        (&viewer, "get", "projections", Some(b), false),
        (&viewer, "get", "clusterprojections", None, false),
        // ClusterProjections only through the explicit binding.
        (&platform, "create", "clusterprojections", None, true),
        (&platform, "delete", "clusterprojections", None, true),
        (&platform, "get", "clusterprojections/status", None, true),
        (&platform, "create", "projections", Some(a), false),
    ];
    let mut wrong = Vec::new();
    for (user, verb, resource, namespace, expected) in people {
        if can(user, &users, verb, p, resource, namespace) != expected {
            wrong.push(format!(
                "{user} {verb} {resource} in {namespace:?}: expected {expected}"
            ));
        }
    }

    // The services' ServiceAccounts: what the chart grants with supportedKinds = [configmaps].
    let controller = format!("system:serviceaccount:{sys}:projection-rbac-controller");
    let webhook = format!("system:serviceaccount:{sys}:projection-rbac-webhook");
    let sa_groups = ["system:serviceaccounts", "system:authenticated"];
    #[rustfmt::skip]
    let services: Vec<ServiceAccess<'_>> = vec![
        (&controller, "patch", "", "configmaps", Some(b), true),
        (&controller, "delete", "", "configmaps", Some(b), true),
        (&controller, "get", "", "secrets", Some(b), false),
        (&controller, "get", "apps", "deployments", Some(b), false),
        (&controller, "create", "events.k8s.io", "events", Some(b), true),
        (&controller, "watch", "", "namespaces", None, true),
        (&controller, "watch", "apiextensions.k8s.io", "customresourcedefinitions", None, true),
        (&controller, "watch", "apiregistration.k8s.io", "apiservices", None, true),
        (&controller, "patch", p, "projections", Some(b), true),
        (&controller, "patch", p, "projections/status", Some(b), true),
        (&controller, "patch", p, "clusterprojections/status", None, true),
        (&controller, "create", p, "projections", Some(b), false),
        (&controller, "delete", p, "clusterprojections", None, false),
        (&controller, "update", "coordination.k8s.io", "leases", Some(sys), true),
        (&controller, "update", "coordination.k8s.io", "leases", Some(b), false),
        (&controller, "create", "authorization.k8s.io", "subjectaccessreviews", None, false),
        (&webhook, "create", "authorization.k8s.io", "subjectaccessreviews", None, true),
        (&webhook, "get", "", "configmaps", Some(b), true),
        (&webhook, "list", "", "configmaps", Some(b), false),
        (&webhook, "patch", "", "configmaps", Some(b), false),
        (&webhook, "get", "", "secrets", Some(b), false),
        (&webhook, "create", "", "secrets", Some(sys), true),
        (&webhook, "create", "", "secrets", Some(b), false),
        (&webhook, "patch", p, "projections", Some(b), false),
        (&webhook, "create", "events.k8s.io", "events", Some(b), false),
    ];
    for (user, verb, group, resource, namespace, expected) in services {
        if can(user, &sa_groups, verb, group, resource, namespace) != expected {
            wrong.push(format!(
                "{user} {verb} {group}/{resource} in {namespace:?}: expected {expected}"
            ));
        }
    }
    // Name-scoped grants: its own Secret and webhook configurations only.
    for (name, expected) in [("projection-rbac-webhook-tls", true), ("someone-elses", false)] {
        if can_named(
            &webhook,
            &sa_groups,
            "update",
            "",
            "secrets",
            Some(sys),
            Some(name),
        ) != expected
        {
            wrong.push(format!("webhook update secret {name}: expected {expected}"));
        }
    }
    for (name, expected) in [("projection-rbac-webhook", true), ("someone-elses", false)] {
        for resource in ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"] {
            let allowed = can_named(
                &webhook,
                &sa_groups,
                "patch",
                "admissionregistration.k8s.io",
                resource,
                None,
                Some(name),
            );
            if allowed != expected {
                wrong.push(format!("webhook patch {resource} {name}: expected {expected}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "RBAC differs from the model:\n{}",
        wrong.join("\n")
    );

    // The built-in roles never gain ClusterProjections through aggregation.
    for role in ["edit", "admin", "view"] {
        let rules = kubectl_ok(&["get", "clusterrole", role, "-o", "jsonpath={.rules}"]);
        assert!(!rules.contains("clusterprojections"), "{role}: {rules}");
    }
    release.uninstall();
    for ns in [a_ns, b_ns, system] {
        ns.delete_and_wait(&client).await;
    }
}
