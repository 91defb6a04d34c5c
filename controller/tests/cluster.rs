//! The ClusterProjection controller against the real control plane: fan-out by list and by
//! selector, namespaces coming and going, partial failures, cleanup and coexistence. Objects, status
//! counts and reasons, and events, as a user sees them.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams},
};
use projection_tests::{
    NamespaceSet, ServiceProcess, events_about, kubectl_ok, metric_value, wait_for, wait_for_event,
};
use serde_json::{Value, json};
use shared::api::crd::{ClusterProjection, ClusterProjectionStatus, Projection};
use std::time::Duration;

mod common;
use common::*;

/// One test's world: its namespaces, its ClusterProjections (deleted at the end while the
/// controller still runs), and the controller. Fields drop in order: the controller stops before
/// `env` releases the exclusive right to run one.
struct World {
    client: Client,
    namespaces: NamespaceSet,
    source: String,
    controller: ServiceProcess,
    env: Env,
}

async fn world(name: &str, controller_args: &[&str]) -> World {
    let env = env(name).await;
    let client = env.client.clone();
    let mut namespaces = NamespaceSet::new(name);
    let source = namespaces.create(&client, "src", &[]).await;
    let controller = controller(controller_args).await;
    World {
        client,
        namespaces,
        source,
        controller,
        env,
    }
}

impl World {
    fn cps(&self) -> Api<ClusterProjection> {
        Api::all(self.client.clone())
    }

    fn configmaps(&self, namespace: &str) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// A ClusterProjection named after the test run.
    fn cp_name(&self, suffix: &str) -> String {
        self.namespaces.name(suffix)
    }

    async fn source_configmap(&self, name: &str, data: Value) {
        create(
            &self.configmaps(&self.source),
            json!({"metadata": {"name": name, "annotations": opted_in()}, "data": data}),
        )
        .await;
    }

    async fn cluster_projection(&self, suffix: &str, source_name: &str, destination: Value) -> String {
        let name = self.cp_name(suffix);
        create(
            &self.cps(),
            json!({"apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
                   "metadata": {"name": name, "labels": {"projection.test/run": self.namespaces.run}},
                   "spec": {"source": cm_source(&self.source, source_name), "destination": destination}}),
        )
        .await;
        name
    }

    /// Waits for the status to satisfy `check` for the current generation.
    async fn wait_status<F>(&self, name: &str, what: &str, check: F) -> ClusterProjectionStatus
    where
        F: Fn(&ClusterProjectionStatus) -> bool,
    {
        let api = self.cps();
        wait_for(&format!("{name}: {what}"), TIMEOUT, || async {
            let cp = api.get(name).await.map_err(|e| e.to_string())?;
            let status = cp.status.clone().unwrap_or_default();
            let current = status
                .copy
                .conditions
                .iter()
                .all(|c| c.observed_generation == cp.metadata.generation);
            if current && !status.copy.conditions.is_empty() && check(&status) {
                Ok(status)
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await
    }

    async fn wait_ready(&self, name: &str, written: i32) -> ClusterProjectionStatus {
        self.wait_status(name, &format!("Ready with {written} written"), |s| {
            ready(s) == Some(("True", "Projected"))
                && s.counts.namespaces_written == written
                && s.counts.namespaces_failed == 0
        })
        .await
    }

    async fn data_in(&self, namespace: &str, name: &str) -> Option<Value> {
        self.configmaps(namespace)
            .get_opt(name)
            .await
            .expect("get")
            .map(|c| data_of(&c))
    }

    /// Deletes the run's ClusterProjections and waits until their finalizers are done.
    async fn finish(self) {
        let api = self.cps();
        let selector = format!("projection.test/run={}", self.namespaces.run);
        let _ = api
            .delete_collection(&DeleteParams::default(), &ListParams::default().labels(&selector))
            .await;
        wait_for("the run's ClusterProjections to be deleted", TIMEOUT, || async {
            let left = api
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?;
            left.items
                .is_empty()
                .then_some(())
                .ok_or_else(|| format!("{} left", left.items.len()))
        })
        .await;
        self.env.finish().await;
    }
}

fn ready(status: &ClusterProjectionStatus) -> Option<(&str, &str)> {
    condition(&status.copy.conditions, "Ready").map(|c| (c.status.as_str(), c.reason.as_str()))
}

#[tokio::test]
async fn a_list_of_three_namespaces_gets_three_copies() {
    let mut w = world("cp-list", &[]).await;
    let names: Vec<String> = [
        w.namespaces.create(&w.client, "a", &[]).await,
        w.namespaces.create(&w.client, "b", &[]).await,
        w.namespaces.create(&w.client, "c", &[]).await,
    ]
    .into();
    w.source_configmap("cfg", json!({"k": "v"})).await;
    let cp = w
        .cluster_projection("three", "cfg", json!({"namespaces": names}))
        .await;
    let status = w.wait_ready(&cp, 3).await;
    assert_eq!(status.copy.destination_name.as_deref(), Some("cfg"));
    for ns in &names {
        assert_eq!(
            w.data_in(ns, "cfg").await,
            Some(json!({"k": "v"})),
            "copy in {ns}"
        );
        let copy = w.configmaps(ns).get("cfg").await.expect("copy");
        assert_eq!(
            copy.annotations()
                .get("projection.sh/owned-by-cluster-projection"),
            Some(&cp)
        );
    }
    // Each copy is announced (in one event per pass; namespaces seen late come in a later pass).
    wait_for("a Projected event naming every copy", TIMEOUT, || async {
        let notes: Vec<String> = events_about(&w.client, "default", &cp)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Projected"))
            .filter_map(|e| e.note)
            .collect();
        let all = names
            .iter()
            .all(|ns| notes.iter().any(|n| n.contains(&format!("{ns}/cfg"))));
        all.then_some(()).ok_or_else(|| format!("{notes:?}"))
    })
    .await;
    // kubectl shows the counts.
    let out = kubectl_ok(&["get", "cproj", &cp]);
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|row| row.split_whitespace().any(|c| c == "3")),
        "{out}"
    );

    // A source edit reaches every copy, in one pass: our own writes wake nothing. The count starts
    // once the last pass has counted itself and the watch has delivered everything before (a probe
    // of the other kind follows an edit of its source), and ends once the edit's pass has counted
    // itself and the watch has delivered everything after our writes.
    let (probe_src, probe_dst) = w.env.names();
    let (probe_sources, probe_copies) = (w.configmaps(&probe_src), w.configmaps(&probe_dst));
    create(
        &probe_sources,
        json!({"metadata": {"name": "probe", "annotations": opted_in()}, "data": {"barrier": "0"}}),
    )
    .await;
    create(
        &w.env.projections(),
        projection("probe", cm_source(&probe_src, "probe"), json!({})),
    )
    .await;
    wait_ready(&w.env.projections(), "probe").await;
    let projected_at = event_time(&w.client, "default", &cp, "Projected").await;
    wait_reconciled_after(&w.controller, &cp, projected_at).await;
    watch_barrier(&probe_sources, &probe_copies, "probe", 1).await;
    let sample = "projection_reconcile_total{kind=\"ClusterProjection\",result=\"success\"}";
    let before = metric_value(&w.controller.metrics(), sample).expect("reconcile metric");
    merge(&w.configmaps(&w.source), "cfg", json!({"data": {"k": "v2"}})).await;
    for ns in &names {
        wait_object(&w.configmaps(ns), "cfg", "edit propagated", |c| {
            data_of(c)["k"] == "v2"
        })
        .await;
    }
    wait_for("the edit's pass counted", TIMEOUT, || async {
        metric_value(&w.controller.metrics(), sample)
            .filter(|v| *v > before)
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    watch_barrier(&probe_sources, &probe_copies, "probe", 2).await;
    let after = metric_value(&w.controller.metrics(), sample).expect("reconcile metric");
    assert_eq!(after - before, 1.0, "one reconcile for one source edit");
    wait_for_event(&w.client, "default", &cp, "Updated").await;
    // A namespace removed from the list loses its copy.
    merge(
        &w.cps(),
        &cp,
        json!({"spec": {"destination": {"namespaces": [names[0], names[1]]}}}),
    )
    .await;
    wait_absent(
        &w.configmaps(&names[2]),
        "cfg",
        "copy removed from the dropped namespace",
    )
    .await;
    w.wait_ready(&cp, 2).await;
    wait_for_event(&w.client, "default", &cp, "DestinationDeleted").await;

    // A rename moves every copy, leaving no orphan.
    merge(
        &w.cps(),
        &cp,
        json!({"spec": {"destination": {"name": "renamed"}}}),
    )
    .await;
    w.wait_ready(&cp, 2).await;
    for ns in &names[..2] {
        wait_absent(&w.configmaps(ns), "cfg", "old name removed").await;
        assert!(w.data_in(ns, "renamed").await.is_some());
    }
    w.finish().await;
}

#[tokio::test]
async fn a_selector_follows_namespaces_as_their_labels_change() {
    let mut w = world("cp-sel", &[]).await;
    let run = w.namespaces.run.clone();
    let label = ("projection.test/tier", run.as_str());
    let a = w
        .namespaces
        .create(&w.client, "a", &[("projection.test/tier", &run)])
        .await;
    let b = w
        .namespaces
        .create(&w.client, "b", &[("projection.test/tier", &run)])
        .await;
    let c = w.namespaces.create(&w.client, "c", &[]).await;
    w.source_configmap("cfg", json!({"k": "v"})).await;
    let cp = w
        .cluster_projection(
            "sel",
            "cfg",
            json!({"namespaceSelector": {"matchLabels": {label.0: label.1}}}),
        )
        .await;
    w.wait_ready(&cp, 2).await;
    assert!(w.data_in(&a, "cfg").await.is_some() && w.data_in(&b, "cfg").await.is_some());
    assert!(w.data_in(&c, "cfg").await.is_none());
    let client = w.client.clone();
    let version_of = |ns: String| {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        async move { api.get("cfg").await.expect("copy").resource_version() }
    };
    let (a_before, b_before) = (version_of(a.clone()).await, version_of(b.clone()).await);

    // A namespace labelled later gets the copy; created with the label, too.
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(w.client.clone());
    merge(&nss, &c, json!({"metadata": {"labels": {label.0: label.1}}})).await;
    wait_object(
        &w.configmaps(&c),
        "cfg",
        "copy in the newly labelled namespace",
        |_| true,
    )
    .await;
    let d = w
        .namespaces
        .create(&w.client, "d", &[("projection.test/tier", &run)])
        .await;
    wait_object(&w.configmaps(&d), "cfg", "copy in the new namespace", |_| true).await;
    w.wait_ready(&cp, 4).await;
    // The namespace events' passes wrote only the new copies: those in place were not written.
    assert_eq!(
        version_of(a.clone()).await,
        a_before,
        "the copy in {a} was written again"
    );
    assert_eq!(
        version_of(b.clone()).await,
        b_before,
        "the copy in {b} was written again"
    );

    // A copy those passes found up to date is edited by someone else: it is compared again (its
    // resourceVersion moved) and restored.
    merge(&w.configmaps(&b), "cfg", json!({"data": {"k": "tampered"}})).await;
    wait_object(&w.configmaps(&b), "cfg", "the edited copy restored", |c| {
        data_of(c)["k"] == "v"
    })
    .await;

    // Unlabelled, it loses the copy.
    merge(&nss, &a, json!({"metadata": {"labels": {label.0: null}}})).await;
    wait_absent(&w.configmaps(&a), "cfg", "copy removed when the label goes").await;
    w.wait_ready(&cp, 3).await;
    w.finish().await;
}

#[tokio::test]
async fn pending_terminating_and_source_namespaces_are_not_failures() {
    let mut w = world("cp-pending", &[]).await;
    let held = w.namespaces.create(&w.client, "held", &[]).await;
    // A ConfigMap with a finalizer holds its namespace in Terminating.
    create(
        &w.configmaps(&held),
        json!({"metadata": {"name": "hold", "finalizers": ["projection.test/hold"]}}),
    )
    .await;
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(w.client.clone());
    delete(&nss, &held).await;
    wait_object(&nss, &held, "namespace terminating", |n| {
        n.metadata.deletion_timestamp.is_some()
    })
    .await;

    w.source_configmap("cfg", json!({"k": "v"})).await;
    let later = w.namespaces.name("later");
    let listed = vec![held.clone(), later.clone(), w.source.clone()];
    let cp = w
        .cluster_projection("pending", "cfg", json!({"namespaces": listed}))
        .await;
    let status = w.wait_ready(&cp, 0).await;
    let written = condition_message(&status.copy.conditions, "DestinationWritten");
    assert!(
        written.contains(&format!("pending until created: {later}")),
        "{written}"
    );
    assert!(
        written.contains(&format!("skipped while terminating: {held}")),
        "{written}"
    );
    assert!(
        written.contains("the copy would be the source itself"),
        "{written}"
    );
    assert!(
        w.data_in(&w.source, "cfg").await.is_some(),
        "the source is untouched"
    );

    // The listed namespace appears: written at once.
    w.namespaces.create(&w.client, "later", &[]).await;
    wait_object(
        &w.configmaps(&later),
        "cfg",
        "copy in the namespace created later",
        |_| true,
    )
    .await;
    w.wait_ready(&cp, 1).await;

    merge(
        &w.configmaps(&held),
        "hold",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    w.finish().await;
}

#[tokio::test]
async fn a_stranger_fails_one_namespace_and_the_others_are_written() {
    let mut w = world("cp-stranger", &[]).await;
    let a = w.namespaces.create(&w.client, "a", &[]).await;
    let b = w.namespaces.create(&w.client, "b", &[]).await;
    create(
        &w.configmaps(&b),
        json!({"metadata": {"name": "cfg"}, "data": {"mine": "keep"}}),
    )
    .await;
    w.source_configmap("cfg", json!({"k": "v"})).await;
    let cp = w
        .cluster_projection("stranger", "cfg", json!({"namespaces": [a, b]}))
        .await;
    let status = w
        .wait_status(&cp, "partial failure", |s| {
            s.counts.namespaces_written == 1 && s.counts.namespaces_failed == 1
        })
        .await;
    assert_eq!(ready(&status), Some(("False", "DestinationConflict")));
    assert_eq!(status.counts.failed_namespaces.len(), 1);
    assert_eq!(status.counts.failed_namespaces[0].namespace, b);
    assert_eq!(status.counts.failed_namespaces[0].reason, "DestinationConflict");
    let message = condition_message(&status.copy.conditions, "Ready");
    assert!(
        message.contains(&format!("{b} (DestinationConflict)")),
        "{message}"
    );
    assert_eq!(
        w.data_in(&b, "cfg").await,
        Some(json!({"mine": "keep"})),
        "the stranger is untouched"
    );
    assert!(w.data_in(&a, "cfg").await.is_some());
    let note = wait_for_event(&w.client, "default", &cp, "DestinationConflict").await;
    assert!(note.starts_with(&format!("{b}/cfg: ")), "{note}");

    delete(&w.configmaps(&b), "cfg").await;
    w.wait_ready(&cp, 2).await;
    assert_eq!(w.data_in(&b, "cfg").await, Some(json!({"k": "v"})));
    w.finish().await;
}

#[tokio::test]
async fn source_deletion_veto_and_cluster_projection_deletion_clean_up() {
    let mut w = world("cp-cleanup", &[]).await;
    let a = w.namespaces.create(&w.client, "a", &[]).await;
    let b = w.namespaces.create(&w.client, "b", &[]).await;
    w.source_configmap("cfg", json!({"k": "v"})).await;
    let cp = w
        .cluster_projection("cleanup", "cfg", json!({"namespaces": [a, b]}))
        .await;
    w.wait_ready(&cp, 2).await;

    delete(&w.configmaps(&w.source), "cfg").await;
    let status = w
        .wait_status(&cp, "SourceDeleted", |s| {
            ready(s) == Some(("False", "SourceDeleted"))
        })
        .await;
    assert_eq!(
        (status.counts.namespaces_written, status.counts.namespaces_failed),
        (0, 0),
        "counts are honest after withdrawal"
    );
    wait_absent(&w.configmaps(&a), "cfg", "copy removed with the source").await;
    wait_absent(&w.configmaps(&b), "cfg", "copy removed with the source").await;

    w.source_configmap("cfg", json!({"k": "back"})).await;
    w.wait_ready(&cp, 2).await;
    assert_eq!(w.data_in(&a, "cfg").await, Some(json!({"k": "back"})));

    merge(
        &w.configmaps(&w.source),
        "cfg",
        json!({"metadata": {"annotations": {"projection.sh/projectable": "false"}}}),
    )
    .await;
    w.wait_status(&cp, "SourceOptedOut", |s| {
        ready(s) == Some(("False", "SourceOptedOut"))
    })
    .await;
    wait_absent(&w.configmaps(&a), "cfg", "copy retracted on veto").await;
    wait_for_event(&w.client, "default", &cp, "SourceOptedOut").await;

    merge(
        &w.configmaps(&w.source),
        "cfg",
        json!({"metadata": {"annotations": {"projection.sh/projectable": "true"}}}),
    )
    .await;
    w.wait_ready(&cp, 2).await;
    // Claim one copy by removing its ownership annotation, then delete the ClusterProjection.
    merge(
        &w.configmaps(&b),
        "cfg",
        json!({"metadata": {"annotations": {"projection.sh/owned-by-cluster-projection": null}}}),
    )
    .await;
    delete(&w.cps(), &cp).await;
    wait_absent(&w.cps(), &cp, "ClusterProjection gone").await;
    wait_absent(&w.configmaps(&a), "cfg", "owned copy swept").await;
    assert!(
        w.data_in(&b, "cfg").await.is_some(),
        "a claimed copy is left alone"
    );
    let note = wait_for_event(&w.client, "default", &cp, "DestinationLeftAlone").await;
    assert_eq!(note, format!("{b}/cfg (not owned)"));
    w.finish().await;
}

#[tokio::test]
async fn coexistence_and_chains_stay_stable() {
    let mut w = world("cp-coexist", &["--source-mode", "permissive"]).await;
    let a = w.namespaces.create(&w.client, "a", &[]).await;
    let b = w.namespaces.create(&w.client, "b", &[]).await;
    w.source_configmap("cfg", json!({"k": "v"})).await;
    // Two ClusterProjections writing different names into overlapping namespaces.
    let first = w
        .cluster_projection("first", "cfg", json!({"namespaces": [a, b]}))
        .await;
    let second = w
        .cluster_projection("second", "cfg", json!({"namespaces": [b], "name": "cfg-2"}))
        .await;
    w.wait_ready(&first, 2).await;
    w.wait_ready(&second, 1).await;
    // A third one wanting the first one's copy in b gets a conflict for b only.
    let third = w
        .cluster_projection("third", "cfg", json!({"namespaces": [b]}))
        .await;
    let status = w
        .wait_status(&third, "conflict", |s| s.counts.namespaces_failed == 1)
        .await;
    assert_eq!(ready(&status), Some(("False", "DestinationConflict")));
    // A Projection on the same source, and a ClusterProjection whose source is a copy.
    let projections: Api<Projection> = Api::namespaced(w.client.clone(), &a);
    create(
        &projections,
        projection(
            "mirror",
            cm_source(&w.source, "cfg"),
            json!({"destination": {"name": "cfg-p"}}),
        ),
    )
    .await;
    wait_ready(&projections, "mirror").await;
    let chained = w.namespaces.create(&w.client, "chained", &[]).await;
    let name = w.cp_name("chain");
    create(
        &w.cps(),
        json!({"apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
        "metadata": {"name": name, "labels": {"projection.test/run": w.namespaces.run}},
        "spec": {"source": cm_source(&a, "cfg"), "destination": {"namespaces": [chained]}}}),
    )
    .await;
    w.wait_ready(&name, 1).await;
    let copy = w.configmaps(&chained).get("cfg").await.expect("chained copy");
    assert_eq!(
        copy.annotations()
            .get("projection.sh/owned-by-cluster-projection"),
        Some(&name)
    );

    // Nothing moves afterwards: no two owners fight.
    let versions = |w: &World| {
        let (a, b, chained) = (a.clone(), b.clone(), chained.clone());
        let api = |ns: &str| w.configmaps(ns);
        let (aa, bb, cc) = (api(&a), api(&b), api(&chained));
        async move {
            let mut v = Vec::new();
            for (api, name) in [
                (&aa, "cfg"),
                (&bb, "cfg"),
                (&bb, "cfg-2"),
                (&aa, "cfg-p"),
                (&cc, "cfg"),
            ] {
                v.push(api.get(name).await.expect("copy").resource_version());
            }
            v
        }
    };
    let before = versions(&w).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(versions(&w).await, before, "every copy is stable");
    let events = events_about(&w.client, "default", &third).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("DestinationConflict"))
    );
    delete(&projections, "mirror").await;
    wait_absent(&projections, "mirror", "projection gone").await;
    w.finish().await;
}

#[tokio::test]
async fn a_fan_out_to_200_namespaces_is_complete() {
    let mut w = world("cp-200", &[]).await;
    let run = w.namespaces.run.clone();
    let names = w
        .namespaces
        .create_many(&w.client, "n", 200, &[("projection.test/wide", &run)])
        .await;
    w.source_configmap("cfg", json!({"k": "v"})).await;
    let cp = w
        .cluster_projection(
            "wide",
            "cfg",
            json!({"namespaceSelector": {"matchLabels": {"projection.test/wide": run}}}),
        )
        .await;
    w.wait_status(&cp, "200 written", |s| {
        s.counts.namespaces_written == 200 && ready(s) == Some(("True", "Projected"))
    })
    .await;
    merge(&w.configmaps(&w.source), "cfg", json!({"data": {"k": "v2"}})).await;
    wait_for("every copy updated", Duration::from_secs(60), || async {
        let mut stale = 0;
        for ns in &names {
            if w.data_in(ns, "cfg").await != Some(json!({"k": "v2"})) {
                stale += 1;
            }
        }
        (stale == 0)
            .then_some(())
            .ok_or_else(|| format!("{stale} stale copies"))
    })
    .await;
    w.finish().await;
}
