//! Copies written into another cluster (`spec.destination.kubeConfig`), against two real control
//! planes on loopback: the one the CRs live in, and the second one `scripts/test.sh` starts
//! (`tests/control-plane/remote.sh`). The controller reaches the second with a ServiceAccount's
//! token, allowed only what each test grants, as a platform team would set it up.

mod common;

use k8s_openapi::{
    api::core::v1::{ConfigMap, Namespace, Secret},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams},
};
use projection_tests::{
    ClusterScopedGuard,
    black_hole::BlackHoleProxy,
    free_port, metric_value,
    remote::{
        RemoteNamespace, remote_client, remote_server_and_ca, service_account_kubeconfig, token_kubeconfig,
    },
    wait_for,
};
use serde_json::{Value, json};
use shared::{
    api::{
        crd::ClusterProjection,
        keys::{OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION, SOURCE_CLUSTER},
    },
    policy::kubeconfig::KubeconfigSecret,
};

use common::*;

/// What the controller's ServiceAccount in the other cluster may do with ConfigMaps where copies
/// go: everything a copy needs, nothing else.
fn copy_rules() -> Value {
    json!([{"apiGroups": [""], "resources": ["configmaps"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}])
}

/// Writes the kubeconfig `text` into the Secret `name` of `namespace` (key `value`, Flux's default).
async fn kubeconfig_secret(client: &Client, namespace: &str, name: &str, text: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name}, "stringData": {"value": text}
    }))
    .expect("a Secret");
    let params = kube::api::PatchParams::apply("projection-tests").force();
    secrets
        .patch(name, &params, &kube::api::Patch::Apply(&secret))
        .await
        .unwrap_or_else(|e| panic!("cannot write Secret {namespace}/{name}: {e}"));
}

/// The UID of the `kube-system` of the cluster `client` reaches: the identity copies written from
/// it carry elsewhere, and the one recorded for copies written into it.
async fn local_identity(client: &Client) -> String {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .get("kube-system")
        .await
        .expect("kube-system")
        .metadata
        .uid
        .expect("a uid")
}

fn annotation<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The Secret every Projection test names.
const SECRET: &str = "other-cluster";

/// The other cluster's side of a Projection test: the namespace there of the name of the test's
/// destination namespace, and the kubeconfig Secret [`SECRET`] there here, for the ServiceAccount
/// `account` allowed ConfigMaps there (reached at `server` instead, when given).
async fn other_cluster_for(
    env: &Env,
    remote: &Client,
    account: &str,
    server: Option<&str>,
) -> RemoteNamespace {
    let dst = env.dest.name();
    let there = RemoteNamespace::create_named(remote, dst, json!({})).await;
    let mut kubeconfig =
        service_account_kubeconfig(remote, (there.name(), account), (&[dst], copy_rules()), None).await;
    if let Some(server) = server {
        kubeconfig = kubeconfig.replace(&remote_server_and_ca().0, server);
    }
    kubeconfig_secret(&env.client, dst, SECRET, &kubeconfig).await;
    there
}

/// The Projection `name` of the source namespace's ConfigMap `settings` (created with `level: 1`
/// unless it exists), writing into the cluster of [`SECRET`], with `annotations`.
async fn project_settings_there(env: &Env, name: &str, annotations: Value) {
    let src = env.source.name();
    let sources: Api<ConfigMap> = env.api(src);
    if sources.get_opt("settings").await.expect("get").is_none() {
        source_configmap(&sources, "settings", json!({"level": "1"})).await;
    }
    let mut cr = projection(
        name,
        cm_source(src, "settings"),
        json!({"destination": {"kubeConfig": {"secretRef": {"name": SECRET}}}}),
    );
    cr["metadata"]["annotations"] = annotations;
    create(&env.projections(), cr).await;
}

#[tokio::test]
async fn a_projection_writes_its_copy_into_another_cluster_and_keeps_it_there() {
    let env = env("remote-p").await;
    let (src, dst) = env.names();
    let remote = remote_client().await;
    // The copy lands in the namespace of the Projection's namespace's name there.
    let there = other_cluster_for(&env, &remote, "copies", None).await;
    let controller = controller(&[]).await;
    let remote_copies: Api<ConfigMap> = Api::namespaced(remote.clone(), &dst);
    project_settings_there(&env, "p", json!({})).await;
    wait_ready(&env.projections(), "p").await;
    let identity = local_identity(&env.client).await;
    let copy = wait_object(
        &remote_copies,
        "settings",
        "the copy in the other cluster",
        |cm| data_of(cm)["level"] == "1",
    )
    .await;
    assert_eq!(
        annotation(&copy, OWNED_BY_PROJECTION),
        Some(format!("{dst}/p").as_str())
    );
    assert_eq!(
        annotation(&copy, SOURCE_CLUSTER),
        Some(identity.as_str()),
        "the copy names the cluster its CR is in"
    );
    let local_copies: Api<ConfigMap> = env.api(&dst);
    assert!(
        local_copies.get_opt("settings").await.expect("get").is_none(),
        "nothing is written in the CR's own cluster"
    );
    // Credentials bound to one namespace may not read the other cluster's identity: none recorded.
    let written = env
        .projections()
        .get("p")
        .await
        .expect("get")
        .status
        .expect("status");
    let written = written.copy.written_destination.expect("recorded");
    assert!(written.cluster.is_some_and(|c| c.starts_with("server-")));
    assert_eq!(written.cluster_identity, None);
    // The other cluster is counted, and its requests under its alias, never its URL.
    let alias = KubeconfigSecret {
        namespace: dst.clone(),
        name: "other-cluster".into(),
        key: "value".into(),
    }
    .alias();
    let metrics = controller.metrics();
    assert_eq!(
        metric_value(&metrics, "projection_remote_clusters "),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("rest_client_requests_total") && l.contains(&format!("host=\"{alias}\""))),
        "no request counted under {alias}"
    );
    assert!(
        !metrics.contains("17443"),
        "the other cluster's address became a label"
    );
    // Where the copies go cannot change under them (they would be left behind): the CRD refuses.
    for edit in [
        json!({"spec": {"destination": {"kubeConfig": null}}}),
        json!({"spec": {"destination": {"kubeConfig": {"secretRef": {"name": "elsewhere"}}}}}),
    ] {
        let refused = env
            .projections()
            .patch("p", &PatchParams::default(), &Patch::Merge(&edit))
            .await
            .expect_err("the edit is refused");
        assert!(
            refused
                .to_string()
                .contains("destination.kubeConfig cannot change"),
            "{refused}"
        );
    }

    // A source edit reaches the other cluster; a copy deleted there comes back.
    merge(
        &env.api::<ConfigMap>(&src),
        "settings",
        json!({"data": {"level": "2"}}),
    )
    .await;
    wait_object(
        &remote_copies,
        "settings",
        "the edit in the other cluster",
        |cm| data_of(cm)["level"] == "2",
    )
    .await;
    delete(&remote_copies, "settings").await;
    wait_object(
        &remote_copies,
        "settings",
        "the copy healed in the other cluster",
        |cm| data_of(cm)["level"] == "2",
    )
    .await;

    // Rotated credentials: another ServiceAccount's token in the Secret, the first one gone. The
    // next pass (a source edit) opens the cluster with the new kubeconfig.
    let rotated =
        service_account_kubeconfig(&remote, (there.name(), "copies-2"), (&[&dst], copy_rules()), None).await;
    kubeconfig_secret(&env.client, &dst, "other-cluster", &rotated).await;
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(remote.clone(), &dst);
    delete(&accounts, "copies").await;
    merge(
        &env.api::<ConfigMap>(&src),
        "settings",
        json!({"data": {"level": "3"}}),
    )
    .await;
    wait_object(
        &remote_copies,
        "settings",
        "the edit written with the rotated credentials",
        |cm| data_of(cm)["level"] == "3",
    )
    .await;

    // Deleting the Projection removes its copy from the other cluster.
    delete(&env.projections(), "p").await;
    wait_absent(
        &remote_copies,
        "settings",
        "the copy in the other cluster removed",
    )
    .await;
    env.finish().await;
}

#[tokio::test]
async fn a_cluster_projection_writes_into_the_namespaces_of_another_cluster() {
    let env = env("remote-cp").await;
    let (src, controller_namespace) = env.names();
    let remote = remote_client().await;
    let listed = [
        RemoteNamespace::create(&remote, "list").await,
        RemoteNamespace::create(&remote, "list").await,
    ];
    let selected = RemoteNamespace::create(&remote, "sel").await;
    let home = RemoteNamespace::create(&remote, "home").await;
    // Watching the copies everywhere and selecting namespaces needs a ClusterRole; writing, a Role
    // in each namespace written (here every one, through the same ClusterRole).
    let cluster_rules = json!([
        {"apiGroups": [""], "resources": ["configmaps"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    ]);
    let kubeconfig = service_account_kubeconfig(
        &remote,
        (home.name(), "copies"),
        (&[], json!([])),
        Some(cluster_rules),
    )
    .await;
    // A ClusterProjection's Secret is in the controller's namespace.
    kubeconfig_secret(&env.client, &controller_namespace, "fleet", &kubeconfig).await;
    let _controller = controller(&["--controller-namespace", &controller_namespace]).await;

    source_configmap(&env.api(&src), "ca", json!({"bundle": "pem"})).await;
    let cps: Api<ClusterProjection> = Api::all(env.client.clone());
    let names: Vec<&str> = listed.iter().map(RemoteNamespace::name).collect();
    let listing = format!("{controller_namespace}-list");
    let _listing_guard = ClusterScopedGuard::new("clusterprojection", &listing);
    create_cluster_projection(
        &cps,
        &listing,
        json!({"source": cm_source(&src, "ca"),
               "destination": {"namespaces": names, "kubeConfig": {"secretRef": {"name": "fleet"}}}}),
    )
    .await;
    for namespace in &names {
        let copies: Api<ConfigMap> = Api::namespaced(remote.clone(), namespace);
        let copy = wait_object(
            &copies,
            "ca",
            "a listed namespace's copy in the other cluster",
            |cm| data_of(cm)["bundle"] == "pem",
        )
        .await;
        assert_eq!(
            annotation(&copy, OWNED_BY_CLUSTER_PROJECTION),
            Some(listing.as_str())
        );
    }
    // Credentials that may get namespaces there read the other cluster's identity, recorded for
    // admission (the webhook places the copies by it).
    let identity_there = local_identity(&remote).await;
    wait_object(&cps, &listing, "the other cluster's identity recorded", |cp| {
        cp.status
            .as_ref()
            .and_then(|s| s.copy.written_destination.as_ref())
            .is_some_and(|w| w.cluster_identity.as_deref() == Some(identity_there.as_str()))
    })
    .await;

    // A selector is evaluated among the other cluster's namespaces, as their labels change.
    let selecting = format!("{controller_namespace}-sel");
    let _selecting_guard = ClusterScopedGuard::new("clusterprojection", &selecting);
    let label = format!("projection-test-{controller_namespace}");
    create_cluster_projection(
        &cps,
        &selecting,
        json!({"source": cm_source(&src, "ca"),
               "destination": {"namespaceSelector": {"matchLabels": {label.clone(): "yes"}},
                               "name": "ca-selected", "kubeConfig": {"secretRef": {"name": "fleet"}}}}),
    )
    .await;
    let remote_namespaces: Api<Namespace> = Api::all(remote.clone());
    merge(
        &remote_namespaces,
        selected.name(),
        json!({"metadata": {"labels": {label.clone(): "yes"}}}),
    )
    .await;
    let selected_copies: Api<ConfigMap> = Api::namespaced(remote.clone(), selected.name());
    wait_object(
        &selected_copies,
        "ca-selected",
        "the copy in the namespace labelled there",
        |_| true,
    )
    .await;
    merge(
        &remote_namespaces,
        selected.name(),
        json!({"metadata": {"labels": {label: null}}}),
    )
    .await;
    wait_absent(&selected_copies, "ca-selected", "the copy gone with the label").await;

    // Deleting the ClusterProjection removes every copy it wrote there.
    cps.delete(&listing, &DeleteParams::default())
        .await
        .expect("delete");
    for namespace in &names {
        let copies: Api<ConfigMap> = Api::namespaced(remote.clone(), namespace);
        wait_absent(&copies, "ca", "the listed copies removed from the other cluster").await;
    }
    cps.delete(&selecting, &DeleteParams::default())
        .await
        .expect("delete");
    env.finish().await;
}

#[tokio::test]
async fn a_kubeconfig_that_runs_a_program_is_refused_and_a_cluster_that_does_not_answer_holds_only_its_cr() {
    let env = env("remote-bad").await;
    let (src, dst) = env.names();
    let (_, ca) = remote_server_and_ca();
    let runs_a_program = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:17443"}}],
        "users": [{"name": "x", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                   "command": "/bin/touch", "args": ["/tmp/projection-test-ran"]}}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
    });
    kubeconfig_secret(
        &env.client,
        &dst,
        "runs-a-program",
        &serde_yaml::to_string(&runs_a_program).unwrap(),
    )
    .await;
    // Nothing listens on this loopback port.
    let nowhere = token_kubeconfig(&format!("https://127.0.0.1:{}", free_port()), &ca, "token");
    kubeconfig_secret(&env.client, &dst, "nowhere", &nowhere).await;
    let _controller = controller(&[]).await;

    source_configmap(&env.api(&src), "cfg", json!({"k": "v"})).await;
    let to = |secret: &str| json!({"destination": {"name": format!("cfg-{secret}"), "kubeConfig": {"secretRef": {"name": secret}}}});
    create(
        &env.projections(),
        projection("exec", cm_source(&src, "cfg"), to("runs-a-program")),
    )
    .await;
    create(
        &env.projections(),
        projection("nowhere", cm_source(&src, "cfg"), to("nowhere")),
    )
    .await;
    create(
        &env.projections(),
        projection("here", cm_source(&src, "cfg"), json!({})),
    )
    .await;

    let refused = wait_not_ready(&env.projections(), "exec", "DestinationClusterInvalid").await;
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("users[\"x\"].exec would make the controller run a program"),
        "{message}"
    );
    let unreachable = wait_not_ready(&env.projections(), "nowhere", "DestinationClusterUnreachable").await;
    assert!(
        unreachable["message"]
            .as_str()
            .unwrap_or_default()
            .contains("did not answer"),
        "{unreachable}"
    );
    // The local path is not held up by either.
    wait_ready(&env.projections(), "here").await;
    assert!(
        !std::path::Path::new("/tmp/projection-test-ran").exists(),
        "the exec plugin was run"
    );
    env.finish().await;
}

#[tokio::test]
async fn an_author_who_may_not_read_the_kubeconfig_secret_writes_nothing_there() {
    let env = env("remote-author").await;
    let (src, dst) = env.names();
    let remote = remote_client().await;
    let _there = other_cluster_for(&env, &remote, "copies", None).await;
    let _controller = controller(&["--author-access=enforce"]).await;
    let user = format!("tenant-{dst}");
    // The author may read the source, not the Secret.
    grant(&env.client, &src, &user, rule("", "configmaps", "get")).await;
    project_settings_there(
        &env,
        "p",
        json!({shared::policy::author::AUTHOR: record(&user, &[])}),
    )
    .await;
    let denied = wait_not_ready(&env.projections(), "p", "DestinationClusterForbidden").await;
    let message = denied["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "the author {user} may not get secrets {dst}/other-cluster"
        )),
        "{message}"
    );
    let remote_copies: Api<ConfigMap> = Api::namespaced(remote.clone(), &dst);
    assert!(
        remote_copies.get_opt("settings").await.expect("get").is_none(),
        "a copy was written with credentials its author may not read"
    );

    // Allowed to read that Secret: the retry writes the copy there.
    grant(
        &env.client,
        &dst,
        &user,
        json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["other-cluster"]}),
    )
    .await;
    wait_ready(&env.projections(), "p").await;
    wait_object(
        &remote_copies,
        "settings",
        "the copy in the other cluster",
        |cm| data_of(cm)["level"] == "1",
    )
    .await;
    env.finish().await;
}

#[tokio::test]
async fn a_cluster_that_stops_answering_holds_only_its_cr_and_is_caught_up_when_it_answers_again() {
    let env = env("remote-gone").await;
    let (src, dst) = env.names();
    let remote = remote_client().await;
    // The controller reaches the other cluster through a proxy whose path the test cuts: every
    // connection stays open and nothing comes back, as behind a dead route.
    let proxy = proxy_to_the_other_cluster().await;
    let through_proxy = format!("https://{}", proxy.addr());
    let _there = other_cluster_for(&env, &remote, "copies", Some(&through_proxy)).await;
    let _controller = controller(&[]).await;
    project_settings_there(&env, "p", json!({})).await;
    create(
        &env.projections(),
        projection(
            "here",
            cm_source(&src, "settings"),
            json!({"destination": {"name": "local"}}),
        ),
    )
    .await;
    wait_ready(&env.projections(), "p").await;
    let remote_copies: Api<ConfigMap> = Api::namespaced(remote.clone(), &dst);
    wait_object(
        &remote_copies,
        "settings",
        "the copy in the other cluster",
        |_| true,
    )
    .await;

    proxy.black_hole();
    merge(
        &env.api::<ConfigMap>(&src),
        "settings",
        json!({"data": {"level": "2"}}),
    )
    .await;
    // The local copy follows at once; the CR writing over there reports its cluster, once the
    // request to it times out (15 s).
    let local_copies: Api<ConfigMap> = env.api(&dst);
    wait_object(&local_copies, "local", "the local copy, not held up", |cm| {
        data_of(cm)["level"] == "2"
    })
    .await;
    let projections = env.projections();
    let unreachable = wait_for(
        "p Ready=False DestinationClusterUnreachable",
        std::time::Duration::from_secs(45),
        || async {
            let p = projections.get("p").await.map_err(|e| e.to_string())?;
            let conditions = p.status.map(|s| s.copy.conditions).unwrap_or_default();
            match condition(&conditions, "Ready") {
                Some(c) if c.reason == "DestinationClusterUnreachable" => Ok(c.clone()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(unreachable.status, "False");

    // The path comes back: the retry (with backoff) writes the edit there.
    proxy.restore();
    wait_for("p Ready again", std::time::Duration::from_secs(45), || async {
        let p = projections.get("p").await.map_err(|e| e.to_string())?;
        let conditions = p.status.map(|s| s.copy.conditions).unwrap_or_default();
        match condition(&conditions, "Ready") {
            Some(c) if c.status == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_object(
        &remote_copies,
        "settings",
        "the edit caught up over there",
        |cm| data_of(cm)["level"] == "2",
    )
    .await;
    env.finish().await;
}

#[tokio::test]
async fn a_cluster_property_of_the_about_api_names_the_source_cluster_where_served() {
    let env = env("remote-about").await;
    let dst = env.dest.name().to_owned();
    // The About API (KEP-2149), served here for this test only: its CRD and the property naming
    // this cluster in its ClusterSet.
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "clusterproperties.about.k8s.io",
                     "annotations": {"api-approved.kubernetes.io": "unapproved, this test's stand-in"}},
        "spec": {"group": "about.k8s.io", "scope": "Cluster",
                 "names": {"plural": "clusterproperties", "singular": "clusterproperty", "kind": "ClusterProperty"},
                 "versions": [{"name": "v1alpha1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {"spec": {"type": "object", "properties": {"value": {"type": "string"}}}}}}}]}}))
    .expect("a CRD");
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    crds.patch(
        "clusterproperties.about.k8s.io",
        &PatchParams::apply("projection-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("the About API's CRD");
    let _crd_guard = ClusterScopedGuard::new("crd", "clusterproperties.about.k8s.io");
    projection_tests::wait_crd_established(&env.client, "clusterproperties.about.k8s.io").await;
    let properties = Api::<kube::api::DynamicObject>::all_with(
        env.client.clone(),
        &kube::api::ApiResource {
            group: "about.k8s.io".into(),
            version: "v1alpha1".into(),
            api_version: "about.k8s.io/v1alpha1".into(),
            kind: "ClusterProperty".into(),
            plural: "clusterproperties".into(),
        },
    );
    let identity = format!("eu-{dst}");
    let property = json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
                          "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": identity}});
    properties
        .patch(
            "cluster.clusterset.k8s.io",
            &PatchParams::apply("projection-tests").force(),
            &Patch::Apply(&property),
        )
        .await
        .expect("the property");

    let remote = remote_client().await;
    let _there = other_cluster_for(&env, &remote, "copies", None).await;
    let _controller = controller(&[]).await;
    project_settings_there(&env, "p", json!({})).await;
    let remote_copies: Api<ConfigMap> = Api::namespaced(remote.clone(), &dst);
    let copy = wait_object(
        &remote_copies,
        "settings",
        "the copy in the other cluster",
        |_| true,
    )
    .await;
    assert_eq!(
        annotation(&copy, SOURCE_CLUSTER),
        Some(identity.as_str()),
        "the copy names the cluster by its ClusterProperty"
    );
    env.finish().await;
}

/// A copy written into the other cluster just before its CR was deleted, its status not recorded
/// yet (a controller that stopped between the write and the status write): the deletion still
/// sweeps it there, found by the CR's UID and proven ours by its annotations.
#[tokio::test]
async fn a_copy_written_before_its_status_was_recorded_is_swept_when_its_cr_goes() {
    let env = env("remote-unrecorded").await;
    let remote = remote_client().await;
    let there = other_cluster_for(&env, &remote, "copies", None).await;
    let dst = env.dest.name().to_owned();
    // The CR, with the finalizer a controller would have added, and no status: no controller runs.
    project_settings_there(&env, "p", json!({})).await;
    let cr = merge(
        &env.projections(),
        "p",
        json!({"metadata": {"finalizers": ["projection.sh/finalizer"]}}),
    )
    .await;
    let uid = cr.metadata.uid.clone().expect("a uid");
    // The copy that controller wrote over there before it stopped.
    let copies: Api<ConfigMap> = Api::namespaced(remote.clone(), there.name());
    create(
        &copies,
        json!({"metadata": {
            "name": "settings",
            "labels": {"projection.sh/owned-by-projection-uid": uid},
            "annotations": {OWNED_BY_PROJECTION: format!("{dst}/p"), SOURCE_CLUSTER: local_identity(&env.client).await},
        }, "data": {"level": "1"}}),
    )
    .await;
    env.projections()
        .delete("p", &DeleteParams::default())
        .await
        .expect("deleted");
    let _controller = controller(&[]).await;
    wait_absent(&copies, "settings", "the unrecorded copy swept over there").await;
    wait_absent(&env.projections(), "p", "the CR gone").await;
    env.finish().await;
}

/// Longer than the backoff a held deletion has reached after a few failed retries.
const RETRIED_WITHIN: std::time::Duration = std::time::Duration::from_secs(90);

/// The kubeconfig Secret a Projection's copies were written through, pointed later at another
/// apiserver: the Projection is `Stalled` with `DestinationClusterInvalid` saying what to do, and
/// its copy stays as it was where it is (not updated, not left ours and out of reach); deleting
/// the Projection then waits (`DeletionBlocked`) until the Secret points back, when the copy goes
/// with it.
#[tokio::test]
async fn a_secret_pointed_at_another_cluster_leaves_no_copy_behind() {
    let env = env("remote-repoint").await;
    let (src, dst) = env.names();
    let remote = remote_client().await;
    let _there = other_cluster_for(&env, &remote, "copies", None).await;
    let _controller = controller(&[]).await;
    let remote_copies: Api<ConfigMap> = Api::namespaced(remote.clone(), &dst);
    project_settings_there(&env, "p", json!({})).await;
    wait_ready(&env.projections(), "p").await;
    wait_object(&remote_copies, "settings", "the copy over there", |cm| {
        data_of(cm)["level"] == "1"
    })
    .await;
    let recorded = env.projections().get("p").await.expect("p").status;
    let recorded = recorded
        .and_then(|s| s.copy.written_destination)
        .and_then(|w| w.cluster)
        .expect("the other apiserver recorded");
    assert!(recorded.starts_with("server-"), "{recorded}");

    // The same Secret, now reaching another apiserver (no connection is needed to tell).
    let secrets: Api<Secret> = env.api(&dst);
    let first = secrets.get(SECRET).await.expect("the Secret").data.expect("data")["value"].clone();
    let first = String::from_utf8(first.0).expect("UTF-8");
    let elsewhere = first.replace(&remote_server_and_ca().0, "https://127.0.0.1:9");
    assert_ne!(first, elsewhere);
    kubeconfig_secret(&env.client, &dst, SECRET, &elsewhere).await;
    // A source edit wakes the Projection (no Secret is watched).
    merge(
        &env.api::<ConfigMap>(&src),
        "settings",
        json!({"data": {"level": "2"}}),
    )
    .await;
    let ready = wait_not_ready(&env.projections(), "p", "DestinationClusterInvalid").await;
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("Secret {dst}/{SECRET} now reaches another apiserver"))
            && message.contains(&recorded)
            && message.contains("Point the Secret back"),
        "{message}"
    );
    wait_condition(
        &env.projections(),
        "p",
        "Stalled",
        "True",
        Some("DestinationClusterInvalid"),
    )
    .await;
    let copy = remote_copies.get("settings").await.expect("the copy stays");
    assert_eq!(
        data_of(&copy)["level"],
        "1",
        "not written through the repointed Secret"
    );

    // Deleting it now would leave the copy behind: the deletion waits for the Secret.
    env.projections()
        .delete("p", &DeleteParams::default())
        .await
        .expect("deleted");
    wait_for("the deletion held", common::TIMEOUT, || async {
        let events = projection_tests::events_about(&env.client, &dst, "p").await;
        events
            .iter()
            .find(|e| {
                e.reason.as_deref() == Some("DeletionBlocked")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("now reaches another apiserver"))
            })
            .map(|_| ())
            .ok_or(format!("{events:?}"))
    })
    .await;
    assert!(
        env.projections().get_opt("p").await.expect("get").is_some(),
        "held by its finalizer"
    );
    assert!(remote_copies.get_opt("settings").await.expect("get").is_some());
    // Pointed back: at the next retry (backing off, as the Secret is not watched) the copy goes,
    // then the Projection.
    kubeconfig_secret(&env.client, &dst, SECRET, &first).await;
    wait_for(
        "the copy removed over there, then the Projection",
        RETRIED_WITHIN,
        || async {
            let copy = remote_copies
                .get_opt("settings")
                .await
                .map_err(|e| e.to_string())?;
            let cr = env.projections().get_opt("p").await.map_err(|e| e.to_string())?;
            match (copy, cr) {
                (None, None) => Ok(()),
                (copy, cr) => Err(format!(
                    "copy there: {}, Projection: {}",
                    copy.is_some(),
                    cr.is_some()
                )),
            }
        },
    )
    .await;
    env.finish().await;
}

/// An object already at a copy's coordinates in the other cluster is adopted only with a consent
/// naming the CR *and* its cluster (`<namespace>/<name>@<identity>`): one naming the CR alone is a
/// conflict whose message gives the value to write, and the object is left untouched.
#[tokio::test]
async fn adoption_in_another_cluster_needs_a_consent_naming_the_crs_cluster() {
    let env = env("remote-adopt").await;
    let dst = env.dest.name().to_owned();
    let remote = remote_client().await;
    let _there = other_cluster_for(&env, &remote, "copies", None).await;
    let identity = local_identity(&env.client).await;
    let remote_copies: Api<ConfigMap> = Api::namespaced(remote.clone(), &dst);
    create(
        &remote_copies,
        json!({"metadata": {"name": "settings", "annotations": {"projection.sh/adopt-by": format!("{dst}/p")}},
               "data": {"level": "0", "theirs": "x"}}),
    )
    .await;
    let _controller = controller(&[]).await;
    project_settings_there(&env, "p", json!({})).await;
    let ready = wait_not_ready(&env.projections(), "p", "DestinationConflict").await;
    let wanted = format!("{dst}/p@{identity}");
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("names \"{dst}/p\", not \"{wanted}\""))),
        "{ready}"
    );
    assert_eq!(
        data_of(&remote_copies.get("settings").await.expect("there"))["level"],
        "0",
        "a stranger's object, untouched"
    );
    merge(
        &remote_copies,
        "settings",
        json!({"metadata": {"annotations": {"projection.sh/adopt-by": wanted}}}),
    )
    .await;
    wait_ready(&env.projections(), "p").await;
    let copy = wait_object(&remote_copies, "settings", "the object adopted", |cm| {
        data_of(cm)["level"] == "1"
    })
    .await;
    assert_eq!(
        annotation(&copy, OWNED_BY_PROJECTION),
        Some(format!("{dst}/p").as_str())
    );
    assert_eq!(annotation(&copy, SOURCE_CLUSTER), Some(identity.as_str()));
    assert_eq!(
        annotation(&copy, "projection.sh/adopt-by"),
        None,
        "the consent is used up"
    );
    env.finish().await;
}

/// The proxy in front of the second apiserver, whose path a test can cut.
async fn proxy_to_the_other_cluster() -> BlackHoleProxy {
    let (server, _) = remote_server_and_ca();
    let upstream: std::net::SocketAddr = server
        .trim_start_matches("https://")
        .parse()
        .expect("the second apiserver's address");
    BlackHoleProxy::start(upstream).await.expect("the proxy")
}

#[tokio::test]
async fn a_pass_still_waiting_when_its_replicas_lease_lapses_is_cut_short_and_run_anew() {
    let _cores = projection_tests::cores_timed().await;
    let env = env("remote-fence").await;
    let (src, dst) = env.names();
    let remote = remote_client().await;
    // The Projection's pass waits on the other cluster, whose path is cut from the start.
    let there_path = proxy_to_the_other_cluster().await;
    there_path.black_hole();
    let _there = other_cluster_for(
        &env,
        &remote,
        "copies",
        Some(&format!("https://{}", there_path.addr())),
    )
    .await;
    // One replica with shards (a ring of one), reaching its own apiserver through a proxy too.
    let upstream = projection_tests::apiserver_addr()
        .await
        .expect("the apiserver's address");
    let home_path = BlackHoleProxy::start(upstream).await.expect("the proxy");
    let kubeconfig_file = projection_tests::kubeconfig_through(home_path.addr(), "fence");
    let name = format!("fence-{}", std::process::id());
    let mut replica = projection_tests::ServiceProcess::start_as(
        binary(),
        &[
            "--author-access=trusted",
            "--requeue-interval",
            "5m",
            "--shard-by-lease",
            "--leader-election-lease-duration",
            "4s",
            "--leader-election-namespace",
            &src,
        ],
        &kubeconfig_file,
        &[("POD_NAME", &name)],
    );
    replica.wait_ready().await;
    let fenced = "projection_shard_fenced_passes_total";
    assert_eq!(metric_value(&replica.metrics(), fenced), Some(0.0));

    let asked = std::time::Instant::now();
    project_settings_there(&env, "p", json!({})).await;
    wait_for(
        "the pass waiting on the other cluster",
        std::time::Duration::from_secs(20),
        || async {
            (there_path.accepted_since(asked).0 > 0)
                .then_some(())
                .ok_or_else(|| "no connection to the other cluster yet".to_owned())
        },
    )
    .await;
    // Its own apiserver falls silent: no renewal gets through, and within two thirds of the Lease
    // the pass waiting elsewhere is cut short, before its request there could time out (15 s) and
    // before anything after it (the status) is written.
    home_path.black_hole();
    let silenced = std::time::Instant::now();
    wait_for(
        "the pass cut short",
        std::time::Duration::from_secs(10),
        || async {
            let metrics = replica.metrics();
            (metric_value(&metrics, fenced).unwrap_or_default() >= 1.0)
                .then_some(())
                .ok_or(format!("{fenced} still 0"))
        },
    )
    .await;
    let cut_after = silenced.elapsed();
    assert!(
        cut_after < std::time::Duration::from_secs(4),
        "cut {cut_after:?} after the apiserver fell silent (Lease 4 s)"
    );
    eprintln!("the pass was cut short {cut_after:?} after the replica's apiserver fell silent");
    // Both paths back: the replica renews its Lease and runs the pass anew, to its end.
    home_path.restore();
    there_path.restore();
    wait_ready(&env.projections(), "p").await;
    let copies: Api<ConfigMap> = Api::namespaced(remote.clone(), &dst);
    wait_object(&copies, "settings", "the copy in the other cluster", |cm| {
        data_of(cm)["level"] == "1"
    })
    .await;
    let _ = std::fs::remove_file(&kubeconfig_file);
    env.finish().await;
}
