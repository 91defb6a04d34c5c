//! Fan-out throughput of a set of ClusterProjections (`--cluster-projections N`, N > 1): N sources,
//! each copied by a ClusterProjection of its own into every target namespace. One CR is never split
//! between replicas, so only a set shows whether more replicas write more copies per second: the
//! ring spreads the N CRs over them, and each replica writes its CRs' copies.

use super::{RUN_LABEL, TARGET_LABEL, in_parallel, kind_resource, now_nanos, stamp, stamped, summarize};
use anyhow::bail;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, PostParams},
    runtime::watcher,
};
use serde_json::{Value, json};
use shared::api::crd::ClusterProjection;
use std::time::{Duration, Instant};

/// The label every ClusterProjection's copy carries (its value is the CR's uid).
const COPY_LABEL: &str = "projection.sh/owned-by-cluster-projection-uid";

/// Creates the set (sources `set-<j>` in `source_ns`, ClusterProjections `<run>-set-<j>` to every
/// namespace labelled as a target of `run`), then records into `report`: how long until every copy
/// of the set was written, and per sample, every source stamped at once and the times until the
/// first and the last of all copies show it, with the copies per second that last time gives.
pub async fn measure(
    client: &Client,
    (run, source_ns): (&str, &str),
    (set, samples): (usize, usize),
    report: &mut Value,
) -> anyhow::Result<()> {
    let targets = Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default().labels(&format!("{TARGET_LABEL}={run}")))
        .await?
        .items
        .len();
    let expected = set * targets;
    let sources: Api<ConfigMap> = Api::namespaced(client.clone(), source_ns);
    let names: Vec<usize> = (0..set).collect();
    in_parallel(names.clone(), |j| {
        let sources = sources.clone();
        async move {
            let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("set-{j}"),
                "annotations": {"projection.sh/projectable": "true"}}, "data": {"k": "v"}}))?;
            sources.create(&PostParams::default(), &cm).await?;
            Ok(())
        }
    })
    .await?;
    let author = projection_tests::author_annotation(client).await?;
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let t = Instant::now();
    in_parallel(names.clone(), |j| {
        let (cps, author) = (cps.clone(), author.clone());
        async move {
            let cp: ClusterProjection = serde_json::from_value(json!({
                "metadata": {"name": format!("{run}-set-{j}"), "labels": {RUN_LABEL: run}, "annotations": author},
                "spec": {"source": {"kind": "ConfigMap", "namespace": source_ns, "name": format!("set-{j}")},
                    "destination": {"namespaceSelector": {"matchLabels": {TARGET_LABEL: run}}}}}))?;
            cps.create(&PostParams::default(), &cp).await?;
            Ok(())
        }
    })
    .await?;
    let written = i32::try_from(targets)?;
    super::wait_until(
        "the set's fan-out to complete",
        Duration::from_secs(900),
        || async {
            let listed = cps
                .list(&ListParams::default().labels(&format!("{RUN_LABEL}={run}")))
                .await?;
            let done = listed
                .items
                .iter()
                .filter(|cp| {
                    cp.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&format!("{run}-set-")))
                })
                .filter(|cp| {
                    cp.status
                        .as_ref()
                        .is_some_and(|s| s.counts.namespaces_written == written)
                })
                .count();
            Ok(done == set)
        },
    )
    .await?;
    let initial = t.elapsed().as_secs_f64();
    report["fan_out_set"] =
        json!({"cluster_projections": set, "target_namespaces": targets, "copies": expected});
    report["fan_out_set_initial_seconds"] = json!(initial);
    report["fan_out_set_initial_copies_per_second"] = json!(expected as f64 / initial);

    let copies = Api::<DynamicObject>::all_with(client.clone(), &kind_resource(0));
    let config = watcher::Config::default().labels(COPY_LABEL);
    let (mut first, mut last) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let value = now_nanos();
        let observer = super::Observer::start(copies.clone(), config.clone(), stamped(value.clone())).await;
        let t = Instant::now();
        in_parallel(names.clone(), |j| {
            let (client, value) = (client.clone(), value.clone());
            async move {
                let api = Api::<DynamicObject>::namespaced_with(client, source_ns, &kind_resource(0));
                stamp(&api, &format!("set-{j}"), &value).await
            }
        })
        .await?;
        let seen = observer.wait(expected, Duration::from_secs(300)).await;
        if seen.len() < expected {
            bail!("only {} of the set's {expected} copies were updated", seen.len());
        }
        let since = |at: Option<&Instant>| {
            at.map(|at| at.duration_since(t).as_secs_f64())
                .unwrap_or_default()
        };
        first.push(since(seen.iter().min()));
        last.push(since(seen.iter().max()));
    }
    let last = summarize(last);
    if let Some(p50) = last.as_ref().map(|s| s.p50_ms).filter(|ms| *ms > 0.0) {
        report["fan_out_set_copies_per_second"] = json!(expected as f64 / (p50 / 1000.0));
    }
    report["fan_out_set_edit_first_copy"] = json!(summarize(first));
    report["fan_out_set_edit_last_copy"] = json!(last);
    Ok(())
}

/// The set's copies per second after an edit of every source against the apiserver's own writes per
/// second in the same run (its last write of one ConfigMap into each of the profile's target
/// namespaces, p50).
pub fn fraction_of_limit(report: &Value) -> Option<f64> {
    let ours = report.get("fan_out_set_copies_per_second")?.as_f64()?;
    let targets = report.get("plan")?.get("fan_out")?.as_f64()?;
    let limit_ms = report
        .get("apiserver_fan_out_last_write")?
        .get("p50_ms")?
        .as_f64()?;
    let limit = targets / (limit_ms / 1000.0);
    (limit > 0.0).then_some(ours / limit)
}
