//! The chart's RBAC on the local control plane: what the chart grants users and its own
//! ServiceAccounts, answered by the apiserver's authorizer (SubjectAccessReviews). What the
//! services do with those rights on the node is in chart_node.
//!
//! The release here registers webhooks that fail closed for all Projection writes, so the test
//! runs alone (`exclusive`).

use kube::Client;
use projection_tests::{
    TestNamespace,
    chart::{Release, can},
    client, client_as, exclusive, install_crds, kubectl_ok, patch_webhook_configuration, wait_for,
};
use serde_json::{Value, json};
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
        // On v1.36 copies are created and updated as their author: the controller itself may not
        // create or update the projected kinds, only impersonate for those verbs on them.
        (&controller, "create", "", "configmaps", Some(b), false),
        (&controller, "update", "", "configmaps", Some(b), false),
        (&controller, "impersonate-on:user-info:create", "", "configmaps", Some(b), true),
        (&controller, "impersonate-on:user-info:patch", "", "configmaps", Some(b), true),
        (&controller, "impersonate-on:serviceaccount:create", "", "configmaps", Some(b), true),
        (&controller, "impersonate-on:user-info:create", "", "secrets", Some(b), false),
        (&controller, "impersonate-on:user-info:delete", "", "configmaps", Some(b), false),
        (&controller, "impersonate-on:user-info:get", "", "configmaps", Some(b), false),
        (&controller, "impersonate:user-info", "authentication.k8s.io", "users", None, true),
        (&controller, "impersonate:user-info", "authentication.k8s.io", "groups", None, true),
        (&controller, "impersonate:serviceaccount", "authentication.k8s.io", "serviceaccounts", Some(b), true),
        (&controller, "impersonate", "", "users", None, false),
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
        // The default webhook authenticates no caller, so it never reads a source: no right to.
        (&webhook, "get", "", "configmaps", Some(b), false),
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

/// The webhook's ServiceAccount in the self-managed certificate mode, with client authentication
/// configured: it may `get` the supported kinds (it reads sources for authenticated callers), and
/// the chart's ValidatingAdmissionPolicy lets it change only the `caBundle` of its two webhook
/// configurations, though RBAC lets it `patch` them. Impersonated (`--as`), as a stolen token.
#[tokio::test]
async fn the_webhooks_service_account_may_change_only_the_ca_bundle_of_its_configurations() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let system = TestNamespace::create(&client, "chart-cfg").await;
    let sys = system.name();
    let values = vec![
        (
            "supportedKinds",
            json!([{"apiGroup": "", "resources": ["configmaps"]}]),
        ),
        ("webhook.clientAuth.configMapName", json!("apiserver-client-ca")),
    ];
    let release = Release::install("projection-cfg", sys, &values);
    let account = format!("system:serviceaccount:{sys}:projection-cfg-webhook");
    let sa_groups = ["system:serviceaccounts", "system:authenticated"];
    assert!(
        can(
            &account,
            &sa_groups,
            "get",
            "",
            "configmaps",
            Some("default"),
            None
        ),
        "with webhook.clientAuth the webhook reads sources, so it may get them"
    );
    assert!(!can(
        &account,
        &sa_groups,
        "get",
        "",
        "secrets",
        Some("default"),
        None
    ));

    let thief = client_as(&account, &["system:serviceaccounts"]).await;
    let name = "projection-cfg-webhook";
    // The configuration's webhooks as they are, with `change` made to the first.
    let webhooks_with = |plural: &str, change: &dyn Fn(&mut Value)| {
        let current: Value =
            serde_json::from_str(&kubectl_ok(&["get", plural, name, "-o", "json"])).expect("JSON");
        let mut webhooks = current["webhooks"].clone();
        change(&mut webhooks[0]);
        json!({"webhooks": webhooks})
    };
    let widen = |w: &mut Value| w["rules"][0]["resources"] = json!(["*"]);
    let refused = format!("{account} may change only webhooks[*].clientConfig.caBundle");
    // The policy takes a moment to be loaded: a dry run changes nothing while it is not.
    let probe = webhooks_with("validatingwebhookconfigurations", &widen);
    wait_for("the configuration policy loaded", TIMEOUT, || async {
        match patch_webhook_configuration(&thief, "validatingwebhookconfigurations", name, &probe, true).await
        {
            Err(message) if message.contains(&refused) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    for plural in ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"] {
        let other_service = |w: &mut Value| w["clientConfig"]["service"]["name"] = json!("elsewhere");
        let selector = |w: &mut Value| w["namespaceSelector"] = json!({"matchLabels": {"a": "b"}});
        let fail_open = |w: &mut Value| w["failurePolicy"] = json!("Ignore");
        for (what, patch) in [
            ("a wider rule", webhooks_with(plural, &widen)),
            ("another service", webhooks_with(plural, &other_service)),
            ("a namespace selector", webhooks_with(plural, &selector)),
            ("failing open", webhooks_with(plural, &fail_open)),
            (
                "an annotation",
                json!({"metadata": {"annotations": {"cert-manager.io/inject-ca-from": "x/y"}}}),
            ),
        ] {
            let answer = patch_webhook_configuration(&thief, plural, name, &patch, false).await;
            match answer {
                Err(message) => assert!(message.contains(&refused), "{plural}: {what}: {message}"),
                Ok(()) => panic!("{plural}: {what} was admitted"),
            }
        }
        let bundle = |w: &mut Value| w["clientConfig"]["caBundle"] = json!("Tm90IG91ciBDQQ==");
        patch_webhook_configuration(&thief, plural, name, &webhooks_with(plural, &bundle), false)
            .await
            .unwrap_or_else(|message| panic!("{plural}: the caBundle: {message}"));
        let set = kubectl_ok(&[
            "get",
            plural,
            name,
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ]);
        assert_eq!(set, "Tm90IG91ciBDQQ==");
    }
    // Others (here the admin) are not held by it.
    kubectl_ok(&[
        "label",
        "validatingwebhookconfiguration",
        "projection-cfg-webhook",
        "checked=yes",
    ]);
    release.uninstall();
    system.delete_and_wait(&client).await;
}

/// The API Priority and Fairness level the apiserver classified a request of `client`'s into (the
/// UID it answers in `X-Kubernetes-PF-PriorityLevel-UID`, as a level's name), and the answer's
/// status. A Lease is written by server-side apply, as the controller renews its own.
async fn priority_level_of(client: &Client, method: &str, path: &str, body: Option<Value>) -> (String, u16) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/apply-patch+yaml")
        .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())
        .expect("a request");
    let response = client.send(request.map(Into::into)).await.expect("an answer");
    let uid = response
        .headers()
        .get("x-kubernetes-pf-prioritylevel-uid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let levels: Value =
        serde_json::from_str(&kubectl_ok(&["get", "prioritylevelconfigurations", "-o", "json"]))
            .expect("JSON");
    let name = levels["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|level| level["metadata"]["uid"] == uid.as_str())
        .and_then(|level| level["metadata"]["name"].as_str())
        .unwrap_or("none")
        .to_owned();
    (name, response.status().as_u16())
}

#[tokio::test]
async fn the_controllers_lease_requests_have_a_priority_level_of_their_own() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let system = TestNamespace::create(&client, "chart-apf").await;
    let sys = system.name();
    let values = vec![(
        "supportedKinds",
        json!([{"apiGroup": "", "resources": ["configmaps"]}]),
    )];
    let release = Release::install("projection-apf", sys, &values);
    let account = format!("system:serviceaccount:{sys}:projection-apf-controller");
    let namespace_group = format!("system:serviceaccounts:{sys}");
    let controller = client_as(&account, &["system:serviceaccounts", &namespace_group]).await;
    let lease = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{sys}/leases/apf-probe?fieldManager=projection-controller"
    );
    let body = || {
        Some(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "apf-probe", "namespace": sys},
            "spec": {"holderIdentity": "apf-probe", "leaseDurationSeconds": 15},
        }))
    };
    let configmaps = format!("/api/v1/namespaces/{sys}/configmaps");
    // A FlowSchema is matched once the apiserver's APF controller has read it (or its removal).
    let lease_level_becomes = |what: &'static str, expected: &'static str| {
        let (controller, lease) = (&controller, &lease);
        wait_for(what, TIMEOUT, move || async move {
            match priority_level_of(controller, "PATCH", lease, body()).await {
                (level, 200 | 201) if level == expected => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
    };
    lease_level_becomes(
        "the controller's Leases classified as leader election",
        "leader-election",
    )
    .await;
    assert_eq!(
        priority_level_of(&controller, "GET", &configmaps, None).await,
        ("workload-low".to_owned(), 200),
        "its other requests stay in the service accounts' flow"
    );

    // Turned off, its Lease requests are a service account's like any other.
    let mut off = values.clone();
    off.push(("controller.leasePriorityLevel", json!("")));
    release.upgrade(&off);
    lease_level_becomes(
        "the controller's Leases back in the service accounts' flow",
        "workload-low",
    )
    .await;
}
