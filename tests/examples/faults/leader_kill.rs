//! Scenario 3: two replicas with leader election under a fan-out, the leader SIGKILLed in the middle
//! of one. Measures how long the standby takes to write the next change, and counts the writes of
//! every copy through a watch: a value written twice to one copy is a double write (two replicas
//! writing, or a new leader redoing what was done).

use super::{PARALLEL, Plan, RUN_LABEL, Random, create_namespace, create_source, edit_source, round2};
use anyhow::{Context as _, ensure};
use futures::StreamExt;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api, Client, ResourceExt,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use projection_tests::{ServiceProcess, in_parallel};
use serde_json::{Value, json};
use shared::api::crd::ClusterProjection;
use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

const COPY: &str = "leader-copy";
const LEASE: &str = "projection-controller-leader";
/// Short, so that a takeover is seconds, not the chart's 15 s.
const LEASE_SECONDS: &str = "4s";

/// Every write of every copy seen by the watch: namespace → the values, one per resourceVersion.
type Writes = Arc<Mutex<BTreeMap<String, Vec<(String, u64)>>>>;

pub async fn leader_kill(
    client: &Client,
    run: &str,
    plan: &Plan,
    random: &mut Random,
    binary: &Path,
    extra_args: &[String],
) -> anyhow::Result<Value> {
    let home = format!("{run}-lease");
    create_namespace(client, &home, BTreeMap::new(), run).await?;
    let source_ns = format!("{run}-lsrc");
    create_namespace(client, &source_ns, BTreeMap::new(), run).await?;
    let sources = create_source(client, &source_ns).await?;
    let prefix = format!("{run}-l");
    let names: Vec<String> = (0..plan.namespaces).map(|i| format!("{prefix}{i}")).collect();
    in_parallel(names.clone(), PARALLEL, |name| async move {
        create_namespace(client, &name, BTreeMap::new(), run).await
    })
    .await?;

    // Every write of a copy, from before the first one.
    let writes: Writes = Arc::default();
    let recorder = writes.clone();
    let watched_prefix = prefix.clone();
    let copies = Api::<ConfigMap>::all(client.clone());
    let watch = tokio::spawn(
        watcher(
            copies,
            watcher::Config::default().fields(&format!("metadata.name={COPY}")),
        )
        .default_backoff()
        .applied_objects()
        .for_each(move |copy| {
            if let Ok(copy) = copy {
                let ns = copy.namespace().unwrap_or_default();
                let value = copy
                    .data
                    .as_ref()
                    .and_then(|d| d.get("value"))
                    .and_then(|v| v.parse().ok());
                if let (true, Some(value)) = (ns.starts_with(&watched_prefix), value) {
                    let version = copy.resource_version().unwrap_or_default();
                    let mut writes = recorder.lock().unwrap_or_else(|e| e.into_inner());
                    let seen = writes.entry(ns).or_default();
                    // A relist delivers what was seen already: count each version once.
                    if !seen.iter().any(|(v, _)| *v == version) {
                        seen.push((version, value));
                    }
                }
            }
            std::future::ready(())
        }),
    );

    let args: Vec<String> = [
        "--leader-elect",
        "--leader-election-lease-duration",
        LEASE_SECONDS,
        "--leader-election-namespace",
        home.as_str(),
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .chain(extra_args.iter().cloned())
    .collect();
    let mut replicas = vec![
        super::start_controller(binary, &args),
        super::start_controller(binary, &args),
    ];
    for replica in &mut replicas {
        replica.wait_ready().await;
    }
    let author = projection_tests::author_annotation(client).await?;
    Api::<ClusterProjection>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
                "metadata": {"name": format!("{run}-leader"), "labels": {RUN_LABEL: run}, "annotations": author},
                "spec": {
                    "source": {"version": "v1", "kind": "ConfigMap", "namespace": source_ns, "name": "settings"},
                    "destination": {"namespaces": names, "name": COPY},
                },
            }))?,
        )
        .await?;
    wait_all(&writes, &names, 0).await?;
    let writes_before = configmap_writes(client).await?;

    // Edits with the fan-out running; the leader is killed at a random point of one of them, and
    // the next edit is made at once, so the standby's first writes measure the takeover.
    let edits = (plan.kills.max(2) * 2) as u64;
    let kill_at = edits / 2;
    let mut takeover = None;
    let mut value = 0;
    while value < edits {
        value += 1;
        edit_source(&sources, value).await?;
        if value != kill_at {
            wait_all(&writes, &names, value).await?;
            continue;
        }
        let delay = Duration::from_millis(random.below(300));
        tokio::time::sleep(delay).await;
        let leader = leader_index(client, &home, &replicas).await?;
        replicas[leader].kill_hard();
        let killed = Instant::now();
        value += 1;
        edit_source(&sources, value).await?;
        wait_first(&writes, value).await?;
        let first = killed.elapsed();
        wait_all(&writes, &names, value).await?;
        let all = killed.elapsed();
        eprintln!(
            "leader killed {delay:?} into the fan-out of value {}; the standby wrote value {value} \
             {first:?} after the kill, to every copy {all:?} after",
            value - 1
        );
        takeover = Some(json!({"kill_delay_ms": delay.as_millis() as u64,
            "first_copy_seconds": round2(first), "all_copies_seconds": round2(all)}));
        replicas.remove(leader);
    }
    let last = value;
    wait_all(&writes, &names, last).await?;
    // Our own edits of the source are writes too; every other write was the replicas'.
    let replica_writes = configmap_writes(client).await? - writes_before - last;
    drop(replicas);
    watch.abort();

    let writes = writes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut double = Vec::new();
    let mut counts = Vec::new();
    for (ns, seen) in &writes {
        counts.push(seen.len());
        let mut values: Vec<u64> = seen.iter().map(|(_, v)| *v).collect();
        let written = values.len();
        values.dedup();
        if values.len() != written {
            double.push(ns.clone());
        }
    }
    let most = counts.iter().copied().max().unwrap_or_default();
    // Writes that changed a copy: all but the first (value 0) of each.
    let changes: u64 = counts.iter().map(|c| c.saturating_sub(1) as u64).sum();
    let unchanged = replica_writes.saturating_sub(changes);
    ensure!(
        double.is_empty(),
        "{} copies were written twice with one value, e.g. {:?}: {:?}",
        double.len(),
        double.first(),
        double.first().and_then(|ns| writes.get(ns))
    );
    eprintln!(
        "{} copies, {last} edits: at most {most} writes per copy (one per value), no double write; \
         the replicas made {replica_writes} writes for {changes} changed copies",
        names.len(),
    );
    Ok(json!({
        "namespaces": names.len(),
        "values": last + 1,
        "most_writes_per_copy": most,
        "double_writes": 0,
        "replica_writes": replica_writes,
        "copy_changes": changes,
        "writes_that_changed_nothing": unchanged,
        "takeover": takeover,
        "lease_duration": LEASE_SECONDS,
    }))
}

/// The replica holding the Lease (its identity ends with its process id).
async fn leader_index(client: &Client, home: &str, replicas: &[ServiceProcess]) -> anyhow::Result<usize> {
    let lease = Api::<Lease>::namespaced(client.clone(), home).get(LEASE).await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .context("nobody holds the Lease")?;
    replicas
        .iter()
        .position(|r| holder.ends_with(&format!("-{}", r.pid())))
        .with_context(|| format!("the holder {holder} is none of the replicas"))
}

/// Waits until every copy has been written with `value`.
async fn wait_all(writes: &Writes, names: &[String], value: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + super::CONVERGE_LIMIT;
    loop {
        let behind = {
            let writes = writes.lock().unwrap_or_else(|e| e.into_inner());
            names
                .iter()
                .filter(|ns| writes.get(*ns).and_then(|w| w.last()).map(|(_, v)| *v) != Some(value))
                .count()
        };
        if behind == 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{behind} copies still without value {value}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until some copy has been written with `value`.
async fn wait_first(writes: &Writes, value: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let written = {
            let writes = writes.lock().unwrap_or_else(|e| e.into_inner());
            writes.values().any(|w| w.iter().any(|(_, v)| *v == value))
        };
        if written {
            return Ok(());
        }
        ensure!(
            started.elapsed() < super::CONVERGE_LIMIT,
            "no copy written with value {value}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Successful writes (POST, PUT, PATCH) of ConfigMaps the apiserver has answered since it started,
/// from its own metrics.
async fn configmap_writes(client: &Client) -> anyhow::Result<u64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"configmaps\""))
        .filter(|l| {
            ["POST", "PUT", "PATCH"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
        })
        .filter(|l| l.contains("code=\"2"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum())
}
