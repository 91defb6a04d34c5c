//! Tenancy held by the controller itself, with no webhook at all (as with the webhook down under
//! `failurePolicy: Ignore`): the CR's recorded author must be allowed to read the source and to
//! create its kind where the copies go; a CR without an author copies nothing; the operator's own
//! kinds and kinds that grant power are never copied unless allowed; and the chart's admission
//! policy holds the author record to the requesting user. Users are impersonated (`--as`).

mod common;

use common::{
    account::{ControllerAccount, controller_rules, controller_rules_writing_as_author},
    *,
};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Secret},
    rbac::v1::RoleBinding,
};
use kube::{Api, Client, api::PostParams};
use projection_tests::{
    ClusterScopedGuard, ServiceProcess, TestNamespace, chart, kubectl_ok, kubectl_stdin, metric_value,
    test_config, wait_for,
};
use serde_json::{Value, json};
use shared::{
    api::crd::{ClusterProjection, Projection},
    policy::author::AUTHOR,
};

/// A client acting as `user` in `groups` (the admin impersonating them, as `kubectl --as`).
async fn client_as(user: &str, groups: &[&str]) -> Client {
    let mut config = test_config().await.expect("test kubeconfig");
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
    Client::try_from(config).expect("impersonating client")
}

/// A tenant of `namespace`: manages Projections and ConfigMaps there.
async fn tenant_of(client: &Client, namespace: &str, user: &str) {
    grant(client, namespace, user, rule("projection.sh", "projections", "*")).await;
    grant(client, namespace, user, rule("", "configmaps", "*")).await;
}

fn projection_by(name: &str, source: Value, extra: Value, author: &str) -> Value {
    let mut value = projection(name, source, extra);
    value["metadata"]["annotations"] = json!({AUTHOR: author});
    value
}

/// Asserts that a condition's message says `text`.
fn assert_says(condition: &Value, text: &str) {
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(message.contains(text), "{condition}");
}

async fn copy_absent(api: &Api<ConfigMap>, name: &str) -> bool {
    matches!(api.get_opt(name).await, Ok(None))
}

#[tokio::test]
async fn a_cr_without_a_recorded_author_copies_nothing() {
    let env = env("no-author").await;
    let _controller = controller(&["--author-access=enforce"]).await;
    env.project_new_configmap("p", "cfg", json!({"k": "v"}), json!({}))
        .await;
    let condition = wait_not_ready(&env.projections(), "p", "SourceForbidden").await;
    let message = condition["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("no author is recorded"), "{message}");
    assert!(
        copy_absent(&env.api(env.dest.name()), "cfg").await,
        "a copy was made without an author"
    );
    env.finish().await;
}

#[tokio::test]
async fn an_author_who_cannot_read_the_source_gets_no_copy_until_granted() {
    let env = env("unreadable").await;
    let (src, dst) = env.names();
    let _controller = controller(&["--author-access=enforce"]).await;
    let user = format!("tenant-{dst}");
    tenant_of(&env.client, &dst, &user).await;
    source_configmap(&env.api(&src), "cfg", json!({"password": "hunter2"})).await;

    // Written by the tenant itself (no webhook), with its own record: admitted, but the controller
    // asks the apiserver whether the tenant may read the source.
    let tenant = client_as(&user, &[]).await;
    let api: Api<Projection> = Api::namespaced(tenant, &dst);
    create(
        &api,
        projection_by("p", cm_source(&src, "cfg"), json!({}), &record(&user, &[])),
    )
    .await;
    let condition = wait_not_ready(&env.projections(), "p", "SourceForbidden").await;
    let message = condition["message"].as_str().unwrap_or_default().to_owned();
    assert!(
        message.contains(&format!("the author {user} may not get configmaps {src}/cfg")),
        "{message}"
    );
    assert!(
        copy_absent(&env.api(&dst), "cfg").await,
        "a copy was made for an author who may not read the source"
    );

    // Granted: the retry picks it up.
    grant(
        &env.client,
        &src,
        &user,
        json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["cfg"]}),
    )
    .await;
    wait_ready(&env.projections(), "p").await;
    let copy: ConfigMap = env.api(&dst).get("cfg").await.expect("copy");
    assert_eq!(data_of(&copy)["password"], "hunter2");
    env.finish().await;
}

/// The SubjectAccessReviews the controller sent about authors, asking about `scope`.
fn reviews(controller: &ServiceProcess, scope: &str) -> f64 {
    metric_value(
        &controller.metrics(),
        &format!("projection_author_access_reviews_total{{scope=\"{scope}\"}}"),
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn an_author_allowed_a_whole_namespace_costs_one_review_there_not_one_per_source() {
    let env = env("wide-grant").await;
    let (src, dst) = env.names();
    // No periodic recheck: each review counted here is one a pass asked for.
    let controller = controller(&["--author-access=enforce", "--author-recheck-interval=0s"]).await;
    let sources: Api<ConfigMap> = env.api(&src);
    const CRS: usize = 8;

    // Alice may get every ConfigMap of the source namespace: one review answers for all of them.
    let alice = format!("alice-{dst}");
    tenant_of(&env.client, &dst, &alice).await;
    grant(&env.client, &src, &alice, rule("", "configmaps", "get")).await;
    let as_alice: Api<Projection> = Api::namespaced(client_as(&alice, &[]).await, &dst);
    for i in 0..CRS {
        let name = format!("wide-{i}");
        source_configmap(&sources, &name, json!({"k": name})).await;
    }
    // All at once, so their passes start together and ask together: they share the reviews.
    futures::future::join_all((0..CRS).map(|i| {
        let name = format!("wide-{i}");
        let cr = projection_by(&name, cm_source(&src, &name), json!({}), &record(&alice, &[]));
        create(&as_alice, cr)
    }))
    .await;
    for i in 0..CRS {
        wait_ready(&env.projections(), &format!("wide-{i}")).await;
    }
    assert_eq!(
        reviews(&controller, "object"),
        0.0,
        "a source was asked about on its own although its author may get the whole kind there"
    );
    assert_eq!(
        reviews(&controller, "namespace"),
        2.0,
        "reviews about namespaces for {CRS} Projections made at once (one to read, one to create)"
    );

    // Bob may get two ConfigMaps by name only: the wide question is not granted, so each source
    // is asked about, and the one not named is refused.
    let bob = format!("bob-{dst}");
    tenant_of(&env.client, &dst, &bob).await;
    grant(
        &env.client,
        &src,
        &bob,
        json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["wide-0", "wide-1"]}),
    )
    .await;
    let as_bob: Api<Projection> = Api::namespaced(client_as(&bob, &[]).await, &dst);
    for (name, source) in [("bob-0", "wide-0"), ("bob-1", "wide-1"), ("bob-2", "wide-2")] {
        let spec = json!({"destination": {"name": name}});
        create(
            &as_bob,
            projection_by(name, cm_source(&src, source), spec, &record(&bob, &[])),
        )
        .await;
    }
    wait_ready(&env.projections(), "bob-0").await;
    wait_ready(&env.projections(), "bob-1").await;
    let condition = wait_not_ready(&env.projections(), "bob-2", "SourceForbidden").await;
    assert_says(
        &condition,
        &format!("the author {bob} may not get configmaps {src}/wide-2"),
    );
    assert!(copy_absent(&env.api(&dst), "bob-2").await);
    assert!(
        reviews(&controller, "object") >= 3.0,
        "each of bob's sources asked about on its own"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_spec_edit_by_someone_who_cannot_read_the_source_withdraws_the_copy() {
    let env = env("widening").await;
    let (src, dst) = env.names();
    let _controller = controller(&["--author-access=enforce"]).await;
    let (alice, bob) = (format!("alice-{dst}"), format!("bob-{dst}"));
    tenant_of(&env.client, &dst, &alice).await;
    tenant_of(&env.client, &dst, &bob).await;
    grant(&env.client, &src, &alice, rule("", "configmaps", "get")).await;
    source_configmap(
        &env.api(&src),
        "db",
        json!({"user": "app", "admin-password": "s3cret"}),
    )
    .await;
    let exclude = json!({"fields": {"exclude": ["$.data['admin-password']"]}});
    let as_alice: Api<Projection> = Api::namespaced(client_as(&alice, &[]).await, &dst);
    create(
        &as_alice,
        projection_by("db", cm_source(&src, "db"), exclude, &record(&alice, &[])),
    )
    .await;
    wait_ready(&env.projections(), "db").await;
    let copies: Api<ConfigMap> = env.api(&dst);
    let copy = copies.get("db").await.expect("copy");
    assert!(data_of(&copy).get("admin-password").is_none());

    // Bob removes the exclusion; he becomes the author, and he may not read the source.
    let as_bob: Api<Projection> = Api::namespaced(client_as(&bob, &[]).await, &dst);
    let mut edited = as_bob.get("db").await.expect("projection");
    edited.spec.controls.fields = None;
    edited
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(AUTHOR.to_owned(), record(&bob, &[]));
    as_bob
        .replace("db", &PostParams::default(), &edited)
        .await
        .expect("bob's edit");
    let condition = wait_not_ready(&env.projections(), "db", "SourceForbidden").await;
    assert!(
        condition["message"].as_str().unwrap_or_default().contains(&bob),
        "{condition}"
    );
    wait_for("the copy withdrawn", TIMEOUT, || async {
        match copies.get_opt("db").await {
            Ok(None) => Ok(()),
            Ok(Some(c)) if data_of(&c).get("admin-password").is_some() => {
                panic!("the excluded key reached the copy for an author who may not read the source")
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    env.finish().await;
}

#[tokio::test]
async fn the_operators_own_kinds_and_power_kinds_are_never_sources() {
    let env = env("power-kinds").await;
    let (src, dst) = env.names();
    let _controller = controller(&["--author-access=enforce"]).await;
    let admin = projection_tests::author_annotation(&env.client)
        .await
        .expect("admin record");
    let admin = admin[AUTHOR].as_str().unwrap_or_default().to_owned();
    // A Projection as a source: its copy would be a Projection made with the controller's authority.
    let inner = projection_by("inner", cm_source(&src, "cfg"), json!({}), &admin);
    create(&Api::<Projection>::namespaced(env.client.clone(), &src), inner).await;
    let of_projection = json!({"group": "projection.sh", "version": "v1", "kind": "Projection",
                               "namespace": src, "name": "inner"});
    create(
        &env.projections(),
        projection_by("of-projection", of_projection, json!({}), &admin),
    )
    .await;
    let condition = wait_not_ready(&env.projections(), "of-projection", "SourceNotProjectable").await;
    assert!(
        condition["message"]
            .as_str()
            .unwrap_or_default()
            .contains("projection.sh kinds cannot be projected"),
        "{condition}"
    );
    // A RoleBinding (opted in by its owner) needs the platform's flag.
    let bindings: Api<RoleBinding> = env.api(&src);
    create(
        &bindings,
        json!({"metadata": {"name": "admins", "annotations": {"projection.sh/projectable": "true"}},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "someone"}]}),
    )
    .await;
    let of_binding = json!({"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "RoleBinding",
                            "namespace": src, "name": "admins"});
    create(
        &env.projections(),
        projection_by("of-binding", of_binding, json!({}), &admin),
    )
    .await;
    let condition = wait_not_ready(&env.projections(), "of-binding", "SourceNotProjectable").await;
    assert!(
        condition["message"]
            .as_str()
            .unwrap_or_default()
            .contains("--allow-power-kinds=RoleBinding.rbac.authorization.k8s.io"),
        "{condition}"
    );
    assert!(matches!(
        env.api::<RoleBinding>(&dst).get_opt("admins").await,
        Ok(None)
    ));
    // A ServiceAccount token Secret, opted in: refused too.
    let secrets: Api<Secret> = env.api(&src);
    create(
        &secrets,
        json!({"metadata": {"name": "token", "annotations": {"projection.sh/projectable": "true",
                                                             "kubernetes.io/service-account.name": "default"}},
               "type": "kubernetes.io/service-account-token"}),
    )
    .await;
    let of_token = json!({"version": "v1", "kind": "Secret", "namespace": src, "name": "token"});
    create(
        &env.projections(),
        projection_by("of-token", of_token, json!({}), &admin),
    )
    .await;
    let condition = wait_not_ready(&env.projections(), "of-token", "SourceNotProjectable").await;
    assert!(
        condition["message"]
            .as_str()
            .unwrap_or_default()
            .contains("ServiceAccount token Secret"),
        "{condition}"
    );
    assert!(matches!(env.api::<Secret>(&dst).get_opt("token").await, Ok(None)));
    env.finish().await;
}

#[tokio::test]
async fn a_cluster_projection_writes_only_where_its_author_may_create_the_kind() {
    let env = env("cp-author").await;
    let (src, dst) = env.names();
    let other = TestNamespace::create(&env.client, "cp-author-other").await;
    let _controller = controller(&["--author-access=enforce"]).await;
    let user = format!("platform-{dst}");
    grant(&env.client, &src, &user, rule("", "configmaps", "get")).await;
    grant(&env.client, &dst, &user, rule("", "configmaps", "create")).await;
    source_configmap(&env.api(&src), "cfg", json!({"k": "v"})).await;
    let name = format!("author-{dst}");
    let _guard = ClusterScopedGuard::new("clusterprojections", &name);
    let cps: Api<ClusterProjection> = Api::all(env.client.clone());
    create(
        &cps,
        json!({"apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
               "metadata": {"name": name, "annotations": {AUTHOR: record(&user, &[])}},
               "spec": {"source": cm_source(&src, "cfg"),
                        "destination": {"namespaces": [dst, other.name()]}}}),
    )
    .await;
    let failed = wait_for("the other namespace failed as forbidden", TIMEOUT, || async {
        let cp = cps.get(&name).await.map_err(|e| e.to_string())?;
        let status = serde_json::to_value(cp.status).unwrap_or_default();
        match status["failedNamespaces"].as_array() {
            Some(failed) if !failed.is_empty() && status["namespacesWritten"] == 1 => Ok(failed.clone()),
            _ => Err(status.to_string()),
        }
    })
    .await;
    assert_eq!(failed[0]["namespace"], other.name());
    assert_eq!(failed[0]["reason"], "DestinationForbidden");
    assert!(env.api::<ConfigMap>(&dst).get("cfg").await.is_ok());
    assert!(copy_absent(&env.api(other.name()), "cfg").await);
    cps.delete(&name, &Default::default()).await.expect("delete");
    wait_absent(&cps, &name, "the ClusterProjection").await;
    env.finish().await;
}

/// The chart's author policy, applied alone under a name of this test's own, and loaded: a forged
/// record (the admin's, created by `api`'s user) is refused. Deletes the policy when dropped.
struct AuthorPolicy {
    _guards: [ClusterScopedGuard; 2],
}

impl AuthorPolicy {
    async fn apply(tag: &str, api: &Api<Projection>, src: &str, admin: &str) -> Self {
        let release = format!("vap-{tag}-{}", std::process::id());
        let rendered = chart::helm_ok(&[
            "template",
            &release,
            &chart::chart_dir().to_string_lossy(),
            "--show-only",
            "templates/author-policy.yaml",
        ]);
        let policy_name = format!("{release}-projection-author");
        let guards = [
            ClusterScopedGuard::new("validatingadmissionpolicies", &policy_name),
            ClusterScopedGuard::new("validatingadmissionpolicybindings", &policy_name),
        ];
        let applied = kubectl_stdin(&["apply", "-f", "-"], &rendered);
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
        let forged = projection_by("forged", cm_source(src, "cfg"), json!({}), admin);
        // The policy takes a moment to be loaded by the apiserver: wait until it refuses the forgery.
        let refusal = wait_for("the forged author refused", TIMEOUT, || async {
            let object: Projection = serde_json::from_value(forged.clone()).map_err(|e| e.to_string())?;
            match api.create(&PostParams::default(), &object).await {
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => Ok(s.message),
                Ok(_) => {
                    let _ = api.delete("forged", &Default::default()).await;
                    Err("admitted".to_owned())
                }
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        assert!(
            refusal.contains("must record the user who writes the spec"),
            "{refusal}"
        );
        Self { _guards: guards }
    }
}

async fn admin_record(client: &Client) -> String {
    let admin = projection_tests::author_annotation(client)
        .await
        .expect("admin record");
    admin[AUTHOR].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_admission_policy_holds_the_author_record_to_the_requesting_user() {
    let env = env("author-policy").await;
    let (src, dst) = env.names();
    let user = format!("tenant-{dst}");
    tenant_of(&env.client, &dst, &user).await;
    let api: Api<Projection> = Api::namespaced(client_as(&user, &[]).await, &dst);
    let _policy = AuthorPolicy::apply("hold", &api, &src, &admin_record(&env.client).await).await;
    // Its own record passes.
    create(
        &api,
        projection_by("own", cm_source(&src, "cfg"), json!({}), &record(&user, &[])),
    )
    .await;
    env.finish().await;
}

/// The denial of a patch of `name` by `api`'s user, or a panic if it was admitted.
async fn refused_patch(api: &Api<Projection>, name: &str, patch: Value) -> String {
    match api
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => s.message,
        Ok(p) => panic!(
            "{patch} was admitted: annotations now {:?}",
            p.metadata.annotations
        ),
        Err(e) => panic!("{patch}: {e}"),
    }
}

#[tokio::test]
async fn an_author_record_once_written_cannot_be_removed_by_an_editor() {
    let env = env("author-kept").await;
    let (src, dst) = env.names();
    // A namespace editor (the built-in `edit` role; Projections granted as the chart's aggregated
    // role would, which this test does not install).
    let user = format!("editor-{dst}");
    kubectl_ok(&[
        "-n",
        &dst,
        "create",
        "rolebinding",
        "editor",
        "--clusterrole=edit",
        &format!("--user={user}"),
    ]);
    grant(
        &env.client,
        &dst,
        &user,
        rule("projection.sh", "projections", "*"),
    )
    .await;
    let api: Api<Projection> = Api::namespaced(client_as(&user, &[]).await, &dst);
    let admin = admin_record(&env.client).await;
    let _policy = AuthorPolicy::apply("kept", &api, &src, &admin).await;

    // Someone else's Projection, recorded by the webhook (here: written by the admin, its author).
    let admins: Api<Projection> = env.projections();
    create(
        &admins,
        projection_by("theirs", cm_source(&src, "cfg"), json!({}), &admin),
    )
    .await;
    let expected = "metadata.annotations[projection.sh/author] cannot be removed once recorded";
    for (what, value) in [("removed", Value::Null), ("emptied", json!(""))] {
        let denial = refused_patch(
            &api,
            "theirs",
            json!({"metadata": {"annotations": {AUTHOR: value}}}),
        )
        .await;
        assert!(denial.contains(expected), "{what}: {denial}");
        assert!(
            denial.contains(&format!("record yourself instead: {}", record(&user, &[]))),
            "{what}: the denial says what to write instead: {denial}"
        );
    }
    // Not by the admin either: the policy holds whoever asks.
    let denial = refused_patch(
        &admins,
        "theirs",
        json!({"metadata": {"annotations": {AUTHOR: null}}}),
    )
    .await;
    assert!(denial.contains(expected), "{denial}");
    let kept = admins.get("theirs").await.expect("the Projection");
    assert_eq!(
        kept.metadata.annotations.unwrap_or_default().get(AUTHOR),
        Some(&admin),
        "the record is unchanged"
    );
    // Metadata edits that keep the record pass; replacing it with one's own record is still allowed
    // (it is held to the requester, as before).
    merge(&api, "theirs", json!({"metadata": {"labels": {"team": "a"}}})).await;
    let mine = record(&user, &[]);
    let taken = merge(
        &api,
        "theirs",
        json!({"metadata": {"annotations": {AUTHOR: mine}}}),
    )
    .await;
    assert_eq!(
        taken.metadata.annotations.unwrap_or_default().get(AUTHOR),
        Some(&mine)
    );

    // A CR that never had a record (the migration case) stays editable, and may be recorded.
    create(&admins, projection("legacy", cm_source(&src, "cfg"), json!({}))).await;
    merge(&api, "legacy", json!({"metadata": {"labels": {"team": "a"}}})).await;
    let recorded = merge(
        &api,
        "legacy",
        json!({"metadata": {"annotations": {AUTHOR: mine}}}),
    )
    .await;
    assert_eq!(
        recorded.metadata.annotations.unwrap_or_default().get(AUTHOR),
        Some(&mine)
    );
    env.finish().await;
}

#[tokio::test]
async fn a_projection_is_made_only_where_its_author_may_create_the_kind() {
    let env = env("dest-forbidden").await;
    let (src, dst) = env.names();
    let _controller = controller(&["--author-access=enforce"]).await;
    let user = format!("reader-{dst}");
    // May manage Projections in its namespace and read the source, but not create ConfigMaps.
    grant(
        &env.client,
        &dst,
        &user,
        rule("projection.sh", "projections", "*"),
    )
    .await;
    grant(&env.client, &src, &user, rule("", "configmaps", "get")).await;
    source_configmap(&env.api(&src), "cfg", json!({"k": "v"})).await;
    let api: Api<Projection> = Api::namespaced(client_as(&user, &[]).await, &dst);
    create(
        &api,
        projection_by("p", cm_source(&src, "cfg"), json!({}), &record(&user, &[])),
    )
    .await;
    let condition = wait_condition(
        &env.projections(),
        "p",
        "DestinationWritten",
        "False",
        Some("DestinationForbidden"),
    )
    .await;
    assert_says(
        &condition,
        &format!("the author {user} may not create configmaps in {dst}"),
    );
    assert!(copy_absent(&env.api(&dst), "cfg").await);
    env.finish().await;
}

#[tokio::test]
async fn a_kind_served_only_after_admission_is_checked_when_it_is() {
    // GitOps applies CRs before CRDs: admission could not check a kind it did not know, so the
    // controller checks the author when the kind appears.
    let env = env("late-kind").await;
    let (src, dst) = env.names();
    let _controller = controller(&["--author-access=enforce"]).await;
    let user = format!("tenant-{dst}");
    tenant_of(&env.client, &dst, &user).await;
    let group = format!("{src}.test.projection.sh");
    grant(&env.client, &dst, &user, rule(&group, "widgets", "*")).await;
    let api: Api<Projection> = Api::namespaced(client_as(&user, &[]).await, &dst);
    let source = json!({"group": group, "kind": "Widget", "namespace": src, "name": "w"});
    create(
        &api,
        projection_by("late", source, json!({}), &record(&user, &[])),
    )
    .await;
    wait_not_ready(&env.projections(), "late", "SourceResolutionFailed").await;

    let crd = install_widget_crd(&env.client, &group, &["v1"]).await;
    let _crd = ClusterScopedGuard::new("customresourcedefinitions", &crd);
    let widget: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "w", "annotations": opted_in()}, "spec": {"secret": "x"}}))
    .expect("widget");
    widgets(&env.client, &group, "v1", &src)
        .create(&PostParams::default(), &widget)
        .await
        .expect("widget created");
    let condition = wait_not_ready(&env.projections(), "late", "SourceForbidden").await;
    assert!(
        condition["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("the author {user} may not get widgets.{group} {src}/w")),
        "{condition}"
    );
    assert!(matches!(
        widgets(&env.client, &group, "v1", &dst).get_opt("w").await,
        Ok(None)
    ));
    env.finish().await;
}

/// The Ready condition and every other status field of `cr`, with the times that differ between
/// passes removed and `source_namespace` replaced, for a byte-for-byte comparison.
async fn status_seen(api: &Api<Projection>, cr: &str, source_namespace: &str) -> String {
    let mut status = serde_json::to_value(api.get(cr).await.expect("projection").status).expect("status");
    for condition in status["conditions"].as_array_mut().into_iter().flatten() {
        condition.as_object_mut().map(|c| c.remove("lastTransitionTime"));
    }
    status.to_string().replace(source_namespace, "SOURCE-NAMESPACE")
}

/// What the events about `cr` say (type, reason, action and note; `source_namespace` replaced),
/// each once and sorted: a repeat of the same event only counts up its series.
async fn events_seen(client: &Client, namespace: &str, cr: &str, source_namespace: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    let mut seen: Vec<String> = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(cr))
        .map(|e| {
            format!("{:?} {:?} {:?} {:?}", e.type_, e.reason, e.action, e.note)
                .replace(source_namespace, "SOURCE-NAMESPACE")
        })
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

#[tokio::test]
async fn a_tenant_learns_nothing_about_a_source_it_may_not_read() {
    let env = env("oracle").await;
    let dst = env.dest.name().to_owned();
    let _controller = controller(&["--author-access=enforce"]).await;
    let user = format!("tenant-{dst}");
    tenant_of(&env.client, &dst, &user).await;
    // The same name in three namespaces the tenant may not read: no Secret there, one whose owner
    // did not opt in, and one opted in.
    let missing = TestNamespace::create(&env.client, "oracle-missing").await;
    let plain = TestNamespace::create(&env.client, "oracle-plain").await;
    let shared = TestNamespace::create(&env.client, "oracle-shared").await;
    create(
        &Api::<Secret>::namespaced(env.client.clone(), plain.name()),
        json!({"metadata": {"name": "db"}, "stringData": {"password": "p"}}),
    )
    .await;
    create(
        &Api::<Secret>::namespaced(env.client.clone(), shared.name()),
        json!({"metadata": {"name": "db", "annotations": {"projection.sh/projectable": "true"}},
               "stringData": {"password": "p"}}),
    )
    .await;

    // Written by the tenant itself, with its own record (no webhook to stop it).
    let as_tenant: Api<Projection> = Api::namespaced(client_as(&user, &[]).await, &dst);
    let probes = [
        ("probe-missing", missing.name()),
        ("probe-plain", plain.name()),
        ("probe-shared", shared.name()),
    ];
    for (cr, namespace) in probes {
        let source = json!({"version": "v1", "kind": "Secret", "namespace": namespace, "name": "db"});
        create(
            &as_tenant,
            projection_by(cr, source, json!({}), &record(&user, &[])),
        )
        .await;
    }
    let mut seen = Vec::new();
    for (cr, namespace) in probes {
        let condition = wait_not_ready(&env.projections(), cr, "SourceForbidden").await;
        let message = condition["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("may not get secrets {namespace}/db")),
            "{message}"
        );
        // The event of the pass that set the condition is published before the status is written.
        let events = events_seen(&env.client, &dst, cr, namespace).await;
        assert!(!events.is_empty(), "no event about {cr}");
        seen.push((
            cr,
            status_seen(&env.projections(), cr, namespace)
                .await
                .replace(cr, "CR"),
            events,
        ));
    }
    for (cr, status, events) in &seen[1..] {
        assert_eq!(
            (status, events),
            (&seen[0].1, &seen[0].2),
            "{cr} tells its source apart from {}",
            seen[0].0
        );
    }
    let secrets: Api<Secret> = env.api(&dst);
    assert!(matches!(secrets.get_opt("db").await, Ok(None)), "a copy was made");
    env.finish().await;
}

#[tokio::test]
async fn suspension_and_silence_never_freeze_a_copy_its_author_could_no_longer_make() {
    let env = env("frozen").await;
    let (src, dst) = env.names();
    // Nothing retries on a timer within the test (`controller` caps the backoff at 5 minutes): a
    // copy withdrawn with nothing touched was withdrawn by the author recheck.
    let _controller = controller(&[
        "--author-access=enforce",
        "--author-recheck-interval=3s",
        "--author-grant-ttl=1s",
    ])
    .await;
    let alice = format!("alice-{dst}");
    tenant_of(&env.client, &dst, &alice).await;
    let read = rule("", "configmaps", "get");
    grant(&env.client, &src, &alice, read.clone()).await;
    let sources: Api<ConfigMap> = env.api(&src);
    let as_alice: Api<Projection> = Api::namespaced(client_as(&alice, &[]).await, &dst);
    for name in ["vetoed", "revoked", "quiet"] {
        source_configmap(&sources, name, json!({"k": name})).await;
        create(
            &as_alice,
            projection_by(name, cm_source(&src, name), json!({}), &record(&alice, &[])),
        )
        .await;
        wait_ready(&env.projections(), name).await;
    }
    for name in ["vetoed", "revoked"] {
        merge(&env.projections(), name, json!({"spec": {"suspend": true}})).await;
        wait_condition(&env.projections(), name, "Suspended", "True", None).await;
    }
    let copies: Api<ConfigMap> = env.api(&dst);

    // The owner vetoes the source of a suspended Projection: its copy goes all the same.
    merge(
        &sources,
        "vetoed",
        json!({"metadata": {"annotations": {"projection.sh/projectable": "false"}}}),
    )
    .await;
    wait_absent(
        &copies,
        "vetoed",
        "the vetoed copy of a suspended Projection withdrawn",
    )
    .await;
    wait_not_ready(&env.projections(), "vetoed", "SourceOptedOut").await;
    wait_condition(&env.projections(), "vetoed", "Suspended", "True", None).await;

    // Alice may no longer read the sources, and nobody touches anything: the recheck finds it,
    // for the suspended Projection and the running one alike.
    let grant_name = format!("grant-{}", rand_suffix(&alice, &read));
    delete(
        &Api::<RoleBinding>::namespaced(env.client.clone(), &src),
        &grant_name,
    )
    .await;
    for name in ["revoked", "quiet"] {
        wait_absent(
            &copies,
            name,
            &format!("the copy {name} withdrawn after the revocation"),
        )
        .await;
        let condition = wait_not_ready(&env.projections(), name, "SourceForbidden").await;
        assert!(
            condition["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("the author {alice} may not get configmaps {src}/{name}")),
            "{condition}"
        );
    }
    wait_condition(&env.projections(), "revoked", "Suspended", "True", None).await;
    env.finish().await;
}

/// A ValidatingAdmissionPolicy that refuses ConfigMaps created or updated by `user` in `namespace`,
/// applied under a name of this test's own and loaded (a ConfigMap `user` writes there by hand is
/// refused). Deleted when dropped.
struct RefuseWritesBy {
    message: String,
    _guards: [ClusterScopedGuard; 2],
}

impl RefuseWritesBy {
    async fn apply(user: &str, namespace: &str) -> Self {
        let name = format!("refuse-{namespace}");
        let message = format!("{user} may not write ConfigMaps in {namespace} (the test's policy)");
        let guards = [
            ClusterScopedGuard::new("validatingadmissionpolicies", &name),
            ClusterScopedGuard::new("validatingadmissionpolicybindings", &name),
        ];
        let policy = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "List", "items": [
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": name},
             "spec": {"failurePolicy": "Fail",
                      "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                          "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}]},
                      "validations": [{"expression": format!("request.userInfo.username != '{user}'"),
                                       "message": message}]}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": name},
             "spec": {"policyName": name, "validationActions": ["Deny"],
                      "matchResources": {"namespaceSelector": {"matchLabels":
                          {"kubernetes.io/metadata.name": namespace}}}}},
        ]});
        let applied = kubectl_stdin(&["apply", "-f", "-"], &policy.to_string());
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
        // The apiserver loads a policy a moment after it is stored: wait until it refuses `user`.
        let by_hand: Api<ConfigMap> = Api::namespaced(client_as(user, &[]).await, namespace);
        let probe: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "by-hand"}})).expect("json");
        wait_for("the policy refusing the user's own write", TIMEOUT, || async {
            match by_hand.create(&PostParams::default(), &probe).await {
                Err(kube::Error::Api(s)) if s.message.contains(&message) => Ok(()),
                Ok(_) => {
                    let _ = by_hand.delete("by-hand", &Default::default()).await;
                    Err("admitted".to_owned())
                }
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        Self {
            message,
            _guards: guards,
        }
    }
}

/// Copies written as their author (`--write-copies-as=author`; this suite's controller runs as the
/// admin, who may impersonate anyone): an admission policy keyed on the requesting user sees the
/// author of each copy, not the controller. The same policy refuses alice's copy and lets bob's,
/// of the same source into the same namespace, be written.
#[tokio::test]
async fn an_admission_policy_keyed_on_the_user_sees_the_author_of_each_copy() {
    let env = env("as-author").await;
    let (src, dst) = env.names();
    let controller = controller(&["--author-access=enforce", "--write-copies-as=author"]).await;
    assert_eq!(
        metric_value(
            &controller.metrics(),
            "projection_copy_writer_info{writer=\"author\"}"
        ),
        Some(1.0)
    );
    source_configmap(&env.api(&src), "cfg", json!({"k": "v"})).await;
    let (alice, bob) = (format!("alice-{dst}"), format!("bob-{dst}"));
    for user in [&alice, &bob] {
        tenant_of(&env.client, &dst, user).await;
        grant(&env.client, &src, user, rule("", "configmaps", "get")).await;
    }
    let policy = RefuseWritesBy::apply(&alice, &dst).await;
    for (user, name) in [(&alice, "from-alice"), (&bob, "from-bob")] {
        let api: Api<Projection> = Api::namespaced(client_as(user, &[]).await, &dst);
        let destination = json!({"destination": {"name": name}});
        create(
            &api,
            projection_by(name, cm_source(&src, "cfg"), destination, &record(user, &[])),
        )
        .await;
    }
    wait_ready(&env.projections(), "from-bob").await;
    let copy: ConfigMap = env.api(&dst).get("from-bob").await.expect("bob's copy");
    assert_eq!(data_of(&copy)["k"], "v");
    let refused = wait_not_ready(&env.projections(), "from-alice", "DestinationCreateFailed").await;
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(message.contains(&policy.message), "{message}");
    assert!(
        copy_absent(&env.api(&dst), "from-alice").await,
        "alice's copy was written"
    );
    env.finish().await;
}

/// The controller as the chart runs it on Kubernetes v1.36 (`controller.writeCopiesAs: auto`): its
/// ClusterRole has no `create` or `update` on ConfigMaps, only the impersonation verbs, and a
/// tenant's copy is still created and updated, as the tenant.
#[tokio::test]
async fn a_controller_without_create_writes_copies_as_their_author() {
    let env = env("no-create").await;
    let (src, dst) = env.names();
    let rules = controller_rules_writing_as_author(&["configmaps"]);
    let account = ControllerAccount::create_with_rules(&env, "no-create-home", rules).await;
    assert_eq!(account.can_i("create", "configmaps"), "no");
    let controller = account
        .start_controller(&["--write-copies-as=author", "--requeue-interval", "5m"])
        .await;
    assert_eq!(
        metric_value(
            &controller.metrics(),
            "projection_copy_writer_info{writer=\"author\"}"
        ),
        Some(1.0)
    );
    let user = format!("tenant-{dst}");
    tenant_of(&env.client, &dst, &user).await;
    grant(&env.client, &src, &user, rule("", "configmaps", "get")).await;
    source_configmap(&env.api(&src), "cfg", json!({"k": "v"})).await;
    let api: Api<Projection> = Api::namespaced(client_as(&user, &[]).await, &dst);
    create(
        &api,
        projection_by("p", cm_source(&src, "cfg"), json!({}), &record(&user, &[])),
    )
    .await;
    wait_ready(&env.projections(), "p").await;
    let copies: Api<ConfigMap> = env.api(&dst);
    assert_eq!(data_of(&copies.get("cfg").await.expect("copy"))["k"], "v");
    // An update of the copy is the author's write too.
    merge(&env.api::<ConfigMap>(&src), "cfg", json!({"data": {"k": "w"}})).await;
    wait_object(&copies, "cfg", "the edit in the copy", |copy| {
        data_of(copy)["k"] == "w"
    })
    .await;
    env.finish().await;
}

/// Where the apiserver does not let the controller impersonate (its ClusterRole lacks the verbs, as
/// on a cluster without constrained impersonation): `auto` writes as the controller and says so in
/// its metric; `author` refuses to start, saying why and what to set.
#[tokio::test]
async fn without_impersonation_auto_writes_as_the_controller_and_author_does_not_start() {
    let env = env("no-impersonation").await;
    let account =
        ControllerAccount::create_with_rules(&env, "no-imp-home", controller_rules(&["configmaps"])).await;
    let auto = account.start_controller(&[]).await;
    assert_eq!(
        metric_value(
            &auto.metrics(),
            "projection_copy_writer_info{writer=\"controller\"}"
        ),
        Some(1.0)
    );
    drop(auto);
    let refused = tokio::task::spawn_blocking({
        let kubeconfig = account.kubeconfig.clone();
        move || {
            std::process::Command::new(binary())
                .args([
                    "--write-copies-as=author",
                    "--metrics-bind-address=127.0.0.1:0",
                    "--health-probe-bind-address=127.0.0.1:0",
                ])
                .env("KUBECONFIG", kubeconfig)
                .output()
                .expect("the controller runs")
        }
    });
    let out = tokio::time::timeout(TIMEOUT, refused)
        .await
        .expect("the controller stops by itself")
        .expect("joined");
    assert!(!out.status.success(), "started without impersonation");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    for part in [
        "--write-copies-as=author",
        "impersonat",
        "controller.writeCopiesAs: controller",
    ] {
        assert!(said.contains(part), "{part:?} not in {said}");
    }
    env.finish().await;
}

/// The apiserver lets nobody impersonate `system:masters`: an author in that group is impersonated
/// without it, so its copy is written only where the RBAC of its name and other groups allows, and
/// the refusal says why and what to do. (Written as the controller, the admin running this suite,
/// the copy would have been made.)
#[tokio::test]
async fn an_author_in_system_masters_is_impersonated_without_it() {
    let env = env("masters").await;
    let (src, dst) = env.names();
    let _controller = controller(&["--author-access=enforce", "--write-copies-as=author"]).await;
    source_configmap(&env.api(&src), "cfg", json!({"k": "v"})).await;
    let root = format!("root-{dst}");
    let record = record(&root, &["system:masters"]);
    create(
        &env.projections(),
        projection_by("p", cm_source(&src, "cfg"), json!({}), &record),
    )
    .await;
    let refused = wait_not_ready(&env.projections(), "p", "DestinationForbidden").await;
    let message = refused["message"].as_str().unwrap_or_default();
    let parts = [
        format!("the apiserver refused the copy written as its author {root}"),
        format!("User \"{root}\" cannot create resource \"configmaps\""),
        "lets nobody impersonate system:masters".to_owned(),
    ];
    for part in parts {
        assert!(message.contains(&part), "{part:?} not in {message}");
    }
    assert!(copy_absent(&env.api(&dst), "cfg").await, "a copy was made");
    env.finish().await;
}
