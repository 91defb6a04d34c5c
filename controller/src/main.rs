//! projection-controller: reconciles `Projection`s (and serves metrics and probes), optionally as
//! one of several replicas behind a leader Lease.

mod cli;
mod cluster;
mod context;
mod discovery;
mod error;
mod events;
mod leader;
mod metrics;
mod namespaces;
mod projection;
mod reconcile;
mod watches;
mod writer;

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api, Client, Resource,
    api::PartialObjectMeta,
    runtime::{
        Controller, PredicateConfig, WatchStreamExt, controller, reflector,
        watcher::{self, Event},
    },
};
use prometheus_client::registry::Registry;
use runtime::http;
use shared::{
    crd::{ClusterProjection, Projection},
    keys::{CLUSTER_PROJECTION_FINALIZER, PROJECTION_FINALIZER},
};
use std::{
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

/// Reconciles running at once (each object is still reconciled by one at a time).
const RECONCILE_CONCURRENCY: u16 = 32;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runtime::crypto::install_crypto_provider();
    let args = cli::Args::parse();
    runtime::logs::init_json_logs();
    let metrics_addr = http::bind_address(&args.metrics_bind_address)?;
    let probe_addr = http::bind_address(&args.health_probe_bind_address)?;
    tracing::info!(
        source_mode = %args.source_mode,
        requeue_interval = ?args.requeue_interval,
        selector_write_concurrency = args.selector_write_concurrency,
        metrics = ?metrics_addr,
        health = ?probe_addr,
        leader_elect = args.leader_elect,
        "projection-controller starting"
    );

    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        let signal = runtime::signals::shutdown_signal().await;
        tracing::info!(signal, "projection-controller shutting down");
        on_signal.cancel();
    });
    let stopped = {
        let stop = stop.clone();
        move || stop.clone().cancelled_owned()
    };

    let mut registry = Registry::default();
    let metrics = Arc::new(metrics::Metrics::register(&mut registry));
    let readiness = http::Readiness::default();
    let server = tokio::spawn(http::serve(
        metrics_addr,
        probe_addr,
        Arc::new(registry),
        readiness.clone(),
        stopped(),
    ));

    let client = runtime::kube_client::infer().await?;
    let mut leadership = None;
    if args.leader_elect {
        let namespace = args.leader_election_namespace.clone();
        let identity = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .map(|h| format!("{h}-{}", std::process::id()))
            .unwrap_or_else(|_| format!("projection-controller-{}", std::process::id()));
        // A standby is ready: it has nothing to sync until it leads.
        readiness.set(true);
        tokio::select! {
            acquired = leader::Leadership::acquire(client.clone(), &namespace, &identity, args.leader_election_lease_duration) => {
                leadership = Some(acquired?);
                readiness.set(false);
            }
            () = stopped() => {
                server.await??;
                return Ok(());
            }
        }
    }

    let settings = context::Settings {
        source_mode: args.source_mode,
        requeue_cap: args.requeue_interval,
        write_concurrency: usize::from(args.selector_write_concurrency),
    };
    let run = run_controllers(client, metrics, settings, readiness.clone(), stop);
    let lost = async {
        match leadership.as_mut() {
            Some(l) => l.lost().await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        () = run => Ok(()),
        () = lost => Err(anyhow::anyhow!("lost the leader lease; exiting so a standby takes over")),
    };
    readiness.set(false);
    if let Some(l) = leadership {
        l.release().await;
    }
    if result.is_ok() {
        server.await??;
    }
    result
}

/// Which changes of a CR need a reconcile: its spec (generation), its deletion, and our finalizer.
/// Status writes, including our own, do not.
fn reconcile_relevant<K: Resource>(object: &K, finalizer: &str) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    object.meta().generation.hash(&mut hasher);
    object.meta().deletion_timestamp.is_some().hash(&mut hasher);
    object
        .meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizer)
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// The watch stream of one CR kind, feeding `writer`'s store and filtered to relevant changes.
fn cr_stream<K>(
    client: &Client,
    writer: reflector::store::Writer<K>,
    finalizer: &'static str,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Watchable,
{
    watcher::watcher(
        Api::<K>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects()
    .predicate_filter(
        move |o: &K| reconcile_relevant(o, finalizer),
        PredicateConfig::default(),
    )
}

/// A kind the controller lists and watches cluster-wide.
trait Watchable:
    Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static
{
}
impl<K> Watchable for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

fn log_result<T, E: std::fmt::Display>(result: Result<T, E>) -> std::future::Ready<()> {
    if let Err(e) = result {
        tracing::debug!(error = %e, "reconcile did not complete");
    }
    std::future::ready(())
}

async fn run_controllers(
    client: Client,
    metrics: Arc<metrics::Metrics>,
    settings: context::Settings,
    readiness: http::Readiness,
    stop: CancellationToken,
) {
    let (projections_tx, projections_rx) = tokio::sync::mpsc::unbounded_channel();
    let (clusters_tx, clusters_rx) = tokio::sync::mpsc::unbounded_channel();
    let wake = watches::Wake {
        projections: projections_tx,
        clusters: clusters_tx,
    };
    let namespaces = namespaces::Namespaces::new();
    let namespace_task = tokio::spawn(namespaces.clone().run(client.clone(), wake.clone()));
    let ctx = Arc::new(context::Context {
        client: client.clone(),
        discovery: discovery::Discovery::new(client.clone()),
        watches: Arc::new(watches::WatchRegistry::new(client.clone(), metrics.clone(), wake)),
        namespaces,
        events: events::Events::new(client.clone()),
        metrics,
        settings,
        backoff: context::Backoff::default(),
        statuses: context::WrittenStatuses::default(),
    });

    // Discovery changes when a CRD, or an APIService (one per served group and version: the
    // aggregator registers a CRD's versions one by one, and aggregated APIs come this way), appears,
    // changes or goes: forget cached resolutions and re-resolve the sources of that group.
    let crd_task = tokio::spawn(follow_discovery_changes::<CustomResourceDefinition>(
        client.clone(),
        ctx.clone(),
    ));
    let api_service_task = tokio::spawn(follow_discovery_changes::<APIService>(
        client.clone(),
        ctx.clone(),
    ));

    let (projection_store, projection_writer) = reflector::store::<Projection>();
    let (cluster_store, cluster_writer) = reflector::store::<ClusterProjection>();
    let ready = (
        projection_store.clone(),
        cluster_store.clone(),
        ctx.namespaces.clone(),
    );
    tokio::spawn(async move {
        let limit = std::time::Duration::from_secs(3600);
        if watches::store_ready(&ready.0, limit).await && watches::store_ready(&ready.1, limit).await {
            ready.2.synced().await;
            readiness.set(true);
            tracing::info!("caches synced; ready");
        }
    });

    let config = controller::Config::default().concurrency(RECONCILE_CONCURRENCY);
    let projections = Controller::for_stream(
        cr_stream(&client, projection_writer, PROJECTION_FINALIZER),
        projection_store,
    )
    .reconcile_on(UnboundedReceiverStream::new(projections_rx))
    .with_config(config.clone())
    .graceful_shutdown_on(stop.clone().cancelled_owned())
    .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
    .for_each(log_result);
    let clusters = Controller::for_stream(
        cr_stream(&client, cluster_writer, CLUSTER_PROJECTION_FINALIZER),
        cluster_store,
    )
    .reconcile_on(UnboundedReceiverStream::new(clusters_rx))
    .with_config(config)
    .graceful_shutdown_on(stop.cancelled_owned())
    .run(reconcile::reconcile, reconcile::error_policy, ctx)
    .for_each(log_result);
    tokio::join!(projections, clusters);
    crd_task.abort();
    api_service_task.abort();
    namespace_task.abort();
}

/// Invalidates discovery and wakes the CRs following the group of every `K` that changes.
async fn follow_discovery_changes<K>(client: Client, ctx: Arc<context::Context>)
where
    K: Watchable,
{
    watcher::watcher(
        Api::<PartialObjectMeta<K>>::all(client),
        watcher::Config::default(),
    )
    .default_backoff()
    .for_each(|event| {
        if let Ok(Event::Apply(object) | Event::Delete(object)) = event {
            ctx.discovery.invalidate();
            ctx.watches
                .wake_discovery_followers(group_of(object.metadata.name.as_deref().unwrap_or_default()));
        }
        std::future::ready(())
    })
    .await;
}

/// The API group in the name of a CRD (`<plural>.<group>`) or an APIService (`<version>.<group>`,
/// `v1.` for the core group).
fn group_of(name: &str) -> &str {
    name.split_once('.').map_or("", |(_, group)| group)
}

#[cfg(test)]
mod tests {
    #[test]
    fn group_of_crd_and_api_service_names() {
        assert_eq!(super::group_of("widgets.example.com"), "example.com");
        assert_eq!(super::group_of("v1beta1.example.com"), "example.com");
        assert_eq!(super::group_of("v1."), "");
    }
}
