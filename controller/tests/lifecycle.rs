//! Lifecycle controls against the real control plane, as a user sees them (SPEC §10): suspend and
//! resume, a requested reconcile, the deletion and source-deletion policies, adoption with consent.
//! Both kinds; objects, conditions, events and `kubectl get -o wide`.

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{WatchEvent, WatchParams},
};
use projection_tests::{NamespaceSet, events_about, kubectl_ok, wait_for, wait_for_event};
use serde_json::json;
use shared::api::crd::{ClusterProjection, ClusterProjectionStatus, Projection};

mod common;
use common::*;

const OWNED_BY_PROJECTION: &str = "projection.sh/owned-by-projection";
const OWNED_BY_PROJECTION_UID: &str = "projection.sh/owned-by-projection-uid";
const OWNED_BY_CLUSTER: &str = "projection.sh/owned-by-cluster-projection";
const OWNED_BY_CLUSTER_UID: &str = "projection.sh/owned-by-cluster-projection-uid";
const REQUESTED_AT: &str = "projection.sh/requested-at";
const ADOPT_BY: &str = "projection.sh/adopt-by";

/// How many times the object `name` was written since `resource_version`, read from the watch
/// history (the window only bounds how long the history is read; the state was waited for).
async fn writes_since(api: &Api<ConfigMap>, name: &str, resource_version: &str) -> usize {
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(2);
    let events: Vec<WatchEvent<ConfigMap>> = api
        .watch(&params, resource_version)
        .await
        .expect("watch the copy's history")
        .try_collect()
        .await
        .expect("the copy's history");
    events
        .iter()
        .filter(|e| {
            matches!(
                e,
                WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)
            )
        })
        .count()
}

/// Creates the test run's ClusterProjection (the member `cp` of `namespaces`) with `spec`; returns
/// its name: the ClusterProjection tests' opening.
async fn create_run_cluster_projection(
    cps: &Api<ClusterProjection>,
    namespaces: &NamespaceSet,
    spec: serde_json::Value,
) -> String {
    let name = namespaces.name("cp");
    create_cluster_projection(cps, &name, spec).await;
    name
}

/// Creates, in the run's namespace `source`, the opted-in ConfigMap `cfg` holding `{"a": "1"}` and
/// the run's ClusterProjection of it with the spec fields `extra`; returns the ClusterProjection's
/// name: the opening of the tests that read their source from a namespace of the run.
async fn cluster_project_new_configmap(
    cps: &Api<ClusterProjection>,
    namespaces: &NamespaceSet,
    source: &str,
    extra: serde_json::Value,
) -> String {
    let client = cps.clone().into_client();
    source_configmap(&Api::namespaced(client, source), "cfg", json!({"a": "1"})).await;
    create_run_cluster_projection(cps, namespaces, spec_of(cm_source(source, "cfg"), extra)).await
}

/// Deletes a ClusterProjection and waits until its finalizer is done.
async fn delete_cluster_projection(api: &Api<ClusterProjection>, name: &str) {
    delete(api, name).await;
    wait_gone(api, name).await;
}

/// The value in the first row of `kubectl get` output under the column `header` (columns are
/// aligned, and an empty cell leaves only spaces).
fn column(table: &str, header: &str) -> String {
    let mut lines = table.lines();
    let head = lines.next().unwrap_or_default();
    let start = head
        .find(header)
        .unwrap_or_else(|| panic!("no {header} column: {table}"));
    let row = lines.next().unwrap_or_default();
    row.get(start..)
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Waits until the CR is gone, its finalizer done.
async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_for(&format!("{name} gone"), TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

/// Whether the object carries none of the keys of `owner_keys` (annotation, label).
fn unmanaged(cm: &ConfigMap, (annotation, label): (&str, &str)) -> bool {
    !cm.annotations().contains_key(annotation)
        && !cm.labels().contains_key(label)
        && !cm.annotations().contains_key(REQUESTED_AT)
}

async fn projection_status(api: &Api<Projection>, name: &str) -> shared::api::crd::ProjectionStatus {
    api.get(name)
        .await
        .expect("projection")
        .status
        .unwrap_or_default()
}

#[tokio::test]
async fn a_suspended_projection_writes_nothing_and_resumes_with_one_write() {
    let env = env("suspend").await;
    let controller = controller(&[]).await;
    let (src, dst) = env.names();
    let sources = env.api::<ConfigMap>(&src);
    let copies = env.api::<ConfigMap>(&dst);
    env.project_new_configmap("p", "cfg", json!({"level": "info"}), json!({}))
        .await;
    wait_ready(&env.projections(), "p").await;

    merge(&env.projections(), "p", json!({"spec": {"suspend": true}})).await;
    let suspended = wait_condition(&env.projections(), "p", "Suspended", "True", Some("Suspended")).await;
    assert!(
        suspended["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.suspend"),
        "{suspended}"
    );
    let status = projection_status(&env.projections(), "p").await;
    let ready = condition(&status.copy.conditions, "Ready").expect("Ready");
    assert_eq!(
        (
            ready.status.as_str(),
            ready.reason.as_str(),
            ready.observed_generation
        ),
        ("True", "Projected", Some(1)),
        "the other conditions keep the values of the last pass"
    );
    let wide = kubectl_ok(&["get", "projection", "p", "-n", &dst, "-o", "wide"]);
    assert_eq!(column(&wide, "SUSPENDED"), "true", "{wide}");

    // A source edit while suspended wakes the Projection, which writes nothing.
    let before = copies.get("cfg").await.expect("copy");
    let edit = merge(&sources, "cfg", json!({"data": {"level": "debug"}}));
    change_and_wait_reconciled(&controller, &format!("{dst}/p"), edit).await;
    let held = copies.get("cfg").await.expect("copy");
    assert_eq!(
        data_of(&held),
        json!({"level": "info"}),
        "no write while suspended"
    );
    assert_eq!(held.resource_version(), before.resource_version());

    // Resume: one full reconcile catches up with exactly one write of the copy.
    merge(&env.projections(), "p", json!({"spec": {"suspend": false}})).await;
    wait_ready(&env.projections(), "p").await;
    wait_object(&copies, "cfg", "the copy caught up", |c| {
        data_of(c) == json!({"level": "debug"})
    })
    .await;
    let status = projection_status(&env.projections(), "p").await;
    assert!(
        condition(&status.copy.conditions, "Suspended").is_none(),
        "Suspended is gone once resumed: {:?}",
        status.copy.conditions
    );
    let rv = before.resource_version().expect("resourceVersion");
    assert_eq!(
        writes_since(&copies, "cfg", &rv).await,
        1,
        "exactly one write on resume"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_suspended_cluster_projection_ignores_deleted_copies_and_new_namespaces_until_resumed() {
    let env = env("csuspend").await;
    let controller = controller(&[]).await;
    let client = env.client.clone();
    let mut namespaces = NamespaceSet::new("csuspend");
    let source = namespaces.create(&client, "src", &[]).await;
    let first = namespaces
        .create(&client, "one", &[("lifecycle-test", "yes")])
        .await;
    let second = namespaces.create(&client, "two", &[]).await;
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let name = cluster_project_new_configmap(
        &cps,
        &namespaces,
        &source,
        json!({"destination": {"namespaceSelector": {"matchLabels": {"lifecycle-test": "yes"}}}}),
    )
    .await;
    let cm = |ns: &str| Api::<ConfigMap>::namespaced(client.clone(), ns);
    wait_cluster(&cps, &name, "Ready with 1 copy", |s| ready_with(s, 1)).await;

    merge(&cps, &name, json!({"spec": {"suspend": true}})).await;
    wait_cluster(&cps, &name, "Suspended", |cp| {
        let status = cp.status.clone().unwrap_or_default();
        condition(&status.copy.conditions, "Suspended")
            .is_some_and(|c| c.status == "True" && c.observed_generation == cp.metadata.generation)
    })
    .await;
    let wide = kubectl_ok(&["get", "clusterprojection", &name, "-o", "wide"]);
    assert_eq!(column(&wide, "SUSPENDED"), "true", "{wide}");

    // A deleted copy and a namespace that starts matching: nothing happens while suspended.
    change_and_wait_reconciled(&controller, &name, delete(&cm(&first), "cfg")).await;
    change_and_wait_reconciled(&controller, &name, async {
        kubectl_ok(&["label", "namespace", &second, "lifecycle-test=yes"])
    })
    .await;
    assert!(
        cm(&first).get_opt("cfg").await.expect("get").is_none(),
        "not re-created while suspended"
    );
    assert!(
        cm(&second).get_opt("cfg").await.expect("get").is_none(),
        "not written while suspended"
    );
    let held = cps.get(&name).await.expect("cp").status.unwrap_or_default();
    assert_eq!(
        held.counts.namespaces_written, 1,
        "the counts of the last pass stay"
    );

    merge(&cps, &name, json!({"spec": {"suspend": false}})).await;
    let status = wait_cluster(&cps, &name, "Ready with 2 copies", |s| ready_with(s, 2)).await;
    assert!(condition(&status.copy.conditions, "Suspended").is_none());
    for ns in [&first, &second] {
        let copy = cm(ns).get("cfg").await.expect("copy after resume");
        assert_eq!(data_of(&copy), json!({"a": "1"}));
    }
    delete_cluster_projection(&cps, &name).await;
    env.finish().await;
}

#[tokio::test]
async fn a_requested_reconcile_rewrites_unchanged_copies_once_and_is_echoed() {
    let env = env("requested").await;
    let _controller = controller(&[]).await;
    let (_, dst) = env.names();
    let copies = env.api::<ConfigMap>(&dst);
    env.project_new_configmap("p", "cfg", json!({"a": "1"}), json!({}))
        .await;
    wait_ready(&env.projections(), "p").await;
    let before = copies.get("cfg").await.expect("copy");
    let rv = before.resource_version().expect("resourceVersion");

    merge(
        &env.projections(),
        "p",
        json!({"metadata": {"annotations": {REQUESTED_AT: "2026-11-23T16:00:00Z"}}}),
    )
    .await;
    wait_for("lastHandledReconcileAt echoed", TIMEOUT, || async {
        let status = projection_status(&env.projections(), "p").await;
        match status.copy.last_handled_reconcile_at.as_deref() {
            Some("2026-11-23T16:00:00Z") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let copy = copies.get("cfg").await.expect("copy");
    assert_eq!(
        copy.annotations().get(REQUESTED_AT).map(String::as_str),
        Some("2026-11-23T16:00:00Z"),
        "the copy carries the request it was rewritten for"
    );
    assert_eq!(data_of(&copy), json!({"a": "1"}));
    assert_eq!(
        writes_since(&copies, "cfg", &rv).await,
        1,
        "rewritten exactly once"
    );
    let shown = kubectl_ok(&[
        "get",
        "projection",
        "p",
        "-n",
        &dst,
        "-o",
        "jsonpath={.status.lastHandledReconcileAt}",
    ]);
    assert_eq!(shown, "2026-11-23T16:00:00Z");
    wait_ready(&env.projections(), "p").await;
    env.finish().await;
}

#[tokio::test]
async fn a_requested_reconcile_rewrites_every_copy_of_a_cluster_projection() {
    let env = env("crequested").await;
    let _controller = controller(&[]).await;
    let client = env.client.clone();
    let mut namespaces = NamespaceSet::new("crequested");
    let source = namespaces.create(&client, "src", &[]).await;
    let targets = [
        namespaces.create(&client, "a", &[]).await,
        namespaces.create(&client, "b", &[]).await,
    ];
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let name = cluster_project_new_configmap(
        &cps,
        &namespaces,
        &source,
        json!({"destination": {"namespaces": targets}}),
    )
    .await;
    let cm = |ns: &str| Api::<ConfigMap>::namespaced(client.clone(), ns);
    wait_cluster(&cps, &name, "Ready with 2 copies", |s| ready_with(s, 2)).await;
    let mut versions = Vec::new();
    for ns in &targets {
        let copy = cm(ns).get("cfg").await.expect("copy");
        versions.push(copy.resource_version().expect("resourceVersion"));
    }
    merge(
        &cps,
        &name,
        json!({"metadata": {"annotations": {REQUESTED_AT: "first"}}}),
    )
    .await;
    wait_cluster(&cps, &name, "request echoed", |cp| {
        cp.status
            .as_ref()
            .and_then(|s| s.copy.last_handled_reconcile_at.as_deref())
            == Some("first")
            && ready_with(cp, 2)
    })
    .await;
    for (ns, rv) in targets.iter().zip(&versions) {
        let copy = cm(ns).get("cfg").await.expect("copy");
        assert_eq!(
            copy.annotations().get(REQUESTED_AT).map(String::as_str),
            Some("first")
        );
        assert_eq!(
            writes_since(&cm(ns), "cfg", rv).await,
            1,
            "{ns}: rewritten exactly once"
        );
    }
    delete_cluster_projection(&cps, &name).await;
    env.finish().await;
}

#[tokio::test]
async fn orphan_on_deletion_leaves_unmanaged_copies_with_events() {
    let env = env("orphan").await;
    let _controller = controller(&[]).await;
    let client = env.client.clone();
    let (src, dst) = env.names();
    let copies = env.api::<ConfigMap>(&dst);
    env.project_new_configmap("p", "cfg", json!({"a": "1"}), json!({"deletionPolicy": "Orphan"}))
        .await;
    let mut namespaces = NamespaceSet::new("orphan");
    let targets = [
        namespaces.create(&client, "a", &[]).await,
        namespaces.create(&client, "b", &[]).await,
    ];
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let name = create_run_cluster_projection(
        &cps,
        &namespaces,
        json!({"source": cm_source(&src, "cfg"), "destination": {"namespaces": targets},
                 "deletionPolicy": "Orphan"}),
    )
    .await;
    wait_ready(&env.projections(), "p").await;
    wait_cluster(&cps, &name, "Ready with 2 copies", |s| ready_with(s, 2)).await;

    delete(&env.projections(), "p").await;
    wait_gone(&env.projections(), "p").await;
    let copy = copies.get("cfg").await.expect("the copy stays");
    assert!(
        unmanaged(&copy, (OWNED_BY_PROJECTION, OWNED_BY_PROJECTION_UID)),
        "{:?}",
        copy.metadata
    );
    assert_eq!(data_of(&copy), json!({"a": "1"}));
    let note = wait_for_event(&client, &dst, "p", "DestinationOrphaned").await;
    assert_eq!(note, format!("{dst}/cfg left in place, no longer managed"));

    delete_cluster_projection(&cps, &name).await;
    for ns in &targets {
        let copy = Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get("cfg")
            .await
            .expect("the copy stays");
        assert!(
            unmanaged(&copy, (OWNED_BY_CLUSTER, OWNED_BY_CLUSTER_UID)),
            "{:?}",
            copy.metadata
        );
    }
    let note = wait_for_event(&client, "default", &name, "DestinationOrphaned").await;
    assert_eq!(
        note,
        format!(
            "{}/cfg, {}/cfg left in place, no longer managed",
            targets[0], targets[1]
        ),
        "one event for the fan-out"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_deleted_source_with_orphan_keeps_the_copies_but_a_veto_retracts_them() {
    let env = env("srcorphan").await;
    let _controller = controller(&[]).await;
    let client = env.client.clone();
    let (src, dst) = env.names();
    let sources = env.api::<ConfigMap>(&src);
    let copies = env.api::<ConfigMap>(&dst);
    for name in ["gone", "vetoed"] {
        env.project_new_configmap(
            name,
            name,
            json!({"a": "1"}),
            json!({"sourceDeletionPolicy": "Orphan"}),
        )
        .await;
    }
    let mut namespaces = NamespaceSet::new("srcorphan");
    let target = namespaces.create(&client, "a", &[]).await;
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let name = create_run_cluster_projection(
        &cps,
        &namespaces,
        json!({"source": cm_source(&src, "gone"), "destination": {"namespaces": [target]},
                 "sourceDeletionPolicy": "Orphan"}),
    )
    .await;
    wait_ready(&env.projections(), "gone").await;
    wait_ready(&env.projections(), "vetoed").await;
    wait_cluster(&cps, &name, "Ready with 1 copy", |s| ready_with(s, 1)).await;

    delete(&sources, "gone").await;
    wait_condition(
        &env.projections(),
        "gone",
        "SourceResolved",
        "False",
        Some("SourceDeleted"),
    )
    .await;
    let kept = copies.get("gone").await.expect("the copy stays");
    assert!(
        unmanaged(&kept, (OWNED_BY_PROJECTION, OWNED_BY_PROJECTION_UID)),
        "{:?}",
        kept.metadata
    );
    let note = wait_for_event(&client, &dst, "gone", "DestinationOrphaned").await;
    assert_eq!(note, format!("{dst}/gone left in place, no longer managed"));
    wait_cluster(&cps, &name, "SourceDeleted", |cp| {
        let status = cp.status.clone().unwrap_or_default();
        condition(&status.copy.conditions, "SourceResolved").is_some_and(|c| c.reason == "SourceDeleted")
    })
    .await;
    let cluster_copy = Api::<ConfigMap>::namespaced(client.clone(), &target)
        .get("gone")
        .await
        .expect("the cluster copy stays");
    assert!(unmanaged(&cluster_copy, (OWNED_BY_CLUSTER, OWNED_BY_CLUSTER_UID)));

    // A veto withdraws consent: the copy goes whatever the policy says.
    merge(
        &sources,
        "vetoed",
        json!({"metadata": {"annotations": {"projection.sh/projectable": "false"}}}),
    )
    .await;
    wait_condition(
        &env.projections(),
        "vetoed",
        "SourceResolved",
        "False",
        Some("SourceOptedOut"),
    )
    .await;
    wait_absent(&copies, "vetoed", "the vetoed copy deleted").await;
    delete_cluster_projection(&cps, &name).await;
    env.finish().await;
}

#[tokio::test]
async fn adoption_needs_the_exact_cr_named_by_the_owner() {
    let env = env("adopt").await;
    let _controller = controller(&[]).await;
    let client = env.client.clone();
    let (src, dst) = env.names();
    let copies = env.api::<ConfigMap>(&dst);
    source_configmap(&env.api::<ConfigMap>(&src), "cfg", json!({"a": "from-source"})).await;
    // Two hand-made objects: one names the Projection that will adopt it, one names another.
    create(
        &copies,
        json!({"metadata": {"name": "adopted", "annotations": {ADOPT_BY: format!("{dst}/p")}},
               "data": {"a": "hand-made"}}),
    )
    .await;
    create(
        &copies,
        json!({"metadata": {"name": "refused", "annotations": {ADOPT_BY: format!("{dst}/someone-else")}},
               "data": {"a": "hand-made"}}),
    )
    .await;
    env.project_configmap("p", "cfg", json!({"destination": {"name": "adopted"}}))
        .await;
    env.project_configmap("q", "cfg", json!({"destination": {"name": "refused"}}))
        .await;

    wait_ready(&env.projections(), "p").await;
    let adopted = copies.get("adopted").await.expect("adopted");
    assert_eq!(data_of(&adopted), json!({"a": "from-source"}));
    assert_eq!(
        adopted.annotations().get(OWNED_BY_PROJECTION).map(String::as_str),
        Some(format!("{dst}/p").as_str())
    );
    assert!(
        !adopted.annotations().contains_key(ADOPT_BY),
        "consent is used up"
    );
    let note = wait_for_event(&client, &dst, "p", "DestinationAdopted").await;
    assert_eq!(note, format!("adopted {dst}/adopted as the copy of {src}/cfg"));

    let refused = wait_condition(
        &env.projections(),
        "q",
        "DestinationWritten",
        "False",
        Some("DestinationConflict"),
    )
    .await;
    assert_eq!(
        refused["message"],
        format!(
            "destination {dst}/refused exists and is not owned by this Projection: its \
             projection.sh/adopt-by names \"{dst}/someone-else\", not \"{dst}/q\""
        )
    );
    let untouched = copies.get("refused").await.expect("refused");
    assert_eq!(data_of(&untouched), json!({"a": "hand-made"}));

    // The owner names q instead: the watch on the stranger wakes q, which adopts it.
    merge(
        &copies,
        "refused",
        json!({"metadata": {"annotations": {ADOPT_BY: format!("{dst}/q")}}}),
    )
    .await;
    wait_ready(&env.projections(), "q").await;
    let now_ours = copies.get("refused").await.expect("adopted by q");
    assert_eq!(data_of(&now_ours), json!({"a": "from-source"}));
    assert!(!now_ours.annotations().contains_key(ADOPT_BY));

    // A ClusterProjection adopts with `cluster/<name>`.
    let mut namespaces = NamespaceSet::new("adopt");
    let target = namespaces.create(&client, "a", &[]).await;
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let name = namespaces.name("cp");
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), &target),
        json!({"metadata": {"name": "cfg", "annotations": {ADOPT_BY: format!("cluster/{name}")}},
               "data": {"a": "hand-made"}}),
    )
    .await;
    create_cluster_projection(
        &cps,
        &name,
        json!({"source": cm_source(&src, "cfg"), "destination": {"namespaces": [target]}}),
    )
    .await;
    wait_cluster(&cps, &name, "Ready with 1 copy", |s| ready_with(s, 1)).await;
    let note = wait_for_event(&client, "default", &name, "DestinationAdopted").await;
    assert_eq!(note, format!("adopted {target}/cfg as the copy of {src}/cfg"));
    let copy = Api::<ConfigMap>::namespaced(client.clone(), &target)
        .get("cfg")
        .await
        .expect("adopted");
    assert_eq!(copy.annotations().get(OWNED_BY_CLUSTER), Some(&name));
    assert!(!copy.annotations().contains_key(ADOPT_BY));
    assert!(
        events_about(&client, &dst, "p")
            .await
            .iter()
            .all(|e| e.type_.as_deref() == Some("Normal")),
        "adoption is no warning"
    );
    delete_cluster_projection(&cps, &name).await;
    env.finish().await;
}

/// Whether every condition was computed for the current generation, `Ready` is `True` and
/// `written` namespaces hold a copy.
fn ready_with(cp: &ClusterProjection, written: i32) -> bool {
    let status = cp.status.clone().unwrap_or_default();
    !status.copy.conditions.is_empty()
        && status
            .copy
            .conditions
            .iter()
            .all(|c| c.observed_generation == cp.metadata.generation)
        && condition(&status.copy.conditions, "Ready").is_some_and(|c| c.status == "True")
        && status.counts.namespaces_written == written
        && status.counts.namespaces_failed == 0
}

/// Waits until the ClusterProjection satisfies `check`; returns its status.
async fn wait_cluster<F>(
    api: &Api<ClusterProjection>,
    name: &str,
    what: &str,
    check: F,
) -> ClusterProjectionStatus
where
    F: Fn(&ClusterProjection) -> bool,
{
    wait_for(&format!("{name}: {what}"), TIMEOUT, || async {
        let cp = api.get(name).await.map_err(|e| e.to_string())?;
        if check(&cp) {
            Ok(cp.status.unwrap_or_default())
        } else {
            Err(format!("{:?}", cp.status))
        }
    })
    .await
}

#[tokio::test]
async fn apply_once_creates_each_copy_once_and_reconcile_takes_them_over_again() {
    let env = env("applyonce").await;
    let controller = controller(&[]).await;
    let client = env.client.clone();
    let mut namespaces = NamespaceSet::new("applyonce");
    let source = namespaces.create(&client, "src", &[]).await;
    let edited = namespaces
        .create(&client, "edited", &[("lifecycle-once", "yes")])
        .await;
    let deleted = namespaces
        .create(&client, "deleted", &[("lifecycle-once", "yes")])
        .await;
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let name = cluster_project_new_configmap(
        &cps,
        &namespaces,
        &source,
        json!({"syncPolicy": "ApplyOnce",
                 "destination": {"namespaceSelector": {"matchLabels": {"lifecycle-once": "yes"}}}}),
    )
    .await;
    let cm = |ns: &str| Api::<ConfigMap>::namespaced(client.clone(), ns);
    let status = wait_cluster(&cps, &name, "Ready with 2 copies", |cp| ready_with(cp, 2)).await;
    let record = status.copy.applied_once.expect("the record of created copies");
    assert_eq!(record.count, 2);

    // A hand edit stays, a deleted copy is not created again, a source edit reaches no copy.
    merge(&cm(&edited), "cfg", json!({"data": {"a": "by-hand"}})).await;
    change_and_wait_reconciled(&controller, &name, delete(&cm(&deleted), "cfg")).await;
    let sources = cm(&source);
    let edit = merge(&sources, "cfg", json!({"data": {"a": "2"}}));
    change_and_wait_reconciled(&controller, &name, edit).await;
    assert_eq!(
        data_of(&cm(&edited).get("cfg").await.expect("copy")),
        json!({"a": "by-hand"})
    );
    assert!(
        cm(&deleted).get_opt("cfg").await.expect("get").is_none(),
        "stays deleted"
    );
    let status = wait_cluster(&cps, &name, "one copy held, the deleted one named", |cp| {
        let status = cp.status.clone().unwrap_or_default();
        ready_with(cp, 1)
            && condition(&status.copy.conditions, "DestinationWritten").is_some_and(|c| {
                c.message
                    .contains(&format!("deleted since, not created again: {deleted}"))
            })
    })
    .await;
    assert_eq!(status.copy.applied_once.map(|r| r.count), Some(2));

    // A namespace that starts matching gets its copy once, with the source as it is now.
    let later = namespaces
        .create(&client, "later", &[("lifecycle-once", "yes")])
        .await;
    wait_object(&cm(&later), "cfg", "the new namespace's copy", |c| {
        data_of(c) == json!({"a": "2"})
    })
    .await;
    wait_cluster(&cps, &name, "two copies held of three targets", |cp| {
        ready_with(cp, 2)
    })
    .await;

    // Back to Reconcile: every copy is taken over again.
    merge(&cps, &name, json!({"spec": {"syncPolicy": "Reconcile"}})).await;
    let status = wait_cluster(&cps, &name, "Ready with 3 copies", |cp| ready_with(cp, 3)).await;
    assert!(status.copy.applied_once.is_none(), "Reconcile keeps no record");
    for ns in [&edited, &deleted, &later] {
        wait_object(&cm(ns), "cfg", "the copy follows the source again", |c| {
            data_of(c) == json!({"a": "2"})
        })
        .await;
    }
    delete_cluster_projection(&cps, &name).await;
    env.finish().await;
}

#[tokio::test]
async fn an_apply_once_projection_leaves_its_copy_alone() {
    let env = env("papplyonce").await;
    let controller = controller(&[]).await;
    let (src, dst) = env.names();
    let sources = env.api::<ConfigMap>(&src);
    let copies = env.api::<ConfigMap>(&dst);
    env.project_new_configmap("p", "cfg", json!({"a": "1"}), json!({"syncPolicy": "ApplyOnce"}))
        .await;
    wait_ready(&env.projections(), "p").await;
    let edit = merge(&sources, "cfg", json!({"data": {"a": "2"}}));
    change_and_wait_reconciled(&controller, &format!("{dst}/p"), edit).await;
    assert_eq!(
        data_of(&copies.get("cfg").await.expect("copy")),
        json!({"a": "1"})
    );
    delete(&copies, "cfg").await;
    let written = wait_condition(&env.projections(), "p", "DestinationWritten", "True", None).await;
    let message = written["message"].as_str().unwrap_or_default().to_owned();
    wait_for("the deleted copy reported", TIMEOUT, || async {
        let status = projection_status(&env.projections(), "p").await;
        let message = condition_message(&status.copy.conditions, "DestinationWritten");
        if message.contains(&format!("deleted since, not created again: {dst}")) {
            Ok(())
        } else {
            Err(message)
        }
    })
    .await;
    assert!(message.starts_with("syncPolicy ApplyOnce"), "{message}");
    assert!(
        copies.get_opt("cfg").await.expect("get").is_none(),
        "not re-created"
    );
    merge(
        &env.projections(),
        "p",
        json!({"spec": {"syncPolicy": "Reconcile"}}),
    )
    .await;
    wait_ready(&env.projections(), "p").await;
    wait_object(&copies, "cfg", "re-created by Reconcile", |c| {
        data_of(c) == json!({"a": "2"})
    })
    .await;
    env.finish().await;
}
