//! The chart's RBAC on the local control plane: what the chart grants users and its own
//! ServiceAccounts, answered by the apiserver's authorizer (SubjectAccessReviews). What the
//! services do with those rights on the node is in chart_node.
//!
//! The release here registers webhooks that fail closed for all Projection writes, so the test
//! runs alone (`exclusive`).

use projection_tests::{
    TestNamespace,
    chart::{Release, can},
    client, exclusive, install_crds, kubectl_ok, wait_for,
};
use serde_json::json;
use std::time::Duration;

/// (user, verb, API group, resource, namespace, expected answer).
type ServiceAccess<'a> = (&'a str, &'a str, &'a str, &'a str, Option<&'a str>, bool);

const TIMEOUT: Duration = Duration::from_secs(30);

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
            .all(|u| can(u, &users, "list", "projection.sh", "projections", Some(a), None));
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
        if can(user, &users, verb, p, resource, namespace, None) != expected {
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
        (&controller, "create", "authorization.k8s.io", "subjectaccessreviews", None, true),
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
        if can(user, &sa_groups, verb, group, resource, namespace, None) != expected {
            wrong.push(format!(
                "{user} {verb} {group}/{resource} in {namespace:?}: expected {expected}"
            ));
        }
    }
    // Name-scoped grants: its own Secret and webhook configurations only.
    for (name, expected) in [("projection-rbac-webhook-tls", true), ("someone-elses", false)] {
        if can(
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
            let allowed = can(
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
