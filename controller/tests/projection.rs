//! The Projection controller against the real control plane, as a user sees it: objects, conditions,
//! events and metrics. Each test runs its own controller process (one at a time).

use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        coordination::v1::Lease,
        core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
};
use projection_tests::{ServiceProcess, kubectl_ok, metric_value, wait_for, wait_for_event};
use serde_json::{Value, json};
use shared::api::crd::{ClusterProjection, Projection};
use std::time::Duration;

mod common;
use common::*;

#[tokio::test]
async fn configmap_and_secret_are_mirrored_with_overlay() {
    let env = env("mirror").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    create(
        &env.api::<ConfigMap>(&src),
        json!({"metadata": {"name": "settings", "annotations": opted_in(),
        "labels": {"app": "web"}}, "data": {"level": "info"}}),
    )
    .await;
    create(
        &env.api::<Secret>(&src),
        json!({"metadata": {"name": "creds", "annotations": opted_in()},
        "type": "Opaque", "data": {"password": "aHVudGVyMg=="}}),
    )
    .await;
    create(&env.projections(), projection("settings", cm_source(&src, "settings"),
        json!({"destination": {"name": "copied"}, "overlay": {"labels": {"team": "a", "app": "overridden"},
               "annotations": {"note": "from-overlay"}}}))).await;
    create(
        &env.projections(),
        projection(
            "creds",
            json!({"kind": "Secret", "namespace": src, "name": "creds"}),
            json!({}),
        ),
    )
    .await;

    wait_ready(&env.projections(), "settings").await;
    wait_ready(&env.projections(), "creds").await;
    let copy = env
        .api::<ConfigMap>(&dst)
        .get("copied")
        .await
        .expect("copy exists");
    assert_eq!(data_of(&copy), json!({"level": "info"}));
    let labels = copy.labels();
    assert_eq!(labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("overridden"),
        "the overlay wins"
    );
    assert_eq!(
        copy.annotations().get("note").map(String::as_str),
        Some("from-overlay")
    );
    assert_eq!(
        copy.annotations()
            .get("projection.sh/owned-by-projection")
            .map(String::as_str),
        Some(format!("{dst}/settings").as_str())
    );
    assert!(
        !copy.annotations().contains_key("projection.sh/projectable"),
        "source's projection.sh keys are not copied"
    );
    let secret = env
        .api::<Secret>(&dst)
        .get("creds")
        .await
        .expect("secret copy exists");
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    assert_eq!(
        serde_json::to_value(&secret.data).unwrap()["password"],
        "aHVudGVyMg=="
    );

    let p = env.projections().get("settings").await.expect("projection");
    assert_eq!(
        p.status.as_ref().and_then(|s| s.copy.destination_name.as_deref()),
        Some("copied")
    );
    let resolved = wait_condition(
        &env.projections(),
        "settings",
        "SourceResolved",
        "True",
        Some("Resolved"),
    )
    .await;
    assert_eq!(
        resolved["message"], "",
        "a pinned source has no resolution message"
    );
    let note = wait_for_event(&env.client, &dst, "settings", "Projected").await;
    assert_eq!(
        note,
        format!("projected /v1, Kind=ConfigMap {src}/settings to {dst}/copied")
    );
    let resolved = wait_condition(&env.projections(), "creds", "SourceResolved", "True", None).await;
    assert_eq!(resolved["message"], "resolved /Secret to preferred version v1");

    // kubectl as a user would use it.
    kubectl_ok(&[
        "wait",
        "-n",
        &dst,
        "--for=condition=Ready",
        "projection/settings",
        "--timeout=10s",
    ]);
    let described = kubectl_ok(&["describe", "projection", "-n", &dst, "settings"]);
    assert!(
        described.contains("DestinationWritten") && described.contains("Projected"),
        "{described}"
    );
    env.finish().await;
}

#[tokio::test]
async fn source_edits_propagate_and_other_writers_are_left_alone() {
    let env = env("edits").await;
    let controller = controller(&[]).await;
    let (src, dst) = env.names();
    let sources = env.api::<ConfigMap>(&src);
    let copies = env.api::<ConfigMap>(&dst);
    env.project_new_configmap("cfg", "cfg", json!({"a": "1", "b": "2"}), json!({}))
        .await;
    wait_ready(&env.projections(), "cfg").await;

    // Someone else labels the copy and adds a key of their own: both survive our updates.
    merge(
        &copies,
        "cfg",
        json!({"metadata": {"labels": {"added-by": "someone"}}, "data": {"theirs": "x"}}),
    )
    .await;
    merge(&sources, "cfg", json!({"data": {"a": "10", "b": null}})).await;
    let copy = wait_object(&copies, "cfg", "copy updated", |c| data_of(c)["a"] == "10").await;
    assert_eq!(
        data_of(&copy),
        json!({"a": "10", "theirs": "x"}),
        "b removed from the source is removed; theirs stays"
    );
    assert_eq!(copy.labels().get("added-by").map(String::as_str), Some("someone"));
    wait_for_event(&env.client, &dst, "cfg", "Updated").await;

    // One reconcile per source edit, one write, and no echo from our own writes. The count starts
    // once the last edit's reconcile has counted itself, and ends once that of the next edit has
    // and the watch has delivered everything after our write (a probe of the other kind follows
    // an edit of its source).
    let probe = format!("probe-{dst}");
    source_configmap(&sources, "probe", json!({"barrier": "0"})).await;
    let probes: Api<ClusterProjection> = Api::all(env.client.clone());
    create_cluster_projection(
        &probes,
        &probe,
        json!({"source": cm_source(&src, "probe"), "destination": {"namespaces": [dst]}}),
    )
    .await;
    wait_object(&copies, "probe", "the probe's copy", |_| true).await;
    let updated_at = event_time(&env.client, &dst, "cfg", "Updated").await;
    wait_reconciled_after(&controller, &format!("{dst}/cfg"), updated_at).await;
    let sample = "projection_reconcile_total{kind=\"Projection\",result=\"success\"}";
    let before = metric_value(&controller.metrics(), sample).expect("reconcile metric");
    let rv_before = copies.get("cfg").await.expect("copy").resource_version();
    merge(&sources, "cfg", json!({"data": {"a": "11"}})).await;
    wait_object(&copies, "cfg", "second edit", |c| data_of(c)["a"] == "11").await;
    wait_for("the second edit's reconcile counted", TIMEOUT, || async {
        metric_value(&controller.metrics(), sample)
            .filter(|v| *v > before)
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    watch_barrier(&sources, &copies, "probe", 1).await;
    let after = metric_value(&controller.metrics(), sample).expect("reconcile metric");
    assert_eq!(after - before, 1.0, "exactly one reconcile for one source edit");
    let copy = copies.get("cfg").await.expect("copy");
    assert_ne!(copy.resource_version(), rv_before);
    // An unrelated annotation on the source that does not change the copy costs no write.
    let rv = copy.resource_version();
    merge(
        &sources,
        "cfg",
        json!({"metadata": {"annotations": {"projection.sh/projectable": "true"}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        copies.get("cfg").await.expect("copy").resource_version(),
        rv,
        "no write when nothing changed"
    );
    delete(&probes, &probe).await;
    wait_absent(&probes, &probe, "the probe gone").await;
    env.finish().await;
}

#[tokio::test]
async fn a_copy_deleted_or_edited_by_hand_is_restored() {
    let env = env("heal").await;
    let _controller = controller(&[]).await;
    let (_, dst) = env.names();
    let copies = env.api::<ConfigMap>(&dst);
    env.project_new_configmap("cfg", "cfg", json!({"a": "1"}), json!({}))
        .await;
    wait_ready(&env.projections(), "cfg").await;
    let original = copies.get("cfg").await.expect("copy").uid();

    delete(&copies, "cfg").await;
    let restored = wait_object(&copies, "cfg", "copy restored", |c| c.uid() != original).await;
    assert_eq!(data_of(&restored), json!({"a": "1"}));

    merge(&copies, "cfg", json!({"data": {"a": "tampered"}})).await;
    wait_object(&copies, "cfg", "tampered value restored", |c| {
        data_of(c)["a"] == "1"
    })
    .await;
    wait_for_event(&env.client, &dst, "cfg", "Updated").await;
    env.finish().await;
}

/// A pass that wrote its copies and ended before it reported them (its replica killed, or cut short
/// by the fence when its member Lease lapsed) leaves the copies newer than `status.sourceHash`. The
/// next pass finds nothing to write and still tells the update, once: made here by a status whose
/// hash is another content's while no controller runs.
#[tokio::test]
async fn copies_written_by_a_pass_that_never_reported_are_told_by_the_next() {
    let env = env("unreported").await;
    let mut first = controller(&[]).await;
    let (_, dst) = env.names();
    let copies = env.api::<ConfigMap>(&dst);
    env.project_new_configmap("cfg", "cfg", json!({"a": "1"}), json!({}))
        .await;
    wait_ready(&env.projections(), "cfg").await;
    let copy = copies.get("cfg").await.expect("copy");
    let hash = copy.annotations()["projection.sh/source-hash"].clone();
    let reported = |p: &Projection| p.status.as_ref().and_then(|s| s.copy.source_hash.clone());
    assert_eq!(
        reported(&env.projections().get("cfg").await.expect("cr")).as_ref(),
        Some(&hash)
    );
    first.kill_hard();
    let updates = || async {
        projection_tests::events_about(&env.client, &dst, "cfg")
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Updated"))
            // A repeated event is one object with a series.
            .map(|e| e.series.map_or(1, |s| s.count))
            .sum::<i32>()
    };
    assert_eq!(updates().await, 0, "nothing was updated yet");
    env.projections()
        .patch_status(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"sourceHash": "an-earlier-content"}})),
        )
        .await
        .expect("status patched");

    let _next = controller(&[]).await;
    let note = wait_for_event(&env.client, &dst, "cfg", "Updated").await;
    assert!(note.ends_with(&format!("to {dst}/cfg")), "{note}");
    wait_object(
        &env.projections(),
        "cfg",
        "the status reporting the copies' content",
        |p| reported(p).as_ref() == Some(&hash),
    )
    .await;
    assert_eq!(
        copies.get("cfg").await.expect("copy").resource_version(),
        copy.resource_version(),
        "the copy was current: not written again"
    );
    assert_eq!(updates().await, 1, "told once");
    env.finish().await;
}

#[tokio::test]
async fn services_keep_their_nature() {
    let env = env("svc").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    let services = env.api::<Service>(&src);
    let port = |p: u16| json!({"name": format!("p{p}"), "port": p, "protocol": "TCP", "targetPort": p});
    create(
        &services,
        json!({"metadata": {"name": "clusterip", "annotations": opted_in()},
        "spec": {"selector": {"app": "a"}, "ports": [port(80)]}}),
    )
    .await;
    create(
        &services,
        json!({"metadata": {"name": "headless", "annotations": opted_in()},
        "spec": {"clusterIP": "None", "selector": {"app": "a"}, "ports": [port(5432)]}}),
    )
    .await;
    create(
        &services,
        json!({"metadata": {"name": "nodeport", "annotations": opted_in()},
        "spec": {"type": "NodePort", "selector": {"app": "a"}, "ports": [port(8080)]}}),
    )
    .await;
    for name in ["clusterip", "headless", "nodeport"] {
        create(
            &env.projections(),
            projection(
                name,
                json!({"kind": "Service", "namespace": src, "name": name}),
                json!({}),
            ),
        )
        .await;
    }
    for name in ["clusterip", "headless", "nodeport"] {
        wait_ready(&env.projections(), name).await;
    }
    let copies = env.api::<Service>(&dst);
    let source_ip = services.get("clusterip").await.unwrap().spec.unwrap().cluster_ip;
    let copy = copies.get("clusterip").await.expect("copy").spec.expect("spec");
    assert!(
        copy.cluster_ip.is_some() && copy.cluster_ip != source_ip,
        "the copy got its own cluster IP"
    );
    let headless = copies.get("headless").await.expect("copy").spec.expect("spec");
    assert_eq!(
        headless.cluster_ip.as_deref(),
        Some("None"),
        "a headless Service stays headless"
    );
    let source_port = services
        .get("nodeport")
        .await
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()[0]
        .node_port;
    let copy_port = copies
        .get("nodeport")
        .await
        .expect("copy")
        .spec
        .expect("spec")
        .ports
        .expect("ports")[0]
        .node_port;
    assert!(
        copy_port.is_some() && copy_port != source_port,
        "the NodePort copy got its own node port"
    );
    let note = wait_for_event(&env.client, &dst, "headless", "Projected").await;
    assert_eq!(
        note,
        format!("projected /v1, Kind=Service {src}/headless to {dst}/headless")
    );
    env.finish().await;
}

#[tokio::test]
async fn deployments_are_mirrored() {
    let env = env("deploy").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    let deployments = env.api::<Deployment>(&src);
    create(&deployments, json!({"metadata": {"name": "web", "annotations": opted_in()}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})).await;
    create(
        &env.projections(),
        projection(
            "web",
            json!({"group": "apps", "kind": "Deployment", "namespace": src, "name": "web"}),
            json!({}),
        ),
    )
    .await;
    wait_ready(&env.projections(), "web").await;
    let copy = env.api::<Deployment>(&dst).get("web").await.expect("copy");
    assert_eq!(copy.spec.as_ref().and_then(|s| s.replicas), Some(1));
    merge(&deployments, "web", json!({"spec": {"replicas": 3}})).await;
    wait_object(&env.api::<Deployment>(&dst), "web", "replicas propagated", |d| {
        d.spec.as_ref().and_then(|s| s.replicas) == Some(3)
    })
    .await;
    let note = wait_for_event(&env.client, &dst, "web", "Updated").await;
    assert_eq!(
        note,
        format!("updated apps/v1, Kind=Deployment {src}/web to {dst}/web")
    );
    // The copy's own Deployment controller writes its revision annotation; we never fight it.
    let copy = wait_object(&env.api::<Deployment>(&dst), "web", "revision annotation", |d| {
        d.annotations().contains_key("deployment.kubernetes.io/revision")
    })
    .await;
    let revision = copy
        .annotations()
        .get("deployment.kubernetes.io/revision")
        .cloned();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let later = env.api::<Deployment>(&dst).get("web").await.expect("copy");
    assert_eq!(
        later
            .annotations()
            .get("deployment.kubernetes.io/revision")
            .cloned(),
        revision
    );
    env.finish().await;
}

#[tokio::test]
async fn custom_resources_pinned_and_unpinned_and_a_kind_that_becomes_known() {
    let env = env("crd").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    // A group of its own per run, so the CRD is unknown when the Projection arrives.
    let group = format!("{}.test.projection.sh", env.source.name());
    create(
        &env.projections(),
        projection(
            "late",
            json!({"group": group, "kind": "Widget", "namespace": src, "name": "w"}),
            json!({}),
        ),
    )
    .await;
    let failed = wait_condition(
        &env.projections(),
        "late",
        "SourceResolved",
        "False",
        Some("SourceResolutionFailed"),
    )
    .await;
    assert!(
        failed["message"].as_str().unwrap_or_default().contains("Widget"),
        "{failed}"
    );
    wait_for_event(&env.client, &dst, "late", "SourceResolutionFailed").await;

    let crd = install_widget_crd(&env.client, &group, &["v1", "v1beta1"]).await;
    let body = |v: &str| {
        json!({"apiVersion": format!("{group}/{v}"), "kind": "Widget",
        "metadata": {"name": "w", "annotations": opted_in()}, "spec": {"size": 3}})
    };
    let object: DynamicObject = serde_json::from_value(body("v1")).expect("widget");
    widgets(&env.client, &group, "v1", &src)
        .create(&PostParams::default(), &object)
        .await
        .expect("widget created");
    // Recovered without a timer: the CRD watch wakes the Projection.
    wait_ready(&env.projections(), "late").await;
    // Discovery registers a new CRD's versions one by one: a pass on the CRD's event may resolve
    // the kind at v1beta1 before v1 is listed; the controller looks again and settles on v1.
    let settled = format!("resolved {group}/Widget to preferred version v1");
    wait_for(&format!("late {settled}"), TIMEOUT, || async {
        let resolved = wait_condition(&env.projections(), "late", "SourceResolved", "True", None).await;
        match resolved["message"].as_str() {
            Some(message) if message == settled => Ok(()),
            _ => Err(resolved.to_string()),
        }
    })
    .await;

    create(
        &env.projections(),
        projection(
            "pinned",
            json!({"group": group, "version": "v1beta1", "kind": "Widget",
        "namespace": src, "name": "w"}),
            json!({"destination": {"name": "w-pinned"}}),
        ),
    )
    .await;
    wait_ready(&env.projections(), "pinned").await;
    let pinned = wait_condition(&env.projections(), "pinned", "SourceResolved", "True", None).await;
    assert_eq!(pinned["message"], "");
    let copy = widgets(&env.client, &group, "v1", &dst)
        .get("w-pinned")
        .await
        .expect("pinned copy");
    assert_eq!(copy.data["spec"]["size"], 3);
    let copy = widgets(&env.client, &group, "v1", &dst)
        .get("w")
        .await
        .expect("unpinned copy");
    assert_eq!(copy.data["spec"]["size"], 3);
    let client = env.client.clone();
    env.finish().await;
    let _ = Api::<CustomResourceDefinition>::all(client)
        .delete(&crd, &DeleteParams::default())
        .await;
}

/// The gauges of the kinds this controller watches (sources, copies).
fn watched_kinds(controller: &ServiceProcess) -> (f64, f64) {
    let text = controller.metrics();
    (
        metric_value(&text, "projection_watched_gvks").unwrap_or(-1.0),
        metric_value(&text, "projection_watched_dest_gvks").unwrap_or(-1.0),
    )
}

async fn wait_watched_kinds(controller: &ServiceProcess, what: &str, expected: (f64, f64)) {
    wait_for(what, Duration::from_secs(30), || async {
        let now = watched_kinds(controller);
        if now == expected {
            Ok(())
        } else {
            Err(format!("watched (sources, copies) = {now:?}, want {expected:?}"))
        }
    })
    .await;
}

async fn wait_copy_size(api: &Api<DynamicObject>, name: &str, size: i64, within: Duration) {
    wait_for(&format!("copy {name} with size {size}"), within, || async {
        match api.get_opt(name).await {
            Ok(Some(copy)) if copy.data["spec"]["size"] == size => Ok(()),
            other => Err(format!("{:?}", other.map(|o| o.map(|o| o.data["spec"].clone())))),
        }
    })
    .await;
}

#[tokio::test]
async fn a_crd_deleted_and_created_again_resumes_at_once_and_unread_kinds_are_no_longer_watched() {
    let env = env("crd-again").await;
    let controller = controller(&[]).await;
    let (src, dst) = env.names();
    let group = format!("{}.test.projection.sh", env.source.name());
    let crd = install_widget_crd(&env.client, &group, &["v1"]).await;
    let sources = widgets(&env.client, &group, "v1", &src);
    let copies = widgets(&env.client, &group, "v1", &dst);
    let widget = |size: i64| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": format!("{group}/v1"), "kind": "Widget",
            "metadata": {"name": "w", "annotations": opted_in()}, "spec": {"size": size}}))
        .expect("widget")
    };
    sources
        .create(&PostParams::default(), &widget(1))
        .await
        .expect("widget created");
    create(
        &env.projections(),
        projection(
            "w",
            json!({"group": group, "kind": "Widget", "namespace": src, "name": "w"}),
            json!({}),
        ),
    )
    .await;
    wait_ready(&env.projections(), "w").await;
    let (kinds, copy_kinds) = watched_kinds(&controller);
    assert!(kinds >= 1.0 && copy_kinds >= 1.0, "{kinds} {copy_kinds}");

    // The CRD goes (and every Widget with it): its watches stop instead of retrying a 404.
    let crds = Api::<CustomResourceDefinition>::all(env.client.clone());
    delete(&crds, &crd).await;
    wait_for("the CRD to be gone", Duration::from_secs(60), || async {
        match crds.get_opt(&crd).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|c| c.map(|c| c.status)))),
        }
    })
    .await;
    wait_watched_kinds(
        &controller,
        "the watches of the deleted kind to stop",
        (kinds - 1.0, copy_kinds - 1.0),
    )
    .await;

    // It comes back, and so does the source: the copy follows at the normal pace, not after a
    // watch's backoff (which had reached 6 s and more by the time the kind was served again).
    install_widget_crd(&env.client, &group, &["v1"]).await;
    sources
        .create(&PostParams::default(), &widget(2))
        .await
        .expect("widget created again");
    wait_copy_size(&copies, "w", 2, Duration::from_secs(5)).await;
    sources
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 3}})),
        )
        .await
        .expect("widget edited");
    wait_copy_size(&copies, "w", 3, Duration::from_secs(5)).await;
    assert_eq!(watched_kinds(&controller), (kinds, copy_kinds));

    // The last Projection reading the kind goes: nothing watches it any more.
    delete(&env.projections(), "w").await;
    wait_for("the Projection to be gone", Duration::from_secs(30), || async {
        match env.projections().get_opt("w").await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.map(|p| p.metadata.finalizers)))),
        }
    })
    .await;
    wait_watched_kinds(
        &controller,
        "the watches of the kind nobody reads to stop",
        (kinds - 1.0, copy_kinds - 1.0),
    )
    .await;
    env.finish().await;
    let _ = crds.delete(&crd, &DeleteParams::default()).await;
}

#[tokio::test]
async fn cluster_scoped_kinds_are_refused() {
    let env = env("scope").await;
    let _controller = controller(&[]).await;
    create(
        &env.projections(),
        projection(
            "ns",
            json!({"version": "v1", "kind": "Namespace", "namespace": env.source.name(), "name": "default"}),
            json!({}),
        ),
    )
    .await;
    let c = wait_not_ready(&env.projections(), "ns", "SourceResolutionFailed").await;
    assert_eq!(
        c["message"],
        "v1/Namespace is cluster-scoped; projection only mirrors namespaced resources"
    );
    wait_for_event(&env.client, env.dest.name(), "ns", "SourceResolutionFailed").await;
    env.finish().await;
}

#[tokio::test]
async fn a_stranger_is_never_touched_and_its_departure_is_noticed_at_once() {
    let env = env("conflict").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    source_configmap(&env.api::<ConfigMap>(&src), "cfg", json!({"a": "1"})).await;
    create(
        &env.api::<ConfigMap>(&dst),
        json!({"metadata": {"name": "cfg"}, "data": {"mine": "do not touch"}}),
    )
    .await;
    env.project_configmap("cfg", "cfg", json!({})).await;
    let c = wait_not_ready(&env.projections(), "cfg", "DestinationConflict").await;
    assert_eq!(
        c["message"],
        format!("destination {dst}/cfg exists and is not owned by this Projection")
    );
    wait_for_event(&env.client, &dst, "cfg", "DestinationConflict").await;
    let stranger = env.api::<ConfigMap>(&dst).get("cfg").await.expect("stranger");
    assert_eq!(data_of(&stranger), json!({"mine": "do not touch"}));
    assert!(
        stranger.annotations().is_empty() && stranger.labels().is_empty(),
        "the stranger was not modified"
    );

    delete(&env.api::<ConfigMap>(&dst), "cfg").await;
    // The retry cap is 5 minutes: recovering within the timeout proves a watch woke us.
    wait_ready(&env.projections(), "cfg").await;
    assert_eq!(
        data_of(&env.api::<ConfigMap>(&dst).get("cfg").await.expect("copy")),
        json!({"a": "1"})
    );

    // The same object as source and destination is refused, not a conflict with itself.
    create(
        &env.api::<ConfigMap>(&dst),
        json!({"metadata": {"name": "self", "annotations": opted_in()}, "data": {"a": "1"}}),
    )
    .await;
    create(
        &env.projections(),
        projection("self", cm_source(&dst, "self"), json!({})),
    )
    .await;
    let c = wait_not_ready(&env.projections(), "self", "DestinationConflict").await;
    assert!(
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("the copy would be the source itself"),
        "{c}"
    );
    env.finish().await;
}

#[tokio::test]
async fn allowlist_permissive_and_veto() {
    let env = env("policy").await;
    let (src, dst) = env.names();
    let sources = env.api::<ConfigMap>(&src);
    let copies = env.api::<ConfigMap>(&dst);
    create(
        &sources,
        json!({"metadata": {"name": "plain"}, "data": {"a": "1"}}),
    )
    .await;
    env.project_configmap("plain", "plain", json!({})).await;
    {
        let _allowlist = controller(&[]).await;
        let c = wait_not_ready(&env.projections(), "plain", "SourceNotProjectable").await;
        assert_eq!(
            c["message"],
            format!(
                "source-mode=allowlist requires annotation projection.sh/projectable=\"true\" on source {src}/plain"
            )
        );
        assert!(copies.get_opt("plain").await.expect("get").is_none());
        // Opting in is noticed through the source watch.
        merge(
            &sources,
            "plain",
            json!({"metadata": {"annotations": opted_in()}}),
        )
        .await;
        wait_ready(&env.projections(), "plain").await;
        merge(
            &sources,
            "plain",
            json!({"metadata": {"annotations": {"projection.sh/projectable": null}}}),
        )
        .await;
        wait_not_ready(&env.projections(), "plain", "SourceNotProjectable").await;
        wait_absent(
            &copies,
            "plain",
            "copy retracted when the source is no longer opted in",
        )
        .await;
    }
    {
        let _permissive = controller(&["--source-mode", "permissive"]).await;
        wait_ready(&env.projections(), "plain").await;
        assert!(copies.get_opt("plain").await.expect("get").is_some());
        // "false" wins in every mode, and retracts the copy.
        merge(
            &sources,
            "plain",
            json!({"metadata": {"annotations": {"projection.sh/projectable": "false"}}}),
        )
        .await;
        let c = wait_not_ready(&env.projections(), "plain", "SourceOptedOut").await;
        assert_eq!(
            c["message"],
            format!(
                "source {src}/plain has projection.sh/projectable=\"false\"; owner has opted out of projection"
            )
        );
        wait_absent(&copies, "plain", "copy retracted on veto").await;
        wait_for_event(&env.client, &dst, "plain", "DestinationDeleted").await;
        wait_for_event(&env.client, &dst, "plain", "SourceOptedOut").await;
    }
    let _cleanup = controller(&[]).await;
    env.finish().await;
}

#[tokio::test]
async fn a_deleted_source_takes_its_copy_and_a_recreated_one_brings_it_back() {
    let env = env("srcdel").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    let sources = env.api::<ConfigMap>(&src);
    let copies = env.api::<ConfigMap>(&dst);
    env.project_configmap("cfg", "cfg", json!({})).await;
    let c = wait_not_ready(&env.projections(), "cfg", "SourceNotFound").await;
    assert_eq!(c["message"], format!("source {src}/cfg not found"));

    source_configmap(&sources, "cfg", json!({"a": "1"})).await;
    wait_ready(&env.projections(), "cfg").await;
    delete(&sources, "cfg").await;
    let c = wait_not_ready(&env.projections(), "cfg", "SourceDeleted").await;
    assert_eq!(c["message"], format!("source {src}/cfg has been deleted"));
    wait_absent(&copies, "cfg", "copy removed with its source").await;
    wait_for_event(&env.client, &dst, "cfg", "SourceDeleted").await;
    let note = wait_for_event(&env.client, &dst, "cfg", "DestinationDeleted").await;
    assert_eq!(note, format!("{dst}/cfg"));

    source_configmap(&sources, "cfg", json!({"a": "2"})).await;
    wait_ready(&env.projections(), "cfg").await;
    assert_eq!(
        data_of(&copies.get("cfg").await.expect("copy back")),
        json!({"a": "2"})
    );
    env.finish().await;
}

#[tokio::test]
async fn renames_and_source_changes_leave_no_orphan() {
    let env = env("orphans").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    source_configmap(&env.api::<ConfigMap>(&src), "one", json!({"n": "1"})).await;
    source_configmap(&env.api::<ConfigMap>(&src), "two", json!({"n": "2"})).await;
    create(
        &env.api::<Secret>(&src),
        json!({"metadata": {"name": "two", "annotations": opted_in()}, "stringData": {"n": "2"}}),
    )
    .await;
    let projections = env.projections();
    let cms = env.api::<ConfigMap>(&dst);
    env.project_configmap("p", "one", json!({})).await;
    wait_ready(&projections, "p").await;

    merge(
        &projections,
        "p",
        json!({"spec": {"destination": {"name": "renamed"}}}),
    )
    .await;
    wait_ready(&projections, "p").await;
    wait_absent(&cms, "one", "old copy removed after a rename").await;
    let note = wait_for_event(&env.client, &dst, "p", "DestinationDeleted").await;
    assert_eq!(note, format!("{dst}/one"));
    assert_eq!(
        data_of(&cms.get("renamed").await.expect("renamed copy")),
        json!({"n": "1"})
    );

    merge(
        &projections,
        "p",
        json!({"spec": {"source": {"name": "two"}, "destination": null}}),
    )
    .await;
    wait_ready(&projections, "p").await;
    wait_absent(&cms, "renamed", "old copy removed after a source change").await;
    assert_eq!(
        data_of(&cms.get("two").await.expect("copy of two")),
        json!({"n": "2"})
    );

    merge(&projections, "p", json!({"spec": {"source": {"kind": "Secret"}}})).await;
    wait_ready(&projections, "p").await;
    wait_absent(&cms, "two", "old ConfigMap copy removed after a kind change").await;
    assert!(
        env.api::<Secret>(&dst)
            .get_opt("two")
            .await
            .expect("get")
            .is_some()
    );
    env.finish().await;
}

#[tokio::test]
async fn deleting_the_projection_removes_its_copy_unless_the_copy_was_claimed() {
    let env = env("delete").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    source_configmap(&env.api::<ConfigMap>(&src), "cfg", json!({"a": "1"})).await;
    let projections = env.projections();
    let copies = env.api::<ConfigMap>(&dst);
    env.project_configmap("owned", "cfg", json!({"destination": {"name": "owned"}}))
        .await;
    env.project_configmap("claimed", "cfg", json!({"destination": {"name": "claimed"}}))
        .await;
    wait_ready(&projections, "owned").await;
    wait_ready(&projections, "claimed").await;
    let finalizers = projections.get("owned").await.expect("p").finalizers().to_vec();
    assert_eq!(finalizers, ["projection.sh/finalizer"]);

    delete(&projections, "owned").await;
    wait_absent(&projections, "owned", "projection gone").await;
    wait_absent(&copies, "owned", "its copy gone").await;

    // Removing the ownership annotation is the escape hatch: the copy is now someone else's.
    merge(
        &copies,
        "claimed",
        json!({"metadata": {"annotations": {"projection.sh/owned-by-projection": null}}}),
    )
    .await;
    delete(&projections, "claimed").await;
    wait_absent(&projections, "claimed", "projection gone").await;
    assert!(
        copies.get_opt("claimed").await.expect("get").is_some(),
        "a claimed copy is left alone"
    );
    let note = wait_for_event(&env.client, &dst, "claimed", "DestinationLeftAlone").await;
    assert_eq!(note, format!("{dst}/claimed (not owned)"));
    env.finish().await;
}

#[tokio::test]
async fn an_immutable_copy_is_recreated_when_its_source_changes() {
    let env = env("immutable").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    // A copy made immutable by someone else cannot take the next source edit in place.
    let configmaps = env.api::<ConfigMap>(&src);
    env.project_new_configmap("m", "m", json!({"v": "1"}), json!({}))
        .await;
    wait_ready(&env.projections(), "m").await;
    let copies = env.api::<ConfigMap>(&dst);
    let first = copies.get("m").await.expect("copy").uid();
    merge(&copies, "m", json!({"immutable": true})).await;
    merge(&configmaps, "m", json!({"data": {"v": "2"}})).await;
    let copy = wait_object(&copies, "m", "copy recreated with the new value", |c| {
        data_of(c)["v"] == "2"
    })
    .await;
    assert_ne!(copy.uid(), first, "a new object replaced the immutable one");
    let note = wait_for_event(&env.client, &dst, "m", "DestinationRecreated").await;
    assert!(note.contains("immutable"), "{note}");
    wait_ready(&env.projections(), "m").await;

    // Immutable Secrets change by being replaced; so does a Secret whose type changes.
    let secrets = env.api::<Secret>(&src);
    for (name, first_type, second_type, immutable) in [
        ("s", "Opaque", "Opaque", true),
        ("t", "Opaque", "example.com/custom", false),
    ] {
        create(
            &secrets,
            json!({"metadata": {"name": name, "annotations": opted_in()}, "type": first_type,
            "immutable": immutable, "stringData": {"v": "1"}}),
        )
        .await;
        create(
            &env.projections(),
            projection(
                name,
                json!({"kind": "Secret", "namespace": src, "name": name}),
                json!({}),
            ),
        )
        .await;
        wait_ready(&env.projections(), name).await;
        delete(&secrets, name).await;
        create(
            &secrets,
            json!({"metadata": {"name": name, "annotations": opted_in()}, "type": second_type,
            "immutable": immutable, "stringData": {"v": "2"}}),
        )
        .await;
        wait_object(
            &env.api::<Secret>(&dst),
            name,
            "copy of the replaced secret",
            |s| {
                s.type_.as_deref() == Some(second_type)
                    && s.data.as_ref().and_then(|d| d.get("v")).map(|b| b.0.as_slice()) == Some(b"2")
            },
        )
        .await;
        wait_ready(&env.projections(), name).await;
    }
    env.finish().await;
}

/// An update refused as immutable for a kind other than ConfigMap and Secret never deletes the copy
/// (a PersistentVolumeClaim's volume could go with it): the copy stays as it is and the Projection
/// names the immutable field and the ways out. A platform that opts the kind in
/// (`--recreate-on-immutable`) gets it recreated.
#[tokio::test]
async fn an_immutable_copy_of_another_kind_is_kept_and_its_field_named() {
    let env = env("immutable-pvc").await;
    let (src, dst) = env.names();
    let controller_process = controller(&[]).await;
    create(
        &env.api::<PersistentVolumeClaim>(&src),
        json!({"metadata": {"name": "data", "annotations": opted_in()},
               "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "slow",
                        "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    let projections = env.projections();
    create(
        &projections,
        projection(
            "data",
            json!({"version": "v1", "kind": "PersistentVolumeClaim", "namespace": src, "name": "data"}),
            json!({}),
        ),
    )
    .await;
    wait_ready(&projections, "data").await;
    let copies = env.api::<PersistentVolumeClaim>(&dst);
    let first = copies.get("data").await.expect("copy");
    assert_eq!(
        first.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()),
        Some("slow")
    );

    // Leaving the storage class out would change the claim's spec, which the apiserver refuses.
    merge(
        &projections,
        "data",
        json!({"spec": {"fields": {"exclude": ["$.spec.storageClassName"]}}}),
    )
    .await;
    let ready = wait_not_ready(&projections, "data", "DestinationImmutable").await;
    let message = ready["message"].as_str().unwrap_or_default().to_owned();
    for part in [
        format!("the copy {dst}/data was left unchanged"),
        "refuses to change the immutable field spec in place".to_owned(),
        "delete the copy by hand".to_owned(),
        "--recreate-on-immutable=PersistentVolumeClaim".to_owned(),
        "the apiserver said: PersistentVolumeClaim \"data\" is invalid: spec: Forbidden".to_owned(),
    ] {
        assert!(message.contains(&part), "{part:?} not in {message:?}");
    }
    let note = wait_for_event(&env.client, &dst, "data", "DestinationImmutable").await;
    assert_eq!(note, message, "the event says what the condition says");
    let copy = copies.get("data").await.expect("the copy is still there");
    assert_eq!(copy.uid(), first.uid(), "the copy was not deleted");
    assert_eq!(copy.resource_version(), first.resource_version(), "nor changed");
    let events = projection_tests::events_about(&env.client, &dst, "data").await;
    assert!(
        !events
            .iter()
            .any(|e| e.reason.as_deref() == Some("DestinationRecreated")),
        "{events:?}"
    );
    drop(controller_process);

    // Opted in by the platform: the next controller recreates the claim without the storage class.
    let _controller = controller(&["--recreate-on-immutable", "PersistentVolumeClaim"]).await;
    let recreated = wait_object(&copies, "data", "the claim recreated", |c| {
        c.uid() != first.uid()
            && c.metadata.deletion_timestamp.is_none()
            && c.spec.as_ref().is_some_and(|s| s.storage_class_name.is_none())
    })
    .await;
    assert_ne!(recreated.uid(), first.uid());
    let note = wait_for_event(&env.client, &dst, "data", "DestinationRecreated").await;
    assert!(note.contains("spec is immutable after creation"), "{note}");
    assert!(
        !note.contains("@@"),
        "the apiserver's first line, not its diff: {note}"
    );
    wait_ready(&projections, "data").await;
    env.finish().await;
}

#[tokio::test]
async fn a_chained_projection_stays_stable() {
    let env = env("chain").await;
    let _controller = controller(&["--source-mode", "permissive"]).await;
    let (src, dst) = env.names();
    create(
        &env.api::<ConfigMap>(&src),
        json!({"metadata": {"name": "root"}, "data": {"a": "1"}}),
    )
    .await;
    // first: src/root -> dst/mid; second: dst/mid (a copy) -> src/leaf
    env.project_configmap("first", "root", json!({"destination": {"name": "mid"}}))
        .await;
    wait_ready(&env.projections(), "first").await;
    create(
        &env.api::<Projection>(&src),
        projection(
            "second",
            cm_source(&dst, "mid"),
            json!({"destination": {"name": "leaf"}}),
        ),
    )
    .await;
    wait_ready(&env.api::<Projection>(&src), "second").await;
    wait_for_event(&env.client, &src, "second", "Projected").await;
    let leaf = env.api::<ConfigMap>(&src).get("leaf").await.expect("leaf");
    assert_eq!(
        leaf.annotations()
            .get("projection.sh/owned-by-projection")
            .map(String::as_str),
        Some(format!("{src}/second").as_str())
    );
    let mid_rv = env
        .api::<ConfigMap>(&dst)
        .get("mid")
        .await
        .expect("mid")
        .resource_version();
    let leaf_rv = leaf.resource_version();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        env.api::<ConfigMap>(&dst)
            .get("mid")
            .await
            .expect("mid")
            .resource_version(),
        mid_rv,
        "mid is stable"
    );
    assert_eq!(
        env.api::<ConfigMap>(&src)
            .get("leaf")
            .await
            .expect("leaf")
            .resource_version(),
        leaf_rv,
        "leaf is stable"
    );
    // A change flows through both.
    merge(&env.api::<ConfigMap>(&src), "root", json!({"data": {"a": "2"}})).await;
    wait_object(
        &env.api::<ConfigMap>(&src),
        "leaf",
        "change through the chain",
        |c| data_of(c)["a"] == "2",
    )
    .await;
    env.finish().await;
}

#[tokio::test]
async fn metrics_and_probes_are_served() {
    let env = env("metrics").await;
    let controller = controller(&[]).await;
    env.project_new_configmap("cfg", "cfg", Value::Null, json!({}))
        .await;
    wait_ready(&env.projections(), "cfg").await;
    let text = controller
        .metrics_once_counted(&["projection_reconcile_total{kind=\"Projection\",result=\"success\"}"])
        .await;
    for family in [
        "projection_reconcile_total{kind=\"Projection\",result=\"success\"}",
        "projection_watched_gvks",
        "projection_watched_dest_gvks",
        "projection_e2e_seconds_count{kind=\"Projection\",event=\"create\"}",
        "projection_reconcile_duration_seconds_count{kind=\"Projection\"}",
        "process_resident_memory_bytes",
    ] {
        assert!(
            metric_value(&text, family).is_some_and(|v| v > 0.0),
            "{family} missing or zero in:\n{text}"
        );
    }
    assert_eq!(
        projection_tests::http_get(controller.http_port, "/healthz").map(|r| r.0),
        Some(200)
    );
    env.finish().await;
}

/// A scraper that does not ask for OpenMetrics (the Go operator's harness, client_golang-era
/// scrapers) reads the classic text format; one that asks reads OpenMetrics. Both carry the
/// controller-runtime names the Go operator exposed, with real values.
#[tokio::test]
async fn metrics_answer_both_formats_with_the_controller_runtime_names() {
    let env = env("metrics-formats").await;
    let controller = controller(&[]).await;
    env.project_new_configmap("cfg", "cfg", Value::Null, json!({}))
        .await;
    wait_ready(&env.projections(), "cfg").await;
    controller
        .metrics_once_counted(&["projection_reconcile_total{kind=\"Projection\",result=\"success\"}"])
        .await;
    let port = controller.metrics_port;
    let (code, content_type, classic) =
        projection_tests::http_get_accepting(port, "/metrics", None).expect("metrics answer");
    assert_eq!(code, 200);
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    assert!(!classic.contains("# EOF"), "{classic}");
    assert!(
        classic.contains("# TYPE controller_runtime_reconcile_total counter"),
        "{classic}"
    );
    assert!(
        classic.contains("# TYPE workqueue_adds_total counter"),
        "{classic}"
    );
    for sample in [
        "controller_runtime_reconcile_total{controller=\"projection\",result=\"success\"}",
        "controller_runtime_reconcile_time_seconds_count{controller=\"projection\"}",
        "workqueue_adds_total{controller=\"projection\",name=\"projection\"}",
        "workqueue_queue_duration_seconds_count{controller=\"projection\",name=\"projection\"}",
        "projection_reconcile_total{kind=\"Projection\",result=\"success\"}",
    ] {
        assert!(
            metric_value(&classic, sample).is_some_and(|v| v > 0.0),
            "{sample} missing or zero in:\n{classic}"
        );
    }
    // Served from the start, at zero while nothing is counted under them; their values also count
    // the CRs others left on the cluster (the demo's), which this controller reconciles too.
    let others = kube::Api::<Projection>::all(env.client.clone())
        .list(&Default::default())
        .await
        .expect("listing Projections")
        .items
        .len()
        - 1
        + kube::Api::<ClusterProjection>::all(env.client.clone())
            .list(&Default::default())
            .await
            .expect("listing ClusterProjections")
            .items
            .len();
    for sample in [
        "controller_runtime_reconcile_errors_total{controller=\"projection\"}",
        "workqueue_retries_total{controller=\"projection\",name=\"projection\"}",
        "controller_runtime_reconcile_total{controller=\"clusterprojection\",result=\"success\"}",
    ] {
        let value = metric_value(&classic, sample);
        assert!(
            value.is_some() && (others > 0 || value == Some(0.0)),
            "{sample} in:\n{classic}"
        );
    }
    // Nothing is left waiting once the Projection is Ready and nothing else changes (its status
    // write may still wake it once).
    let depth = "workqueue_depth{controller=\"projection\",name=\"projection\",priority=\"0\"}";
    wait_for("an empty work queue", Duration::from_secs(30), || async {
        let text = controller.metrics();
        match metric_value(&text, depth) {
            Some(0.0) => Ok(()),
            other => Err(format!("{depth} = {other:?}")),
        }
    })
    .await;
    // And no reconcile left running: no worker busy, no unfinished work.
    let busy = [
        "controller_runtime_active_workers{controller=\"projection\"}",
        "workqueue_unfinished_work_seconds{controller=\"projection\",name=\"projection\"}",
        "workqueue_longest_running_processor_seconds{controller=\"projection\",name=\"projection\"}",
    ];
    wait_for("no reconcile running", Duration::from_secs(30), || async {
        let text = controller.metrics();
        let values: Vec<Option<f64>> = busy.iter().map(|sample| metric_value(&text, sample)).collect();
        match values.iter().all(|v| *v == Some(0.0)) {
            true => Ok(()),
            false => Err(format!("{busy:?} = {values:?}")),
        }
    })
    .await;
    // Its client's requests, by answer (client-go's name and labels).
    assert!(
        classic
            .lines()
            .any(|l| l.starts_with("rest_client_requests_total{code=\"200\",host=")
                && l.contains("method=\"GET\"")),
        "no answered GET in rest_client_requests_total:\n{classic}"
    );
    let limit = "controller_runtime_max_concurrent_reconciles{controller=\"clusterprojection\"}";
    assert!(
        metric_value(&controller.metrics(), limit).is_some_and(|v| v > 0.0),
        "{limit} missing or zero"
    );

    let (code, content_type, openmetrics) = projection_tests::http_get_accepting(
        port,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
    )
    .expect("metrics answer");
    assert_eq!(code, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    assert!(
        openmetrics.contains("# TYPE controller_runtime_reconcile counter"),
        "{openmetrics}"
    );
    assert!(
        metric_value(
            &openmetrics,
            "controller_runtime_reconcile_total{controller=\"projection\",result=\"success\"}"
        )
        .is_some_and(|v| v > 0.0),
        "{openmetrics}"
    );
    env.finish().await;
}

/// A replica's arguments for leader election on a Lease of `duration` in `namespace`.
fn leader_elect_args<'a>(namespace: &'a str, duration: &'a str) -> [&'a str; 6] {
    [
        "--author-access=trusted",
        "--leader-elect",
        "--leader-election-lease-duration",
        duration,
        "--leader-election-namespace",
        namespace,
    ]
}

#[tokio::test]
async fn leader_election_hands_over_when_the_leader_dies() {
    let env = env("leader").await;
    let namespace = env.source.name().to_owned();
    let args = leader_elect_args(&namespace, "4s");
    let mut first = ServiceProcess::start(binary(), &args);
    first.wait_ready().await;
    let leases: Api<Lease> = env.api(&namespace);
    let holder = |l: &Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default()
    };
    let lease = wait_object(&leases, "projection-controller-leader", "lease held", |l| {
        !holder(l).is_empty()
    })
    .await;
    let first_holder = holder(&lease);
    // `quiet` and its copy exist before the standby starts: its watches' first lists wake it, which
    // is no change it missed, so it does not go first.
    for (cr, source) in [("quiet", "quiet-cfg"), ("a", "cfg")] {
        create(
            &env.api::<ConfigMap>(&namespace),
            json!({"metadata": {"name": source, "annotations": opted_in()}}),
        )
        .await;
        create(
            &env.projections(),
            projection(cr, cm_source(&namespace, source), json!({})),
        )
        .await;
        wait_ready(&env.projections(), cr).await;
    }
    wait_object(
        &env.api::<ConfigMap>(env.dest.name()),
        "quiet-cfg",
        "quiet's copy",
        |_| true,
    )
    .await;
    let mut second = ServiceProcess::start(binary(), &args);
    second.wait_ready().await; // a standby is ready too
    let success = "projection_reconcile_total{kind=\"Projection\",result=\"success\"}";
    assert!(
        metric_value(&second.metrics(), success).is_none(),
        "the standby wrote nothing"
    );

    first.kill_hard();
    let started = std::time::Instant::now();
    // An edit while no one leads: the standby's watch would have woken `a`, so `a` goes first once
    // it leads, and its copy follows the edit.
    merge(
        &env.api::<ConfigMap>(&namespace),
        "cfg",
        json!({"data": {"k": "while no one leads"}}),
    )
    .await;
    wait_object(&leases, "projection-controller-leader", "lease taken over", |l| {
        !holder(l).is_empty() && holder(l) != first_holder
    })
    .await;
    wait_object(
        &env.api::<ConfigMap>(env.dest.name()),
        "cfg",
        "the edit in a's copy",
        |copy| data_of(copy)["k"] == "while no one leads",
    )
    .await;
    let sent_first = std::fs::read_to_string(&second.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| {
            l["fields"]["message"]
                == "sent first the CRs whose source or copies changed while this replica stood by"
        })
        .map(|l| l["fields"]["crs"].clone())
        .collect::<Vec<_>>();
    assert_eq!(
        sent_first,
        [json!(1)],
        "a, woken while the standby stood by, went first, and quiet, only listed, did not"
    );
    create(
        &env.projections(),
        projection(
            "b",
            cm_source(&namespace, "cfg"),
            json!({"destination": {"name": "cfg-b"}}),
        ),
    )
    .await;
    wait_ready(&env.projections(), "b").await;
    wait_for_event(&env.client, env.dest.name(), "b", "Projected").await;
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "took over in {:?}",
        started.elapsed()
    );
    assert!(second.is_running());
    stop_cleanly(&mut second);
    let _cleanup = controller(&[]).await;
    env.finish().await;
}

/// Replicas that start together, with no one holding the Lease yet, elect one leader: the one that
/// writes the Lease first; the others' takes conflict and they wait. (Each replica takes the Lease
/// as a field manager of its own; under one shared manager, two took it within milliseconds in
/// the fault profile and both wrote until the next renewal.)
#[tokio::test]
async fn replicas_started_together_elect_one_leader() {
    let env = env("one-leader").await;
    let namespace = env.source.name().to_owned();
    let args = leader_elect_args(&namespace, "3s");
    let mut replicas: Vec<ServiceProcess> = (0..8).map(|_| ServiceProcess::start(binary(), &args)).collect();
    let leases: Api<Lease> = env.api(&namespace);
    // Held, and renewed a whole Lease later: a replica that also believed it led would have said so
    // at once, and been told otherwise at its first renewal.
    let lease = wait_object(
        &leases,
        "projection-controller-leader",
        "the Lease held a whole term",
        |l| {
            l.spec.as_ref().is_some_and(|s| {
                s.holder_identity.is_some()
                    && matches!((&s.acquire_time, &s.renew_time), (Some(a), Some(r))
                    if r.0.as_second() - a.0.as_second() >= 3)
            })
        },
    )
    .await;
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    let leading: Vec<u32> = replicas
        .iter()
        .filter(|r| {
            std::fs::read_to_string(&r.log)
                .unwrap_or_default()
                .contains("\"acquired leadership\"")
        })
        .map(ServiceProcess::pid)
        .collect();
    assert_eq!(
        leading.len(),
        1,
        "replicas {leading:?} each said they led; the Lease names {holder}"
    );
    assert!(
        holder.ends_with(&format!("-{}", leading[0])),
        "{holder} is not {leading:?}"
    );
    for replica in &mut replicas {
        assert!(
            replica.is_running(),
            "no replica exited (log {})",
            replica.log.display()
        );
    }
    for replica in &mut replicas {
        stop_cleanly(replica);
    }
    let _cleanup = controller(&[]).await;
    env.finish().await;
}

/// The `retry_in` of every `reconcile failed` line about `name` in a controller's log.
#[tokio::test]
async fn apiserver_refusals_read_as_the_apiservers_own_message() {
    let env = env("apimsg").await;
    let (_, dst) = env.names();
    let copies = env.api::<ConfigMap>(&dst);
    let policy = format!("deny-{dst}");
    let _policy = DenyPolicy::create(
        &env.client,
        &policy,
        ("", "configmaps", &["CREATE"]),
        &dst,
        "object.metadata.name != 'blocked'",
        "copies named blocked are refused here",
        || {
            let copies = copies.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "blocked"}})).unwrap();
                let dry_run = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                copies.create(&dry_run, &cm).await.map(|_| ())
            }
        },
    )
    .await;
    let controller = controller(&[]).await;
    env.project_new_configmap("blocked", "blocked", Value::Null, json!({}))
        .await;
    let ready = wait_not_ready(&env.projections(), "blocked", "DestinationCreateFailed").await;
    let message = ready["message"].as_str().unwrap_or_default().to_owned();
    assert!(
        message.starts_with(r#"configmaps "blocked" is forbidden: "#)
            && message.ends_with("copies named blocked are refused here"),
        "the apiserver's message: {message}"
    );
    for noise in ["ApiError", "Status {", "ListMeta", "code: 403"] {
        assert!(
            !message.contains(noise),
            "no debug dump in the condition: {message}"
        );
    }
    let note = wait_for_event(&env.client, &dst, "blocked", "DestinationCreateFailed").await;
    assert_eq!(note, message, "the event says the same");
    // A handled failure is counted under its own category, not under the finalizer's.
    let text = controller
        .metrics_once_counted(&[
            "projection_reconcile_errors_total{kind=\"Projection\",category=\"handled\"}",
        ])
        .await;
    assert!(
        metric_value(
            &text,
            "projection_reconcile_errors_total{kind=\"Projection\",category=\"finalizer\"}"
        )
        .is_none(),
        "{text}"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_refused_finalizer_removal_is_retried_with_backoff() {
    let env = env("finrm").await;
    let (_, dst) = env.names();
    let controller = controller(&[]).await;
    env.project_new_configmap("cfg", "cfg", Value::Null, json!({}))
        .await;
    let projections = env.projections();
    wait_ready(&projections, "cfg").await;

    // The apiserver refuses to let the finalizer go, as when an admission webhook is down.
    let message = "the finalizer stays for this test";
    let remove_finalizer = || {
        let projections = projections.clone();
        async move {
            let dry_run = PatchParams {
                dry_run: true,
                ..Default::default()
            };
            let patch = json!({"metadata": {"finalizers": null}});
            projections
                .patch("cfg", &dry_run, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
    };
    let policy = DenyPolicy::create(
        &env.client,
        &format!("keep-finalizer-{dst}"),
        ("projection.sh", "projections", &["UPDATE"]),
        &dst,
        "!(has(oldObject.metadata.finalizers) && 'projection.sh/finalizer' in oldObject.metadata.finalizers) \
         || (has(object.metadata.finalizers) && 'projection.sh/finalizer' in object.metadata.finalizers)",
        message,
        remove_finalizer,
    )
    .await;
    delete(&projections, "cfg").await;
    wait_absent(
        &env.api::<ConfigMap>(&dst),
        "cfg",
        "the copy removed by the cleanup",
    )
    .await;
    let failures = "projection_reconcile_errors_total{kind=\"Projection\",category=\"finalizer\"}";
    wait_for("a failed finalizer removal", TIMEOUT, || async {
        metric_value(&controller.metrics(), failures)
            .filter(|v| *v >= 1.0)
            .ok_or_else(|| "none yet".to_owned())
    })
    .await;
    // Settled once the delay has grown to 2 s (the third failure): a fixed 500 ms retry would have
    // failed about 13 times by then.
    let name = format!("{dst}/cfg");
    wait_retry_delay(&controller, &name, "2s").await;
    let count = metric_value(&controller.metrics(), failures).unwrap_or_default();
    let retries = retries_of(&controller, &name);
    // From 500 ms, doubling: attempts at about 0, 0.5, 1.5, 3.5 (and 7.5) s; a fixed 500 ms retry
    // would have made about 13.
    assert!(
        (2.0..=6.0).contains(&count),
        "{count} failed removals in about 6 s; retry_in: {retries:?}"
    );
    assert!(
        retries.iter().any(|r| r == "2s" || r == "4s"),
        "the delay grows: {retries:?}"
    );

    // Once the apiserver lets the finalizer go, the Projection goes.
    drop(policy);
    wait_for("the policy withdrawn", TIMEOUT, || async {
        remove_finalizer().await.map_err(|e| e.to_string())
    })
    .await;
    // A nudge, in case the next retry is far off; the retry may also have come first and the
    // Projection be gone already.
    let poke = json!({"metadata": {"labels": {"poke": "1"}}});
    match projections
        .patch("cfg", &PatchParams::default(), &Patch::Merge(&poke))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => panic!("poking cfg: {e}"),
    }
    wait_for("the Projection deleted", TIMEOUT, || async {
        match projections.get_opt("cfg").await {
            Ok(None) => Ok(()),
            Ok(Some(p)) => Err(format!("finalizers {:?}", p.metadata.finalizers)),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    env.finish().await;
}

/// A copy another writer keeps changing while its Projection is deleted: each delete carries a
/// resourceVersion precondition, so it conflicts (409) whenever the copy moved since it was read.
/// A pass reads it again once, then gives up and reports `DeletionBlocked`, and the deletion still
/// completes (every write of the other writer wakes the Projection). Whether two conflicts in a row
/// happen depends on timing (on this machine they did in most runs, the deletion taking 0.1 to
/// 1.2 s): what is asserted holds either way, the deletion completes and the blocked pass
/// reads the same each time, so repeats are one event series, not one event per conflict.
#[tokio::test]
async fn a_copy_changed_continuously_by_another_writer_is_still_deleted_without_an_event_flood() {
    let env = env("hot").await;
    let _controller = controller(&[]).await;
    let (_, dst) = env.names();
    env.project_new_configmap("hot", "hot", json!({"v": "1"}), json!({}))
        .await;
    wait_ready(&env.projections(), "hot").await;
    let copies = env.api::<ConfigMap>(&dst);
    // A bounded writer: at most 8 s, and it stops at the first refused write (the copy gone).
    let writer = {
        let copies = copies.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut n = 0u32;
            while started.elapsed() < Duration::from_secs(8) {
                let patch = json!({"metadata": {"annotations": {"example.com/bump": n.to_string()}}});
                if copies
                    .patch("hot", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_err()
                {
                    break;
                }
                n += 1;
            }
            n
        })
    };
    wait_object(&copies, "hot", "the other writer at work", |c| {
        c.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("example.com/bump"))
    })
    .await;
    delete(&env.projections(), "hot").await;
    wait_for("the Projection and its copy gone", TIMEOUT, || async {
        let projection = env
            .projections()
            .get_opt("hot")
            .await
            .map_err(|e| e.to_string())?;
        let copy = copies.get_opt("hot").await.map_err(|e| e.to_string())?;
        match (projection, copy) {
            (None, None) => Ok(()),
            (p, c) => Err(format!(
                "projection {:?}, copy {}",
                p.map(|p| p.status),
                c.is_some()
            )),
        }
    })
    .await;
    let writes = writer.await.expect("the writer ran");
    assert!(writes > 0, "the other writer wrote");
    let blocked: Vec<_> = projection_tests::events_about(&env.client, &dst, "hot")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DeletionBlocked"))
        .collect();
    assert!(blocked.len() <= 1, "one series at most: {blocked:?}");
    if let Some(event) = blocked.first() {
        let note = event.note.as_deref().unwrap_or_default();
        assert!(note.contains("kept changing while being deleted"), "{note}");
    }
    env.finish().await;
}
