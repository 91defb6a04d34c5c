//! The controller running as a ServiceAccount whose ClusterRole mirrors the chart's, with
//! `supportedKinds` narrowed to ConfigMaps: a Projection of a Secret must say at once, in its
//! conditions and an event, that the operator's RBAC does not cover Secrets, while ConfigMaps are
//! mirrored; granting Secrets lets it recover.

use k8s_openapi::api::{
    core::v1::{ConfigMap, Secret, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use projection_tests::{
    ClusterScopedGuard, ServiceProcess, events_about, kubeconfig_path, kubectl_ok, metric_value, testenv_dir,
    wait_for, wait_for_event,
};
use serde_json::{Value, json};
use std::{path::PathBuf, time::Duration};

mod common;
use common::*;

/// The chart's controller ClusterRole (`charts/projection/templates/controller-rbac.yaml`) with
/// `supportedKinds` = `kinds` of the core group.
fn controller_rules(kinds: &[&str]) -> Value {
    json!([
        {"apiGroups": [""], "resources": kinds,
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["projection.sh"], "resources": ["projections", "clusterprojections"],
         "verbs": ["get", "list", "watch", "update", "patch"]},
        {"apiGroups": ["projection.sh"], "resources": ["projections/status", "clusterprojections/status"],
         "verbs": ["get", "update", "patch"]},
        {"apiGroups": ["projection.sh"],
         "resources": ["projections/finalizers", "clusterprojections/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apiregistration.k8s.io"], "resources": ["apiservices"],
         "verbs": ["get", "list", "watch"]},
    ])
}

/// A kubeconfig for the local cluster that authenticates with `token`.
fn kubeconfig_with_token(token: &str, file: &str) -> PathBuf {
    let admin = kube::config::Kubeconfig::read_from(kubeconfig_path()).expect("admin kubeconfig");
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .expect("a cluster in the admin kubeconfig");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
            "certificate-authority": cluster.certificate_authority,
        }}],
        "users": [{"name": "controller", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "controller"}}],
        "current-context": "local",
    });
    let path = testenv_dir().join(file);
    std::fs::write(&path, serde_json::to_string_pretty(&config).expect("json")).expect("kubeconfig written");
    path
}

#[tokio::test]
async fn a_kind_outside_the_controllers_rbac_is_reported_at_once() {
    let env = env("rbac").await;
    let (src, dst) = env.names();
    // The controller's own namespace: its ServiceAccount and (as in the chart) its Lease Role.
    let home = projection_tests::TestNamespace::create(&env.client, "rbac-home").await;
    let sa_namespace = home.name().to_owned();
    create(
        &env.api::<ServiceAccount>(&sa_namespace),
        json!({"metadata": {"name": "projection-controller"}}),
    )
    .await;
    let role_name = format!("projection-controller-{sa_namespace}");
    let _role_guards = [
        ClusterScopedGuard::new("clusterrolebindings", &role_name),
        ClusterScopedGuard::new("clusterroles", &role_name),
    ];
    let subject =
        json!([{"kind": "ServiceAccount", "name": "projection-controller", "namespace": sa_namespace}]);
    let cluster_roles: Api<ClusterRole> = Api::all(env.client.clone());
    create(
        &cluster_roles,
        json!({"metadata": {"name": role_name}, "rules": controller_rules(&["configmaps"])}),
    )
    .await;
    create(
        &Api::<ClusterRoleBinding>::all(env.client.clone()),
        json!({"metadata": {"name": role_name}, "subjects": subject,
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name}}),
    )
    .await;
    create(
        &env.api::<Role>(&sa_namespace),
        json!({"metadata": {"name": "leader-election"}, "rules": [{"apiGroups": ["coordination.k8s.io"],
               "resources": ["leases"], "verbs": ["get", "create", "update", "patch"]}]}),
    )
    .await;
    create(
        &env.api::<RoleBinding>(&sa_namespace),
        json!({"metadata": {"name": "leader-election"}, "subjects": subject,
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leader-election"}}),
    )
    .await;
    let token = kubectl_ok(&[
        "create",
        "token",
        "projection-controller",
        "-n",
        &sa_namespace,
        "--duration=1h",
    ]);
    let kubeconfig = kubeconfig_with_token(token.trim(), &format!("{sa_namespace}.kubeconfig"));
    let can_i = |verb: &str, resource: &str| {
        kubectl_ok(&[
            "auth",
            "can-i",
            verb,
            resource,
            "--all-namespaces",
            &format!("--as=system:serviceaccount:{sa_namespace}:projection-controller"),
        ])
    };
    assert_eq!(can_i("list", "configmaps").trim(), "yes");

    let mut controller = ServiceProcess::start_as(
        binary(),
        &[
            "--requeue-interval",
            "5s",
            "--leader-elect=true",
            "--leader-election-namespace",
            &sa_namespace,
        ],
        &kubeconfig,
        &[],
    );
    controller.wait_ready().await;

    create(
        &env.api::<Secret>(&src),
        json!({"metadata": {"name": "tls", "annotations": opted_in()}, "stringData": {"key": "v"}}),
    )
    .await;
    create(
        &env.api::<ConfigMap>(&src),
        json!({"metadata": {"name": "settings", "annotations": opted_in()}, "data": {"a": "1"}}),
    )
    .await;
    let projections = env.projections();
    let started = std::time::Instant::now();
    create(
        &projections,
        projection(
            "tls",
            json!({"version": "v1", "kind": "Secret", "namespace": src, "name": "tls"}),
            json!({}),
        ),
    )
    .await;
    create(
        &projections,
        projection("settings", cm_source(&src, "settings"), json!({})),
    )
    .await;

    let ready = wait_condition(&projections, "tls", "Ready", "False", Some("SourceForbidden")).await;
    let elapsed = started.elapsed();
    let message = ready["message"].as_str().unwrap_or_default().to_owned();
    for part in [
        "the controller may not list and watch secrets in all namespaces",
        "its RBAC does not cover secrets (Helm value supportedKinds",
        "secrets is forbidden: User \"system:serviceaccount:",
        "cannot list resource \"secrets\"",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert!(!message.contains("Status {"), "{message}");
    assert!(
        elapsed < Duration::from_secs(10),
        "reported after {elapsed:?}, not after a 30 s sync timeout"
    );
    let source_resolved = wait_condition(
        &projections,
        "tls",
        "SourceResolved",
        "False",
        Some("SourceForbidden"),
    )
    .await;
    assert_eq!(source_resolved["message"], ready["message"]);
    let note = wait_for_event(&env.client, &dst, "tls", "SourceForbidden").await;
    assert_eq!(note, message, "the event says what the condition says");
    let event = events_about(&env.client, &dst, "tls")
        .await
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("SourceForbidden"))
        .expect("the event");
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    // ConfigMaps are covered and mirrored in the same run.
    wait_ready(&projections, "settings").await;
    let copy = env.api::<ConfigMap>(&dst).get("settings").await.expect("copy");
    assert_eq!(data_of(&copy), json!({"a": "1"}));
    let text = controller.metrics();
    assert!(
        metric_value(
            &text,
            "projection_reconcile_total{kind=\"Projection\",result=\"source_error\"}"
        )
        .is_some_and(|v| v >= 1.0),
        "{text}"
    );

    // A cluster admin adds Secrets (supportedKinds): the Projection follows on its next retry.
    let grant = |kinds: &'static [&'static str]| {
        let (cluster_roles, role_name) = (cluster_roles.clone(), role_name.clone());
        async move {
            cluster_roles
                .patch(
                    &role_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"rules": controller_rules(kinds)})),
                )
                .await
                .expect("ClusterRole patched");
        }
    };
    grant(&["configmaps", "secrets"]).await;
    wait_ready(&projections, "tls").await;
    let copy = env.api::<Secret>(&dst).get("tls").await.expect("secret copy");
    assert!(copy.data.is_some_and(|d| d.contains_key("key")));

    // Taken away again mid-run, with the watches of Secrets already running: the next edit of the
    // source cannot be read. The Projection says so, retries with a growing delay (one INFO line
    // per retry, no WARN flood) and follows the grant again without a restart.
    grant(&["configmaps"]).await;
    wait_for("Secrets to be refused to the controller", TIMEOUT, || async {
        // `kubectl auth can-i` answers "no" with exit status 1.
        let answer = projection_tests::kubectl(&[
            "auth",
            "can-i",
            "get",
            "secrets",
            "--all-namespaces",
            &format!("--as=system:serviceaccount:{sa_namespace}:projection-controller"),
        ]);
        let said = String::from_utf8_lossy(&answer.stdout).trim().to_owned();
        (said == "no").then_some(()).ok_or(said)
    })
    .await;
    let loud_before = loud_lines_about(&controller, "tls");
    merge(
        &env.api::<Secret>(&src),
        "tls",
        json!({"stringData": {"key": "v2"}}),
    )
    .await;
    let refused = wait_condition(&projections, "tls", "Ready", "False", Some("SourceForbidden")).await;
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("secrets \"tls\" is forbidden")),
        "{refused}"
    );
    let name = format!("{dst}/tls");
    wait_retry_delay(&controller, &name, "2s").await;
    let retries = retries_of(&controller, &name);
    let loud = loud_lines_about(&controller, "tls") - loud_before;
    assert!(
        loud <= 2,
        "{loud} WARN/ERROR lines about the refused source; retries: {retries:?}"
    );

    grant(&["configmaps", "secrets"]).await;
    wait_object(
        &env.api::<Secret>(&dst),
        "tls",
        "the copy with the edit made while refused",
        |copy: &Secret| {
            copy.data
                .as_ref()
                .and_then(|d| d.get("key"))
                .is_some_and(|v| v.0 == b"v2")
        },
    )
    .await;
    wait_ready(&projections, "tls").await;
    assert!(controller.is_running(), "no restart needed");

    env.finish().await;
    drop(controller);
    home.delete_and_wait(&env.client).await;
}
