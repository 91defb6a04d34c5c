//! The controller's Prometheus metrics. Names follow the Go operator; labels are bounded (kind,
//! result, event), never object names or error text.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// The Go operator's buckets for `projection_e2e_seconds`, kept so dashboards carry over.
const E2E_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

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

/// Every metric of the controller.
pub struct Metrics {
    pub reconcile_total: Family<ReconcileLabels, Counter>,
    pub e2e_seconds: Family<E2eLabels, Histogram>,
    pub reconcile_duration_seconds: Family<KindLabels, Histogram>,
    pub reconcile_errors_total: Family<ErrorLabels, Counter>,
    pub watched_gvks: Gauge,
    pub watched_dest_gvks: Gauge,
    /// The controller-runtime names the Go operator exposed.
    pub queue: crate::queue_metrics::QueueMetrics,
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
            watched_gvks: Gauge::default(),
            watched_dest_gvks: Gauge::default(),
            queue: crate::queue_metrics::QueueMetrics::register(registry),
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
            "projection_watched_gvks",
            "Source kinds with a running watch",
            metrics.watched_gvks.clone(),
        );
        registry.register(
            "projection_watched_dest_gvks",
            "Destination kinds with a running watch",
            metrics.watched_dest_gvks.clone(),
        );
        registry.register_collector(Box::new(runtime::process_metrics::ProcessCollector::default()));
        metrics
    }
}
