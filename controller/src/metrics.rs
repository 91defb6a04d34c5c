//! The controller's Prometheus metrics. Names follow the Go operator; labels are bounded (kind,
//! result, event), never object names or error text.

use crate::cache::stored_cr::{ReadySummary, StoredCr};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, runtime::reflector::Store};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        MetricType, counter::Counter, family::Family, gauge::ConstGauge, gauge::Gauge, histogram::Histogram,
    },
    registry::Registry,
};
use shared::api::crd::{ClusterProjection, Projection};
use std::{
    collections::BTreeMap,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
};

/// The Go operator's buckets for `projection_e2e_seconds`, kept so dashboards carry over.
const E2E_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of `projection_shard_takeover_seconds`: a takeover waits for the members'
/// acknowledgements (a second or two) and then for its pass, up to a Lease's length or more.
const TAKEOVER_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

/// Labels of `projection_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `Projection` or `ClusterProjection`.
    pub kind: &'static str,
    /// `success`, `conflict`, `source_error` or `destination_error`.
    pub result: &'static str,
}

/// Labels of `projection_e2e_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct E2eLabels {
    /// `Projection` or `ClusterProjection`.
    pub kind: &'static str,
    /// `create` (first copy of a new CR).
    pub event: &'static str,
}

/// Labels of the reconcile duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `Projection` or `ClusterProjection`.
    pub kind: &'static str,
}

/// Labels of `projection_api_errors_total`-style counters by error category.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `Projection` or `ClusterProjection`.
    pub kind: &'static str,
    /// The error's category (a fixed, small set).
    pub category: &'static str,
}

/// Labels of `projection_author_rechecks_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecheckLabels {
    /// `Projection` or `ClusterProjection`.
    pub kind: &'static str,
    /// `allowed`, `denied` or `error`.
    pub result: &'static str,
}

/// Labels of `projection_author_access_reviews_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// What the review asked about: `object` (one source, or one kubeconfig Secret), `namespace`
    /// (every object of a kind in a namespace), `cluster` (in every namespace).
    pub scope: &'static str,
}

/// Labels of `projection_copy_writer_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriterLabels {
    /// `author` (impersonated) or `controller`.
    pub writer: &'static str,
}

/// Every metric of the controller.
pub struct Metrics {
    pub reconcile_total: Family<ReconcileLabels, Counter>,
    pub e2e_seconds: Family<E2eLabels, Histogram>,
    pub reconcile_duration_seconds: Family<KindLabels, Histogram>,
    pub reconcile_errors_total: Family<ErrorLabels, Counter>,
    /// Author questions asked again by the periodic recheck, by answer.
    pub author_rechecks_total: Family<RecheckLabels, Counter>,
    /// SubjectAccessReviews sent about authors (passes and rechecks), by what they asked about.
    pub author_access_reviews_total: Family<ReviewLabels, Counter>,
    /// 1 for who creates and updates copies, as decided at start-up.
    pub copy_writer: Family<WriterLabels, Gauge>,
    pub watched_gvks: Gauge,
    pub watched_dest_gvks: Gauge,
    /// Other clusters open for copies (`spec.destination.kubeConfig`).
    pub remote_clusters: Gauge,
    /// CR watch events a replica with shards received and dropped as another replica's: none where
    /// the apiserver filters by `shardSelector`, the others' share where it ignores it.
    pub shard_events_dropped_total: Family<KindLabels, Counter>,
    /// With shards: the live members this replica sees, and the changes of the ring it applied.
    pub shard_members: Gauge,
    pub shard_ring_changes_total: Counter,
    /// Passes cut short because the replica's member Lease lapsed (the fence).
    pub shard_fenced_passes_total: Counter,
    /// Seconds from a replica seeing the membership change that moved a CR to it to the end of
    /// that CR's first pass there (one observation per CR taken over).
    pub shard_takeover_seconds: Histogram,
    /// CRs taken over that were handed to the reconcilers before the others that became this
    /// replica's at the same time, because the source they read changed lately (an edit made while
    /// their owner was gone).
    pub shard_sent_first_total: Counter,
    /// The controller-runtime names the Go operator exposed.
    pub queue: crate::queue_metrics::QueueMetrics,
    /// client-go's `rest_client_requests_total`, for the controller's client.
    pub rest_client: runtime::rest_client_metrics::RestClientMetrics,
    /// What the gauges read at scrape time (`projection_resources`,
    /// `projection_cluster_projection_namespaces`, `leader_election_master_status`).
    replica: Arc<OnceLock<ReplicaView>>,
}

impl Metrics {
    /// Creates the metrics and registers them, with the process metrics, into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconcile_total: Family::default(),
            e2e_seconds: Family::new_with_constructor(|| Histogram::new(E2E_BUCKETS)),
            reconcile_duration_seconds: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.001, 2.0, 16,
                ))
            }),
            reconcile_errors_total: Family::default(),
            author_rechecks_total: Family::default(),
            author_access_reviews_total: Family::default(),
            copy_writer: Family::default(),
            watched_gvks: Gauge::default(),
            watched_dest_gvks: Gauge::default(),
            remote_clusters: Gauge::default(),
            shard_events_dropped_total: Family::default(),
            shard_members: Gauge::default(),
            shard_ring_changes_total: Counter::default(),
            shard_fenced_passes_total: Counter::default(),
            shard_takeover_seconds: Histogram::new(TAKEOVER_BUCKETS),
            shard_sent_first_total: Counter::default(),
            queue: crate::queue_metrics::QueueMetrics::register(registry),
            rest_client: runtime::rest_client_metrics::RestClientMetrics::register(registry),
            replica: Arc::default(),
        };
        registry.register(
            "projection_reconcile",
            "Reconciles that reached an outcome, by kind and result",
            metrics.reconcile_total.clone(),
        );
        registry.register(
            "projection_e2e_seconds",
            "Time from a CR's creation to its first copy written",
            metrics.e2e_seconds.clone(),
        );
        registry.register(
            "projection_reconcile_duration_seconds",
            "Duration of one reconcile",
            metrics.reconcile_duration_seconds.clone(),
        );
        registry.register(
            "projection_reconcile_errors",
            "Reconciles that failed with an error, by category",
            metrics.reconcile_errors_total.clone(),
        );
        registry.register(
            "projection_author_rechecks",
            "Author access questions asked again by the periodic recheck, by answer",
            metrics.author_rechecks_total.clone(),
        );
        registry.register(
            "projection_author_access_reviews",
            "SubjectAccessReviews sent about CRs' authors, by what they asked about: one object, every object of a kind in a namespace, or in every namespace",
            metrics.author_access_reviews_total.clone(),
        );
        registry.register(
            "projection_copy_writer_info",
            "Who creates and updates copies, decided at start-up: the CR's author (impersonated) or the controller",
            metrics.copy_writer.clone(),
        );
        registry.register(
            "projection_watched_gvks",
            "Source kinds with a running watch",
            metrics.watched_gvks.clone(),
        );
        registry.register(
            "projection_watched_dest_gvks",
            "Destination kinds with a running watch",
            metrics.watched_dest_gvks.clone(),
        );
        registry.register(
            "projection_remote_clusters",
            "Other clusters open for copies (spec.destination.kubeConfig): each named by at least one CR",
            metrics.remote_clusters.clone(),
        );
        registry.register(
            "projection_shard_events_dropped",
            "CR watch events a replica with shards (--shard-by-lease) received and dropped as another replica's, by kind",
            metrics.shard_events_dropped_total.clone(),
        );
        registry.register(
            "projection_shard_members",
            "Live members of the ring this replica with shards (--shard-by-lease) sees; 0 without shards",
            metrics.shard_members.clone(),
        );
        registry.register(
            "projection_shard_ring_changes",
            "Changes of the members a replica with shards applied (each moves some CRs between replicas)",
            metrics.shard_ring_changes_total.clone(),
        );
        registry.register(
            "projection_shard_fenced_passes",
            "Passes a replica with shards cut short because its member Lease lapsed before they ended (no write started after)",
            metrics.shard_fenced_passes_total.clone(),
        );
        registry.register(
            "projection_shard_takeover_seconds",
            "Seconds from a replica with shards seeing the membership change that moved a CR to it to the end of that CR's first pass there",
            metrics.shard_takeover_seconds.clone(),
        );
        registry.register(
            "projection_shard_sent_first",
            "CRs a replica with shards took over and handed to its reconcilers before the others that became its own with them, because the source they read changed lately",
            metrics.shard_sent_first_total.clone(),
        );
        registry.register_collector(Box::new(ReplicaCollector(metrics.replica.clone())));
        registry.register_collector(Box::new(runtime::process_metrics::ProcessCollector::default()));
        metrics
    }

    /// Lets the scrape-time gauges read this replica's CR stores and whether it leads (called
    /// once, when the replica starts; before, they report no CR and no leadership).
    pub fn observe_replica(
        &self,
        leading: &Arc<AtomicBool>,
        projections: &Store<StoredCr<Projection>>,
        clusters: &Store<StoredCr<ClusterProjection>>,
    ) {
        let _ = self.replica.set(ReplicaView {
            leading: leading.clone(),
            projections: projections.clone(),
            clusters: clusters.clone(),
        });
    }
}

/// The prefix of the controller's own metrics that name the service (the metrics endpoint's
/// certificate, served over HTTPS: `projection_controller_metrics_certificate_*`).
pub const SERVICE: &str = "projection_controller";

/// The replica state the scrape-time gauges read.
struct ReplicaView {
    leading: Arc<AtomicBool>,
    projections: Store<StoredCr<Projection>>,
    clusters: Store<StoredCr<ClusterProjection>>,
}

/// Encodes, at each scrape, the gauges computed from the replica's CR stores, while it reconciles
/// (the leader, or every member with shards, each holding its own CRs): a standby holds every CR
/// too but reports none, so each CR is reported by one replica and dashboards and alerts `sum`
/// across replicas in either mode (and a standby does not serialize a series per CR for nothing).
#[derive(Clone)]
struct ReplicaCollector(Arc<OnceLock<ReplicaView>>);

impl std::fmt::Debug for ReplicaCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaCollector")
            .field("observing", &self.0.get().is_some())
            .finish()
    }
}

/// Labels of `projection_resources`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ReadyLabels {
    /// `Projection` or `ClusterProjection`.
    pub kind: &'static str,
    /// The status of the `Ready` condition: `True`, `False`, or `Unknown` (also without one).
    pub ready: &'static str,
    /// The `Ready` condition's reason (one of `shared::api::reason::Reason`), `Other` for a reason the
    /// controller does not write, empty without a condition.
    pub reason: &'static str,
}

/// The labels of a CR's `projection_resource_info` series: `kind`, `namespace` (empty for a
/// ClusterProjection), `name`, `ready` and `reason` (as in `projection_resources`), `cause` (`tenant`, `platform`, empty when
/// ready: whose move it is), `suspended`
/// (`true` or `false`). The only labels of ours that name objects, on purpose (the convention of
/// kube-state-metrics' `kube_*_info`, Flux's `gotk_resource_info`, cert-manager's per-certificate
/// series), so an alert can name the CR and be routed by its namespace; bounded by the CRs that
/// exist, each series gone with its CR.
fn info_labels<'a>(
    kind: &'static str,
    meta: &'a ObjectMeta,
    summary: &ReadySummary,
) -> [(&'static str, &'a str); 7] {
    [
        ("kind", kind),
        ("namespace", meta.namespace.as_deref().unwrap_or_default()),
        ("name", meta.name.as_deref().unwrap_or_default()),
        ("ready", summary.ready()),
        ("reason", summary.reason()),
        ("cause", summary.cause()),
        ("suspended", if summary.suspended { "true" } else { "false" }),
    ]
}

/// Labels of `projection_cluster_projection_namespaces`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `written` or `failed`.
    pub state: &'static str,
}

/// Labels of `leader_election_master_status` (client-go's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    /// The Lease's name.
    pub name: &'static str,
}

/// The labels of a CR's `projection_resources` series, from what its store entry keeps.
fn ready_labels(kind: &'static str, summary: &ReadySummary) -> ReadyLabels {
    ReadyLabels {
        kind,
        ready: summary.ready(),
        reason: summary.reason(),
    }
}

impl Collector for ReplicaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let view = self.0.get();
        let leading = view.is_some_and(|v| v.leading.load(Ordering::Acquire));
        let reconciled = view.filter(|_| leading);
        let mut resources: BTreeMap<ReadyLabels, i64> = BTreeMap::new();
        let (mut written, mut failed) = (0_i64, 0_i64);
        if let Some(view) = reconciled {
            // Each CR's summary was read when it was stored: a scrape decodes no CR.
            for cr in view.projections.state() {
                *resources
                    .entry(ready_labels("Projection", &cr.ready_summary()))
                    .or_default() += 1;
            }
            for cr in view.clusters.state() {
                let summary = cr.ready_summary();
                written += i64::from(summary.namespaces_written);
                failed += i64::from(summary.namespaces_failed);
                *resources
                    .entry(ready_labels("ClusterProjection", &summary))
                    .or_default() += 1;
            }
        }
        let mut family = encoder.encode_descriptor(
            "projection_resources",
            "Projections and ClusterProjections this replica reconciles (the leader, or each member with shards; 0 on a standby), by kind and the status and reason of their Ready condition",
            None,
            MetricType::Gauge,
        )?;
        for (labels, count) in &resources {
            ConstGauge::new(*count).encode(family.encode_family(labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "projection_resource_info",
            "1 for each Projection and ClusterProjection this replica reconciles (none on a standby), naming it, with the status and reason of its Ready condition, whose move it is (cause: tenant or platform) and whether it is suspended",
            None,
            MetricType::Gauge,
        )?;
        if let Some(view) = reconciled {
            for cr in view.projections.state() {
                let labels = info_labels("Projection", cr.meta(), &cr.ready_summary());
                ConstGauge::new(1_i64).encode(family.encode_family(&labels)?)?;
            }
            for cr in view.clusters.state() {
                let labels = info_labels("ClusterProjection", cr.meta(), &cr.ready_summary());
                ConstGauge::new(1_i64).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "projection_cluster_projection_namespaces",
            "Target namespaces of the ClusterProjections this replica reconciles (0 on a standby), as their status counts them: written (namespacesWritten) or failed (namespacesFailed)",
            None,
            MetricType::Gauge,
        )?;
        for (state, value) in [("written", written), ("failed", failed)] {
            ConstGauge::new(value).encode(family.encode_family(&StateLabels { state })?)?;
        }
        let mut family = encoder.encode_descriptor(
            "leader_election_master_status",
            "1 while this replica holds the leader Lease and runs the reconcilers (always, without --leader-elect), else 0",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(leading)).encode(family.encode_family(&LeaseLabels {
            name: crate::leader::LEASE_NAME,
        })?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/observability.md lists exactly what `/metrics` serves: its controller tables and the
    /// process metrics against the registry `main` serves, once each family has a series. (A family
    /// registered without a line in the doc fails `shared/tests/observability_doc.rs` too, observed
    /// here or not.)
    #[test]
    fn the_documented_metrics_are_the_served_ones() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/observability.md"))
            .expect("docs/observability.md");
        // The metric tables of its sections, and the process metrics.
        let documented = runtime::metrics_doc::documented_with_process_names(
            &doc,
            &["Controller", "Controller: the controller-runtime names"],
        );
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        // A labelled family is served once it has a series: one of each, as a running controller
        // soon has (the controller-runtime families start with theirs).
        let kind = "Projection";
        metrics
            .reconcile_total
            .get_or_create(&ReconcileLabels {
                kind,
                result: "success",
            })
            .inc();
        metrics
            .e2e_seconds
            .get_or_create(&E2eLabels {
                kind,
                event: "create",
            })
            .observe(0.1);
        metrics
            .reconcile_duration_seconds
            .get_or_create(&KindLabels { kind })
            .observe(0.1);
        metrics
            .shard_events_dropped_total
            .get_or_create(&KindLabels { kind })
            .inc();
        metrics
            .reconcile_errors_total
            .get_or_create(&ErrorLabels {
                kind,
                category: "api",
            })
            .inc();
        metrics
            .author_rechecks_total
            .get_or_create(&RecheckLabels {
                kind,
                result: "allowed",
            })
            .inc();
        metrics
            .author_access_reviews_total
            .get_or_create(&ReviewLabels { scope: "namespace" })
            .inc();
        metrics
            .copy_writer
            .get_or_create(&WriterLabels { writer: "author" })
            .set(1);
        metrics
            .rest_client
            .count("200".to_owned(), "127.0.0.1:6443", "GET".to_owned());
        // Served over HTTPS (--metrics-cert-file) only.
        let certificate = runtime::tls::CertMetrics::of_metrics_endpoint(&mut registry, SERVICE);
        certificate
            .reloads_total
            .get_or_create(&runtime::tls::ReloadLabels { result: "success" })
            .inc();
        let served = runtime::metrics_doc::served_names(&registry);
        runtime::metrics_doc::assert_same_names(&documented, &served, "controller tables");
    }

    #[test]
    fn the_replica_gauges_report_nothing_and_no_leadership_before_the_replica_starts() {
        let mut registry = Registry::default();
        let _metrics = Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains("leader_election_master_status{name=\"projection-controller-leader\"} 0"),
            "{text}"
        );
        assert!(text.contains("projection_cluster_projection_namespaces{state=\"failed\"} 0"));
        assert!(text.contains("# TYPE projection_resources gauge"));
        assert!(!text.contains("projection_resources{"), "no CR, no series");
        assert!(text.contains("# TYPE projection_resource_info gauge"));
        assert!(!text.contains("projection_resource_info{"), "no CR, no series");
    }

    #[test]
    fn only_a_replica_that_reconciles_reports_its_crs() {
        use kube::runtime::{reflector, watcher};
        let (projections, mut projection_writer) = reflector::store::<StoredCr<Projection>>();
        let (clusters, mut cluster_writer) = reflector::store::<StoredCr<ClusterProjection>>();
        let projection: Projection = serde_json::from_value(serde_json::json!({
            "apiVersion": "projection.sh/v1", "kind": "Projection",
            "metadata": {"name": "settings", "namespace": "team-a", "uid": "u-1"},
            "spec": {"source": {"version": "v1", "kind": "ConfigMap", "namespace": "platform", "name": "settings"}},
        }))
        .expect("a Projection");
        projection_writer
            .apply_watcher_event(&watcher::Event::Apply(StoredCr::new(projection).expect("stored")));
        let cluster: ClusterProjection = serde_json::from_value(serde_json::json!({
            "apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
            "metadata": {"name": "shared-ca", "uid": "c-1"},
            "spec": {
                "source": {"version": "v1", "kind": "ConfigMap", "namespace": "platform", "name": "ca"},
                "destination": {"namespaces": ["team-a", "team-b"]},
            },
            "status": {"namespacesWritten": 1, "namespacesFailed": 1},
        }))
        .expect("a ClusterProjection");
        cluster_writer.apply_watcher_event(&watcher::Event::Apply(StoredCr::new(cluster).expect("stored")));
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let leading = Arc::new(AtomicBool::new(false));
        metrics.observe_replica(&leading, &projections, &clusters);
        let scrape = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
            text
        };

        let standby = scrape();
        assert!(!standby.contains("projection_resources{"), "{standby}");
        assert!(!standby.contains("projection_resource_info{"), "{standby}");
        assert!(standby.contains("projection_cluster_projection_namespaces{state=\"failed\"} 0"));
        assert!(standby.contains("leader_election_master_status{name=\"projection-controller-leader\"} 0"));

        leading.store(true, Ordering::Release);
        let leader = scrape();
        for sample in [
            r#"projection_resources{kind="Projection",ready="Unknown","#,
            r#"projection_resources{kind="ClusterProjection",ready="Unknown","#,
            r#"projection_resource_info{kind="Projection",namespace="team-a",name="settings","#,
            r#"projection_cluster_projection_namespaces{state="failed"} 1"#,
            r#"leader_election_master_status{name="projection-controller-leader"} 1"#,
        ] {
            assert!(leader.contains(sample), "no {sample} in:\n{leader}");
        }
    }

    /// A scrape of the replica gauges with 10,000 Projections and 1,000 ClusterProjections in the
    /// stores, each with the three conditions the controller writes. A benchmark, run by name:
    /// `cargo test -p controller --bin projection-controller the_replica_gauges_at_scale --
    /// --ignored --nocapture`.
    #[test]
    #[ignore = "a benchmark: run it by name with --ignored --nocapture"]
    fn the_replica_gauges_at_scale() {
        use kube::runtime::{reflector, watcher};
        let conditions = |ready: &str, reason: &str| {
            serde_json::json!([
                {"type": "SourceResolved", "status": "True", "reason": "Resolved", "message": "source resolved",
                 "lastTransitionTime": "2026-11-25T00:00:00Z", "observedGeneration": 1},
                {"type": "DestinationWritten", "status": ready, "reason": reason, "message": "written to team-a/settings",
                 "lastTransitionTime": "2026-11-25T00:00:00Z", "observedGeneration": 1},
                {"type": "Ready", "status": ready, "reason": reason, "message": "written to team-a/settings",
                 "lastTransitionTime": "2026-11-25T00:00:00Z", "observedGeneration": 1},
            ])
        };
        let (projections, mut projection_writer) = reflector::store::<StoredCr<Projection>>();
        let (clusters, mut cluster_writer) = reflector::store::<StoredCr<ClusterProjection>>();
        for i in 0..10_000 {
            let (ready, reason) = if i % 10 == 0 {
                ("False", "SourceNotFound")
            } else {
                ("True", "Projected")
            };
            let cr: Projection = serde_json::from_value(serde_json::json!({
                "apiVersion": "projection.sh/v1", "kind": "Projection",
                "metadata": {"name": format!("p-{i}"), "namespace": format!("team-{}", i % 100), "uid": format!("u-{i}")},
                "spec": {"source": {"version": "v1", "kind": "ConfigMap", "namespace": "platform", "name": "settings"}},
                "status": {"conditions": conditions(ready, reason), "destinationName": "settings"},
            }))
            .expect("a Projection");
            projection_writer.apply_watcher_event(&watcher::Event::Apply(StoredCr::new(cr).expect("stored")));
        }
        for i in 0..1_000 {
            let cr: ClusterProjection = serde_json::from_value(serde_json::json!({
                "apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
                "metadata": {"name": format!("c-{i}"), "uid": format!("c-{i}")},
                "spec": {
                    "source": {"version": "v1", "kind": "ConfigMap", "namespace": "platform", "name": "settings"},
                    "destination": {"namespaces": ["team-a", "team-b"]},
                },
                "status": {"conditions": conditions("True", "Projected"), "namespacesWritten": 2, "namespacesFailed": i % 2},
            }))
            .expect("a ClusterProjection");
            cluster_writer.apply_watcher_event(&watcher::Event::Apply(StoredCr::new(cr).expect("stored")));
        }
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.observe_replica(&Arc::new(AtomicBool::new(true)), &projections, &clusters);
        let scrape = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
            text
        };
        let text = scrape();
        for sample in [
            r#"projection_resources{kind="Projection",ready="True",reason="Projected"} 9000"#,
            r#"projection_resources{kind="Projection",ready="False",reason="SourceNotFound"} 1000"#,
            r#"projection_resources{kind="ClusterProjection",ready="True",reason="Projected"} 1000"#,
            r#"projection_cluster_projection_namespaces{state="written"} 2000"#,
            r#"projection_cluster_projection_namespaces{state="failed"} 500"#,
            r#"projection_resource_info{kind="Projection",namespace="team-10",name="p-10",ready="False",reason="SourceNotFound",cause="tenant",suspended="false"} 1"#,
            r#"projection_resource_info{kind="Projection",namespace="team-11",name="p-11",ready="True",reason="Projected",cause="",suspended="false"} 1"#,
            r#"projection_resource_info{kind="ClusterProjection",namespace="",name="c-7",ready="True",reason="Projected",cause="",suspended="false"} 1"#,
        ] {
            assert!(text.contains(sample), "no {sample} in:\n{text}");
        }
        let runs = 50;
        let started = std::time::Instant::now();
        for _ in 0..runs {
            std::hint::black_box(scrape());
        }
        println!(
            "one scrape with 11,000 CRs in the stores: {:?} (mean of {runs}), {} bytes, of which {} in projection_resource_info",
            started.elapsed() / runs,
            text.len(),
            text.lines()
                .filter(|l| l.starts_with("projection_resource_info{"))
                .map(|l| l.len() + 1)
                .sum::<usize>()
        );
    }
}
