//! A replica of the controller: what it runs whether or not it leads (the watches of the CRs, the
//! namespaces and the source kinds, the indexes, the warm-up), and the reconcilers it runs once it
//! holds the Lease (or at once without leader election).

use crate::{
    cache::stored_cr::StoredCr, context, initial_list, metrics, namespace_watch, pass,
    pass::kind::ProjectionKind, queue_metrics, wake, warm, warm::Warmable, watches,
};
use futures::StreamExt;
use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api, Client, Resource,
    api::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt, controller, reflector,
        watcher::{self, Event},
    },
};
use runtime::http;
use shared::api::{
    crd::{ClusterProjection, Projection},
    keys::{CLUSTER_PROJECTION_FINALIZER, PROJECTION_FINALIZER},
};
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

/// The watch stream of one CR kind, feeding `writer`'s store (each CR compacted as it is decoded,
/// `crate::cache::stored_cr`) and filtered to relevant changes; `deleted` is told of each CR the watch
/// reports deleted.
fn cr_stream<K>(
    (client, wake, (kind, dropped)): (
        &Client,
        &wake::Wake,
        (&'static str, prometheus_client::metrics::counter::Counter),
    ),
    writer: reflector::store::Writer<StoredCr<K>>,
    finalizer: &'static str,
    initial: crate::initial_list::InitialList,
    deleted: impl Fn(&StoredCr<K>) + Send + 'static,
) -> impl futures::Stream<Item = Result<StoredCr<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let watch = |client: Client| {
        move || {
            initial_list::watch(
                Api::<StoredCr<K>>::all(client.clone()),
                watcher::Config::default().any_semantic(),
                initial,
            )
            .default_backoff()
            .boxed()
        }
    };
    // With shards: this replica's ranges only, listed anew when they change (those of the sources
    // changed lately first).
    let (shard, recent) = (wake.shard.clone(), wake.recent_sources.clone());
    let events = match shard.clone() {
        None => watch(client.clone())(),
        Some(shard) => {
            let first = {
                let (client, shard) = (client.clone(), shard.clone());
                move || crate::shard_watch::gained_first(&client, (shard.clone(), recent.clone()), kind)
            };
            let sharded = crate::shard_watch::sharded_client(client, shard.selector());
            let events = crate::shard_watch::restarting((watch(sharded), first), shard.selector());
            crate::shard_watch::owned_only(events, shard, dropped)
        }
    }
    .reflect(writer)
    .inspect({
        let shard = shard.clone();
        move |event| {
            // The list is in the store now: the CRs that moved here with it can be handed over.
            if let (Some(shard), Ok(Event::InitDone)) = (&shard, event) {
                shard.relisted();
            }
        }
    });
    on_deleted(events, deleted).applied_objects().filter({
        let mut changes = crate::relevance::RelevantChanges::default();
        move |change| {
            let relevant = match change {
                // A CR that moved here and was not reconciled here yet is the resend's to hand over
                // (those reading a source changed meanwhile first), not the watch's in list order.
                Ok(cr) => {
                    changes.is_relevant(cr.meta(), finalizer, std::time::Instant::now())
                        && !shard.as_ref().is_some_and(|shard| {
                            shard.awaiting_takeover(cr.meta().uid.as_deref().unwrap_or_default())
                        })
                }
                Err(_) => true,
            };
            std::future::ready(relevant)
        }
    })
}

/// Passes every watch event on, telling `deleted` of each object the watch reports deleted (before
/// `applied_objects` drops those events).
fn on_deleted<K, S>(
    events: S,
    deleted: impl Fn(&K) + Send + 'static,
) -> impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send,
{
    events.inspect(move |event| {
        if let Ok(Event::Delete(object)) = event {
            deleted(object);
        }
    })
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

/// The CR changes sent to a reconciler, as the stream it takes.
fn changes<K>(
    rx: tokio::sync::mpsc::UnboundedReceiver<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    UnboundedReceiverStream::new(rx).map(Ok)
}

/// The CR changes handed to a reconciler, counted into its queue metrics on the way.
fn queued_changes<K>(
    stream: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    queue: Arc<queue_metrics::ControllerMetrics>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Send + 'static,
{
    stream.inspect(move |change| {
        if let Ok(cr) = change {
            queue.queued_change(queue_metrics::queue_key(
                cr.meta().namespace.as_deref(),
                cr.meta().name.as_deref().unwrap_or_default(),
            ));
        }
    })
}

/// The wakes handed to a reconciler, counted into its queue metrics on the way.
fn queued_wakes<K>(
    wakes: tokio::sync::mpsc::UnboundedReceiver<reflector::ObjectRef<K>>,
    queue: Arc<queue_metrics::ControllerMetrics>,
) -> impl futures::Stream<Item = reflector::ObjectRef<StoredCr<K>>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Send + 'static,
{
    UnboundedReceiverStream::new(wakes).map(move |wake| {
        queue.queued_change(queue_metrics::queue_key(wake.namespace.as_deref(), &wake.name));
        stored_ref(&wake)
    })
}

/// The store's key of the CR `cr` names.
fn stored_ref<K>(cr: &reflector::ObjectRef<K>) -> reflector::ObjectRef<StoredCr<K>>
where
    K: Resource<DynamicType = ()>,
{
    let key = reflector::ObjectRef::new(&cr.name);
    match &cr.namespace {
        Some(namespace) => key.within(namespace),
        None => key,
    }
}

/// Logs a reconcile that did not complete; one the controller dropped (its CR left the store)
/// leaves the queue metrics.
fn log_result<T, E: std::fmt::Display, Q: std::error::Error>(
    result: Result<T, controller::Error<E, Q>>,
    queue: &queue_metrics::ControllerMetrics,
) -> std::future::Ready<()> {
    if let Err(e) = result {
        if let controller::Error::ObjectNotFound(cr) = &e {
            queue.dropped(&queue_metrics::queue_key(cr.namespace.as_deref(), &cr.name));
        }
        tracing::debug!(error = %e, "reconcile did not complete");
    }
    std::future::ready(())
}

/// What a replica runs whether or not it leads: the watches, the indexes and the stores of the CRs,
/// and the warm-up of the source kinds they name.
pub struct Replica {
    ctx: Arc<context::Context>,
    /// Reconciles running at once, per kind.
    reconcile_concurrency: u16,
    /// How often the leader asks every CR's author again (`None`: authors are not checked, or
    /// the recheck is off).
    author_recheck: Option<std::time::Duration>,
    wake: wake::Wake,
    leading: Arc<AtomicBool>,
    projections: reflector::Store<StoredCr<Projection>>,
    clusters: reflector::Store<StoredCr<ClusterProjection>>,
    /// CR changes for the reconcilers (sent once this replica leads).
    projection_changes: (
        tokio::sync::mpsc::UnboundedSender<StoredCr<Projection>>,
        tokio::sync::mpsc::UnboundedReceiver<StoredCr<Projection>>,
    ),
    cluster_changes: (
        tokio::sync::mpsc::UnboundedSender<StoredCr<ClusterProjection>>,
        tokio::sync::mpsc::UnboundedReceiver<StoredCr<ClusterProjection>>,
    ),
    /// Wakes from the watch tasks.
    projection_wakes: tokio::sync::mpsc::UnboundedReceiver<reflector::ObjectRef<Projection>>,
    cluster_wakes: tokio::sync::mpsc::UnboundedReceiver<reflector::ObjectRef<ClusterProjection>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Replica {
    pub fn start(
        client: Client,
        metrics: Arc<metrics::Metrics>,
        settings: context::Settings,
        readiness: http::Readiness,
        shard: Option<Arc<crate::shard::Shard>>,
    ) -> Self {
        let leading = Arc::new(AtomicBool::new(false));
        let (projections_tx, projection_wakes) = tokio::sync::mpsc::unbounded_channel();
        let (clusters_tx, cluster_wakes) = tokio::sync::mpsc::unbounded_channel();
        let wake = wake::Wake {
            projections: projections_tx,
            clusters: clusters_tx,
            leading: leading.clone(),
            missed: Arc::default(),
            shard: shard.clone(),
            recent_sources: wake::RecentSources::new(settings.lease_duration),
        };
        let initial = settings.initial_list;
        let namespaces = namespace_watch::Namespaces::new();
        let mut tasks = vec![tokio::spawn(namespaces.clone().run(
            client.clone(),
            wake.clone(),
            initial,
        ))];
        let watches = Arc::new(watches::WatchRegistry::new(
            client.clone(),
            metrics.clone(),
            wake.clone(),
            initial,
        ));
        let ctx = Arc::new(context::Context {
            shard,
            ..context::Context::new(&client, &settings, (watches, namespaces, wake.clone()), metrics)
        });

        // Discovery changes when a CRD, or an APIService (one per served group and version: the
        // aggregator registers a CRD's versions one by one, and aggregated APIs come this way),
        // appears, changes or goes: forget cached resolutions and re-resolve the sources of that group.
        // A CRD's own kind's watches also follow it (stopped when it goes, replaced when it comes
        // back while they fail).
        tasks.push(tokio::spawn(
            follow_discovery_changes::<CustomResourceDefinition>(
                client.clone(),
                ctx.clone(),
                initial,
                |watches, name, deleted| watches.crd_changed(name, deleted),
            ),
        ));
        tasks.push(tokio::spawn(follow_discovery_changes::<APIService>(
            client.clone(),
            ctx.clone(),
            initial,
            |_, _, _| {},
        )));

        let (warm_tx, warm_rx) = tokio::sync::mpsc::unbounded_channel();
        tasks.push(tokio::spawn(warm::warm_up(ctx.sources.clone(), warm_rx)));
        let (projections, projection_writer) = reflector::store::<StoredCr<Projection>>();
        let (clusters, cluster_writer) = reflector::store::<StoredCr<ClusterProjection>>();
        ctx.report
            .metrics
            .observe_replica(&leading, &projections, &clusters);
        let projection_changes = tokio::sync::mpsc::unbounded_channel();
        let cluster_changes = tokio::sync::mpsc::unbounded_channel();
        tasks.push(tokio::spawn(warm::feed(
            cr_stream(
                (&client, &wake, dropped(&ctx, "Projection")),
                projection_writer,
                PROJECTION_FINALIZER,
                initial,
                {
                    let ctx = ctx.clone();
                    move |cr| pass::forget_deleted(&ctx, cr)
                },
            ),
            projection_changes.0.clone(),
            warm_tx.clone(),
            leading.clone(),
        )));
        tasks.push(tokio::spawn(warm::feed(
            cr_stream(
                (&client, &wake, dropped(&ctx, "ClusterProjection")),
                cluster_writer,
                CLUSTER_PROJECTION_FINALIZER,
                initial,
                {
                    let ctx = ctx.clone();
                    move |cr| pass::forget_deleted(&ctx, cr)
                },
            ),
            cluster_changes.0.clone(),
            warm_tx,
            leading.clone(),
        )));

        let ready = (projections.clone(), clusters.clone(), ctx.namespaces.clone());
        tasks.push(tokio::spawn(async move {
            let limit = std::time::Duration::from_secs(3600);
            if watches::store_ready(&ready.0, limit).await && watches::store_ready(&ready.1, limit).await {
                ready.2.synced().await;
                readiness.set(true);
                tracing::info!("caches synced; ready");
            }
        }));
        Self {
            ctx,
            reconcile_concurrency: settings.reconcile_concurrency,
            author_recheck: (settings.author_access == crate::author_access::AuthorAccessMode::Enforce
                && !settings.author_recheck_interval.is_zero())
            .then_some(settings.author_recheck_interval),
            wake,
            leading,
            projections,
            clusters,
            projection_changes,
            cluster_changes,
            projection_wakes,
            cluster_wakes,
            tasks,
        }
    }

    /// Runs the reconcilers until `stop`: every CR known so far is reconciled, then every change.
    pub async fn lead(self, stop: CancellationToken) {
        self.leading.store(true, Ordering::Release);
        // Changes seen from now on are forwarded by `warm::feed`; those before are in the stores,
        // once they have synced: a watch streaming its initial objects keeps them out of its store
        // until it has them all (the reflector swaps them in at once), and those streamed before
        // `leading` went to the warm-up only. Read too early, the store misses them and they would
        // never be reconciled (10,000 Projections there at start, a Lease taken at once: 339 lost).
        if !synced(&self.projections, &stop).await || !synced(&self.clusters, &stop).await {
            self.stop();
            return;
        }
        // The CRs a watch would have woken meanwhile (a copy changed or deleted by someone else),
        // and those whose source changed lately (an edit while the leader was gone: a standby
        // indexes no CR's reads, so it woke none), go first; then every CR, once those have begun
        // (kube's scheduler keeps no order among what it is sent at once, and the reconcilers
        // start below).
        let begun = self.ctx.passes_begun.subscribe();
        let (mut woken_projections, mut woken_clusters) = (Vec::new(), Vec::new());
        for cr in self.wake.take_missed() {
            match cr {
                crate::index::CrRef::Projection(r) => woken_projections.push(stored_ref(&r)),
                crate::index::CrRef::Cluster(r) => woken_clusters.push(stored_ref(&r)),
            }
        }
        let recent = &self.wake.recent_sources;
        let first = send_first(
            &self.projections,
            woken_projections,
            recent,
            &self.projection_changes.0,
        ) + send_first(&self.clusters, woken_clusters, recent, &self.cluster_changes.0);
        let send_all = {
            let target = *begun.borrow() + first as u64;
            let (projections, clusters) = (self.projections.clone(), self.clusters.clone());
            let (to_projections, to_clusters) =
                (self.projection_changes.0.clone(), self.cluster_changes.0.clone());
            tokio::spawn(async move {
                if first > 0 {
                    tracing::info!(
                        crs = first,
                        "sent first the CRs whose source or copies changed while this replica stood by"
                    );
                    until_begun(begun, target).await;
                }
                for cr in projections.state() {
                    let _ = to_projections.send((*cr).clone());
                }
                for cr in clusters.state() {
                    let _ = to_clusters.send((*cr).clone());
                }
            })
        };
        // With shards, a CR this replica may not reconcile yet is skipped by its pass; whenever the
        // membership changes, the ones it now may are sent again.
        let resend = self.ctx.shard.clone().map(|shard| {
            tokio::spawn(resend_when_shards_change(
                (shard, self.ctx.clone(), self.wake.recent_sources.clone()),
                (self.projections.clone(), self.clusters.clone()),
                (self.projection_changes.0.clone(), self.cluster_changes.0.clone()),
            ))
        });
        // Only the leader rechecks: it is the one that would withdraw.
        let recheck = self.author_recheck.map(|interval| {
            tokio::spawn(crate::author_recheck::run(
                (self.ctx.sources.clone(), self.ctx.report.metrics.clone()),
                (self.projections.clone(), self.clusters.clone()),
                self.wake.clone(),
                (interval, self.ctx.sources.concurrency),
            ))
        });
        self.ctx
            .report
            .metrics
            .queue
            .set_max_concurrent(self.reconcile_concurrency);
        let config = controller::Config::default().concurrency(self.reconcile_concurrency);
        let (projections_store, clusters_store) = (self.projections.clone(), self.clusters.clone());
        let queue = self.ctx.report.metrics.queue.projection.clone();
        let projections = Controller::for_stream(
            queued_changes(changes(self.projection_changes.1), queue.clone()),
            self.projections,
        )
        .reconcile_on(queued_wakes(self.projection_wakes, queue.clone()))
        .with_config(config.clone())
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(pass::reconcile, pass::error_policy, self.ctx.clone())
        .for_each(move |result| log_result(result, &queue));
        let queue = self.ctx.report.metrics.queue.cluster.clone();
        let clusters = Controller::for_stream(
            queued_changes(changes(self.cluster_changes.1), queue.clone()),
            self.clusters,
        )
        .reconcile_on(queued_wakes(self.cluster_wakes, queue.clone()))
        .with_config(config)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(pass::reconcile, pass::error_policy, self.ctx.clone())
        .for_each(move |result| log_result(result, &queue));
        let reconcilers = async {
            tokio::join!(
                unless_stopped_unsynced(projections, stop.clone(), projections_store),
                unless_stopped_unsynced(clusters, stop.clone(), clusters_store),
            );
        };
        if !ended_within(reconcilers, &stop, PASS_DRAIN).await {
            tracing::warn!(
                drain = ?PASS_DRAIN,
                "passes still running when the stop's drain ended were dropped: their CRs are reconciled anew by whoever reconciles them next"
            );
        }
        for task in self
            .tasks
            .into_iter()
            .chain(recheck)
            .chain(resend)
            .chain([send_all])
        {
            task.abort();
        }
    }

    /// Stops a replica that never led.
    pub fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

/// The kind, with the counter of its CR watch events dropped as another replica's.
fn dropped(
    ctx: &context::Context,
    kind: &'static str,
) -> (&'static str, prometheus_client::metrics::counter::Counter) {
    let counter = ctx
        .report
        .metrics
        .shard_events_dropped_total
        .get_or_create(&metrics::KindLabels { kind })
        .clone();
    (kind, counter)
}

/// Sends the reconcilers every CR this replica may reconcile now and could not before (or whose
/// pass the fence held), each time the membership (or its own Lease's validity) changes; and
/// forgets the CRs it reconciled that the ring has given to another replica since, once no pass of
/// theirs runs here, so that the watches only they needed stop.
async fn resend_when_shards_change(
    (shard, ctx, recent_sources): (
        Arc<crate::shard::Shard>,
        Arc<context::Context>,
        Arc<wake::RecentSources>,
    ),
    (projections, clusters): (
        reflector::Store<StoredCr<Projection>>,
        reflector::Store<StoredCr<ClusterProjection>>,
    ),
    (projection_changes, cluster_changes): (
        tokio::sync::mpsc::UnboundedSender<StoredCr<Projection>>,
        tokio::sync::mpsc::UnboundedSender<StoredCr<ClusterProjection>>,
    ),
) {
    let mut changed = shard.subscribe();
    // Also every 2 s: a CR that moved here may reach the store (its watch listing anew) after the
    // change that gave it to this replica.
    let mut sweep = tokio::time::interval(std::time::Duration::from_secs(2));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut mine: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut reconciled = Reconciled::default();
    loop {
        tokio::select! {
            alive = changed.changed() => if alive.is_err() { return },
            _ = sweep.tick() => {}
        }
        // Those whose pass the fence held count as not reconcilable before: sent again.
        for held in shard.release_held() {
            mine.remove(&held);
        }
        let mut now_mine = std::collections::HashSet::new();
        let mut stored = std::collections::HashSet::new();
        let fresh_projections = newly_reconcilable(
            &shard,
            &projections,
            &mine,
            (&mut now_mine, &mut stored),
            &mut reconciled,
        );
        let fresh_clusters = newly_reconcilable(
            &shard,
            &clusters,
            &mine,
            (&mut now_mine, &mut stored),
            &mut reconciled,
        );
        mine = now_mine;
        send_stale_takeovers_first(
            (&shard, &recent_sources, &ctx.passes_begun),
            (fresh_projections, &projection_changes),
            (fresh_clusters, &cluster_changes),
        )
        .await;
        let forgotten = forget_moved_away(&shard, &ctx, &mut reconciled, &stored);
        if forgotten > 0 {
            tracing::info!(
                crs = forgotten,
                "forgot the CRs the ring gave to other replicas: the watches only they needed stop"
            );
        }
    }
}

/// The CRs this replica reconciled, by uid, with their names.
type Reconciled = std::collections::HashMap<String, shared::api::kind::CrName>;

/// Forgets each CR of `reconciled` that the ring gives to another replica and whose pass no longer
/// runs here (as a deleted one is: `pass::forget_reconciled`), and lets go of those no longer in the
/// stores (deleted: forgotten then); how many it forgot.
fn forget_moved_away(
    shard: &crate::shard::Shard,
    ctx: &context::Context,
    reconciled: &mut Reconciled,
    stored: &std::collections::HashSet<String>,
) -> usize {
    let mut forgotten = 0;
    reconciled.retain(|uid, name| {
        if !shard.owned_by_another(uid) {
            return stored.contains(uid);
        }
        if shard.running(uid) {
            return true;
        }
        pass::forget_reconciled(ctx, uid, name);
        forgotten += 1;
        false
    });
    forgotten
}

/// The longest the other CRs wait for the ones sent first to begin their passes.
const FIRST_GO_AHEAD: Duration = Duration::from_secs(1);

/// Sends the CRs that became reconcilable here to their reconcilers, first those taken over whose
/// source changed lately: after a replica is gone, the copies an edit made stale meanwhile are
/// written before the hundreds of its other CRs, whose copies need nothing. kube's scheduler keeps
/// no order among what it is sent at once, so the rest is sent once as many passes have begun as
/// were sent first (or after `FIRST_GO_AHEAD`).
async fn send_stale_takeovers_first(
    (shard, recent_sources, passes_begun): (
        &crate::shard::Shard,
        &wake::RecentSources,
        &tokio::sync::watch::Sender<u64>,
    ),
    (projections, projection_changes): (
        Vec<StoredCr<Projection>>,
        &tokio::sync::mpsc::UnboundedSender<StoredCr<Projection>>,
    ),
    (clusters, cluster_changes): (
        Vec<StoredCr<ClusterProjection>>,
        &tokio::sync::mpsc::UnboundedSender<StoredCr<ClusterProjection>>,
    ),
) {
    let (first_projections, projections): (Vec<_>, Vec<_>) = projections
        .into_iter()
        .partition(|cr| taken_over_and_stale(shard, recent_sources, cr));
    let (first_clusters, clusters): (Vec<_>, Vec<_>) = clusters
        .into_iter()
        .partition(|cr| taken_over_and_stale(shard, recent_sources, cr));
    let first = first_projections.len() + first_clusters.len();
    shard.sent_first(first);
    let begun = passes_begun.subscribe();
    let target = *begun.borrow() + first as u64;
    for cr in first_projections {
        let _ = projection_changes.send(cr);
    }
    for cr in first_clusters {
        let _ = cluster_changes.send(cr);
    }
    if first > 0 && !(projections.is_empty() && clusters.is_empty()) {
        tracing::info!(
            crs = first,
            waiting = projections.len() + clusters.len(),
            "sent first the CRs taken over whose source changed lately"
        );
        until_begun(begun, target).await;
    }
    for cr in projections {
        let _ = projection_changes.send(cr);
    }
    for cr in clusters {
        let _ = cluster_changes.send(cr);
    }
}

/// Waits until `begun` counts `target` passes begun, or `FIRST_GO_AHEAD` has passed: the CRs sent
/// ahead of others have left kube's scheduler, whose order the others can no longer overtake.
async fn until_begun(mut begun: tokio::sync::watch::Receiver<u64>, target: u64) {
    let _ = tokio::time::timeout(FIRST_GO_AHEAD, begun.wait_for(|begun| *begun >= target)).await;
}

/// Whether `cr` moved here and waits for its first pass here, and the source it reads changed
/// lately (so its copies may be stale).
fn taken_over_and_stale<K: ProjectionKind>(
    shard: &crate::shard::Shard,
    recent_sources: &wake::RecentSources,
    cr: &StoredCr<K>,
) -> bool {
    shard.awaiting_takeover(cr.meta().uid.as_deref().unwrap_or_default())
        && reads_changed_source(recent_sources, cr)
}

/// Sends the CRs of `store` that `woken` names or that read a source changed lately to `to`; how
/// many.
fn send_first<K: ProjectionKind>(
    store: &reflector::Store<StoredCr<K>>,
    woken: Vec<reflector::ObjectRef<StoredCr<K>>>,
    recent_sources: &wake::RecentSources,
    to: &tokio::sync::mpsc::UnboundedSender<StoredCr<K>>,
) -> usize {
    let woken: std::collections::HashSet<_> = woken.into_iter().collect();
    let mut sent = 0;
    for cr in store.state() {
        if woken.contains(&reflector::ObjectRef::from_obj(&*cr)) || reads_changed_source(recent_sources, &cr)
        {
            let _ = to.send((*cr).clone());
            sent += 1;
        }
    }
    sent
}

/// Whether the source `cr` reads changed lately (so its copies may be stale).
fn reads_changed_source<K: ProjectionKind>(recent_sources: &wake::RecentSources, cr: &StoredCr<K>) -> bool {
    cr.warm_up()
        .is_some_and(|(source, _)| recent_sources.changed_lately(&source))
}

/// Each CR of `store` this replica may reconcile and did not at the last look (`before`), to be
/// sent; records in `now` the uids it may, in `reconciled` their names, and in `stored` every uid.
fn newly_reconcilable<K: ProjectionKind>(
    shard: &crate::shard::Shard,
    store: &reflector::Store<StoredCr<K>>,
    before: &std::collections::HashSet<String>,
    (now, stored): (
        &mut std::collections::HashSet<String>,
        &mut std::collections::HashSet<String>,
    ),
    reconciled: &mut Reconciled,
) -> Vec<StoredCr<K>>
where
    StoredCr<K>: Clone,
{
    let mut fresh = Vec::new();
    for cr in store.state() {
        let uid = cr.meta().uid.clone().unwrap_or_default();
        if shard.may_reconcile(&uid) {
            if !before.contains(&uid) {
                fresh.push((*cr).clone());
            }
            now.insert(uid.clone());
            if !reconciled.contains_key(&uid) {
                reconciled.insert(uid.clone(), cr_name(cr.meta()));
            }
        }
        stored.insert(uid);
    }
    fresh
}

/// A CR's kind and name from its metadata: a Projection has a namespace, a ClusterProjection none.
fn cr_name(meta: &kube::api::ObjectMeta) -> shared::api::kind::CrName {
    let name = meta.name.clone().unwrap_or_default();
    match &meta.namespace {
        Some(namespace) => shared::api::kind::CrName::Projection {
            namespace: namespace.clone(),
            name,
        },
        None => shared::api::kind::CrName::ClusterProjection { name },
    }
}

/// Runs a controller (`run`) to its end, or until `stop` if its store has not synced by then.
/// kube's controller holds its reconciles until its store is ready and its graceful shutdown waits
/// for them, so a replica whose CR watch never syncs (its RBAC does not cover the CRs, a CRD is
/// missing) would otherwise ignore SIGTERM until its pod is killed. A synced controller finishes
/// its running reconciles as before.
async fn unless_stopped_unsynced<K>(
    run: impl std::future::Future<Output = ()>,
    stop: CancellationToken,
    store: reflector::Store<K>,
) where
    K: Watchable,
{
    use futures::FutureExt;
    let unsynced_stop = async {
        stop.cancelled().await;
        if matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = run => {}
        () = unsynced_stop => tracing::info!(
            kind = K::kind(&()).as_ref(),
            "stopped before the caches synced: no reconcile ran, none to finish"
        ),
    }
}

/// Invalidates discovery and wakes the CRs following the group of every `K` that changes, then
/// tells `also` (the watches, the object's name, whether it was deleted).
async fn follow_discovery_changes<K>(
    client: Client,
    ctx: Arc<context::Context>,
    initial: crate::initial_list::InitialList,
    also: fn(&watches::WatchRegistry, &str, bool),
) where
    K: Watchable,
{
    let looking = Arc::new(Mutex::new(HashMap::new()));
    initial_list::watch(
        Api::<PartialObjectMeta<K>>::all(client),
        watcher::Config::default(),
        initial,
    )
    .default_backoff()
    .for_each(|event| {
        if let Ok(Event::Apply(object) | Event::Delete(object)) = &event {
            let name = object.metadata.name.as_deref().unwrap_or_default();
            ctx.sources.discovery.invalidate();
            ctx.watches.wake_discovery_followers(group_of(name));
            look_again(&ctx, &looking, group_of(name));
            also(&ctx.watches, name, matches!(event, Ok(Event::Delete(_))));
        }
        std::future::ready(())
    })
    .await;
}

/// How long a stop waits for the passes in flight before it drops them. A pass waits on the
/// apiserver, up to the response timeout (65 s by default) on a path gone silent, and the pod is
/// killed 15 s after SIGTERM (the chart's grace period): unbounded, the drain would outlast it and
/// the Lease would never be released or deleted, so the others would wait for it to expire. A pass
/// dropped midway is safe: each write is whole, and whoever reconciles the CR next runs it again.
const PASS_DRAIN: Duration = Duration::from_secs(5);

/// Runs `work` until it ends or until `limit` has passed since `stop` (then drops it): whether it
/// ended.
async fn ended_within(
    work: impl std::future::Future<Output = ()>,
    stop: &CancellationToken,
    limit: Duration,
) -> bool {
    tokio::select! {
        () = work => true,
        () = async {
            stop.cancelled().await;
            tokio::time::sleep(limit).await;
        } => false,
    }
}

/// How long the reconcilers wait for a CR store to sync before saying so (and waiting on).
const STORE_SYNC_WARN_AFTER: Duration = Duration::from_secs(30);

/// Waits until `store` has synced; `false` if stopped first.
async fn synced<K>(store: &reflector::Store<K>, stop: &CancellationToken) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        tokio::select! {
            () = stop.cancelled() => return false,
            ready = crate::watches::store_ready(store, STORE_SYNC_WARN_AFTER) => if ready {
                return true;
            },
        }
        tracing::warn!("a CR store has not synced yet: the reconcilers wait for it");
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// When the followers of a group look at discovery again after a change of it. Discovery trails
/// the objects it is made of: the aggregator lists a new CRD's versions one by one, each after its
/// APIService shows, so a look taken on the change's event can see a group whose preferred version
/// is not registered yet (a source resolved to `v1beta1` of a CRD serving `v1` too). The last of
/// these looks settles on what discovery finally serves.
const DISCOVERY_SETTLES_AFTER: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(5)];

/// Schedules the later looks at discovery for the followers of `group`. One schedule runs per group
/// at a time: `looking` holds the groups with one running, and whether the group changed again
/// since it began (then it runs once more, so the last look still follows the last change).
fn look_again(ctx: &Arc<context::Context>, looking: &Arc<Mutex<HashMap<String, bool>>>, group: &str) {
    {
        let mut pending = looking.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(changed_again) = pending.get_mut(group) {
            *changed_again = true;
            return;
        }
        pending.insert(group.to_owned(), false);
    }
    let (ctx, looking, group) = (ctx.clone(), looking.clone(), group.to_owned());
    tokio::spawn(async move {
        loop {
            let mut waited = Duration::ZERO;
            for after in DISCOVERY_SETTLES_AFTER {
                tokio::time::sleep(after - waited).await;
                waited = after;
                ctx.sources.discovery.invalidate();
                ctx.watches.wake_discovery_followers(&group);
            }
            let mut pending = looking.lock().unwrap_or_else(|e| e.into_inner());
            match pending.get_mut(&group) {
                Some(changed_again) if *changed_again => *changed_again = false,
                _ => {
                    pending.remove(&group);
                    return;
                }
            }
        }
    });
}

/// The API group in the name of a CRD (`<plural>.<group>`) or an APIService (`<version>.<group>`,
/// `v1.` for the core group).
fn group_of(name: &str) -> &str {
    name.split_once('.').map_or("", |(_, group)| group)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use kube::runtime::watcher::Event;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn every_deletion_the_watch_reports_is_told_and_every_event_passes_on() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let events = futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply("a")),
            Ok(Event::InitDone),
            Ok(Event::Apply("b")),
            Ok(Event::Delete("a")),
            Err(kube::runtime::watcher::Error::NoResourceVersion),
            Ok(Event::Delete("b")),
        ]);
        let passed: Vec<_> = super::on_deleted(events, {
            let told = told.clone();
            move |name: &&str| told.lock().unwrap().push(*name)
        })
        .collect()
        .await;
        assert_eq!(passed.len(), 7, "nothing is held back");
        assert_eq!(*told.lock().unwrap(), ["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_drops_what_still_runs_once_the_drain_is_over() {
        use std::time::Duration;
        use tokio::time::Instant;
        let stop = tokio_util::sync::CancellationToken::new();
        let limit = Duration::from_secs(5);
        // A pass waiting on a path gone silent: it would end only at the response timeout.
        let stuck = tokio::time::sleep(Duration::from_secs(65));
        let canceller = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            canceller.cancel();
        });
        let started = Instant::now();
        assert!(!super::ended_within(stuck, &stop, limit).await);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(7),
            "the stop came at 2 s, the drain 5 s"
        );

        // Work that ends within the drain is waited for, and said to have ended.
        let started = Instant::now();
        let quick = tokio::time::sleep(Duration::from_secs(3));
        assert!(super::ended_within(quick, &stop, limit).await);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_stop_the_work_runs_as_long_as_it_takes() {
        use std::time::Duration;
        let stop = tokio_util::sync::CancellationToken::new();
        let started = tokio::time::Instant::now();
        let long = tokio::time::sleep(Duration::from_secs(3600));
        assert!(super::ended_within(long, &stop, Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(3600));
    }

    #[test]
    fn group_of_crd_and_api_service_names() {
        assert_eq!(super::group_of("widgets.example.com"), "example.com");
        assert_eq!(super::group_of("v1beta1.example.com"), "example.com");
        assert_eq!(super::group_of("v1."), "");
    }
}
