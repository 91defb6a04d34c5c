//! The controller-runtime metric names the Go operator exposed (`controller_runtime_reconcile_*`,
//! `workqueue_*`), so its dashboards and benchmark harness read real values from us.
//!
//! kube-runtime's controller keeps its queue to itself, so the queue figures are taken at its edges:
//! an object is queued when a change or a wake is handed to the controller (and it was not already
//! waiting) and leaves the queue when its reconcile starts. docs/observability.md says which values
//! are exact equivalents and which are approximations.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// controller-runtime's buckets of `controller_runtime_reconcile_time_seconds`.
const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25,
    1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0,
    50.0, 60.0,
];

/// client-go's work-queue buckets: 10 ns to 1000 s, by factors of ten.
fn workqueue_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(10e-9, 10.0, 12)
}

/// Labels by controller (`projection` or `clusterprojection`, the Go operator's controller names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

/// Labels of `controller_runtime_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub controller: &'static str,
    /// `success`, `error`, `requeue` or `requeue_after`, as controller-runtime.
    pub result: &'static str,
}

/// Labels of the `workqueue_*` metrics (the queue is named after its controller). In
/// client_golang's order (sorted), so text matches of the Go operator's series match ours.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub controller: &'static str,
    pub name: &'static str,
}

/// Labels of `workqueue_depth`: controller-runtime's priority queue (the Go operator's) adds the
/// priority; every reconcile here has the default one, `0`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DepthLabels {
    pub controller: &'static str,
    pub name: &'static str,
    pub priority: &'static str,
}

/// How a reconcile ended, in controller-runtime's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileEnd {
    Success,
    RequeueAfter,
    Error,
}

/// The metric families, shared by both controllers.
#[derive(Clone)]
struct Families {
    reconcile_total: Family<ResultLabels, Counter>,
    reconcile_errors_total: Family<ControllerLabels, Counter>,
    reconcile_time_seconds: Family<ControllerLabels, Histogram>,
    depth: Family<DepthLabels, Gauge>,
    adds_total: Family<QueueLabels, Counter>,
    queue_duration_seconds: Family<QueueLabels, Histogram>,
    work_duration_seconds: Family<QueueLabels, Histogram>,
    retries_total: Family<QueueLabels, Counter>,
}

/// The controller-runtime metrics of one controller, with what its queue holds.
pub struct ControllerMetrics {
    name: &'static str,
    families: Families,
    /// The objects waiting for a reconcile (`namespace/name`), since when.
    queued: Mutex<HashMap<String, Instant>>,
}

impl ControllerMetrics {
    fn new(name: &'static str, families: Families) -> Self {
        let this = Self {
            name,
            families,
            queued: Mutex::default(),
        };
        // As controller-runtime does: every series exists from the start, at zero.
        for result in ["success", "error", "requeue", "requeue_after"] {
            drop(this.families.reconcile_total.get_or_create(&this.result(result)));
        }
        drop(
            this.families
                .reconcile_errors_total
                .get_or_create(&this.controller()),
        );
        drop(
            this.families
                .reconcile_time_seconds
                .get_or_create(&this.controller()),
        );
        drop(this.families.depth.get_or_create(&this.depth_labels()));
        drop(this.families.adds_total.get_or_create(&this.queue()));
        drop(this.families.queue_duration_seconds.get_or_create(&this.queue()));
        drop(this.families.work_duration_seconds.get_or_create(&this.queue()));
        drop(this.families.retries_total.get_or_create(&this.queue()));
        this
    }

    fn controller(&self) -> ControllerLabels {
        ControllerLabels {
            controller: self.name,
        }
    }
    fn result(&self, result: &'static str) -> ResultLabels {
        ResultLabels {
            controller: self.name,
            result,
        }
    }
    fn queue(&self) -> QueueLabels {
        QueueLabels {
            controller: self.name,
            name: self.name,
        }
    }
    fn depth_labels(&self) -> DepthLabels {
        DepthLabels {
            controller: self.name,
            name: self.name,
            priority: "0",
        }
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        // The map holds no invariant a panic could break halfway.
        self.queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_depth(&self, depth: usize) {
        self.families
            .depth
            .get_or_create(&self.depth_labels())
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// A change or a wake of `key` was handed to the controller. Counted as an add only when the
    /// object was not already waiting (a queue holds an object once).
    pub fn queued_change(&self, key: String) {
        let mut queued = self.queued();
        if queued.contains_key(&key) {
            return;
        }
        queued.insert(key, Instant::now());
        self.set_depth(queued.len());
        drop(queued);
        self.families.adds_total.get_or_create(&self.queue()).inc();
    }

    /// The controller dropped `key` without reconciling it (the object is gone from its store).
    pub fn dropped(&self, key: &str) {
        let mut queued = self.queued();
        if queued.remove(key).is_some() {
            self.set_depth(queued.len());
        }
    }

    /// The reconcile of `key` starts. An object that was not waiting comes back from a requeue the
    /// controller scheduled itself: it is counted as an add with no time in the queue, as when
    /// client-go's delayed add fires.
    pub fn started(&self, key: &str) {
        let mut queued = self.queued();
        let since = queued.remove(key);
        self.set_depth(queued.len());
        drop(queued);
        let waited = match since {
            Some(since) => since.elapsed(),
            None => {
                self.families.adds_total.get_or_create(&self.queue()).inc();
                Duration::ZERO
            }
        };
        self.families
            .queue_duration_seconds
            .get_or_create(&self.queue())
            .observe(waited.as_secs_f64());
    }

    /// A reconcile that started at `started` ended with `outcome`.
    pub fn finished(&self, started: Instant, outcome: ReconcileEnd) {
        let took = started.elapsed().as_secs_f64();
        self.families
            .reconcile_time_seconds
            .get_or_create(&self.controller())
            .observe(took);
        self.families
            .work_duration_seconds
            .get_or_create(&self.queue())
            .observe(took);
        let result = match outcome {
            ReconcileEnd::Success => "success",
            ReconcileEnd::RequeueAfter => "requeue_after",
            ReconcileEnd::Error => "error",
        };
        self.families
            .reconcile_total
            .get_or_create(&self.result(result))
            .inc();
        if outcome == ReconcileEnd::Error {
            self.families
                .reconcile_errors_total
                .get_or_create(&self.controller())
                .inc();
            // The error policy requeues with a backoff: controller-runtime's rate-limited add.
            self.families.retries_total.get_or_create(&self.queue()).inc();
        }
    }
}

/// Both controllers' controller-runtime metrics.
pub struct QueueMetrics {
    pub projection: Arc<ControllerMetrics>,
    pub cluster: Arc<ControllerMetrics>,
}

impl QueueMetrics {
    /// The queue metrics of the controller of `scope`'s CRs.
    pub fn of(&self, scope: shared::api::kind::Scope) -> &ControllerMetrics {
        match scope {
            shared::api::kind::Scope::OwnNamespace => &self.projection,
            shared::api::kind::Scope::Namespaces => &self.cluster,
        }
    }

    /// Creates the metrics and registers them into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let families = Families {
            reconcile_total: Family::default(),
            reconcile_errors_total: Family::default(),
            reconcile_time_seconds: Family::new_with_constructor(|| Histogram::new(RECONCILE_TIME_BUCKETS)),
            depth: Family::default(),
            adds_total: Family::default(),
            queue_duration_seconds: Family::new_with_constructor(|| Histogram::new(workqueue_buckets())),
            work_duration_seconds: Family::new_with_constructor(|| Histogram::new(workqueue_buckets())),
            retries_total: Family::default(),
        };
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            families.reconcile_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            families.reconcile_errors_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            families.reconcile_time_seconds.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue by workqueue and priority",
            families.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            families.adds_total.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            families.queue_duration_seconds.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            families.work_duration_seconds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            families.retries_total.clone(),
        );
        Self {
            projection: Arc::new(ControllerMetrics::new("projection", families.clone())),
            cluster: Arc::new(ControllerMetrics::new("clusterprojection", families)),
        }
    }
}

/// The queue key of an object: `namespace/name`, or `name` for a cluster-scoped one.
pub fn queue_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(queue: &ControllerMetrics) -> i64 {
        queue.families.depth.get_or_create(&queue.depth_labels()).get()
    }

    fn encoded(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
        out
    }

    #[test]
    fn every_series_exists_at_zero_from_the_start() {
        let mut registry = Registry::default();
        let _metrics = QueueMetrics::register(&mut registry);
        let text = encoded(&registry);
        for line in [
            r#"controller_runtime_reconcile_total{controller="projection",result="success"} 0"#,
            r#"controller_runtime_reconcile_total{controller="clusterprojection",result="error"} 0"#,
            r#"controller_runtime_reconcile_errors_total{controller="projection"} 0"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="projection"} 0"#,
            r#"workqueue_depth{controller="projection",name="projection",priority="0"} 0"#,
            r#"workqueue_adds_total{controller="clusterprojection",name="clusterprojection"} 0"#,
            r#"workqueue_retries_total{controller="projection",name="projection"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_queue_holds_an_object_once_and_a_start_takes_it_out() {
        let mut registry = Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        let queue = &metrics.projection;
        queue.queued_change(queue_key(Some("a"), "one"));
        queue.queued_change(queue_key(Some("a"), "one"));
        queue.queued_change(queue_key(Some("a"), "two"));
        assert_eq!(depth(queue), 2);
        queue.started("a/one");
        assert_eq!(depth(queue), 1);
        queue.dropped("a/two");
        assert_eq!(depth(queue), 0);
        // A requeue the controller scheduled itself: an add with no wait.
        queue.started("a/one");
        let text = encoded(&registry);
        assert!(text.contains(r#"workqueue_adds_total{controller="projection",name="projection"} 3"#));
        assert!(text.contains(
            r#"workqueue_queue_duration_seconds_count{controller="projection",name="projection"} 2"#
        ));
    }

    #[test]
    fn an_error_counts_as_an_error_and_a_retry() {
        let mut registry = Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        metrics.cluster.finished(Instant::now(), ReconcileEnd::Error);
        metrics.cluster.finished(Instant::now(), ReconcileEnd::Success);
        metrics
            .cluster
            .finished(Instant::now(), ReconcileEnd::RequeueAfter);
        let text = encoded(&registry);
        for line in [
            r#"controller_runtime_reconcile_total{controller="clusterprojection",result="error"} 1"#,
            r#"controller_runtime_reconcile_total{controller="clusterprojection",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="clusterprojection",result="requeue_after"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="clusterprojection"} 1"#,
            r#"workqueue_retries_total{controller="clusterprojection",name="clusterprojection"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="clusterprojection"} 3"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
